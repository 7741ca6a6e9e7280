"""The structure of a model as ``setup`` saw it (:class:`Node`), and walking and rebuilding models with it."""
from __future__ import annotations

import copy
from collections.abc import Callable

from .containers import container_spec, type_name, trainable_keys
from .paths import Path, where

__all__ = ["Node", "flatten", "same_type", "walk_leaves", "rebuild", "describe"]


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
    inside = set()  # ids of the containers on the current path: a model that contains itself is no tree

    def walk(obj, path, trainable):
        node = Node()
        spec = container_spec(obj)
        node.lo = counter[0]
        if spec is not None:
            if id(obj) in inside:
                raise ValueError(f"model{Path(path)}: this {type(obj).__name__} contains itself (a cycle); a model "
                                 "must be a tree (shared sub-containers are fine, cycles are not)")
            inside.add(id(obj))
        if spec is None:
            node.pos = counter[0]
            counter[0] += 1
            node.trained = bool(on_leaf(Path(path), obj, trainable))
        else:
            node.spec, node.type, node.tname = spec, type(obj), type_name(type(obj))
            items = spec.children(obj)
            keys = trainable_keys(spec, obj) if trainable else None
            node.entries = tuple(e for e, _ in items)
            kids = []
            for e, v in items:
                kids.append(walk(v, path + (e,), trainable and (keys is None or e.key in keys)))
            node.children = tuple(kids)
            node.trained = any(k.trained for k in kids)
            inside.discard(id(obj))
        node.hi = counter[0]
        return node

    try:
        return walk(model, (), True)
    except RecursionError:
        raise ValueError("model: nested too deeply to walk (deeper than Python's recursion limit, "
                         "sys.getrecursionlimit())") from None


def same_type(node, obj) -> bool:
    t = type(obj)
    if t is node.type:
        return True
    if node.type is None and type_name(t) == node.tname:  # a loaded state: types known by name
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
        raise TypeError(f"{where(prefix, path)}: expected {describe(node)}, got {type(obj).__name__}")
    spec = container_spec(obj)
    if spec is None:  # a state loaded from a file, whose container type this process has not registered
        raise TypeError(f"{where(prefix, path)}: a {type(obj).__name__}, a container the state knows by name "
                        f"({node.tname}) but that is not registered in this process; call "
                        f"numbaopt.register_container({type(obj).__name__}, ...) as the saving process did")
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
            if child.spec is None:  # a leaf: no call (a flat list of 1000 leaves is the common case)
                if child.trained:
                    out[child.pos] = v
            elif child.trained:
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


def describe(node) -> str:
    name = node.tname.rpartition(":")[2].rpartition(".")[2]
    return name if node.spec.name in ("dict", "list", "tuple") else f"{node.spec.name} {name}"


def rebuild(node, obj, new: dict, inplace: bool, memo: dict | None = None):
    """``obj`` with the leaves at positions in ``new`` replaced.

    In place: mutable containers keep their identity (a changed child is assigned into them);
    immutable ones are rebuilt when a child changed. Pure: every container holding a change is rebuilt.
    A container object that appears several times in the model is rebuilt once: the new model shares it
    where the old one did (its leaves are tied, so every occurrence has the same new values).
    """
    if node.spec is None:
        return new.get(node.pos, obj)
    if not any(p in new for p in range(node.lo, node.hi)):
        return obj
    if memo is None:
        memo = {}
    done = memo.get(id(obj))
    if done is not None:
        return done[1]
    spec = container_spec(obj)
    if isinstance(obj, dict):
        vals = [obj[e.key] for e in node.entries]
    elif spec.name in ("dataclass", "frozen dataclass"):
        vals = [getattr(obj, e.key) for e in node.entries]
    elif spec.name in ("list", "tuple", "namedtuple"):
        vals = list(obj)
    else:
        vals = [v for _, v in spec.children(obj)]
    newvals = [new.get(c.pos, v) if c.spec is None else rebuild(c, v, new, inplace, memo)
               for c, v in zip(node.children, vals)]
    if inplace and spec.setitem is not None:
        for e, v, nv in zip(node.entries, vals, newvals):
            if nv is not v:
                spec.setitem(obj, e, nv)
        out = obj
    elif isinstance(obj, dict):
        out = copy.copy(obj)
        for e, nv in zip(node.entries, newvals):
            out[e.key] = nv
    else:
        out = spec.rebuild(obj, newvals)
    memo[id(obj)] = (obj, out)  # obj kept alive: its id cannot be reused during the rebuild
    return out
