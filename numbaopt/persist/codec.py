"""Encoding a state's description for the file header (JSON): keys, tree nodes, hyperparameter values, rules.

No pickles, and a file never makes ``load`` import, or look up an attribute of, anything it names. A rule
or schedule is stored as ``module:qualname`` and its values; decoding finds the class among the
:class:`~numbaopt.Rule` and :class:`~numbaopt.schedules.Schedule` subclasses that exist in this process
(:func:`known_classes`: the built-in ones, and one of yours once the module defining it is imported), and
rebuilds it through its constructor, so every value is checked as ``Adam(lr=...)`` checks it. A schedule
is rebuilt from its ``_params()`` (without one, from its attributes as keyword arguments), and the file's
attributes must be exactly what that constructor makes: a file cannot add an attribute (shadowing
``values``, say) or skip a constructor's check. Container types are known by name only (the tree's own
registry, :data:`numbaopt.tree.containers.registry`), never imported.
"""
from __future__ import annotations

import sys

import numpy as np

from ..rules.base import Rule
from ..rules.chain import Chain
from ..schedules import Schedule
from ..tree.containers import BUILTIN_SPECS, DICT, JAX_PYTREE, LIST, TUPLE, ContainerSpec, registry
from ..tree.paths import PathEntry
from ..tree.structure import Node
from .checks import as_bool, as_dict, as_int, as_list, as_str
from .files import CheckpointError

__all__ = ["enc_key", "dec_key", "enc_node", "dec_node", "qual", "known_classes", "lookup", "enc_value",
           "dec_value", "enc_rule", "dec_rule"]

#: what a node's ``type`` names for the three built-in containers (any other type is known by name only)
_BUILTIN_TYPES = {"builtins:dict": (dict, DICT), "builtins:list": (list, LIST), "builtins:tuple": (tuple, TUPLE)}
_ENTRY_KINDS = ("attr", "key", "index")


def enc_key(k):
    if isinstance(k, bool):
        return ["b", k]
    if isinstance(k, str):
        return ["s", k]
    if isinstance(k, int):
        return ["i", k]
    if isinstance(k, float):
        return ["f", k]
    if k is None:
        return ["n", None]
    if isinstance(k, tuple):
        return ["t", [enc_key(v) for v in k]]
    raise TypeError(f"save: a container key {k!r} ({type(k).__name__}) cannot be stored; "
                    "keys must be str, int, float, bool, None or tuples of those")


def dec_key(v, what: str = "key"):
    tag, val = as_list(v, what, 2)
    if tag == "t":
        return tuple(dec_key(x, what) for x in as_list(val, what))
    if tag == "i":
        return as_int(val, what, low=None)
    if tag == "f":
        if not isinstance(val, float):
            raise CheckpointError(f"{what} {val!r:.40} is tagged a float")
        return val
    if tag == "b":
        return as_bool(val, what)
    if tag == "s":
        return as_str(val, what)
    if tag == "n" and val is None:
        return None
    raise CheckpointError(f"{what}: unknown key tag {tag!r:.40}")


def enc_node(n):
    if n.spec is None:
        return {"leaf": n.pos}
    return {"spec": n.spec.name, "type": n.tname, "trained": n.trained,
            "entries": [[e.kind, enc_key(e.key)] for e in n.entries],
            "children": [enc_node(c) for c in n.children]}


def _spec_of(name: str, tname: str, what: str):
    """The container spec a node names, and its type where it is a built-in one (nothing is imported:
    other types are matched by name when the state meets a model)."""
    spec = BUILTIN_SPECS.get(name)
    if spec is None:
        spec = next((s for s in registry.values() if s.name == tname), None) or ContainerSpec(name, None, None)
    builtin = _BUILTIN_TYPES.get(tname)
    if builtin is not None and builtin[1] is not spec:
        raise CheckpointError(f"{what}: a {tname} container described as {name!r}")
    return spec, None if builtin is None else builtin[0]


