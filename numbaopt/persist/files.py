"""The file: an uncompressed ``.npz`` (a zip of ``.npy`` members) of named arrays plus a JSON header
(``__header__``, UTF-8 bytes).

Writing is crash safe: the file is written to a temporary file next to the target (see :mod:`.temps`),
flushed to disk, renamed over the target with ``os.replace`` and the directory synced, so a writer killed
at any moment leaves the old file or the new one, complete, and at worst a temporary file that the next
``save`` or ``load`` of that target removes.

Reading trusts nothing in the file. The zip's directory is checked before any member is read: only
``<name>.npy`` members, each once, stored or deflated, not encrypted, the sizes they declare within the
file (a deflated member may inflate to at most :data:`MAX_INFLATION` times the file's size, so a zip bomb
is refused before it is inflated). Each member's ``.npy`` header is parsed on its own and its dtype
(numeric types only), layout and size checked against the member's declared size before its array is
allocated; the zip's CRC-32 is checked on every member. The JSON header is at most
:data:`MAX_HEADER_BYTES` and nests at most :data:`MAX_JSON_DEPTH` levels, checked on the bytes before it
is parsed. Every refusal is a :class:`CheckpointError` naming the file.
"""
from __future__ import annotations

import io
import json
import os
import re
import stat
import zipfile

import numpy as np

from . import temps

__all__ = ["FORMAT", "VERSION", "CheckpointError", "MAX_HEADER_BYTES", "MAX_JSON_DEPTH", "MAX_INFLATION",
           "json_depth", "write", "read"]

FORMAT = "numbaopt-tree-state"
#: 2: step counters per leaf (t, tp, count, skipped), stages as chain members, master copies in groups
VERSION = 2

#: the largest JSON header: about 170 000 leaves at some 200 bytes each (a real model's is kilobytes), and
#: parsed into at most some hundreds of MB of Python objects
MAX_HEADER_BYTES = 32 * 2 ** 20
#: the deepest nesting of the JSON header. A tree level takes two JSON levels, so this is a model nested
#: about 250 containers deep (real models: tens). Python's JSON parser and the decoders here recurse once
#: per level and Python's default recursion limit is 1000: 512 leaves room for the caller's stack. ``save``
#: refuses a deeper model rather than write a file ``load`` refuses.
MAX_JSON_DEPTH = 512
#: how much larger than the file its deflated members may declare to be in all (``save`` writes stored
#: members, which are never larger than the file; a zip bomb inflates a thousandfold)
MAX_INFLATION = 16
#: the dtypes a member may have: state arrays, counters (int64), the header (uint8)
_MEMBER_DTYPES = {np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128, np.int64, np.uint8)}
_MEMBER_NAME = re.compile(r"([A-Za-z0-9_]{1,128})\.npy")
#: general purpose flags a member may carry: data descriptor (bit 3) and UTF-8 names (bit 11)
_FLAGS_OK = 0x0008 | 0x0800
_CHUNK = 2 ** 24
#: a JSON string (escapes included), replaced by ``""`` before the brackets are counted. Possessive, and an
#: unterminated string runs to the end: every match attempt from a quote succeeds, so the scan is linear
#: (``"(?:[^"\\]|\\.)*"`` retries from every escaped quote of an unterminated string: quadratic)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.S)
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


class CheckpointError(ValueError):
    """A file that ``load`` refuses: not a numbaopt state file, damaged (zip, header, arrays), crafted
    (sizes or counters outside their limits) or inconsistent with itself. Nothing is allocated or
    imported on the strength of an unchecked header."""


def json_depth(raw: bytes) -> int:
    """The deepest nesting of brackets in JSON text ``raw`` (brackets inside strings do not count), without
    parsing it: a bound on how deep a parser of ``raw`` recurses."""
    a = np.frombuffer(_JSON_STRING.sub(b'""', raw), np.uint8)
    step = np.isin(a, _OPEN).astype(np.int64) - np.isin(a, _CLOSE)
    return int(np.cumsum(step).max(initial=0))


def _header_bytes(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError(f"save: the state's description is {len(raw)} bytes, more than a checkpoint holds "
                         f"({MAX_HEADER_BYTES}); a model of that many leaves cannot be saved")
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"save: the state's description nests {depth} levels, deeper than a checkpoint holds "
                         f"({MAX_JSON_DEPTH}: a model nested about {MAX_JSON_DEPTH // 2 - 3} containers deep)")
    return raw


def write(path, header: dict, arrays: dict) -> None:
    """Write ``arrays`` and ``header`` to ``path`` atomically (see the module's description); the
    leftovers of killed writers of ``path`` are removed first."""
    path = os.fspath(path)
    arrays = dict(arrays)
    arrays["__header__"] = np.frombuffer(_header_bytes(header), dtype=np.uint8)
    temps.remove_stale(path)
    tmp = temps.temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
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
    temps.fsync_dir(os.path.dirname(os.path.abspath(path)))


# --------------------------------------------------------------------------------------------------
# reading


