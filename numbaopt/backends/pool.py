"""A caching allocator for the arrays a pure step creates: the buffers of dropped states are used again.

A pure ``update`` must allocate its results (new parameters, new state). In a functional loop
(``state, x = update(state, x, g)``) the previous step's arrays are dropped right after, and the next step
asks for arrays of exactly the same sizes. Large fresh allocations come from the operating system as new
pages, and touching them costs page faults: on this project's VM ~1.5 µs per 4 KiB page, 3 ms for 8 MiB,
more than the Adam step on those bytes. So large result buffers (at least :data:`MIN_BYTES`) are taken from
this pool: a buffer is handed out again only when no array refers to it any more (its reference count
says that only the pool holds it), never while any view of it is alive. At most :data:`KEEP` buffers of one
size are kept, and :func:`set_pool_limit` bounds the bytes held (0 turns the pool off; the default is
:data:`DEFAULT_LIMIT`, or ``NUMBAOPT_POOL_BYTES``).
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

from ..compiler.placement import empty_staggered, page_offsets

__all__ = ["empty", "empty_like", "pool_bytes", "set_pool_limit", "clear_pool", "MIN_BYTES", "KEEP", "DEFAULT_LIMIT"]

#: below this many bytes malloc already reuses freed memory: plain allocations
MIN_BYTES = 1 << 16
#: buffers kept per size (a functional loop needs two: the live state and the one being made)
KEEP = 3
DEFAULT_LIMIT = int(os.environ.get("NUMBAOPT_POOL_BYTES", 1 << 31))

_lock = threading.Lock()
_blocks: dict = {}  # nbytes -> [uint8 buffers]
_limit = [DEFAULT_LIMIT]
_held = [0]
_offsets = page_offsets(7)
_next = [0]  # new buffers go round these page offsets: results used together do not alias (placement)


def pool_bytes() -> int:
    """Bytes held by the pool (in use by arrays or free)."""
    return _held[0]


def set_pool_limit(nbytes: int) -> int:
    """Bound the bytes the pool holds (0: no pool, every result a fresh allocation); returns the old bound.
    Lowering it lets go of the free buffers above the bound."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"pool limit must be >= 0, got {nbytes}")
    with _lock:
        old, _limit[0] = _limit[0], nbytes
        if _held[0] > nbytes:
            _release_free()
    return old


def clear_pool() -> None:
    """Let go of every free buffer (buffers still in use stay with their arrays)."""
    with _lock:
        _release_free()


def _release_free():
    for n, lst in list(_blocks.items()):
        keep = [entry for entry in lst if _in_use(entry)]
        _held[0] -= n * (len(lst) - len(keep))
        if keep:
            _blocks[n] = keep
        else:
            del _blocks[n]


def _in_use(entry) -> bool:
    """Whether an array still refers to the buffer of ``entry`` (``[owner, start]``). Every array made from the
    buffer has ``owner`` as its base; free, only ``entry``, this function's local and the argument of
    ``getrefcount`` refer to it."""
    owner = entry[0]
    return sys.getrefcount(owner) > 3


def _take(entry, nbytes, dtype, shape):
    owner, start = entry
    return owner[start:start + nbytes].view(dtype).reshape(shape)


def empty(shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)``, from a free pooled buffer when it is large and one is free."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    count = 1
    for s in shape:
        count *= int(s)
    nbytes = count * dtype.itemsize
    if nbytes < MIN_BYTES or _limit[0] == 0:
        return np.empty(shape, dtype)
    with _lock:
        lst = _blocks.get(nbytes)
        if lst is not None:
            for entry in lst:
                if not _in_use(entry):
                    return _take(entry, nbytes, dtype, shape)
        if (lst is None or len(lst) < KEEP) and _held[0] + nbytes <= _limit[0]:
            view = empty_staggered(nbytes, np.uint8, _offsets[_next[0] % len(_offsets)])
            _next[0] += 1
            owner = view.base if view.base is not None else view
            entry = [owner, view.ctypes.data - owner.ctypes.data]
            del view
            _blocks.setdefault(nbytes, []).append(entry)
            _held[0] += nbytes
            return _take(entry, nbytes, dtype, shape)
    return np.empty(shape, dtype)


def empty_like(a: np.ndarray) -> np.ndarray:
    """:func:`empty` with ``a``'s shape and dtype."""
    return empty(a.shape, a.dtype)
