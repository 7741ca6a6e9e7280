"""Where the kernels' own arrays start in memory: cache-line aligned, and staggered within a 4 KiB page.

The element loops load ``x``, ``g`` and every state array at index ``i`` and store ``x`` and the state at
``i``. When two of these arrays start at the same offset within a 4 KiB page (large NumPy arrays often do:
they come page-aligned from ``mmap`` plus the same header), a load from one matches the page offset of a
store just issued to another, the CPU suspects a dependency ("4K aliasing") and the loop runs up to 2.5x
slower: measured here on 1M float32 elements, Adam in place 3.0 ms with the state at the gradient's page
offset + 16 bytes, 1.2 ms staggered. So large state arrays are placed at chosen page offsets: apart from each
other and from the parameter they belong to.
"""
from __future__ import annotations

import numpy as np

__all__ = ["empty_staggered", "page_offsets", "MIN_BYTES", "PAGE"]

PAGE = 4096
#: smaller arrays stay in cache: no staggering (and no 4 KiB of padding)
MIN_BYTES = 1 << 16


def page_offsets(count: int, anchor: int = 0) -> list:
    """``count`` page offsets (multiples of 64) spread evenly around the page, away from ``anchor`` (the page
    offset of the parameter the arrays go with)."""
    step = (PAGE // (count + 1)) // 64 * 64
    return [(anchor + step * (k + 1)) % PAGE // 64 * 64 for k in range(count)]


def empty_staggered(n: int, dtype, offset: int) -> np.ndarray:
    """An uninitialised 1-D array of ``n`` items starting at page offset ``offset`` (a multiple of 64), or a
    plain ``np.empty`` when it is small."""
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(n, dtype)
    buf = np.empty(nbytes + PAGE, np.uint8)
    start = (offset - buf.ctypes.data) % PAGE
    return buf[start:start + nbytes].view(dtype)
