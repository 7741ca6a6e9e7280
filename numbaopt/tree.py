"""Nested models: containers, paths, container registration, not-trainable marking, state navigation.

A model is any nesting of containers -- dataclasses (mutable, frozen, ``slots=True``), ``dict``,
``list``, ``tuple``, namedtuples and types registered with :func:`register_container` -- whose leaves
are parameters (see :func:`numbaopt.param_info`) or anything else, which is carried through unchanged.

Trainability: a dataclass field made with :func:`not_trainable` (or whose ``metadata`` has
``"trainable": False``) is never trained; a container type may list the children that are trainable
in a class attribute ``__numbaopt_trainable__`` (names or keys), or pass ``trainable=`` to
:func:`register_container`.

The state of a tree (:class:`StateTree`) mirrors the model and is navigated by the same path:
``state.encoder.layers[0].w`` (attributes, keys, indices) gives that leaf's :class:`numbaopt.Leaf`.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, NamedTuple

import numpy as np

__all__ = ["Path", "PathEntry", "register_container", "not_trainable", "StateTree", "StateNode"]


class PathEntry(NamedTuple):
    """One step of a path: ``kind`` is ``"attr"`` (``.name``), ``"key"`` (``['k']``) or ``"index"`` (``[0]``)."""

    kind: str
    key: Any

    def __str__(self):
        if self.kind == "attr":
            return f".{self.key}"
        return f"[{self.key!r}]"


class Path(tuple):
    """A tuple of :class:`PathEntry` from the root to a leaf; ``str(path)`` is e.g. ``['enc'].layers[0].w``."""

    def __str__(self):
        return "".join(map(str, self))

    def __repr__(self):
        return f"Path({str(self) or '<root>'})"

    @property
    def keys(self) -> tuple:
        """The bare keys (``('enc', 'layers', 0, 'w')``)."""
        return tuple(e.key for e in self)


def where(prefix: str, path) -> str:
    return prefix + "".join(map(str, path))


# --------------------------------------------------------------------------------------------------
# container specs


class ContainerSpec:
    """How to list, rebuild and (for mutable containers) assign the children of one container type."""

    __slots__ = ("name", "children", "rebuild", "setitem", "trainable")

    def __init__(self, name, children, rebuild, setitem=None, trainable=None):
        self.name, self.children, self.rebuild, self.setitem, self.trainable = \
            name, children, rebuild, setitem, trainable


_registry: dict = {}


def register_container(cls, children: Callable, rebuild: Callable, *, setitem: Callable | None = None,
                       trainable: Callable | None = None) -> type:
    """Teach the tree engine a container type.

    * ``children(obj) -> [(key, child), ...]``: the children in a fixed order; a ``str`` key reads as an
      attribute in paths (``.key``), anything else as an item (``[key]``);
    * ``rebuild(obj, values) -> new_obj``: a new container like ``obj`` with the children ``values``
      (same order); used for immutable containers and by the pure ``update``;
    * ``setitem(obj, key, value)``: give it for a mutable container, which ``update_`` then keeps (a
      rebuilt immutable child is assigned into it);
    * ``trainable(obj) -> keys`` (optional): the keys of the children that may be trained.

    Returns ``cls`` (usable as a class decorator through ``functools.partial``).
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_container: expected a type, got {cls!r}")
    if not callable(children) or not callable(rebuild):
        raise TypeError("register_container: children and rebuild must be callables")

    def ch(obj):
        out = []
        for k, v in children(obj):
            out.append((PathEntry("attr" if isinstance(k, str) else "index" if isinstance(k, int) else "key", k), v))
        return out

    _registry[cls] = ContainerSpec(_tname(cls), ch, lambda obj, vals: rebuild(obj, list(vals)),
                                   (lambda obj, e, v: setitem(obj, e.key, v)) if setitem else None, trainable)
    return cls