def _check_entries(spec, entries, what: str) -> None:
    """The entries are what the container's ``children`` gives: dict keys, list indices 0..n-1, field names
    of a namedtuple or dataclass, and for other types ``register_container``'s rule (str: attribute, int:
    index, else key); no key twice."""
    keys = [e.key for e in entries]
    if spec in (LIST, TUPLE):
        if keys != list(range(len(keys))) or any(e.kind != "index" for e in entries):
            raise CheckpointError(f"{what}: a {spec.name} whose entries are not the indices 0..{len(keys) - 1}")
    elif spec is DICT:
        if any(e.kind != "key" for e in entries):
            raise CheckpointError(f"{what}: a dict entry that is not a key")
    elif spec is JAX_PYTREE:  # JAX's own keys: attributes, dict keys and indices may mix in one node
        pass
    elif spec.name in BUILTIN_SPECS:  # namedtuples and dataclasses: fields
        if any(e.kind != "attr" or not isinstance(e.key, str) for e in entries):
            raise CheckpointError(f"{what}: a {spec.name} field that is not a name")
    elif any(e.kind != ("attr" if isinstance(e.key, str) else "index" if isinstance(e.key, int) else "key")
             for e in entries):
        raise CheckpointError(f"{what}: an entry kind that does not match its key")
    try:
        distinct = len({(e.kind, e.key) for e in entries})
    except TypeError:  # cannot happen for decoded keys (tuples of scalars), kept as a refusal regardless
        raise CheckpointError(f"{what}: an unhashable key") from None
    if distinct != len(entries):
        raise CheckpointError(f"{what}: the same key twice")


def dec_node(d, counter, what: str = "tree"):
    """The :class:`Node` a header describes; ``counter[0]`` counts the leaves (their positions must come
    in depth-first order)."""
    n = Node()
    n.lo = counter[0]
    if isinstance(d, dict) and "leaf" in d:
        as_dict(d, what, ("leaf",))
        if as_int(d["leaf"], f"{what} leaf position") != counter[0]:
            raise CheckpointError(f"{what}: leaf position {d['leaf']}, expected {counter[0]} (depth-first order)")
        n.pos = counter[0]
        counter[0] += 1
    else:
        as_dict(d, what, ("spec", "type", "trained", "entries", "children"))
        tname = as_str(d["type"], f"{what} type")
        n.spec, n.type = _spec_of(as_str(d["spec"], f"{what} spec"), tname, what)
        n.tname = tname
        entries = []
        for e in as_list(d["entries"], f"{what} entries"):
            kind, key = as_list(e, f"{what} entry", 2)
            if kind not in _ENTRY_KINDS:
                raise CheckpointError(f"{what}: entry kind {kind!r:.40}, expected one of {_ENTRY_KINDS}")
            entries.append(PathEntry(kind, dec_key(key, f"{what} key")))
        _check_entries(n.spec, entries, what)
        n.entries = tuple(entries)
        kids = as_list(d["children"], f"{what} children", len(entries))
        n.children = tuple(dec_node(c, counter, f"{what}{e}") for e, c in zip(entries, kids))
        n.trained = as_bool(d["trained"], f"{what} trained")
    n.hi = counter[0]
    return n


def qual(obj_type) -> str:
    return f"{obj_type.__module__}:{obj_type.__qualname__}"


def known_classes(base) -> dict:
    """``{"module:qualname": class}`` of every subclass of ``base`` that exists in this process (the newest
    of a name wins: a module reloaded, a class defined again)."""
    out, todo, seen = {}, [base], set()
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in seen:
                seen.add(sub)
                out[qual(sub)] = sub
                todo.append(sub)
    return out


def lookup(name, base, what: str):
    """The ``base`` subclass a file names, from :func:`known_classes` (nothing imported, nothing looked up
    in a module)."""
    name = as_str(name, what)
    cls = known_classes(base).get(name)
    if cls is None:
        mod = name.partition(":")[0]
        if mod not in sys.modules:
            raise CheckpointError(f"{name} is in a module that is not imported ({mod}); import it before load")
        raise CheckpointError(f"{name} is not a numbaopt {base.__name__} known to this process (unknown code: a "
                              "class of your own loads once the module defining it is imported)")
    return cls


def enc_value(v):
    if isinstance(v, Schedule):
        state = {k: enc_value(x) for k, x in vars(v).items()}
        return {"schedule": qual(type(v)), "state": state}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, tuple):
        return {"tuple": [enc_value(x) for x in v]}
    if isinstance(v, list):
        return [enc_value(x) for x in v]
    raise TypeError(f"save: hyperparameter value {v!r} cannot be stored")


def _construct(cls, kwargs: dict, what: str):
    """``cls(**kwargs)``: whatever its constructor refuses is the file's fault here."""
    try:
        return cls(**kwargs)
    except MemoryError:
        raise
    except Exception as e:  # a constructor is the validator of its values; yours may raise anything
        raise CheckpointError(f"{what}: {e}" if isinstance(e, (TypeError, ValueError)) else
                              f"{what}: {cls.__name__}(...) raised {type(e).__name__}: {e}") from e


