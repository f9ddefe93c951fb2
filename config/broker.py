"""The embedded default's broker: kombu's filesystem transport with atomic message files.

kombu's own `_put` creates the file and then writes it, so a consumer polling the folder can
read an empty file and its worker dies on the JSON error (kombu issue #1551). Here a message
appears only when complete (written aside, then renamed), and a consumer claims a file by an
atomic rename before reading it, so two consumers never both take it. Queue bindings get the
same treatment: kombu truncates the exchange table before locking it, so a publisher reading
it meanwhile finds it empty and fails.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from pathlib import Path
from time import monotonic
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.transport.filesystem import exchange_queue_t
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

#: The URL scheme that selects this transport: `agentflowfs://localhost//`.
SCHEME = "agentflowfs"
#: kombu records a binding in process-wide state before writing it to the exchange table, and
#: other threads then skip their own bind: they must wait until the table is written.
_binding = threading.Lock()


class Channel(filesystem.Channel):
    # kombu's own base classes disagree on these signatures; these match the callers.

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        aside = folder / f".{name}.part"  # never matches a queue's `<stamp>.<queue>.msg`
        with open(aside, "wb") as out:
            out.write(str_to_bytes(dumps(payload)))
            out.flush()
            os.fsync(out.fileno())
        os.replace(aside, folder / name)

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        wanted = f"{queue}.msg"
        inbox = Path(self.data_folder_in)
        claimed = Path(self.processed_folder)
        for name in sorted(os.listdir(inbox)):
            if name.partition(".")[2] != wanted:
                continue
            mine = claimed / f"{os.getpid()}-{name}"
            try:
                os.rename(inbox / name, mine)  # atomic: exactly one consumer wins the file
            except FileNotFoundError:
                continue
            payload = mine.read_bytes()
            mine.unlink()
            return loads(bytes_to_str(payload))
        raise filesystem.Empty()

    def _restore(self, message: Any) -> None:
        """Give a message back (its consumer died): flagged as redelivered where Celery reads
        it, `delivery_info["redelivered"]`. kombu's virtual transport sets only a top-level
        key, so a read step that kills its worker would be redelivered for ever unflagged."""
        delivery_info = message.delivery_info
        payload = message.serializable()
        payload["redelivered"] = True
        payload.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = True
        payload.setdefault("headers", {})["redelivered"] = True
        for queue in self._lookup(delivery_info["exchange"], delivery_info["routing_key"]):
            self._put(queue, payload)

    def queue_bind(self, *args: Any, **kwargs: Any) -> Any:
        with _binding:
            return super().queue_bind(*args, **kwargs)

    def _queue_bind(self, exchange: Any, routing_key: Any, pattern: Any, queue: Any) -> None:
        table = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        binding = exchange_queue_t(routing_key or "", pattern or "", queue or "")
        # Binders take turns on a lock file; readers never lock: the table is replaced whole.
        with open(table.with_suffix(".lock"), "a") as turn:
            fcntl.flock(turn, fcntl.LOCK_EX)
            bindings = self.get_table(exchange)
            if binding in bindings:
                return
            aside = table.with_name(f".{table.name}.{uuid.uuid4().hex}.part")
            aside.write_bytes(str_to_bytes(dumps([binding, *bindings])))
            os.replace(aside, table)


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = driver_name = SCHEME


TRANSPORT_ALIASES.setdefault(SCHEME, f"{__name__}:Transport")