def not_trainable(**field_kwargs):
    """A dataclass field that is never trained: ``bn_mean: np.ndarray = not_trainable(default=...)``.

    Same arguments as :func:`dataclasses.field`; adds ``metadata={"trainable": False}``.
    """
    md = dict(field_kwargs.pop("metadata", None) or {})
    md["trainable"] = False
    return dataclasses.field(metadata=md, **field_kwargs)


def _tname(t) -> str:
    return f"{t.__module__}:{t.__qualname__}"


def _dict_children(obj):
    return [(PathEntry("key", k), v) for k, v in obj.items()]


def _dict_rebuild(obj, vals):
    new = copy.copy(obj)
    for k, v in zip(list(obj), vals):
        new[k] = v
    return new


def _dict_set(obj, e, v):
    obj[e.key] = v


def _list_children(obj):
    return [(PathEntry("index", i), v) for i, v in enumerate(obj)]


def _list_rebuild(obj, vals):
    new = copy.copy(obj)
    new[:] = vals
    return new


def _list_set(obj, e, v):
    obj[e.key] = v


def _tuple_rebuild(obj, vals):
    return tuple(vals) if type(obj) is tuple else type(obj)(vals)


def _nt_children(obj):
    return [(PathEntry("attr", f), v) for f, v in zip(obj._fields, obj)]


def _nt_rebuild(obj, vals):
    return type(obj)(*vals)


def _dc_children(obj):
    return [(PathEntry("attr", f.name), getattr(obj, f.name)) for f in dataclasses.fields(obj)]


def _dc_rebuild(obj, vals):
    # copy + object.__setattr__: works for frozen and slots dataclasses and never reruns
    # __init__/__post_init__ (which may validate or derive fields)
    new = copy.copy(obj)
    for f, v in zip(dataclasses.fields(obj), vals):
        object.__setattr__(new, f.name, v)
    return new


def _dc_set(obj, e, v):
    setattr(obj, e.key, v)


def _dc_trainable(obj):
    out = set()
    for f in dataclasses.fields(obj):
        md = f.metadata
        flag = md.get("trainable", True)
        sub = md.get("numbaopt")
        if isinstance(sub, dict):
            flag = sub.get("trainable", flag)
        if flag:
            out.add(f.name)
    return out


_DICT = ContainerSpec("dict", _dict_children, _dict_rebuild, _dict_set)
_LIST = ContainerSpec("list", _list_children, _list_rebuild, _list_set)
_TUPLE = ContainerSpec("tuple", _list_children, _tuple_rebuild, None)
_NT = ContainerSpec("namedtuple", _nt_children, _nt_rebuild, None)
_DC = ContainerSpec("dataclass", _dc_children, _dc_rebuild, _dc_set, _dc_trainable)
_DC_FROZEN = ContainerSpec("frozen dataclass", _dc_children, _dc_rebuild, None, _dc_trainable)


def container_spec(obj):
    """The :class:`ContainerSpec` of ``obj``, or None for a leaf."""
    t = type(obj)
    spec = _registry.get(t)
    if spec is not None:
        return spec
    if t is dict:
        return _DICT
    if t is list:
        return _LIST
    if t is tuple:
        return _TUPLE
    if t is np.ndarray:
        return None
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        return _NT
    if dataclasses.is_dataclass(t) and not isinstance(obj, type):
        return _DC_FROZEN if t.__dataclass_params__.frozen else _DC
    if isinstance(obj, dict):
        return _DICT
    if isinstance(obj, list):
        return _LIST
    if isinstance(obj, tuple):
        return _TUPLE
    return None


def trainable_keys(spec, obj):
    """The set of child keys that may be trained, or None for all."""
    declared = getattr(type(obj), "__numbaopt_trainable__", None)
    keys = None
    if spec.trainable is not None:
        keys = set(spec.trainable(obj))
    if declared is not None:
        d = set(declared)
        keys = d if keys is None else keys & d
    return keys


# --------------------------------------------------------------------------------------------------
# the structure of a model, as seen at setup


