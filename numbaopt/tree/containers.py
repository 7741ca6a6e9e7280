"""Containers of a model: how to list, rebuild and assign the children of each container type.

Built in: dataclasses (mutable, frozen, ``slots=True``), ``dict``, ``list``, ``tuple``, namedtuples; more
with :func:`register_container`. Trainability: a dataclass field made with :func:`not_trainable` (or whose
``metadata`` has ``"trainable": False``) is never trained; a container type may list the children that are
trainable in a class attribute ``__numbaopt_trainable__`` (names or keys), or pass ``trainable=`` to
:func:`register_container`.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .jax_models import NODE_TYPES, is_jax_node, pytree_children, pytree_rebuild
from .paths import PathEntry

__all__ = ["ContainerSpec", "register_container", "not_trainable", "container_spec", "trainable_keys", "registry",
           "type_name", "BUILTIN_SPECS", "DICT", "LIST", "TUPLE", "NAMEDTUPLE", "DATACLASS", "FROZEN_DATACLASS",
           "JAX_PYTREE"]

T = TypeVar("T")  # a registered container type


class ContainerSpec:
    """How to list, rebuild and (for mutable containers) assign the children of one container type."""

    __slots__ = ("name", "children", "rebuild", "setitem", "trainable")

    def __init__(self, name, children, rebuild, setitem=None, trainable=None):
        self.name, self.children, self.rebuild, self.setitem, self.trainable = \
            name, children, rebuild, setitem, trainable


registry: dict = {}


def register_container(cls: type[T], children: Callable, rebuild: Callable, *, setitem: Callable | None = None,
                       trainable: Callable | None = None) -> type[T]:
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

    registry[cls] = ContainerSpec(type_name(cls), ch, lambda obj, vals: rebuild(obj, list(vals)),
                                   (lambda obj, e, v: setitem(obj, e.key, v)) if setitem else None, trainable)
    return cls


def not_trainable(**field_kwargs: Any) -> Any:
    """A dataclass field that is never trained: ``bn_mean: np.ndarray = not_trainable(default=...)``.

    Same arguments as :func:`dataclasses.field`; adds ``metadata={"trainable": False}``.
    """
    md = dict(field_kwargs.pop("metadata", None) or {})
    md["trainable"] = False
    return dataclasses.field(metadata=md, **field_kwargs)


def type_name(t) -> str:
    """``module:qualname`` of a type (how a saved state names container types)."""
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


DICT = ContainerSpec("dict", _dict_children, _dict_rebuild, _dict_set)
LIST = ContainerSpec("list", _list_children, _list_rebuild, _list_set)
TUPLE = ContainerSpec("tuple", _list_children, _tuple_rebuild, None)
NAMEDTUPLE = ContainerSpec("namedtuple", _nt_children, _nt_rebuild, None)
DATACLASS = ContainerSpec("dataclass", _dc_children, _dc_rebuild, _dc_set, _dc_trainable)
FROZEN_DATACLASS = ContainerSpec("frozen dataclass", _dc_children, _dc_rebuild, None, _dc_trainable)
#: a pytree node registered with jax.tree_util (numbaopt.tree.jax_models): immutable, rebuilt by its unflatten
JAX_PYTREE = ContainerSpec("jax pytree", pytree_children, pytree_rebuild, None)


def container_spec(obj):
    """The :class:`ContainerSpec` of ``obj``, or None for a leaf."""
    t = type(obj)
    spec = registry.get(t)
    if spec is not None:
        return spec
    if t is dict:
        return DICT
    if t is list:
        return LIST
    if t is tuple:
        return TUPLE
    if t is np.ndarray:
        return None
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        return NAMEDTUPLE
    # before the dataclass rule: a dataclass registered with JAX follows its registration (meta fields)
    jx = NODE_TYPES.get(t)  # decided once per type (is_jax_node); jax is never imported here
    if jx or (jx is None and is_jax_node(obj)):
        return JAX_PYTREE
    if dataclasses.is_dataclass(t) and not isinstance(obj, type):
        return FROZEN_DATACLASS if t.__dataclass_params__.frozen else DATACLASS
    if isinstance(obj, dict):
        return DICT
    if isinstance(obj, list):
        return LIST
    if isinstance(obj, tuple):
        return TUPLE
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


#: the built-in specs by name (a saved state names them)
BUILTIN_SPECS = {s.name: s for s in (DICT, LIST, TUPLE, NAMEDTUPLE, DATACLASS, FROZEN_DATACLASS, JAX_PYTREE)}
