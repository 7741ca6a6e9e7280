"""The state of a tree: :class:`StateTree` (navigated like the model) and what it holds (:class:`TreeCore`).

A state tree mirrors the model: ``state.encoder.layers[0].w`` (attributes, keys, indices) gives that
leaf's :class:`numbaopt.Leaf`. Its contents live in one :class:`TreeCore` (the structure ``setup`` learnt,
the host groups, the device groups, the frozen flags), reached with :func:`core`: the tree pipeline, the
state operations and ``save``/``load`` all go through it, so the state object itself keeps no field that
could shadow a model's attribute.
"""
from __future__ import annotations

import copyreg

import numpy as np

from ..backends.cuda.member import DeviceMember
from ..backends.state import enter, leave
from .containers import BUILTIN_SPECS, ContainerSpec, registry, type_name
from .groups import TreeLeaf
from .paths import Path, where
from .structure import describe

__all__ = ["Structure", "TreeCore", "StateNode", "StateTree", "core", "part", "new_state"]


class Structure:
    """What ``setup`` learnt about a model, shared (never written) by every state derived from it.

    ``root`` (the :class:`numbaopt.tree.structure.Node` tree); per leaf position: ``paths``, ``pos_u`` (the
    unit trained there, or None), ``pos_param`` (whether it is a parameter at all); ``trained_pos``; per unit
    (a trained array; tied positions share one): ``u_positions``, ``u_shape``, ``u_dtype`` (the parameter's),
    ``u_kind``, ``u_tieable``, ``u_group``/``u_j`` (host group and index in it) or ``u_device``/``u_j`` (device
    group), ``u_compute`` (the dtype its kernels compute in); ``gather``: the fast path's generated functions.
    """

    __slots__ = ("root", "paths", "pos_u", "pos_param", "trained_pos", "n_unique", "u_group", "u_device", "u_j",
                 "u_shape", "u_dtype", "u_kind", "u_positions", "u_tieable", "u_compute", "gather")

    def __init__(self):
        self.gather = {}

    def where(self, u: int, prefix: str = "model") -> str:
        """The path of unit ``u`` (its first position) for messages: ``model['enc'].w``."""
        return where(prefix, self.paths[self.u_positions[u][0]])

    # pickled without ``gather`` (generated functions, made again on first use); dtypes by name, so that they
    # come back as NumPy's own descriptor objects, which the fast path compares by identity
    def __getstate__(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "gather" and hasattr(self, k)}
        for k in ("u_dtype", "u_compute"):
            if k in d:
                d[k] = [None if t is None else np.dtype(t).str for t in d[k]]
        return d

    def __setstate__(self, d: dict) -> None:
        for k, v in d.items():
            setattr(self, k, [None if t is None else np.dtype(t) for t in v] if k in ("u_dtype", "u_compute") else v)
        self.gather = {}


class TreeCore:
    """Everything a :class:`StateTree` holds: ``structure``, ``groups`` (host), ``device_groups``,
    ``frozen`` (per unit), ``leafcache`` (leaf views) and ``fast`` (the fast path's plan for the model last
    stepped in place, or None)."""

    __slots__ = ("structure", "groups", "device_groups", "frozen", "leafcache", "fast", "users", "spans",
                 "reducer", "__weakref__")

    def __init__(self, structure, groups, device_groups, frozen):
        self.structure, self.groups, self.device_groups, self.frozen = structure, groups, device_groups, frozen
        self.leafcache, self.fast = {}, None
        self.users = 0  # the in-use guard (numbaopt.backends.state.enter): one writer or several readers
        self.spans = None  # arena_spans(), made on first use (a core's groups and their arenas never change)
        #: combines the reductions of a step across processes (numbaopt.mpi sets it; see tree.step.Order); not
        #: copied or pickled: it belongs to a communicator of this process
        self.reducer = None

    def leaf(self, u: int):
        """The state of unit ``u``: a view of its host group's leaf, or of its device group's."""
        leaf = self.leafcache.get(u)
        if leaf is None:
            s = self.structure
            if s.u_group[u] is not None:
                leaf = self.groups[s.u_group[u]].leaf_view(s.u_j[u], s.u_shape[u], u, self)
            else:
                leaf = DeviceMember(self.device_groups[s.u_device[u]], s.u_j[u])
            self.leafcache[u] = leaf
        return leaf

    def arena_spans(self) -> tuple:
        """``(lo, hi)`` int64 arrays: the byte spans of every host group's state arenas."""
        if self.spans is None:
            arenas = [a for g in self.groups for a in g.arenas]
            lo = np.array([a.ctypes.data for a in arenas], dtype=np.int64)
            self.spans = (lo, lo + np.array([a.nbytes for a in arenas], dtype=np.int64))
        return self.spans

    def copy(self) -> TreeCore:
        """A deep copy (new arenas, counters, frozen flags; device groups copied on the device)."""
        return TreeCore(self.structure, [g.copy() for g in self.groups], [g.copy() for g in self.device_groups],
                        self.frozen.copy())

    def snapshot(self, fname: str) -> TreeCore:
        """:meth:`copy`, taken while no call writes the state (a step in progress in another thread is a
        :class:`numbaopt.StateInUseError` naming ``fname``)."""
        enter(self, fname, False)
        try:
            return self.copy()
        finally:
            leave(self, False)

    def __reduce__(self):
        # pickle a copy taken under the guard (pickle writes the arrays after this returns, when another thread
        # could be stepping the state); the plans, leaf views and spans are process-local and made again
        c = self.snapshot("pickle")
        return TreeCore, (c.structure, c.groups, c.device_groups, c.frozen)