class Node:
    """One node of a model's structure: a container (``spec``, ``entries``, ``children``) or a leaf
    (``pos``: its index among the leaves, in depth-first order). ``lo:hi`` is the range of leaf
    positions below it; ``trained`` whether any of them is trained."""

    __slots__ = ("spec", "type", "tname", "entries", "children", "pos", "lo", "hi", "trained", "index")

    def __init__(self):
        self.spec = self.type = self.tname = None
        self.entries = self.children = ()
        self.pos = -1
        self.lo = self.hi = 0
        self.trained = False
        self.index = None

    def find(self, entry_kind_ok, key):
        if self.index is None:
            self.index = {(e.kind, _hk(e.key)): i for i, e in enumerate(self.entries)}
        for kind in entry_kind_ok:
            i = self.index.get((kind, _hk(key)))
            if i is not None:
                return i
        return None


def _hk(k):
    try:
        hash(k)
        return k
    except TypeError:
        return repr(k)


def flatten(model, on_leaf: Callable):
    """Walk ``model``; ``on_leaf(path, value, trainable) -> trained`` is called per leaf in depth-first
    order. Returns the root :class:`Node`."""
    counter = [0]

    def walk(obj, path, trainable):
        node = Node()
        spec = container_spec(obj)
        node.lo = counter[0]
        if spec is None:
            node.pos = counter[0]
            counter[0] += 1
            node.trained = bool(on_leaf(Path(path), obj, trainable))
        else:
            node.spec, node.type, node.tname = spec, type(obj), _tname(type(obj))
            items = spec.children(obj)
            keys = trainable_keys(spec, obj) if trainable else None
            node.entries = tuple(e for e, _ in items)
            kids = []
            for e, v in items:
                kids.append(walk(v, path + (e,), trainable and (keys is None or e.key in keys)))
            node.children = tuple(kids)
            node.trained = any(k.trained for k in kids)
        node.hi = counter[0]
        return node

    return walk(model, (), True)


def same_type(node, obj) -> bool:
    t = type(obj)
    if t is node.type:
        return True
    if node.type is None and _tname(t) == node.tname:  # a loaded state: types known by name
        node.type = t
        return True
    return False


def walk_leaves(node, obj, prefix, out, none_ok: bool, path=()):
    """Collect the leaves of ``obj`` (a model or a gradient tree) at ``node``'s positions into ``out``.

    Checks container types, keys and lengths on every branch holding trained leaves, naming the path
    on error. With ``none_ok`` a ``None`` (leaf or whole branch) leaves ``None`` in ``out``.
    """
    if obj is None and none_ok:
        return
    if node.spec is None:
        out[node.pos] = obj
        return
    if not node.trained:
        return
    if not same_type(node, obj):
        raise TypeError(f"{where(prefix, path)}: expected {_describe(node)}, got {type(obj).__name__}")
    spec = container_spec(obj)
    name = spec.name
    if name in ("list", "tuple", "namedtuple", "dataclass", "frozen dataclass"):
        # children read directly (no PathEntry objects): the general path walks every step
        if name in ("dataclass", "frozen dataclass"):
            vals = [getattr(obj, e.key) for e in node.entries]  # same type: same fields
        else:
            vals = obj
            if len(vals) != len(node.entries):
                raise ValueError(f"{where(prefix, path)}: {len(vals)} children, expected {len(node.entries)}")
        for v, e, child in zip(vals, node.entries, node.children):
            if child.trained:
                walk_leaves(child, v, prefix, out, none_ok, path + (e,))
        return
    items = obj if isinstance(obj, dict) else spec.children(obj)
    if len(items) != len(node.entries):
        if node.spec.name == "dict" or isinstance(obj, dict):
            missing = [e.key for e in node.entries if e.key not in obj]
            extra = [k for k in obj if (k not in {e.key for e in node.entries})]
            raise ValueError(f"{where(prefix, path)}: keys differ from the model's"
                             f"{'; missing ' + repr(missing) if missing else ''}"
                             f"{'; unexpected ' + repr(extra) if extra else ''}")
        raise ValueError(f"{where(prefix, path)}: {len(items)} children, expected {len(node.entries)}")
    if spec.name == "dict" or isinstance(obj, dict):
        for e, child in zip(node.entries, node.children):
            if e.key not in obj:
                missing = [e2.key for e2 in node.entries if e2.key not in obj]
                raise ValueError(f"{where(prefix, path)}: missing key(s) {missing!r}")
            walk_leaves(child, obj[e.key], prefix, out, none_ok, path + (e,))
        return
    for (e, v), e0, child in zip(items, node.entries, node.children):
        if e != e0:
            raise ValueError(f"{where(prefix, path)}: child {e} where the model has {e0}")
        walk_leaves(child, v, prefix, out, none_ok, path + (e,))


