"""Encoding a state's description for the file header (JSON): keys, tree nodes, hyperparameter values, rules.

No pickles: a rule or schedule is stored as its import path and values, and decoding looks the class up
in modules already imported (a file never makes ``load`` import, i.e. run, a module it names).
"""
from __future__ import annotations

import sys

import numpy as np

from ..rules.base import Rule
from ..rules.chain import Chain
from ..schedules import Schedule
from ..tree.containers import BUILTIN_SPECS, ContainerSpec, registry
from ..tree.paths import PathEntry
from ..tree.structure import Node

__all__ = ["enc_key", "dec_key", "enc_node", "dec_node", "qual", "resolve", "enc_value", "dec_value", "enc_rule",
           "dec_rule"]


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


def dec_key(v):
    tag, val = v
    if tag == "t":
        return tuple(dec_key(x) for x in val)
    if tag == "i":
        return int(val)
    if tag == "f":
        return float(val)
    if tag == "b":
        return bool(val)
    if tag in ("s", "n"):
        return val
    raise ValueError(f"unknown key tag {tag!r}")


def enc_node(n):
    if n.spec is None:
        return {"leaf": n.pos}
    return {"spec": n.spec.name, "type": n.tname, "trained": n.trained,
            "entries": [[e.kind, enc_key(e.key)] for e in n.entries],
            "children": [enc_node(c) for c in n.children]}


def dec_node(d, counter):
    n = Node()
    n.lo = counter[0]
    if "leaf" in d:
        if int(d["leaf"]) != counter[0]:
            raise ValueError("leaf positions out of order")
        n.pos = counter[0]
        counter[0] += 1
    else:
        name, tname = str(d["spec"]), str(d["type"])
        spec = BUILTIN_SPECS.get(name)
        if spec is None:
            spec = next((s for t, s in registry.items() if s.name == tname), None) \
                or ContainerSpec(name, None, None)
        n.spec, n.tname = spec, tname
        builtins = {"builtins:dict": dict, "builtins:list": list, "builtins:tuple": tuple}
        n.type = builtins.get(tname)
        n.entries = tuple(PathEntry(str(k), dec_key(v)) for k, v in d["entries"])
        n.children = tuple(dec_node(c, counter) for c in d["children"])
        if len(n.children) != len(n.entries):
            raise ValueError("entries and children differ in length")
        n.trained = bool(d["trained"])
    n.hi = counter[0]
    return n


def qual(obj_type) -> str:
    return f"{obj_type.__module__}:{obj_type.__qualname__}"


def resolve(name: str):
    """The class ``module:qualname`` from a module that is already imported: loading a file never imports
    (runs) a module the file names; a rule of your own loads once its module is imported."""
    mod, _, qual = name.partition(":")
    obj = sys.modules.get(mod)
    if obj is None:
        raise ValueError(f"{name} is in a module that is not imported ({mod}); import it before load")
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


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


def dec_value(v):
    if isinstance(v, dict) and "schedule" in v:
        cls = resolve(v["schedule"])
        if not (isinstance(cls, type) and issubclass(cls, Schedule)):
            raise ValueError(f"{v['schedule']} is not a numbaopt Schedule")
        obj = cls.__new__(cls)
        obj.__dict__.update({k: dec_value(x) for k, x in v["state"].items()})
        return obj
    if isinstance(v, dict) and "tuple" in v:
        return tuple(dec_value(x) for x in v["tuple"])
    if isinstance(v, list):
        return [dec_value(x) for x in v]
    return v


def enc_rule(r):
    if isinstance(r, Chain):
        return {"chain": [enc_rule(m) for m in r.rules]}
    return {"rule": qual(type(r)), "values": {k: enc_value(v) for k, v in r._values.items()}}


def dec_rule(d):
    if "chain" in d:
        return Chain(*[dec_rule(m) for m in d["chain"]])
    cls = resolve(d["rule"])
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise ValueError(f"{d['rule']} is not a numbaopt Rule")
    return cls(**{k: dec_value(v) for k, v in d["values"].items()})
