"""Groups: the leaves of a tree that share (rule, compute dtype), with their state in flat arenas.

A :class:`Group` is stepped by ONE call of its generated many-leaf kernel (:mod:`numbaopt.compiler.cpu`):
leaf ``j`` has its state at ``offsets[j]`` in every arena and its counters in column ``j`` of ``C``.
A leaf of another dtype under ``MixedPrecision`` computes on its master copy (``masters[j]``).
:class:`TreeLeaf` is the per-leaf view that ``state.encoder.w`` shows.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..backends.state import Leaf, enter, leave
from ..compiler import ChainLayout, kernels

__all__ = ["Group", "TreeLeaf"]


class Group:
    """Leaves sharing (rule, compute dtype): flat state arenas, offsets/sizes, counters, hyperparameters.

    ``members``: the tree's unit ids in leaf order; ``param_dtypes``: each leaf's parameter dtype;
    ``masters``: per leaf the master copy (flat) or None; ``F``/``P``: scratch tables of the reductions
    (per-leaf finals and partial sums, float64); ``act``: all ones (every leaf stepped); ``act_all``: every
    leaf's index.
    """

    __slots__ = ("rule", "dtype", "layout", "arenas", "offsets", "sizes", "C", "hp", "members", "param_dtypes",
                 "masters", "F", "P", "act", "act_all", "kern", "nbytes", "units", "shapes")

    def __init__(self, rule, dtype, members, shapes, param_dtypes, masters=None, arenas=None):
        self.rule, self.dtype, self.members = rule, np.dtype(dtype), list(members)
        self.layout = layout = ChainLayout(rule)
        n = len(self.members)
        self.shapes = [tuple(int(k) for k in s) for s in shapes]
        self.sizes = np.array([int(np.prod(s, dtype=np.int64)) for s in shapes], dtype=np.int64)
        self.offsets = np.zeros(n, dtype=np.int64)
        if n > 1:
            np.cumsum(self.sizes[:-1], out=self.offsets[1:])
        # ``arenas``: state arrays that exist already (load: the file's, checked there), else new ones
        # (axis reductions: then the unit-state arenas and the geometry table, one row per leaf)
        self.arenas = (layout.new_state(int(self.sizes.sum()), self.dtype) + layout.new_units(self.shapes, self.dtype)
                       if arenas is None else tuple(arenas))
        self.C = np.zeros((4, n), dtype=np.int64)
        self.hp = layout.hyper_vector(1, 1, self.dtype)
        self.param_dtypes = [np.dtype(d) for d in param_dtypes]
        self.masters = list(masters) if masters is not None else [None] * n
        self.kern = None
        self._scratch()
        # the kernels' view of each leaf in bytes, and its unit (what the aliasing check compares)
        self.nbytes = self.sizes * self.dtype.itemsize
        self.units = np.array(self.members, dtype=np.int64)

    def _scratch(self):
        n = len(self.members)
        self.F = np.zeros((n, self.layout.n_fin), dtype=np.float64)
        self.P = np.zeros((n, self.layout.n_acc), dtype=np.float64)
        self.act = np.ones(n, dtype=np.int64)
        self.act_all = np.arange(n, dtype=np.int64)

    ts = property(lambda self: self.C[0], doc="steps taken, per leaf (a view of the counters)")
    t = property(lambda self: int(self.C[0].max()) if len(self.members) else 0,
                 doc="steps taken (the largest per-leaf count)")
    skipped = property(lambda self: self.C[3], doc="steps skipped, per leaf (a view of the counters)")

    @property
    def mod(self):
        """The generated CPU module of this group's chain and compute dtype."""
        k = self.kern
        if k is None:
            k = self.kern = kernels(self.rule, self.dtype)
        return k

    def hp_at(self, t: int, tp: int) -> np.ndarray:
        """Hyperparameters for step ``t`` (``tp`` before an AccumGrad): ``hp`` itself when nothing is
        scheduled, else a new vector (schedules evaluated and checked; ``hp`` untouched)."""
        if not self.layout.scheduled:
            return self.hp
        return self.layout.hyper_vector(t, tp, self.dtype)

    def derive(self, arenas, C, masters) -> Group:
        """A group of the same leaves and rule with the given state (a pure step's result)."""
        new = object.__new__(Group)
        for s in Group.__slots__:
            setattr(new, s, getattr(self, s))
        new.arenas, new.C, new.masters = tuple(arenas), C, list(masters)
        new.hp = self.hp.copy()
        new.members = list(self.members)
        new._scratch()
        return new

    def copy(self) -> Group:
        """An independent copy (arenas, counters, hyperparameters, masters)."""
        return self.derive([a.copy() for a in self.arenas], self.C.copy(),
                           [None if m is None else m.copy() for m in self.masters])

    def subset(self, js, rule, hp) -> Group:
        """A new group of this group's leaves ``js`` (their state copied: element and unit states, counters,
        master copies) under ``rule`` (the same options: the same kernels) with hyperparameters ``hp``."""
        lay = self.layout
        g = Group(rule, self.dtype, [self.members[j] for j in js], [self.shapes[j] for j in js],
                  [self.param_dtypes[j] for j in js], [None if self.masters[j] is None else self.masters[j].copy()
                                                       for j in js])
        for k, j in enumerate(js):
            o, n, o2 = int(self.offsets[j]), int(self.sizes[j]), int(g.offsets[k])
            for new, old in zip(g.arenas[:lay.n_state], self.arenas[:lay.n_state]):
                new[o2:o2 + n] = old[o:o + n]
            if lay.units:
                for u, (new, old) in enumerate(zip(lay.unit_arrays(g.arenas), lay.unit_arrays(self.arenas))):
                    a, b = lay.unit_span(self.arenas[-1], j, u)
                    a2, b2 = lay.unit_span(g.arenas[-1], k, u)
                    new[a2:b2] = old[a:b]
            g.C[:, k] = self.C[:, j]
        g.hp[:] = hp
        return g

    def set_rule_(self, rule, hp) -> None:
        """Switch to ``rule`` (same options) with the checked hyperparameters ``hp`` (in place: fast plans
        and leaf views hold this array)."""
        self.rule, self.layout = rule, ChainLayout(rule)
        self.hp[:] = hp

    # Pickling: the data alone. The compiled module, the layout (made from the rule) and the scratch tables are
    # rebuilt; the arenas are placed afresh, as setup places them. A group is pickled inside its tree, whose
    # core copies it under the tree's in-use guard first (see TreeCore.__reduce__).
    def __getstate__(self) -> dict:
        return {"rule": self.rule, "dtype": self.dtype.str, "members": self.members, "sizes": self.sizes,
                "shapes": self.shapes,
                "param_dtypes": [d.str for d in self.param_dtypes], "masters": self.masters, "arenas": self.arenas,
                "C": self.C, "hp": self.hp}

    def __setstate__(self, d: dict) -> None:
        # dtypes by name: NumPy's own descriptor objects, which the fast path compares by identity
        shapes = d.get("shapes") or [(int(n),) for n in d["sizes"]]
        Group.__init__(self, d["rule"], np.dtype(d["dtype"]), d["members"], shapes,
                       [np.dtype(t) for t in d["param_dtypes"]],
                       [None if m is None else np.array(m) for m in d["masters"]])
        for a, v in zip(self.arenas, d["arenas"], strict=True):
            a[...] = v
        self.C[...] = d["C"]
        self.hp[...] = d["hp"]

    def leaf_view(self, j, shape, unit, tree_core) -> TreeLeaf:
        """The view of leaf ``j`` (unit ``unit`` of the tree whose core is ``tree_core``)."""
        return TreeLeaf(self, j, shape, unit, tree_core)


