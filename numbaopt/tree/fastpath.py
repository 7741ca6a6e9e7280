r"""The fast path of ``update_`` on a tree: the model stepped last time, stepped again with little Python.

After a general step found every trained, unfrozen leaf to be a writeable contiguous ndarray (or ndarray
subclass, :func:`numbaopt.tree.params.is_array_subclass`) of its compute dtype (no ties, no master copies,
no device leaves), :meth:`FastPlan.build` generates a function listing the parameter and gradient leaves
of exactly this model, and :func:`numbaopt.backends.abi.gather_lists` checks them (identity of the
parameters, type, shape, dtype, contiguity, writeability of both) and reads their data pointers in
compiled code. The plan then runs the same :class:`numbaopt.tree.step.Run`\ s through the same
transaction as the general path (:func:`numbaopt.tree.step.execute`). Anything unexpected sends the step
to the general path, which names the bad leaf.
"""
from __future__ import annotations

import numpy as np

from ..backends import abi
from ..backends.alias import fast_table
from .params import ARRAY_SUBCLASSES
from .step import Order, Run, execute

__all__ = ["FastPlan", "gen_gather", "Miss"]


class Miss(Exception):
    """The model or the gradients are not what the plan was made for."""


def gen_gather(s, order):
    """Source of ``gather(m, g) -> (model leaves, grad leaves)`` for the trained positions ``order``.

    Gradient containers are checked (exact type, and length for dict/list/tuple) so that the fast
    path accepts exactly what the general path accepts; model containers are not: the model's leaves
    are compared by identity with the plan's in compiled code, which is what in-place writing needs.
    Containers used by several leaves get a local variable; the others are inlined.
    """
    consts = {"_Miss": Miss}
    lines = ["def gather(m, g):"]
    root = s.root
    if root.spec is not None and root.type is list and len(root.children) == len(order) and \
            order == list(range(len(order))) and all(c.spec is None for c in root.children):
        # a flat list of trained leaves: the lists themselves (their lengths are checked in compiled code)
        lines += ["    if type(g) is not list:", "        raise _Miss", "    return m, g"]
        return "\n".join(lines), consts
    want = set(order)
    exprs = {}
    counter = [0]

    def access(node, i, e, var, k):
        if node.spec.name not in ("dict", "list", "tuple", "namedtuple", "dataclass", "frozen dataclass"):
            return f"{var}_c{k}[{i}][1]"
        if e.kind == "attr":
            return f"{var}.{e.key}"
        if e.kind == "index":
            return f"{var}[{e.key}]"
        if type(e.key) in (str, int, float, bool) or e.key is None:
            return f"{var}[{e.key!r}]"
        kn = f"K{k}_{i}"
        consts[kn] = e.key
        return f"{var}[{kn}]"

    def emit(node, mv, gv):
        if node.spec is None:
            exprs[node.pos] = (mv, gv)
            return
        k = counter[0]
        counter[0] += 1
        consts[f"T{k}"] = node.type
        lines.append(f"    if type({gv}) is not T{k}:")
        lines.append("        raise _Miss")
        name = node.spec.name
        if name in ("dict", "list", "tuple"):
            lines.append(f"    if len({gv}) != {len(node.children)}:")
            lines.append("        raise _Miss")
        if name not in ("dict", "list", "tuple", "namedtuple", "dataclass", "frozen dataclass"):
            consts[f"C{k}"] = node.spec.children
            lines.append(f"    m{k}_c{k} = C{k}({mv})")
            lines.append(f"    g{k}_c{k} = C{k}({gv})")
            mv, gv = f"m{k}", f"g{k}"
        for i, (e, c) in enumerate(zip(node.entries, node.children)):
            if not any(p in want for p in range(c.lo, c.hi)):
                continue
            am, ag = access(node, i, e, mv, k), access(node, i, e, gv, k)
            if c.spec is not None:
                v = counter[0]
                lines.append(f"    g{v}_ = {ag}")
                ag = f"g{v}_"
                if sum(1 for p in range(c.lo, c.hi) if p in want) > 1:
                    lines.append(f"    m{v}_ = {am}")
                    am = f"m{v}_"
            emit(c, am, ag)

    emit(root, "m", "g")
    lines.append(f"    return [{', '.join(exprs[p][0] for p in order)}], [{', '.join(exprs[p][1] for p in order)}]")
    return "\n".join(lines), consts