class StateNode:
    """A view of one container of a :class:`StateTree`, navigated like the model:
    ``node.attr``, ``node['key']``, ``node[0]``. Leaves give a :class:`numbaopt.Leaf` (or ``None`` when
    the leaf is not trained)."""

    __slots__ = ("_core", "_node", "_path")

    def __init__(self, tree_core, node, path=()):
        # the core, not the StateTree: a state that referred to itself would be freed only by the cyclic
        # garbage collector, keeping its arenas alive (and out of the pool) after the last reference went
        object.__setattr__(self, "_core", tree_core)
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_path", path)

    def _child(self, i):
        node = self._node.children[i]
        path = self._path + (self._node.entries[i],)
        if node.spec is None:
            u = self._core.structure.pos_u[node.pos]
            return None if u is None else self._core.leaf(u)
        return StateNode(self._core, node, path)

    def __getattr__(self, name):
        if name[:1] == "_":  # cheap refusal of probes; a field named _x is reached as state["_x"]
            raise AttributeError(name)
        node = self._node
        if node.spec is not None:
            i = node.find(("attr", "key"), name)  # dict keys too: state.encoder for model['encoder']
            if i is not None:
                return self._child(i)
        raise AttributeError(f"state{where('', self._path)} has no attribute {name!r}")

    def __getitem__(self, key):
        node = self._node
        if node.spec is not None:
            i = node.find(("key", "index", "attr"), key)
            if i is not None:
                return self._child(i)
        raise KeyError(f"state{where('', self._path)} has no item {key!r}")

    def __setattr__(self, name, value):
        raise AttributeError("the state tree is changed through numbaopt functions (update_, adjust_, freeze_)")

    def __iter__(self):
        for i in range(len(self._node.children)):
            yield self._child(i)

    def __len__(self):
        return len(self._node.children)

    def keys(self):
        """The child keys (attribute names, dict keys or indices)."""
        return [e.key for e in self._node.entries]

    def leaves(self):
        """``[(path, Leaf), ...]`` of the trained leaves below this node (a tied leaf once)."""
        c = self._core
        pos_u = c.structure.pos_u
        out, seen = [], set()

        def walk(n, p):
            if n.spec is None:
                u = pos_u[n.pos]
                if u is not None and u not in seen:
                    seen.add(u)
                    out.append((Path(p), c.leaf(u)))
                return
            for e, ch in zip(n.entries, n.children):
                walk(ch, p + (e,))

        walk(self._node, self._path)
        return out

    def units(self) -> list:
        """The units (trained arrays) below this node, sorted."""
        s = self._core.structure
        return sorted({s.pos_u[p] for p in range(self._node.lo, self._node.hi) if s.pos_u[p] is not None})

    def __reduce__(self):  # a view of a copy of the tree (the core pickles a snapshot)
        return StateNode, (self._core, self._node, self._path)

    def __repr__(self):
        return _format(self._core, self._node, self._path)


class StateTree(StateNode):
    """Optimiser state of a nested model: per-leaf state (in flat per-group arenas), rules, step counts.

    Navigate it like the model (``state.encoder.layers[0].w``); ``print(state)`` shows the tree with
    rule names, hyperparameters, step counts and shapes. Made by :func:`numbaopt.setup`.
    """

    __slots__ = ()

    def __init__(self, tree_core: TreeCore):
        super().__init__(tree_core, tree_core.structure.root, ())

    def __copy__(self):
        return StateTree(self._core.snapshot("copy"))

    def __deepcopy__(self, memo):
        return StateTree(self._core.snapshot("copy"))  # the structure is shared: it is never written

    def __reduce__(self):
        return StateTree, (self._core,)