def _members(zf, file_len: int) -> dict:
    """``{array name: ZipInfo}``, every entry of the zip's directory checked before anything is read."""
    infos, inflated, stored = {}, 0, 0
    for info in zf.infolist():
        m = _MEMBER_NAME.fullmatch(info.filename)
        if m is None:
            raise CheckpointError(f"member {info.filename[:80]!r} is not an array of a numbaopt state file")
        name = m.group(1)
        if name in infos:
            raise CheckpointError(f"member {info.filename!r} appears twice")
        if info.flag_bits & ~_FLAGS_OK:
            raise CheckpointError(f"member {info.filename!r} is encrypted or uses zip features numbaopt does not "
                                  f"write (flags {info.flag_bits:#06x})")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise CheckpointError(f"member {info.filename!r} is stored ({info.compress_size} bytes) but declares "
                                      f"{info.file_size} bytes")
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            inflated += info.file_size
        else:
            raise CheckpointError(f"member {info.filename!r} uses compression method {info.compress_type}; "
                                  "numbaopt reads stored or deflated members")
        stored += info.compress_size
        if info.header_offset + info.compress_size > file_len:
            raise CheckpointError(f"member {info.filename!r} declares {info.compress_size} bytes at offset "
                                  f"{info.header_offset}, beyond the file's {file_len}")
        infos[name] = info
    if stored > file_len:
        raise CheckpointError(f"its members declare {stored} bytes, more than the file's {file_len}")
    if inflated > MAX_INFLATION * file_len:
        raise CheckpointError(f"its compressed members declare {inflated} bytes, more than {MAX_INFLATION} times "
                              f"the file's {file_len} (a zip bomb?)")
    return infos


def _npy_header(f, name: str):
    """``(shape, dtype, header length)`` of the ``.npy`` member open as ``f``."""
    magic = f.read(8)
    if len(magic) != 8 or magic[:6] != b"\x93NUMPY" or magic[6:8] not in (b"\x01\x00", b"\x02\x00"):
        raise CheckpointError(f"array {name} is not a .npy array of format version 1 or 2")
    width = 2 if magic[6] == 1 else 4
    size_bytes = f.read(width)
    n = int.from_bytes(size_bytes, "little")
    if len(size_bytes) != width or n > 65535:  # numpy writes a few hundred bytes
        raise CheckpointError(f"array {name} has a damaged .npy header")
    raw = f.read(n)
    if len(raw) != n:
        raise CheckpointError(f"array {name} has a truncated .npy header")
    reader = np.lib.format.read_array_header_1_0 if width == 2 else np.lib.format.read_array_header_2_0
    try:
        shape, fortran, dtype = reader(io.BytesIO(size_bytes + raw), max_header_size=65536)
    except (ValueError, SyntaxError, TypeError, RecursionError) as e:
        raise CheckpointError(f"array {name} has a damaged .npy header ({e})") from None
    if dtype not in _MEMBER_DTYPES:  # native byte order only: these are the arrays the kernels run on
        raise CheckpointError(f"array {name} has dtype {dtype}, not one a numbaopt state holds")
    if fortran and len(shape) > 1:
        raise CheckpointError(f"array {name} is in Fortran order; numbaopt writes C order")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape) or len(shape) > 2:
        raise CheckpointError(f"array {name} has shape {shape}, not one a numbaopt state holds")
    return shape, dtype, 8 + width + n


def _read_array(zf, info, name: str) -> np.ndarray:
    with zf.open(info) as f:
        shape, dtype, offset = _npy_header(f, name)
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        if offset + nbytes != info.file_size:  # checked before the array is allocated
            raise CheckpointError(f"array {name}: its .npy header says {dtype}{list(shape)} ({nbytes} bytes), "
                                  f"the member holds {info.file_size - offset} bytes")
        out = np.empty(shape, dtype=dtype)
        buf = memoryview(out.reshape(-1).view(np.uint8))
        pos = 0
        while pos < nbytes:
            got = f.readinto(buf[pos:pos + _CHUNK])
            if not got:
                raise CheckpointError(f"array {name} is truncated")
            pos += got
        f.read(1)  # reaches the member's end, where zipfile checks its CRC-32
    return out


def _parse_header(raw: bytes):
    if len(raw) > MAX_HEADER_BYTES:
        raise CheckpointError(f"its header is {len(raw)} bytes (at most {MAX_HEADER_BYTES})")
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise CheckpointError(f"its header nests {depth} levels deep (at most {MAX_JSON_DEPTH})")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"its header is not JSON ({type(e).__name__}: {e})") from None


def read(path):
    """``(header, arrays)`` of a state file: the header's format and version checked, the arrays as the
    file holds them (their shapes and dtypes are for the caller to check against the header). A file that
    cannot be opened raises what ``open`` raises (``FileNotFoundError``, ...); anything else wrong is a
    :class:`CheckpointError`."""
    path = os.fspath(path)
    temps.remove_stale(path)
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):  # a device or pipe: zipfile would read /dev/zero to its end
            raise CheckpointError(f"load: {path} is not a regular file")
        file_len = st.st_size
        try:
            with zipfile.ZipFile(fh) as zf:
                infos = _members(zf, file_len)
                if "__header__" not in infos:
                    raise CheckpointError("it has no header: not a numbaopt state file")
                raw = _read_array(zf, infos.pop("__header__"), "__header__")
                if raw.dtype != np.uint8 or raw.ndim != 1:
                    raise CheckpointError(f"its header is {raw.dtype}{list(raw.shape)}, expected uint8 bytes")
                header = _parse_header(raw.tobytes())
                if not isinstance(header, dict) or header.get("format") != FORMAT:
                    raise CheckpointError("it is not a numbaopt tree state file")
                if header.get("version") != VERSION:
                    raise CheckpointError(f"it has format version {header.get('version')!r:.40}, this numbaopt reads "
                                          f"{VERSION}")
                data = {name: _read_array(zf, info, name) for name, info in infos.items()}
        except CheckpointError as e:
            raise CheckpointError(f"load: {path}: {e}") from None
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, KeyError, IndexError,
                TypeError, OverflowError, RuntimeError) as e:  # RuntimeError: zipfile's NotImplementedError
            raise CheckpointError(f"load: {path} is not a readable numbaopt state file ({type(e).__name__}: {e})") \
                from None
    return header, data
