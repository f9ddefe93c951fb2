"""The embedded broker: every message is read whole and by exactly one consumer."""

from __future__ import annotations

import threading
from pathlib import Path

from kombu import Connection

from config import broker
from tests.support.embedded import needs_embedded_broker

pytestmark = needs_embedded_broker


def _connection(folder: Path) -> Connection:
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(exist_ok=True)
    return Connection(
        f"{broker.SCHEME}://localhost//",
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "polling_interval": 0.01,
        },
    )


def test_filesystem_broker__concurrent_consumers_each_get_every_message_once(
    tmp_path: Path,
) -> None:
    total = 400
    received: list[int] = []
    lock = threading.Lock()
    done = threading.Event()
    stop = threading.Event()  # set however the test ends, so no consumer outlives it

    def consume() -> None:
        with _connection(tmp_path) as conn:
            queue = conn.SimpleQueue("jobs")
            while not stop.is_set():
                try:
                    message = queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                with lock:
                    received.append(message.payload["n"])
                    if len(received) == total:
                        done.set()
                message.ack()
            queue.close()

    consumers = [threading.Thread(target=consume, daemon=True) for _ in range(3)]
    for thread in consumers:
        thread.start()
    try:
        with _connection(tmp_path) as conn:
            queue = conn.SimpleQueue("jobs")
            for n in range(total):
                queue.put({"n": n})  # published while the consumers poll: the race kombu loses
            queue.close()
        assert done.wait(timeout=30), f"only {len(received)} of {total} messages arrived"
    finally:
        stop.set()
        for thread in consumers:
            thread.join(timeout=5)

    assert sorted(received) == list(range(total))
    assert not list((tmp_path / "queue").iterdir())
    assert not list((tmp_path / "processed").iterdir())
