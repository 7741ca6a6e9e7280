"""The file: a ``.npz`` of named arrays plus a JSON header (``__header__``, UTF-8 bytes), written atomically."""
from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile

import numpy as np

__all__ = ["FORMAT", "VERSION", "CheckpointError", "write", "read"]

FORMAT = "numbaopt-tree-state"
#: 2: step counters per leaf (t, tp, count, skipped), stages as chain members, master copies in groups
VERSION = 2


class CheckpointError(ValueError):
    """A file that ``load`` refuses: not a numbaopt state file, damaged (zip, header, arrays), crafted
    (sizes or counters outside their limits) or inconsistent with itself. Nothing is allocated or
    imported on the strength of an unchecked header."""


def write(path, header: dict, arrays: dict) -> None:
    """Write ``arrays`` and ``header`` to ``path`` atomically: next to it, then ``os.replace`` over it, so a
    crash never leaves a half-written file in place of the old one."""
    path = os.fspath(path)
    arrays = dict(arrays)
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".numbaopt-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read(path):
    """``(header, arrays)`` of a state file; a ``ValueError`` for anything that is not one."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        header = json.loads(bytes(data.pop("__header__")).decode())
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"load: {path} is not a readable numbaopt state file ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"load: {path} is not a numbaopt tree state file")
    if header.get("version") != VERSION:
        raise ValueError(f"load: {path} has format version {header.get('version')}, this numbaopt reads {VERSION}")
    return header, data