def _builtin_spec(name: str):
    return BUILTIN_SPECS[name]


def _registered_spec(cls):
    spec = registry.get(cls)
    if spec is None:
        raise TypeError(f"unpickling a state: its model has a container of type {type_name(cls)}, which is not "
                        "registered in this process; call numbaopt.register_container for it first")
    return spec


def _reduce_spec(spec):
    """How a :class:`ContainerSpec` pickles: by name (a built-in one), by its type (a registered one: the
    registration of the unpickling process is used), or as the name-only placeholder ``load`` makes."""
    if BUILTIN_SPECS.get(spec.name) is spec:
        return _builtin_spec, (spec.name,)
    for cls, s in registry.items():
        if s is spec:
            return _registered_spec, (cls,)
    if spec.children is None:
        return ContainerSpec, (spec.name, None, None)
    raise TypeError(f"cannot pickle the container spec {spec.name!r}: it is no longer registered")


# the specs hold functions (closures of register_container): a state's structure pickles them by name
copyreg.pickle(ContainerSpec, _reduce_spec)


def new_state(structure, groups, device_groups, frozen=None) -> StateTree:
    """A state tree holding these parts (``setup``, ``load`` and the pure ``update`` make them)."""
    if frozen is None:
        frozen = np.zeros(structure.n_unique, dtype=np.bool_)
    return StateTree(TreeCore(structure, groups, device_groups, frozen))


def core(state, fname: str = "update") -> TreeCore:
    """The :class:`TreeCore` of a whole state tree; a ``TypeError`` for anything else."""
    if type(state) is StateTree:
        return state._core
    if isinstance(state, StateNode):
        raise TypeError(f"{fname}: expected the whole state tree (from setup), got a sub-state")
    raise TypeError(f"{fname}: expected a state from numbaopt.setup, got {type(state).__name__}")


def part(sub, fname: str) -> tuple:
    """``(core, units, name)`` of a state tree (``units`` None: the whole of it), a part of one
    (``state["enc"]``: the units below it) or one of its leaves; a ``TypeError`` naming ``fname`` otherwise."""
    if type(sub) is StateTree:
        return sub._core, None, "state"
    if isinstance(sub, StateNode):
        return sub._core, sub.units(), where("state", sub._path)
    if isinstance(sub, TreeLeaf) and sub.core_ref is not None:
        c = sub.core_ref()
        if c is None:
            raise TypeError(f"{fname}: this leaf's state tree is gone")
        return c, [sub.unit], c.structure.where(sub.unit, "state")
    if isinstance(sub, DeviceMember):
        raise TypeError(f"{fname}: a device leaf of a tree is reached through the container above it "
                        "(state['gpu'])")
    raise TypeError(f"{fname}: expected a state tree, a part of one (state.layer) or one of its leaves, "
                    f"got {type(sub).__name__}")


def _format(c: TreeCore, node, path) -> str:
    s = c.structure
    lines = []
    if node is s.root:
        lines.append(f"StateTree of {describe(node) if node.spec else 'a leaf'}: {s.n_unique} trained "
                     f"parameter(s) in {len(c.groups) + len(c.device_groups)} group(s)")
        for g in c.groups:
            lines.append(f"  group {g.rule!r} {g.dtype.name}: {len(g.sizes)} leaves, {int(g.sizes.sum())} elements")
        for g in c.device_groups:
            lines.append(f"  GPU group {g.rule!r} {g.dtype.name}: {len(g.shapes)} leaves, {g.total} elements")
    seen = {}

    def leaf_text(pos):
        u = s.pos_u[pos]
        if u is None:
            return "-" if s.pos_param[pos] else "(not a parameter)"
        if u in seen:
            return f"tied to {seen[u]}"
        seen[u] = where("", s.paths[pos]) or "<root>"
        return ("frozen " if c.frozen[u] else "") + repr(c.leaf(u))

    def walk(n, p, ind):
        if n.spec is None:
            lines.append(f"{ind}{str(p[-1]) if p else '<root>'}: {leaf_text(n.pos)}")
            return
        lines.append(f"{ind}{str(p[-1]) if p else '<root>'}: {describe(n)}")
        for e, ch in zip(n.entries, n.children):
            walk(ch, p + (e,), ind + "  ")

    walk(node, path, "  " if node is s.root else "")
    return "\n".join(lines)
