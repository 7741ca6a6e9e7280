"""Reductions across ranks: a sharded step's norms, trust ratios and non-finite checks equal the
single-process ones on the same averaged gradient.

The tree pipeline calls :class:`CrossRankReducer` in place of its own phased reductions
(:class:`numbaopt.tree.step.Order`, ``reducer``). For each reduction rule of the chain, in chain order:

1. every rank computes the partial accumulators of its pieces with the generated ``partial_r`` (the same
   compiled code as a single process: float64, fixed lane order);
2. each rank writes them into a table with one row per *global* array, in the single-process group order
   (identity elsewhere: 0 for a sum, -inf for a max), and ONE ``Allgather`` gives every rank every table;
3. every rank combines the tables in rank order: an array owned by one rank gets its partial plus zeros, so
   exactly the single-process partial; an array cut between ranks gets the sum of its pieces' partials;
4. tree scope: the combined rows are combined in single-process order with the generated ``combine_r``
   and finished once (``finish_row_r``); leaf scope: each piece gets its whole array's partials and the
   generated ``finish_leaves_r``.

So a reduction is bitwise the single-process one when no array is cut between ranks
(``balance="leaves"``), and within rounding (1e-12 relative in float64) when one is. Every rank holds every
combined row, so every rank decides a refusal (a non-finite norm) identically, naming the same array, and
refuses before anything is written: no rank steps while another refuses.
"""
from __future__ import annotations

import math

import numpy as np

from ..backends.state import status_error
from ..compiler import kernels
from ..compiler.layout import ERROR_BASE, reduce_ops

__all__ = ["CrossRankReducer"]