def _describe(node) -> str:
    name = node.tname.rpartition(":")[2].rpartition(".")[2]
    return name if node.spec.name in ("dict", "list", "tuple") else f"{node.spec.name} {name}"


def rebuild(node, obj, new: dict, inplace: bool):
    """``obj`` with the leaves at positions in ``new`` replaced.

    In place: mutable containers keep their identity (a changed child is assigned into them);
    immutable ones are rebuilt when a child changed. Pure: every container holding a change is rebuilt.
    """
    if node.spec is None:
        return new.get(node.pos, obj)
    if not any(p in new for p in range(node.lo, node.hi)):
        return obj
    spec = container_spec(obj)
    if isinstance(obj, dict):
        vals = [obj[e.key] for e in node.entries]
    elif spec.name in ("dataclass", "frozen dataclass"):
        vals = [getattr(obj, e.key) for e in node.entries]
    elif spec.name in ("list", "tuple", "namedtuple"):
        vals = list(obj)
    else:
        vals = [v for _, v in spec.children(obj)]
    newvals = [rebuild(c, v, new, inplace) for c, v in zip(node.children, vals)]
    if inplace and spec.setitem is not None:
        for e, v, nv in zip(node.entries, vals, newvals):
            if nv is not v:
                spec.setitem(obj, e, nv)
        return obj
    if isinstance(obj, dict):
        out = copy.copy(obj)
        for e, nv in zip(node.entries, newvals):
            out[e.key] = nv
        return out
    return spec.rebuild(obj, newvals)


# --------------------------------------------------------------------------------------------------
# the state tree


class StateNode:
    """A view of one container of a :class:`StateTree`, navigated like the model:
    ``node.attr``, ``node['key']``, ``node[0]``. Leaves give a :class:`numbaopt.Leaf` (or ``None`` when
    the leaf is not trained)."""

    __slots__ = ("_tree", "_node", "_path")

    #: api.update/update_ probe this hook (host-level wrapper states have it) on every call: a class
    #: attribute answers without raising AttributeError from __getattr__ (~2 µs)
    _numbaopt_update = None

    def __init__(self, tree, node, path=()):
        object.__setattr__(self, "_tree", tree)
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_path", path)

    def _child(self, i):
        node = self._node.children[i]
        path = self._path + (self._node.entries[i],)
        if node.spec is None:
            return self._tree._leaf_at(node.pos)
        return StateNode(self._tree, node, path)

    def __getattr__(self, name):
        if name[:1] == "_":
            # cheap refusal: hasattr/getattr probes (e.g. api's _numbaopt_update) come on every step;
            # a field named _x is reached as state["_x"]
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
        """``[(path, Leaf), ...]`` of the trained leaves below this node."""
        return self._tree._leaves_in(self._node, self._path)

    def __repr__(self):
        return self._tree._format(self._node, self._path)


