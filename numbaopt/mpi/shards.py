"""Where every trained array sits in the flat per-dtype buffers of a distributed step, and which contiguous
shard of them each rank owns.

The trained arrays (units, in the model's leaf order) are laid end to end in ONE global index space of
``n`` elements, cut into ``size`` contiguous shards (``balance="elements"``: sizes differ by at most one
element, arrays are cut where the cut falls; ``balance="leaves"``: cuts only between arrays, as even as
the arrays allow). The elements of one dtype also sit end to end in that dtype's flat buffer, and a
rank's part of each buffer is contiguous, so one ``Reduce_scatter``/``Allgatherv`` per dtype moves every
rank's shard. A rank's *pieces* are the (array, start, stop) spans inside its shard: its optimiser state
covers those elements only.
"""
from __future__ import annotations

import numpy as np

__all__ = ["FlatLayout", "Piece"]


class Piece:
    """Elements ``[a, b)`` of unit ``u`` (flattened, C order), at ``pos`` in its dtype's buffer."""

    __slots__ = ("u", "dtype", "a", "b", "pos")

    def __init__(self, u, dtype, a, b, pos):
        self.u, self.dtype, self.a, self.b, self.pos = u, dtype, a, b, pos

    def __repr__(self):
        return f"Piece(u={self.u}, {self.dtype}, [{self.a}:{self.b}] at {self.pos})"


def _cuts(sizes: np.ndarray, nranks: int, balance: str) -> np.ndarray:
    """``nranks + 1`` global bounds of the shards."""
    n = int(sizes.sum())
    if balance == "elements":
        q, r = divmod(n, nranks)
        counts = np.array([q + (k < r) for k in range(nranks)], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(counts)])
    edges = np.concatenate([[0], np.cumsum(sizes)])  # cuts between arrays only: the edge nearest each ideal cut
    cuts = [0]
    for k in range(1, nranks):
        ideal = n * k / nranks
        i = int(np.argmin(np.abs(edges - ideal)))
        # keep at least one array per shard before and after the cut
        i = min(max(i, int(np.searchsorted(edges, cuts[-1], side="right"))), len(edges) - 1 - (nranks - k))
        cuts.append(int(edges[i]))
    cuts.append(n)
    return np.array(cuts, dtype=np.int64)


class FlatLayout:
    """The flat layout of a model's trained arrays over ``nranks`` ranks (see the module docstring).

    ``units``/``sizes``/``dtypes``: the trained arrays, their element counts and (compute) dtypes;
    ``buffer_dtypes``: the dtypes, in order of first appearance; ``pos[u]``: unit ``u``'s offset in its
    dtype's buffer; ``total[d]``: that buffer's length; ``counts[d]``/``displs[d]``: every rank's part of
    buffer ``d`` (int arrays of ``nranks``); ``bounds``: the global shard bounds.
    """

    def __init__(self, units, sizes, dtypes, nranks: int, balance: str = "elements"):
        if balance not in ("elements", "leaves"):
            raise ValueError(f"balance: expected 'elements' or 'leaves', got {balance!r}")
        self.units = list(units)
        self.sizes = np.array(sizes, dtype=np.int64)
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.nranks, self.balance = nranks, balance
        self.n = int(self.sizes.sum())
        if self.n < nranks:
            raise ValueError(f"a sharded state needs at least one parameter element per rank: the model has "
                             f"{self.n} trained elements for {nranks} ranks (use shard=False)")
        if balance == "leaves" and len(self.units) < nranks:
            raise ValueError(f"balance='leaves' needs at least one trained array per rank: the model has "
                             f"{len(self.units)} for {nranks} ranks (use balance='elements')")
        self.buffer_dtypes = list(dict.fromkeys(self.dtypes))
        self.pos, self.total, self.start = {}, {d: 0 for d in self.buffer_dtypes}, {}
        self.size_of = {u: int(n) for u, n in zip(self.units, self.sizes)}
        g = 0
        for u, n, d in zip(self.units, self.sizes, self.dtypes):
            self.pos[u], self.start[u] = self.total[d], g
            self.total[d] += int(n)
            g += int(n)
        self.bounds = _cuts(self.sizes, nranks, balance)
        self.counts = {d: np.zeros(nranks, dtype=np.int64) for d in self.buffer_dtypes}
        self._pieces = [self._pieces_of(r) for r in range(nranks)]
        for r, ps in enumerate(self._pieces):
            for p in ps:
                self.counts[p.dtype][r] += p.b - p.a
        self.displs = {d: np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64) for d, c in self.counts.items()}

    def _pieces_of(self, rank: int) -> list:
        lo, hi = int(self.bounds[rank]), int(self.bounds[rank + 1])
        out = []
        for u, n, d in zip(self.units, self.sizes, self.dtypes):
            s = self.start[u]
            a, b = max(lo, s) - s, min(hi, s + int(n)) - s
            if a < b:
                out.append(Piece(u, d, a, b, self.pos[u] + a))
        return out

    def pieces(self, rank: int) -> list:
        """The pieces of ``rank``'s shard, in leaf order."""
        return self._pieces[rank]

    def owned(self, rank: int) -> int:
        """How many elements ``rank`` owns."""
        return int(self.bounds[rank + 1] - self.bounds[rank])

    def describe(self) -> list:
        """Lines every rank must agree on (the signature of the layout)."""
        return [f"shard bounds {self.bounds.tolist()} ({self.balance})"]