class CrossRankReducer:
    """Combines one sharded state's reductions across the ranks of ``comm``.

    ``rows``: the table row of each global unit (single-process group order); ``unit_of``: the global unit
    of each local (piece) unit; ``dtype0``: the compute dtype of the single-process first group (the
    precision of the hyperparameters a tree-scope ``finish`` sees there); ``where``: global unit -> path.
    """

    def __init__(self, comm, rows: dict, unit_of: list, dtype0, where):
        self.comm, self.size = comm, comm.Get_size()
        self.rows, self.unit_of, self.dtype0, self.where = rows, list(unit_of), np.dtype(dtype0), where
        self.n = len(rows)
        self.calls = 0  # reduction phases done in the current step (a rank without active pieces catches up)
        self._rows_of = {}  # id(group) -> table rows of its members

    # -- the pieces ----------------------------------------------------------------------------------
    def _group_rows(self, grp) -> np.ndarray:
        got = self._rows_of.get(id(grp))
        if got is None or got[0] is not grp:
            got = self._rows_of[id(grp)] = (grp, np.array([self.rows[self.unit_of[k]] for k in grp.members],
                                                          dtype=np.int64))
        return got[1]

    def hp0(self, grp) -> np.ndarray:
        """The hyperparameters the single-process first group would use at this step (``grp``: any local
        group of the rule; every leaf of a distributed state is at the same step count)."""
        lay = grp.layout
        if grp.dtype == self.dtype0 and not lay.scheduled:
            return grp.hp
        t, tp = (int(grp.C[0, 0]) + 1, int(grp.C[1, 0]) + 1) if lay.scheduled else (1, 1)
        return lay.hyper_vector(t, tp, self.dtype0)

    def _combined(self, T: np.ndarray, ops) -> np.ndarray:
        """Every rank's table, combined in rank order (one Allgather)."""
        G = np.empty((self.size,) + T.shape, dtype=np.float64)
        self.comm.Allgather(T, G)
        acc = G[0].copy()
        for q in range(1, self.size):
            for c, op in enumerate(ops):
                if op == "sum":
                    acc[:, c] += G[q][:, c]
                else:
                    np.maximum(acc[:, c], G[q][:, c], out=acc[:, c])
            acc[:, -1] += G[q][:, -1]  # the "contributed" flag
        return acc

    def _table(self, ops) -> np.ndarray:
        T = np.zeros((self.n, len(ops) + 1), dtype=np.float64)
        for c, op in enumerate(ops):
            if op != "sum":
                T[:, c] = -np.inf
        return T

    # -- one reduction rule, on every rank -------------------------------------------------------------
    def _global(self, lay, r, acc, hp0, mod0):
        """The combined rows as a partials table, the tree-scope finals row (or None), and a refusal (or None)."""
        rule = lay.rules[r]
        ops = reduce_ops(rule)
        c0, flag = lay.acc_cols[r], lay.acc_cols[r] + len(ops)
        Pg = np.zeros((self.n, lay.n_acc), dtype=np.float64)
        Pg[:, c0:flag + 1] = acc
        finals = type(rule).finals
        row, refusal = None, None
        contributed = acc[:, -1] != 0.0
        if type(rule).scope == "tree":
            tot = lay.totals(r)
            getattr(mod0, f"combine_{r}")(Pg, tot)
            row = np.empty(lay.row_len(r), dtype=np.float64)
            getattr(mod0, f"finish_row_{r}")(tot, hp0, row)
            if "error" in finals and row[finals.index("error")] != 0.0 and contributed.any():
                own = [i for i in np.nonzero(contributed)[0] if not all(math.isfinite(v) for v in acc[i, :-1])]
                refusal = own[0] if own else int(np.nonzero(contributed)[0][0])
        elif "error" in finals:
            Fg = np.zeros((self.n, lay.n_fin), dtype=np.float64)
            getattr(mod0, f"finish_leaves_{r}")(Pg, hp0, Fg)
            bad = np.nonzero(contributed & (Fg[:, lay.fin_cols[r] + finals.index("error")] != 0.0))[0]
            refusal = int(bad[0]) if len(bad) else None
        return row, refusal

    def _refuse(self, rule, r, row_index):
        u = next(u for u, i in self.rows.items() if i == row_index)
        return status_error(rule, ERROR_BASE + r, self.where(u))

    def __call__(self, s, dom) -> None:
        """The reductions of ``dom`` (this rank's runs of the rule), combined across the ranks."""
        first = dom[0]
        lay = first.grp.layout
        mod0 = kernels(first.grp.rule, self.dtype0)
        hp0 = self.hp0(first.grp)
        for r in lay.reducers:
            rule = lay.rules[r]
            ops = reduce_ops(rule)
            c0, flag = lay.acc_cols[r], lay.acc_cols[r] + len(ops)
            T = self._table(ops)
            for run in dom:
                getattr(run.grp.mod, f"partial_{r}")(*run.args(True))
                T[self._group_rows(run.grp)] = run.P[:, c0:flag + 1]
            acc = self._combined(T, ops)
            self.calls += 1
            row, refusal = self._global(lay, r, acc, hp0, mod0)
            if refusal is not None:
                raise self._refuse(rule, r, refusal)
            for run in dom:
                if row is not None:
                    getattr(run.grp.mod, f"put_finals_{r}")(row, run.P, run.F)
                else:
                    mine = run.P[:, flag] != 0.0
                    run.P[mine, c0:flag + 1] = acc[self._group_rows(run.grp)[mine]]
                    getattr(run.grp.mod, f"finish_leaves_{r}")(run.P, run.hp, run.F)
        for run in dom:
            run.checked = True

    def participate(self, grp) -> None:
        """A rank none of whose pieces is stepped takes part in the step's collectives (with identity tables),
        and refuses with the others. ``grp``: any local group (its rule, counters and hyperparameters)."""
        lay = grp.layout
        if not lay.reducers:
            return
        mod0 = kernels(grp.rule, self.dtype0)
        hp0 = self.hp0(grp)
        for r in lay.reducers:
            ops = reduce_ops(lay.rules[r])
            acc = self._combined(self._table(ops), ops)
            _, refusal = self._global(lay, r, acc, hp0, mod0)
            if refusal is not None:
                raise self._refuse(lay.rules[r], r, refusal)
