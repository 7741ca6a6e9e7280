"""``save(path, state)`` / ``load(path)``: optimiser state in a portable ``.npz`` file.

A state is a tree's (from ``setup(rule, model)``) or one array's (a :class:`numbaopt.Leaf`, or a
wrapper's state: ``AccumGradState``, ``MixedPrecisionState``, saved with their inner states). GPU state
(a ``DeviceLeaf``, alone or as a device leaf of a tree) is copied to host memory on save and back to the
current device on load.

The file holds the arrays (per group: the state arenas, step counts and skip counts) and a small JSON
header (``__header__``, UTF-8 bytes): rules by import path with their hyperparameters and options,
dtypes, the tree structure of the state (container types by import path, keys), which leaves are
tied, and frozen flags. No pickles: loading runs no code a file names; the rule (and schedule) classes
named in the header are looked up in modules already imported, and must be :class:`numbaopt.Rule`
(:class:`numbaopt.Schedule`) subclasses.

Writes are atomic: the file is written next to its destination and moved over it with
``os.replace``, so a crash never leaves a half-written file in place of the old one. A corrupt,
truncated or incompatible file is a ``ValueError``.
"""
from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import zipfile

import numpy as np

from .chain import Chain
from .rule import Rule
from .tree import _DC, _DC_FROZEN, _DICT, _LIST, _NT, _TUPLE, ContainerSpec, Node, Path, PathEntry, \
    StateTree, _registry

__all__ = ["save", "load"]

FORMAT = "numbaopt-tree-state"
VERSION = 1

_BUILTIN_SPECS = {s.name: s for s in (_DICT, _LIST, _TUPLE, _NT, _DC, _DC_FROZEN)}


# --------------------------------------------------------------------------------------------------
# encoding


def _enc_key(k):
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
        return ["t", [_enc_key(v) for v in k]]
    raise TypeError(f"save: a container key {k!r} ({type(k).__name__}) cannot be stored; "
                    "keys must be str, int, float, bool, None or tuples of those")


def _dec_key(v):
    tag, val = v
    if tag == "t":
        return tuple(_dec_key(x) for x in val)
    if tag == "i":
        return int(val)
    if tag == "f":
        return float(val)
    if tag == "b":
        return bool(val)
    if tag in ("s", "n"):
        return val
    raise ValueError(f"unknown key tag {tag!r}")


def _enc_node(n):
    if n.spec is None:
        return {"leaf": n.pos}
    return {"spec": n.spec.name, "type": n.tname, "trained": n.trained,
            "entries": [[e.kind, _enc_key(e.key)] for e in n.entries],
            "children": [_enc_node(c) for c in n.children]}


def _dec_node(d, counter):
    n = Node()
    n.lo = counter[0]
    if "leaf" in d:
        if int(d["leaf"]) != counter[0]:
            raise ValueError("leaf positions out of order")
        n.pos = counter[0]
        counter[0] += 1
    else:
        name, tname = str(d["spec"]), str(d["type"])
        spec = _BUILTIN_SPECS.get(name)
        if spec is None:
            spec = next((s for t, s in _registry.items() if s.name == tname), None) \
                or ContainerSpec(name, None, None)
        n.spec, n.tname = spec, tname
        builtins = {"builtins:dict": dict, "builtins:list": list, "builtins:tuple": tuple}
        n.type = builtins.get(tname)
        n.entries = tuple(PathEntry(str(k), _dec_key(v)) for k, v in d["entries"])
        n.children = tuple(_dec_node(c, counter) for c in d["children"])
        if len(n.children) != len(n.entries):
            raise ValueError("entries and children differ in length")
        n.trained = bool(d["trained"])
    n.hi = counter[0]
    return n


def _qual(obj_type) -> str:
    return f"{obj_type.__module__}:{obj_type.__qualname__}"


def _resolve(name: str):
    """The class ``module:qualname`` from a module that is already imported: loading a file never imports
    (runs) a module the file names; a rule of your own loads once its module is imported."""
    mod, _, qual = name.partition(":")
    obj = sys.modules.get(mod)
    if obj is None:
        raise ValueError(f"{name} is in a module that is not imported ({mod}); import it before load")
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _enc_value(v):
    from .schedules import Schedule
    if isinstance(v, Schedule):
        state = {k: _enc_value(x) for k, x in vars(v).items()}
        return {"schedule": _qual(type(v)), "state": state}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, tuple):
        return {"tuple": [_enc_value(x) for x in v]}
    if isinstance(v, list):
        return [_enc_value(x) for x in v]
    raise TypeError(f"save: hyperparameter value {v!r} cannot be stored")