class StateTree(StateNode):
    """Optimiser state of a nested model: per-leaf state (in flat per-group arenas), rules, step counts.

    Navigate it like the model (``state.encoder.layers[0].w``); ``print(state)`` shows the tree with
    rule names, hyperparameters, step counts and shapes. Made by :func:`numbaopt.setup`; the engine
    (:mod:`numbaopt.engine`) owns its internals.
    """

    __slots__ = ("_s", "_groups", "_frozen", "_host", "_leafcache", "_fast")

    def __init__(self, structure, groups, frozen, host):
        super().__init__(self, structure.root, ())
        object.__setattr__(self, "_s", structure)
        object.__setattr__(self, "_groups", groups)
        object.__setattr__(self, "_frozen", frozen)
        object.__setattr__(self, "_host", host)
        object.__setattr__(self, "_leafcache", {})
        object.__setattr__(self, "_fast", None)

    def __copy__(self):
        from .engine import copy_state
        return copy_state(self)

    def __deepcopy__(self, memo):
        from .engine import copy_state
        return copy_state(self)  # new arenas, step counts and flags; the structure is shared (immutable)

    def _leaf_at(self, pos):
        u = self._s.pos_u[pos]
        if u is None:
            return None
        return self._unique_leaf(u)

    def _unique_leaf(self, u):
        h = self._host.get(u)
        if h is not None:
            return h
        leaf = self._leafcache.get(u)
        if leaf is None:
            from .engine import TreeLeaf
            gi, j = self._s.u_group[u], self._s.u_j[u]
            leaf = self._leafcache[u] = TreeLeaf(self._groups[gi], j, self._s.u_shape[u], self, u)
        return leaf

    def _leaves_in(self, node, path):
        out, seen = [], set()

        def walk(n, p):
            if n.spec is None:
                u = self._s.pos_u[n.pos]
                if u is not None and u not in seen:
                    seen.add(u)
                    out.append((Path(p), self._unique_leaf(u)))
                return
            for e, c in zip(n.entries, n.children):
                walk(c, p + (e,))

        walk(node, path)
        return out

    def _format(self, node, path):
        s = self._s
        lines = []
        if node is s.root:
            ng = len(self._groups)
            lines.append(f"StateTree of {_describe(node) if node.spec else 'a leaf'}: {s.n_unique} trained "
                         f"parameter(s) in {ng} group(s)")
            for g in self._groups:
                lines.append(f"  group {g.rule!r} {g.dtype.name}: {len(g.sizes)} leaves, "
                             f"{int(g.sizes.sum())} elements")
            dev = {id(h.group): h.group for h in self._host.values() if hasattr(h, "group")}
            for g in dev.values():
                lines.append(f"  GPU group {g.rule!r} {g.dtype.name}: {len(g.shapes)} leaves, {g.total} elements")
        seen = {}

        def leaf_text(pos):
            u = s.pos_u[pos]
            if u is None:
                return "-" if s.pos_param[pos] else "(not a parameter)"
            if u in seen:
                return f"tied to {seen[u]}"
            seen[u] = where("", s.paths[pos]) or "<root>"
            leaf = self._unique_leaf(u)
            frozen = "frozen " if self._frozen[u] else ""
            return frozen + repr(leaf)

        def walk(n, p, ind):
            if n.spec is None:
                lines.append(f"{ind}{str(p[-1]) if p else '<root>'}: {leaf_text(n.pos)}")
                return
            head = f"{ind}{str(p[-1]) if p else '<root>'}: {_describe(n)}"
            lines.append(head)
            for e, c in zip(n.entries, n.children):
                walk(c, p + (e,), ind + "  ")

        walk(node, path, "  " if node is s.root else "")
        return "\n".join(lines)


# the tree-level public API, exported through ``numbaopt`` (imported last: engine and persist use this module)
from .params import ParamInfo, param_info  # noqa: E402
from .engine import freeze_, thaw_, destructure  # noqa: E402
from .persist import save, load  # noqa: E402

__all__ += ["ParamInfo", "param_info", "freeze_", "thaw_", "destructure", "save", "load"]
