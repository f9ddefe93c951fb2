"""The multiprocess metric files: one per process, named so no two processes ever share one, and
the files of dead processes folded into one archive so a scrape reads the live processes' files
plus one, however many pool children and gunicorn workers came and went.

prometheus_client keeps each process's counters in `<type>_<id>.db` and a scrape adds up every
file. Its default id is the pid, which two containers sharing the directory (compose) can both
use, and which the kernel recycles. Ours is `host-pidns-pid-start`: unique across containers
and PID namespaces, and never reused, so a file whose process is gone can never be written
again and is safe to fold.

Folding is a commit in three moves under an exclusive lock on the directory: write the next
archive generation (old archive + dead files), atomically replace the manifest that names it
and the folded ids, then delete what it replaced. A scrape holds the shared lock and reads what
the manifest names, so it sees the before or the after, never a half, and no series goes
backwards. Only dead processes of this host and PID namespace are folded (others' pids cannot
be checked here); each folds its own when a pool child starts (a replaced one died) and when
it scrapes.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from prometheus_client import values
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

#: Types folded into the archive: their values add up across processes. (Gauge files, which
#: this project does not write, would be left alone.)
SUMMED_TYPES = ("counter", "histogram")
MANIFEST = "archive.json"
LOCK = ".lock"
ARCHIVE_ID = "archive"


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _host() -> str:
    return socket.gethostname().replace("_", "-").replace(".", "-") or "host"


def _pid_namespace() -> str:
    """The inode of this process's PID namespace: containers (or `unshare --pid`) under one
    hostname number their processes apart, and a pid is only meaningful within its namespace."""
    try:
        return os.readlink("/proc/self/ns/pid").split("[", 1)[1].rstrip("]")
    except (OSError, IndexError):
        return "0"


_identities: dict[int, str] = {}


def process_identifier() -> str:
    """`host-pidns-pid-start`, fixed for the life of the process (prometheus_client asks on
    every increment, to notice a fork). No underscores: the file's type precedes the first."""
    pid = os.getpid()
    found = _identities.get(pid)
    if found is None:
        found = f"{_host()}-{_pid_namespace()}-{pid}-{_start_ticks(pid) or '0'}"
        _identities[pid] = found
    return found


def install() -> None:
    """Name this process's files by `process_identifier` (before any metric is created)."""
    values.ValueClass = values.MultiProcessValue(process_identifier=process_identifier)
    MmapedDict.close = _close_inherited  # type: ignore[method-assign]


_close = MmapedDict.close


def _close_inherited(self: MmapedDict) -> None:
    """After a fork prometheus_client closes the parent's files before opening the child's.
    Celery starts beat's process (`worker -B`) closing every inherited descriptor first, so
    that close meets a descriptor that is gone (or is something else now): nothing is left to
    close, and the child's own files open as usual."""
    with suppress(OSError, ValueError):
        _close(self)


def directory() -> Path:
    return Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])


@contextmanager
def _locked(*, exclusive: bool) -> Iterator[None]:
    with open(directory() / LOCK, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _manifest() -> dict[str, Any]:
    try:
        return json.loads((directory() / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"generation": 0, "folded": []}


def _identifier(path: str) -> str:
    return os.path.basename(path)[: -len(".db")].split("_", 1)[1]


def _archive_id(generation: int) -> str:
    return f"{ARCHIVE_ID}-{generation}"


def _empty(path: str) -> bool:
    """A file created but not yet sized: its process was between prometheus_client's `open`
    and `truncate` (or was killed there). It holds no values, and reading it would fail."""
    try:
        return os.path.getsize(path) == 0
    except FileNotFoundError:
        return True


def readable_files() -> list[str]:
    """The files a scrape adds up: live or unfolded processes, and the current archive."""
    manifest = _manifest()
    current = _archive_id(manifest["generation"])
    folded = set(manifest["folded"])
    files = []
    for path in glob.glob(str(directory() / "*.db")):
        if _empty(path):
            continue
        ident = _identifier(path)
        if ident.startswith(ARCHIVE_ID):
            if ident == current:
                files.append(path)
        elif ident not in folded:
            files.append(path)
    return sorted(files)


def collect() -> list[Any]:
    """Every process's metrics, added up (what MultiProcessCollector does, over our files)."""
    with _locked(exclusive=False):
        return list(MultiProcessCollector.merge(readable_files(), accumulate=True))


def _dead_here(ident: str) -> bool:
    """True only for a process of this host and PID namespace that is provably gone (its pid
    is free, or now belongs to a process that started later)."""
    try:
        where, pid_text, start = ident.rsplit("-", 2)
        pid = int(pid_text)
    except ValueError:
        return False  # not ours (e.g. a plain pid from another tool): leave it
    here = process_identifier().rsplit("-", 2)[0]
    if where != here or pid == os.getpid():
        return False
    return _start_ticks(pid) != start


def fold_dead() -> int:
    """Fold this host's dead processes' files into the archive; returns how many processes."""
    with _locked(exclusive=True):
        manifest = _manifest()
        generation = manifest["generation"]
        previous = set(manifest["folded"])
        by_ident: dict[str, list[str]] = {}
        leftovers = []
        unswept: set[str] = set()
        for path in glob.glob(str(directory() / "*.db")):
            if os.path.basename(path).split("_", 1)[0] not in SUMMED_TYPES:
                continue
            ident = _identifier(path)
            if ident.startswith(ARCHIVE_ID):
                if ident != _archive_id(generation):
                    os.remove(path)  # an old generation, or an uncommitted new one
                continue
            if ident in previous:
                leftovers.append(path)  # folded by a fold that stopped before deleting it
                unswept.add(ident)
            elif _dead_here(ident):
                by_ident.setdefault(ident, []).append(path)
        dead = [path for paths in by_ident.values() for path in paths]
        if dead:
            _write_archive(generation + 1, generation, dead)  # nothing reads it yet
            # Folded ids stay listed until their files are surely gone: a reader skips them.
            _commit({"generation": generation + 1, "folded": sorted({*by_ident, *unswept})})
            leftovers += [str(p) for p in directory().glob(f"*_{_archive_id(generation)}.db")]
            leftovers += dead
        for path in leftovers:
            with suppress(FileNotFoundError):
                os.remove(path)
        return len(by_ident)


def _write_archive(generation: int, current: int, dead: list[str]) -> None:
    totals: dict[tuple[str, str], float] = {}
    sources = dead + [str(p) for p in directory().glob(f"*_{_archive_id(current)}.db")]
    for path in sources:
        typ = os.path.basename(path).split("_", 1)[0]
        if typ not in SUMMED_TYPES or _empty(path):
            continue
        for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):
            totals[typ, key] = totals.get((typ, key), 0.0) + value
    files: dict[str, MmapedDict] = {}
    try:
        for (typ, key), value in totals.items():
            if typ not in files:
                files[typ] = MmapedDict(str(directory() / f"{typ}_{_archive_id(generation)}.db"))
            files[typ].write_value(key, value, 0.0)
    finally:
        for archive in files.values():
            archive.close()


def _commit(manifest: dict[str, Any]) -> None:
    temporary = directory() / f"{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest))
    os.replace(temporary, directory() / MANIFEST)
