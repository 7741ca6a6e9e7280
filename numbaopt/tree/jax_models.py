"""JAX models: ``jax.Array`` leaves and pytrees registered with ``jax.tree_util``.

numbaopt never imports jax. Everything here reads ``sys.modules["jax"]`` and runs only once the user has
imported jax, and only for objects that are JAX's:

* a ``jax.Array`` is an immutable parameter (JAX arrays cannot be written): the step reads it through
  ``np.asarray`` (no copy for a CPU array), computes on the host, and returns a new ``jax.Array`` of the
  same dtype placed where the input was (its sharding when committed; the default device, uncommitted,
  when the input was uncommitted). :func:`jax_facts`, :func:`jax_to_host`, :func:`jax_from_host` are what
  :func:`numbaopt.param_info` builds its ``ParamInfo`` from;
* a type that ``jax.tree_util`` knows as a node (``register_pytree_node_class``, ``register_dataclass``,
  ``register_pytree_with_keys``, flax and equinox modules, ...) and that is not one of numbaopt's own
  containers (dict, list, tuple and their subclasses, namedtuples) is a container:
  :func:`pytree_children` flattens it one level with JAX's keys, :func:`pytree_rebuild` rebuilds it with
  the node's ``unflatten`` (aux data kept). Such a container is immutable: ``update_`` rebuilds it too.
  A registered dataclass follows JAX's registration (its ``meta_fields`` are aux data, never trained),
  not numbaopt's dataclass rule.

Types are classified once (:func:`is_jax_node`, cached in :data:`NODE_TYPES`): register a type with JAX
before numbaopt first sees it, as JAX itself requires before ``tree_flatten``.
"""
from __future__ import annotations

import sys

import numpy as np

from .paths import PathEntry

__all__ = ["is_jax_array", "jax_facts", "jax_to_host", "jax_from_host", "is_jax_node", "pytree_children",
           "pytree_rebuild", "entry_of", "NODE_TYPES"]

#: type -> whether it is a JAX pytree container for numbaopt; filled by :func:`is_jax_node`, so a type costs
#: one dict lookup after its first sight (nothing for NumPy models: their types are decided without jax)
NODE_TYPES: dict = {}
_jax_seen = [False]  # whether NODE_TYPES was last filled with jax imported (see is_jax_node)


def is_jax_array(x) -> bool:
    """Whether ``x`` is a ``jax.Array`` (a tracer too); never imports jax."""
    jax = sys.modules.get("jax")
    cls = getattr(jax, "Array", None)
    return cls is not None and isinstance(x, cls)


def jax_facts(x):
    """``(dtype, shape)`` of a ``jax.Array`` parameter, or None for one that is no parameter (integer,
    boolean). A traced value or an array spread over processes is a ``TypeError``."""
    jax = sys.modules["jax"]
    if isinstance(x, jax.core.Tracer):
        raise TypeError(f"a traced JAX value ({type(x).__name__}, inside jax.jit, grad, vmap, ...); numbaopt "
                        "steps concrete arrays: call setup/update outside the traced function")
    if not jax.numpy.issubdtype(x.dtype, jax.numpy.inexact):
        return None  # carried through unchanged, like an integer NumPy array
    if not x.is_fully_addressable:
        raise TypeError("a JAX array sharded over several processes (not fully addressable); numbaopt reads "
                        "the whole array on the host: step each process's shards, or gather it first")
    # bfloat16 and float8 come through as their (ml_dtypes) NumPy dtypes: setup refuses them with the
    # message it gives for every dtype without kernels, naming the path
    return np.dtype(x.dtype), tuple(x.shape)


def jax_to_host(x) -> np.ndarray:
    """The values of a ``jax.Array`` as a NumPy array: a read-only view of a CPU buffer (no copy), a copy
    to the host for an accelerator's."""
    return np.asarray(x)


def jax_from_host(a: np.ndarray, old):
    """A new ``jax.Array`` holding ``a``, of ``old``'s dtype, placed as ``old`` is: on its sharding when it
    is committed to devices, else uncommitted on the device ``old`` lives on (JAX moves uncommitted arrays
    freely, so the new value stays free too)."""
    jax = sys.modules["jax"]
    if a.dtype != old.dtype:
        a = a.astype(old.dtype)
    if getattr(old, "committed", True):
        return jax.device_put(a, old.sharding)
    devices = old.devices()
    if len(devices) == 1:
        with jax.default_device(next(iter(devices))):
            return jax.device_put(a)
    return jax.device_put(a, old.sharding)


def is_jax_node(obj) -> bool:
    """Whether ``obj``'s type is a container registered with ``jax.tree_util`` (other than None and
    numbaopt's own dict/list/tuple containers). Decided once per type."""
    t = type(obj)
    got = NODE_TYPES.get(t)
    if got is not None:
        return got
    jax = sys.modules.get("jax")
    if jax is not None and not _jax_seen[0]:
        # the types decided before jax was imported were decided without it: decide them again
        NODE_TYPES.clear()
        _jax_seen[0] = True
    got = jax is not None and t is not type(None) and not issubclass(t, (dict, list, tuple)) \
        and _registered(jax.tree_util, t, obj)
    NODE_TYPES[t] = got
    return got


def _registered(tu, t, obj) -> bool:
    is_node = getattr(tu, "is_tree_node", None)
    if is_node is not None:
        return bool(is_node(t))
    return not tu.all_leaves([obj])  # older jax: a registered node is not a leaf


def entry_of(key) -> PathEntry:
    """The :class:`PathEntry` of one of JAX's path keys: ``GetAttrKey`` -> ``.name``, ``DictKey`` ->
    ``[k]``, ``SequenceKey`` and ``FlattenedIndexKey`` -> ``[i]`` (another key type: ``[key]``)."""
    name = type(key).__name__
    if name == "GetAttrKey":
        return PathEntry("attr", key.name)
    if name == "DictKey":
        return PathEntry("key", key.key)
    if name == "SequenceKey":
        return PathEntry("index", key.idx)
    if name == "FlattenedIndexKey":
        return PathEntry("index", key.key)
    return PathEntry("key", key)


def pytree_children(obj) -> list:
    """``[(PathEntry, child), ...]``: ``obj`` flattened one level by JAX's registry (a ``None`` child is a
    child, as numbaopt reads None: an absent leaf or gradient)."""
    tu = sys.modules["jax"].tree_util
    one = getattr(tu, "flatten_one_level_with_keys", None)
    if one is not None:
        pairs, _ = one(obj)
        return [(entry_of(k), v) for k, v in pairs]
    pairs, _ = tu.tree_flatten_with_path(obj, is_leaf=lambda v: v is not obj)  # older jax
    return [(entry_of(p[0]), v) for p, v in pairs]


def pytree_rebuild(obj, values):
    """A new node like ``obj`` (same type and aux data) with the children ``values``, through the node's
    registered ``unflatten``."""
    tu = sys.modules["jax"].tree_util
    _, treedef = tu.tree_flatten(obj, is_leaf=lambda v: v is not obj)  # one level: every child is a leaf
    return treedef.unflatten(list(values))
