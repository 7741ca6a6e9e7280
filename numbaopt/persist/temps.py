"""The temporary files of crash-safe writes: named per target and per process, so that a later save or load
can tell the leftovers of a killed writer from the file a live writer is still writing.

``save(path, ...)`` writes ``.<name of path>.numbaopt-<host>-<pid>-<random>.tmp`` next to ``path`` and
renames it over ``path``; a writer killed before the rename leaves only that temporary file. Such a file is
removed by the next save or load of the same ``path`` once its process is gone: same host (a short hash
of the host name, so a shared network directory never loses another machine's file in progress), and
``os.kill(pid, 0)`` says no such process. A live process's file is never removed, so concurrent saves to
one target from several processes all succeed (the last rename wins). A pid reused by an unrelated process
keeps its leftover until that process ends. On Windows a process is not probed (``os.kill`` would end it):
leftovers there stay until removed by hand. A writer in another PID namespace with the same host name (a
container sharing the host's name) may look gone: its save then fails (the target keeps its old, complete
content); it is never corrupted.
"""
from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket

__all__ = ["temp_path", "remove_stale", "fsync_dir", "pid_alive"]

#: names longer than this (bytes) are hashed, so that the temporary name stays within NAME_MAX (255)
_MAX_TAG = 160


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _tag(base: str) -> str:
    if len(base.encode()) <= _MAX_TAG:
        return base
    return hashlib.sha256(base.encode()).hexdigest()[:32]


def _split(path):
    path = os.path.abspath(os.fspath(path))
    return os.path.dirname(path), os.path.basename(path)


def temp_path(path) -> str:
    """A fresh temporary name for writing ``path``: in its directory, naming this host and process."""
    d, base = _split(path)
    return os.path.join(d, f".{_tag(base)}.numbaopt-{_host()}-{os.getpid()}-{secrets.token_hex(6)}.tmp")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts: its parent has not reaped it yet). Where that cannot
    be asked without harm the answer is yes, so the file is kept."""
    if os.name == "nt":  # os.kill(pid, 0) there is TerminateProcess: it would end the process it asks about
        return True
    if pid <= 0:  # os.kill(0, ...) and negative pids address process groups, never one process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:  # a platform that cannot tell: keep the file
        return True
    return True


def remove_stale(path) -> list:
    """Remove the leftovers of killed writers of ``path`` (this host, processes that are gone); returns the
    names removed. Never raises: a directory that cannot be listed or a file that cannot be removed is
    left alone."""
    d, base = _split(path)
    pattern = re.compile(rf"\.{re.escape(_tag(base))}\.numbaopt-{_host()}-(\d{{1,10}})-[0-9a-f]+\.tmp")
    removed = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(d, name))
            removed.append(name)
        except OSError:  # removed meanwhile by another process, or not ours to remove
            pass
    return removed


def fsync_dir(d) -> None:
    """Make a rename in directory ``d`` durable; a no-op where directories cannot be opened or synced
    (Windows, some network file systems)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