def _dec_value(v):
    if isinstance(v, dict) and "schedule" in v:
        from .schedules import Schedule
        cls = _resolve(v["schedule"])
        if not (isinstance(cls, type) and issubclass(cls, Schedule)):
            raise ValueError(f"{v['schedule']} is not a numbaopt Schedule")
        obj = cls.__new__(cls)
        obj.__dict__.update({k: _dec_value(x) for k, x in v["state"].items()})
        return obj
    if isinstance(v, dict) and "tuple" in v:
        return tuple(_dec_value(x) for x in v["tuple"])
    if isinstance(v, list):
        return [_dec_value(x) for x in v]
    return v


def _enc_rule(r):
    if isinstance(r, Chain):
        return {"chain": [_enc_rule(m) for m in r.rules]}
    return {"rule": _qual(type(r)), "values": {k: _enc_value(v) for k, v in r._values.items()}}


def _dec_rule(d):
    if "chain" in d:
        return Chain(*[_dec_rule(m) for m in d["chain"]])
    cls = _resolve(d["rule"])
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise ValueError(f"{d['rule']} is not a numbaopt Rule")
    return cls(**{k: _dec_value(v) for k, v in d["values"].items()})


# --------------------------------------------------------------------------------------------------


class DeviceUnavailable(RuntimeError):
    """The file holds GPU state but this process cannot use a GPU (no numba-cuda, or no device)."""


def _is_device(leaf) -> bool:
    from .backends.cuda import DeviceLeaf, DeviceMember
    return isinstance(leaf, (DeviceLeaf, DeviceMember))


def _leaf_entry(leaf, prefix, arrays) -> dict:
    """The header entry of one array's state; its arrays go into ``arrays`` under ``prefix``."""
    device = _is_device(leaf)
    host = leaf.to_host() if device else leaf  # a device state crosses the bus here, once
    for k, a in enumerate(host.arrays):
        arrays[f"{prefix}_a{k}"] = np.asarray(a)
    return {"rule": _enc_rule(host.rule), "shape": list(host.shape), "dtype": host.dtype.str,
            "t": int(host.t), "skipped": int(host.skipped), "device": device, "n_arrays": len(host.arrays)}


def _state_entry(h, prefix, arrays) -> dict:
    """The header entry of one array's state of any kind: a (device) leaf, or a wrapper's state holding
    an inner state (``AccumGrad``: the running sum; ``MixedPrecision``: the master copy)."""
    from .wrappers import AccumGradState, MixedPrecisionState
    if isinstance(h, AccumGradState):
        arrays[f"{prefix}_acc"] = h.acc
        return {"wrapper": "AccumGrad", "n": h.wrapper.n, "count": int(h.count),
                "inner": _state_entry(h.inner, f"{prefix}_i", arrays)}
    if isinstance(h, MixedPrecisionState):
        arrays[f"{prefix}_master"] = h.master
        return {"wrapper": "MixedPrecision", "dtype": h.master.dtype.str, "param_dtype": h.param_dtype.str,
                "inner": _state_entry(h.inner, f"{prefix}_i", arrays)}
    from .leaf import Leaf
    if isinstance(h, Leaf) or _is_device(h):
        return _leaf_entry(h, prefix, arrays)
    raise NotImplementedError(f"a {type(h).__name__} cannot be saved")


