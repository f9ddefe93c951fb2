"""The embedded default's broker: kombu's filesystem transport with atomic message files.

kombu's own `_put` creates the file and then writes it, so a consumer polling the folder can
read an empty file and its worker dies on the JSON error (kombu issue #1551). Here a message
appears only when complete (written aside, then renamed), and a consumer claims a file by an
atomic rename before reading it, so two consumers never both take it.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from time import monotonic
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

#: The URL scheme that selects this transport: `agentflowfs://localhost//`.
SCHEME = "agentflowfs"


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


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = driver_name = SCHEME


TRANSPORT_ALIASES.setdefault(SCHEME, f"{__name__}:Transport")