class TreeLeaf(Leaf):
    """A :class:`numbaopt.Leaf` view of one leaf of a tree's group: its state arrays are views into the
    group's arenas, and ``t``/``rule``/``hp``/counters are read live from the group (``copy()`` detaches)."""

    __slots__ = ("group", "j", "unit", "core_ref")

    def __init__(self, group, j, shape, unit=None, tree_core=None):
        o, n = int(group.offsets[j]), int(group.sizes[j])
        self.group, self.j, self.unit = group, j, unit
        # weakly: the tree's core caches its leaf views, and a cycle would outlive the last reference
        self.core_ref = None if tree_core is None else weakref.ref(tree_core)
        self.shape = tuple(shape)
        lay = group.layout
        arrays = [a[o:o + n] for a in group.arenas[:lay.n_state]]
        if lay.units:  # the unit states at their offsets (the geometry row says where), the geometry row
            G = group.arenas[-1]
            base = len(G[j]) - 2 * lay.n_unit
            arrays += [a[G[j, base + 2 * u]:G[j, base + 2 * u] + G[j, base + 2 * u + 1]]
                       for u, a in enumerate(lay.unit_arrays(group.arenas))]
            arrays.append(G[j:j + 1])
        self.arrays = tuple(arrays)
        self.fast = None

    rule = property(lambda self: self.group.rule, lambda self, v: None)
    layout = property(lambda self: self.group.layout, lambda self, v: None)
    hp = property(lambda self: self.group.hp, lambda self, v: None)
    dtype = property(lambda self: self.group.dtype, lambda self, v: None)
    param_dtype = property(lambda self: self.group.param_dtypes[self.j], lambda self, v: None)
    master = property(lambda self: self.group.masters[self.j], lambda self, v: None)
    counters = property(lambda self: self.group.C[:, self.j], lambda self, v: None)
    kern = property(lambda self: self.group.mod, lambda self, v: None)

    def copy(self) -> Leaf:
        """A detached :class:`numbaopt.Leaf` with a copy of this leaf's state."""
        m = self.master
        arrays = [a.copy() for a in self.arrays]
        if self.layout.units:  # a geometry row of its own (unit offsets 0)
            arrays[-1] = self.layout.new_units([self.shape], self.dtype)[-1]
        return Leaf(self.rule, self.shape, self.param_dtype, arrays=arrays,
                    hp=self.hp.copy(), counters=self.counters.copy(), master=None if m is None else m.copy())

    def detach(self) -> Leaf:
        """:meth:`copy`, taken while no call writes the tree (its in-use guard: a step in progress in another
        thread is a :class:`numbaopt.StateInUseError`)."""
        c = None if self.core_ref is None else self.core_ref()
        if c is None:  # the tree is gone: nothing else can step this view
            return self.copy()
        enter(c, "copy", False)
        try:
            return self.copy()
        finally:
            leave(c, False)

    # a leaf view pickles and copies as a detached Leaf: the rest of its tree does not come with it
    def __reduce__(self):
        return _unpickle_leaf, (self.detach().__getstate__(),)

    def __copy__(self) -> Leaf:
        return self.detach()


def _unpickle_leaf(d) -> Leaf:
    """A pickled tree leaf: a detached :class:`numbaopt.Leaf`."""
    leaf = Leaf.__new__(Leaf)
    leaf.__setstate__(d)
    return leaf