def _state_from_entry(d, prefix, data, where):
    """``(state, rule, array names)`` from :func:`_state_entry`'s output (host states only)."""
    from .wrappers import AccumGrad, AccumGradState, MixedPrecision, MixedPrecisionState
    kind = d.get("wrapper")
    if kind is None:
        leaf, names = _leaf_from_entry(d, prefix, data, where, to_device=False)
        if d["device"]:
            raise ValueError(f"{where}: GPU state inside a wrapper")
        return leaf, leaf.rule, names
    inner, inner_rule, names = _state_from_entry(d["inner"], f"{prefix}_i", data, where)
    if kind == "AccumGrad":
        acc = data[f"{prefix}_acc"]
        wrapper = AccumGrad(int(d["n"]), inner_rule)
        count = int(d["count"])
        if (acc.shape, acc.dtype) != tuple(_state_shape_dtype(inner)):
            raise ValueError(f"{where}: AccumGrad sum {acc.dtype}{acc.shape} does not match its inner state")
        if not 0 <= count < wrapper.n:
            raise ValueError(f"{where}: AccumGrad count {count} outside [0, {wrapper.n})")
        return AccumGradState(wrapper, inner, acc.copy(), count), wrapper, names + [f"{prefix}_acc"]
    if kind == "MixedPrecision":
        master = data[f"{prefix}_master"]
        if master.dtype != np.dtype(d["dtype"]):
            raise ValueError(f"{where}: master copy {master.dtype}, expected {np.dtype(d['dtype'])}")
        if (master.shape, master.dtype) != tuple(_state_shape_dtype(inner)):
            raise ValueError(f"{where}: master copy {master.dtype}{master.shape} does not match its inner state")
        wrapper = MixedPrecision(master.dtype, inner_rule)
        state = MixedPrecisionState(wrapper, inner, master.copy(), np.dtype(d["param_dtype"]))
        return state, wrapper, names + [f"{prefix}_master"]
    raise ValueError(f"{where}: unknown wrapper {kind!r}")


def _state_shape_dtype(h):
    from .wrappers import AccumGradState, MixedPrecisionState
    if isinstance(h, AccumGradState):
        return h.acc.shape, h.acc.dtype
    if isinstance(h, MixedPrecisionState):
        return h.master.shape, h.param_dtype
    return tuple(h.shape), h.dtype


def _leaf_from_entry(d, prefix, data, where, to_device=True):
    from .leaf import Leaf
    rule = _dec_rule(d["rule"])
    shape = tuple(int(n) for n in d["shape"])
    fresh = Leaf(rule, shape, np.dtype(d["dtype"]), t=int(d["t"]), skipped=int(d["skipped"]))
    if int(d["n_arrays"]) != len(fresh.arrays):
        raise ValueError(f"{where}: {d['n_arrays']} state arrays, the rule has {len(fresh.arrays)}")
    for k, a in enumerate(fresh.arrays):
        src = data[f"{prefix}_a{k}"]
        if src.shape != a.shape or src.dtype != a.dtype:
            raise ValueError(f"{where} state array {k}: {src.dtype}{src.shape}, expected {a.dtype}{a.shape}")
        a[...] = src
    names = [f"{prefix}_a{k}" for k in range(len(fresh.arrays))]
    if not (d["device"] and to_device):
        return fresh, names
    from .backends.cuda import DeviceLeaf
    return _to_device(lambda: DeviceLeaf.from_host(fresh), where), names


def _to_device(make, where):
    from .backends.cuda import _codegen
    try:
        _codegen()
    except (ImportError, RuntimeError) as e:  # no numba-cuda, no GPU: not a problem of the file
        raise DeviceUnavailable(f"load: {where} is GPU state, which goes back to a GPU: {e}") from None
    return make()