class FastPlan:
    """``update_`` on a model whose trained, unfrozen leaves are all writeable arrays stepped directly.
    Frozen leaves are left out of the gather and stay out of the runs (``act`` 0)."""

    __slots__ = ("gather", "params", "tab", "dims", "out", "W", "order", "timed")

    @staticmethod
    def build(c, xu, iu, old=None):
        """The plan for the model whose unit values are ``xu`` (``iu`` their ParamInfo), or None."""
        s = c.structure
        frozen = c.frozen
        if s.n_unique == 0 or c.device_groups or len(s.trained_pos) != s.n_unique:
            return None
        order = [p for p in s.trained_pos if not frozen[s.pos_u[p]]]  # position order; no ties
        if not order:
            return None
        us = [s.pos_u[p] for p in order]
        for u in us:
            grp = c.groups[s.u_group[u]]
            # an ndarray subclass (a pennylane tensor) too: gather_lists compares the parameters by identity
            # and reads their ndarray header, which a subclass instance begins with (the gradients stay exact)
            tx = type(xu[u])
            if not (tx is np.ndarray or tx in ARRAY_SUBCLASSES) or not iu[u].writeable \
                    or grp.masters[s.u_j[u]] is not None or xu[u].dtype != grp.dtype:
                return None
        if old is not None and len(old.params) == len(us) and all(a is xu[u] for a, u in zip(old.params, us)):
            return old  # the same arrays: the plan stands
        key = tuple(order)
        gather = s.gather.get(key)
        if gather is None:
            src, consts = gen_gather(s, order)
            ns = dict(consts)
            exec(compile(src, "<numbaopt tree gather>", "exec"), ns)
            gather = s.gather[key] = ns["gather"]
        fp = FastPlan()
        fp.gather = gather
        n = len(order)
        fp.params = [xu[u] for u in us]  # strong references: an id in the plan is never reused
        ndims = [len(s.u_shape[u]) for u in us]
        dimstart = np.zeros(n, dtype=np.int64)
        if n > 1:
            np.cumsum(ndims[:-1], out=dimstart[1:])
        fp.dims = np.array([d for u in us for d in s.u_shape[u]] or [0], dtype=np.int64)
        # destination slots: one block per group holding every one of its leaves (frozen ones stay 0)
        gis = sorted({s.u_group[u] for u in us})
        start, total = {}, 0
        for gi in gis:
            start[gi] = total
            total += len(c.groups[gi].members)
        fp.tab = np.empty((n, 8), dtype=np.int64)
        fp.tab[:, 0] = [id(x) for x in fp.params]
        fp.tab[:, 1] = 1
        fp.tab[:, 2] = ndims
        fp.tab[:, 3] = dimstart
        fp.tab[:, 4] = [id(np.dtype(s.u_dtype[u])) for u in us]
        fp.tab[:, 5] = [start[s.u_group[u]] + s.u_j[u] for u in us]
        fp.tab[:, 6] = [x.ctypes.data for x in fp.params]  # once per plan: not worth compiling data_pointers
        fp.tab[:, 7] = [x.nbytes for x in fp.params]
        # what this step writes: the parameters (owner: their row) and every group's state arenas
        alo, ahi = c.arena_spans()
        fp.W = fast_table(np.concatenate([fp.tab[:, 6], alo]), np.concatenate([fp.tab[:, 6] + fp.tab[:, 7], ahi]),
                          np.concatenate([np.arange(n), np.full(len(alo), -1)]), fp.tab[:, 0],
                          all(x.flags.owndata for x in fp.params), alo, ahi)
        fp.out = np.zeros((2, max(total, 1)), dtype=np.int64)
        runs, timed = [], []
        stepped = set(us)
        for gi in gis:
            grp = c.groups[gi]
            a, k = start[gi], len(grp.members)
            act = np.array([1 if u in stepped else 0 for u in grp.members], dtype=np.int64)
            run = Run(grp, act, fp.out[0, a:a + k], fp.out[1, a:a + k], grp.hp)
            runs.append(run)
            if grp.layout.scheduled:
                timed.append((run, np.nonzero(act)[0]))
        fp.order = Order(runs, reducer=c.reducer)
        fp.timed = timed
        return fp

    def run(self, c, model, grads) -> bool:
        """True when the step was done here; False sends the caller to the general path (nothing written)."""
        try:
            pl, gl = self.gather(model, grads)
        except Exception:
            return False
        if abi.gather_lists(id(pl), id(gl), self.tab, self.dims, abi.ARRAY_TYPE, self.out, self.W) != -1:
            return False  # a leaf the plan was not made for, or a gradient overlapping what is written
        for run, js in self.timed:  # schedules: every stepped leaf of a group at one step count
            C = run.grp.C
            t, tp = C[0, js], C[1, js]
            if t.min() != t.max() or tp.min() != tp.max():
                return False
            try:
                run.set_hp(run.grp.hp_at(int(t[0]) + 1, int(tp[0]) + 1))
            except (TypeError, ValueError):
                return False  # the general path raises it, naming the leaf
        execute(c.structure, self.order)
        return True