def _dec_schedule(v, what: str):
    cls = lookup(v["schedule"], Schedule, f"{what} schedule")
    raw = as_dict(v["state"], f"{what} schedule state")
    values = {k: dec_value(x, f"{what}.{k}") for k, x in raw.items()}
    try:
        if cls._params is Schedule._params:  # no _params(): the attributes are the constructor's arguments
            params = dict(values)
        else:
            probe = cls.__new__(cls)
            probe.__dict__.update(values)  # only to ask it for its constructor's arguments
            params = dict(probe._params())
    except Exception as e:
        raise CheckpointError(f"{what}: {cls.__name__} cannot be rebuilt from the file's attributes "
                              f"({type(e).__name__}: {e})") from None
    fresh = _construct(cls, params, what)
    try:
        made = {k: enc_value(x) for k, x in vars(fresh).items()}
    except TypeError as e:
        raise CheckpointError(f"{what}: {e}") from None
    if made != raw:
        diff = sorted(k for k in set(made) | set(raw) if made.get(k, ...) != raw.get(k, ...))
        raise CheckpointError(f"{what}: the file's {cls.__name__} attributes differ from what its constructor "
                              f"makes of them (in {diff[:8]})")
    return fresh


def dec_value(v, what: str = "value"):
    """A hyperparameter value: a number, string, None, list, tuple or schedule (nothing else)."""
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return as_str(v, what)
    if isinstance(v, list):
        return [dec_value(x, f"{what}[{k}]") for k, x in enumerate(v)]
    if isinstance(v, dict) and set(v) == {"tuple"}:
        return tuple(dec_value(x, f"{what}[{k}]") for k, x in enumerate(as_list(v["tuple"], what)))
    if isinstance(v, dict) and set(v) == {"schedule", "state"}:
        return _dec_schedule(v, what)
    raise CheckpointError(f"{what} is {v!r:.60}: not a number, string, list, tuple or schedule")


def enc_rule(r):
    if isinstance(r, Chain):
        return {"chain": [enc_rule(m) for m in r.rules]}
    for k, v in r._values.items():
        if callable(v) and not isinstance(v, (Schedule, type)):  # code, not data: it cannot be written by value
            raise ValueError(f"save: {type(r).__name__}: hyperparameter {k} is driven by the function "
                             f"{getattr(v, '__qualname__', None) or repr(v)}, which a checkpoint cannot hold; use a "
                             f"numbaopt schedule (numbaopt.schedules: saved by value), or "
                             f"numbaopt.adjust(state, {k}=<number>) before saving and set the function again "
                             f"after load; nothing was written")
    out = {"rule": qual(type(r)), "values": {k: enc_value(v) for k, v in r._values.items()}}
    if r.span is not None:  # a tree-scope reduction's span name (absent otherwise: older readers see no change)
        out["span"] = r.span
    return out


def dec_rule(d, what: str = "rule"):
    """The rule (or chain) a header describes, built through its constructor."""
    if isinstance(d, dict) and "chain" in d:
        as_dict(d, what, ("chain",))
        members = [dec_rule(m, f"{what} member {k}") for k, m in enumerate(as_list(d["chain"], f"{what} chain"))]
        try:
            return Chain(*members)
        except (TypeError, ValueError) as e:  # the stages out of place
            raise CheckpointError(f"{what}: {e}") from None
    as_dict(d, what, ("rule", "values", "span") if isinstance(d, dict) and "span" in d else ("rule", "values"))
    cls = lookup(d["rule"], Rule, what)
    values = as_dict(d["values"], f"{what} values")
    unknown = sorted(set(values) - set(cls._hypers) - set(cls._options))
    if unknown:
        raise CheckpointError(f"{what}: {cls.__name__} has no hyperparameter or option {unknown[:8]}")
    kwargs = {k: dec_value(v, f"{what} {k}") for k, v in values.items()}
    if "span" in d:
        kwargs["span"] = as_str(d["span"], f"{what} span")
    rule = _construct(cls, kwargs, what)
    if not isinstance(rule, Rule):
        raise CheckpointError(f"{what}: {cls.__name__}(...) made {type(rule).__name__}, not a rule")
    return rule