def _write_atomic(path, arrays) -> None:
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".numbaopt-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save(path, state) -> None:
    """Write ``state`` to ``path`` (``.npz``), atomically.

    ``state`` is a tree's state (from :func:`numbaopt.setup` on a model) or one array's
    (:class:`numbaopt.Leaf`, a wrapper's state, or a ``DeviceLeaf``: GPU state is copied to the host).
    """
    from .leaf import Leaf
    from .wrappers import AccumGradState, MixedPrecisionState
    if isinstance(state, (Leaf, AccumGradState, MixedPrecisionState)) or _is_device(state):
        arrays = {}
        header = {"format": FORMAT, "version": VERSION, "kind": "leaf", "leaf": _state_entry(state, "leaf", arrays)}
        arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        _write_atomic(path, arrays)
        return
    if not isinstance(state, StateTree):
        raise TypeError(f"save: expected a state from numbaopt.setup (a tree's or one array's), "
                        f"got {type(state).__name__}")
    s = state._s
    arrays = {}
    host_units = []
    for u, h in state._host.items():
        try:
            host_units.append({"u": u, "leaf": _state_entry(h, f"h{u}", arrays)})
        except NotImplementedError as e:
            raise NotImplementedError(f"save: state{s.paths[s.u_positions[u][0]]}: {e}") from None
    header = {
        "format": FORMAT, "version": VERSION, "kind": "tree", "host_units": host_units,
        "tree": _enc_node(s.root),
        "pos_u": s.pos_u, "pos_param": s.pos_param,
        "units": [{"shape": list(s.u_shape[u]), "dtype": s.u_dtype[u].str, "kind": s.u_kind[u],
                   "tieable": s.u_tieable[u], "group": s.u_group[u], "j": s.u_j[u],
                   "positions": s.u_positions[u]} for u in range(s.n_unique)],
        "groups": [{"rule": _enc_rule(g.rule), "dtype": g.dtype.str, "members": g.members}
                   for g in state._groups],
        "frozen": [bool(f) for f in state._frozen],
    }
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    for gi, g in enumerate(state._groups):
        for k, a in enumerate(g.arenas):
            arrays[f"g{gi}_a{k}"] = a
        arrays[f"g{gi}_ts"] = g.ts
        arrays[f"g{gi}_skipped"] = g.skipped
    _write_atomic(path, arrays)


def load(path):
    """Read a state written by :func:`save` (a tree's state, or one array's ``Leaf``/``DeviceLeaf``).

    A corrupt or incompatible file is a ``ValueError``. GPU state goes back to the current device; without
    numba-cuda or a GPU that is the backend's ``ImportError``/``RuntimeError``, naming the state.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        header = json.loads(bytes(data.pop("__header__")).decode())
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"load: {path} is not a readable numbaopt state file ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"load: {path} is not a numbaopt tree state file")
    if header.get("version") != VERSION:
        raise ValueError(f"load: {path} has format version {header.get('version')}, this numbaopt reads {VERSION}")
    try:
        kind = header.get("kind", "tree")
        if kind == "leaf" and "wrapper" in header["leaf"]:
            leaf, _, names = _state_from_entry(header["leaf"], "leaf", data, "the state")
            if set(data) != set(names):
                raise ValueError(f"unexpected arrays {sorted(set(data) ^ set(names))}")
            return leaf
        if kind == "leaf":
            leaf, names = _leaf_from_entry(header["leaf"], "leaf", data, "the state")
            if set(data) != set(names):
                raise ValueError(f"unexpected arrays {sorted(set(data) ^ set(names))}")
            return leaf
        if kind != "tree":
            raise ValueError(f"unknown state kind {kind!r}")
        return _build(header, data)
    except DeviceUnavailable:
        raise
    except (KeyError, TypeError, IndexError, AttributeError, ImportError) as e:
        raise ValueError(f"load: {path} is inconsistent or refers to unknown code ({type(e).__name__}: {e})") \
            from None
    except ValueError as e:
        raise ValueError(f"load: {path}: {e}") from None


def _build(header, data) -> StateTree:
    from .engine import Group, Structure
    s = Structure()
    counter = [0]
    s.root = _dec_node(header["tree"], counter)
    npos = counter[0]
    paths = [None] * npos

    def walk(n, p):
        if n.spec is None:
            paths[n.pos] = Path(p)
            return
        for e, c in zip(n.entries, n.children):
            walk(c, p + (e,))

    walk(s.root, ())
    s.paths = paths
    s.pos_u = [None if u is None else int(u) for u in header["pos_u"]]
    s.pos_param = [bool(b) for b in header["pos_param"]]
    if len(s.pos_u) != npos or len(s.pos_param) != npos:
        raise ValueError("position tables do not match the tree")

    def mark(n):
        if n.spec is None:
            n.trained = s.pos_u[n.pos] is not None
        else:
            for c in n.children:
                mark(c)
            if n.trained != any(c.trained for c in n.children):
                raise ValueError("trained flags do not match the positions")

    mark(s.root)
    s.trained_pos = [p for p, u in enumerate(s.pos_u) if u is not None]
    units = header["units"]
    s.n_unique = len(units)
    s.u_shape = [tuple(int(d) for d in u["shape"]) for u in units]
    s.u_dtype = [np.dtype(u["dtype"]) for u in units]
    s.u_kind = [str(u["kind"]) for u in units]
    s.u_tieable = [bool(u["tieable"]) for u in units]
    s.u_group = [None if u["group"] is None else int(u["group"]) for u in units]
    s.u_j = [None if u["j"] is None else int(u["j"]) for u in units]
    s.u_positions = [[int(p) for p in u["positions"]] for u in units]
    s.u_host = [False] * s.n_unique
    for u, ps in enumerate(s.u_positions):
        for p in ps:
            if s.pos_u[p] != u:
                raise ValueError("tie table does not match the positions")
    groups = []
    for gi, gd in enumerate(header["groups"]):
        rule = _dec_rule(gd["rule"])
        members = [int(u) for u in gd["members"]]
        dtype = np.dtype(gd["dtype"])
        for j, u in enumerate(members):
            if s.u_group[u] != gi or s.u_j[u] != j or s.u_dtype[u] != dtype:
                raise ValueError("group table does not match the leaves")
        sizes = [int(np.prod(s.u_shape[u], dtype=np.int64)) for u in members]
        g = Group(rule, dtype, members, sizes)
        for k, a in enumerate(g.arenas):
            src = data[f"g{gi}_a{k}"]
            if src.shape != a.shape or src.dtype != a.dtype:
                raise ValueError(f"group {gi} state array {k}: {src.dtype}{src.shape}, expected {a.dtype}{a.shape}")
            a[...] = src
        for name in ("ts", "skipped"):
            src = data[f"g{gi}_{name}"]
            if src.shape != g.ts.shape or src.dtype != np.int64:
                raise ValueError(f"group {gi} {name}: {src.dtype}{src.shape}, expected int64{g.ts.shape}")
            getattr(g, name)[...] = src
        if len(g.ts):
            g.layout.fill_hyper(g.hp, int(g.ts[0]) + 1)
        groups.append(g)
    expected = {f"g{gi}_{k}" for gi, g in enumerate(groups) for k in
                [f"a{k}" for k in range(len(g.arenas))] + ["ts", "skipped"]}
    host = {}
    device = []  # the tree's device leaves, regrouped as setup groups them: by (rule, dtype)
    for hd in header.get("host_units", []):
        u = int(hd["u"])
        if not 0 <= u < s.n_unique or s.u_group[u] is not None or u in host:
            raise ValueError("host unit table does not match the leaves")
        where = f"state{s.paths[s.u_positions[u][0]]}"
        if "wrapper" in hd["leaf"]:
            leaf, _, names = _state_from_entry(hd["leaf"], f"h{u}", data, where)
        else:
            leaf, names = _leaf_from_entry(hd["leaf"], f"h{u}", data, where, to_device=False)
        shape, dtype = _state_shape_dtype(leaf)
        if tuple(shape) != s.u_shape[u] or dtype != s.u_dtype[u]:
            raise ValueError(f"{where}: shape/dtype do not match the leaf table")
        if hd["leaf"].get("device"):
            bucket = next((b for b in device if b[0] == leaf.rule and b[1] == leaf.dtype), None)
            if bucket is None:
                bucket = (leaf.rule, leaf.dtype, [])
                device.append(bucket)
            bucket[2].append((u, leaf, where))
        host[u] = leaf
        s.u_host[u] = True
        expected.update(names)
    for _, _, members in device:
        from .backends.cuda import DeviceGroup, DeviceMember
        grp = _to_device(lambda: DeviceGroup.from_host([lf for _, lf, _ in members]), members[0][2])
        for j, (u, _, _) in enumerate(members):
            host[u] = DeviceMember(grp, j)
    if any(s.u_group[u] is None and u not in host for u in range(s.n_unique)):
        raise ValueError("a leaf belongs to no group")
    if set(data) != expected:
        raise ValueError(f"unexpected arrays {sorted(set(data) ^ expected)}")
    frozen = np.array([bool(f) for f in header["frozen"]], dtype=np.bool_)
    if frozen.shape != (s.n_unique,):
        raise ValueError("frozen flags do not match the leaves")
    return StateTree(s, groups, frozen, host)
