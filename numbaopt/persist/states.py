"""``save(path, state)`` / ``load(path)``: a tree's state or one array's, in a portable ``.npz`` file.

A state is a tree's (from ``setup(rule, model)``) or one array's (a :class:`numbaopt.Leaf`, a leaf of a
tree, or a ``DeviceLeaf``: GPU state is copied to host memory on save and back to the current device on
load). The header holds the rules (by import path, with their hyperparameters and options), dtypes, the
tree structure (container types by import path, keys), which leaves are tied, and the frozen flags; the
arrays hold the state, the step counters and the master copies. Loading checks every table against the
others: a corrupt, truncated or inconsistent file is a ``ValueError``.
"""
from __future__ import annotations

import numpy as np

from ..backends.cuda import DeviceGroup, DeviceLeaf, DeviceMember
from ..backends.cuda.arrays import runtime
from ..backends.state import Leaf
from ..compiler import ChainLayout
from ..tree.groups import Group, TreeLeaf
from ..tree.paths import Path
from ..tree.state import StateTree, Structure, core, new_state
from . import files
from .codec import dec_node, dec_rule, enc_node, enc_rule

__all__ = ["save", "load", "DeviceUnavailable"]


class DeviceUnavailable(RuntimeError):
    """The file holds GPU state but this process cannot use a GPU (no numba-cuda, or no device)."""


def _to_device(make, where):
    try:
        runtime()
    except (ImportError, RuntimeError) as e:  # no numba-cuda, no GPU: not a problem of the file
        raise DeviceUnavailable(f"load: {where} is GPU state, which goes back to a GPU: {e}") from None
    return make()


def _array(data, name, shape, dtype, where):
    """``data[name]`` checked to be ``dtype[shape]``."""
    a = data[name]
    if a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
        raise ValueError(f"{where}: {name} is {a.dtype}{list(a.shape)}, expected {np.dtype(dtype)}{list(shape)}")
    return a.copy()


# --------------------------------------------------------------------------------------------------
# one array


def _leaf_entry(leaf, prefix, arrays) -> dict:
    device = isinstance(leaf, (DeviceLeaf, DeviceMember))
    host = leaf.to_host() if device else (leaf.copy() if isinstance(leaf, TreeLeaf) else leaf)
    for k, a in enumerate(host.arrays):
        arrays[f"{prefix}_a{k}"] = np.asarray(a)
    arrays[f"{prefix}_C"] = host.counters
    if host.master is not None:
        arrays[f"{prefix}_master"] = host.master
    return {"rule": enc_rule(host.rule), "shape": list(host.shape), "dtype": host.param_dtype.str,
            "device": device, "n_arrays": len(host.arrays), "master": host.master is not None}


def _leaf_from(d, prefix, data, where):
    rule = dec_rule(d["rule"])
    shape = tuple(int(n) for n in d["shape"])
    size = int(np.prod(shape, dtype=np.int64))
    counters = _array(data, f"{prefix}_C", (4,), np.int64, where)
    master = None
    if d["master"]:
        compute = ChainLayout(rule).compute_dtype(d["dtype"])
        master = _array(data, f"{prefix}_master", (size,), compute, where)
    fresh = Leaf(rule, shape, np.dtype(d["dtype"]), counters=counters, master=master)
    if int(d["n_arrays"]) != len(fresh.arrays):
        raise ValueError(f"{where}: {d['n_arrays']} state arrays, the rule has {len(fresh.arrays)}")
    fresh.arrays = tuple(_array(data, f"{prefix}_a{k}", a.shape, a.dtype, where) for k, a in enumerate(fresh.arrays))
    names = [f"{prefix}_a{k}" for k in range(len(fresh.arrays))] + [f"{prefix}_C"] + \
        ([f"{prefix}_master"] if d["master"] else [])
    if d["device"]:
        if master is not None:
            raise ValueError(f"{where}: GPU state with a master copy")
        return _to_device(lambda: DeviceLeaf.from_host(fresh), where), names
    return fresh, names


# --------------------------------------------------------------------------------------------------
# trees


def _tree_header(c, arrays) -> dict:
    s = c.structure
    for gi, g in enumerate(c.groups):
        for k, a in enumerate(g.arenas):
            arrays[f"g{gi}_a{k}"] = a
        arrays[f"g{gi}_C"] = g.C
        for j, m in enumerate(g.masters):
            if m is not None:
                arrays[f"g{gi}_m{j}"] = m
    devices = []
    for di, dg in enumerate(c.device_groups):
        host = dg.to_host()  # the device state crosses the bus here, once
        for k in range(len(dg.arenas)):
            arrays[f"d{di}_a{k}"] = np.concatenate([np.asarray(lf.arrays[k]).reshape(-1) for lf in host]) \
                if host else np.zeros(0)
        arrays[f"d{di}_ts"], arrays[f"d{di}_skips"] = dg.ts, dg.skips
        devices.append({"rule": enc_rule(dg.rule), "dtype": dg.dtype.str})
    return {
        "format": files.FORMAT, "version": files.VERSION, "kind": "tree",
        "tree": enc_node(s.root), "pos_u": s.pos_u, "pos_param": s.pos_param,
        "units": [{"shape": list(s.u_shape[u]), "dtype": s.u_dtype[u].str, "kind": s.u_kind[u],
                   "tieable": s.u_tieable[u], "group": s.u_group[u], "device": s.u_device[u], "j": s.u_j[u],
                   "positions": s.u_positions[u]} for u in range(s.n_unique)],
        "groups": [{"rule": enc_rule(g.rule), "dtype": g.dtype.str, "members": g.members,
                    "masters": [m is not None for m in g.masters]} for g in c.groups],
        "device_groups": devices,
        "frozen": [bool(f) for f in c.frozen],
    }


def _structure(header) -> Structure:
    s = Structure()
    counter = [0]
    s.root = dec_node(header["tree"], counter)
    npos = counter[0]
    paths = [None] * npos

    def walk(n, p):
        if n.spec is None:
            paths[n.pos] = Path(p)
            return
        for e, ch in zip(n.entries, n.children):
            walk(ch, p + (e,))

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
            for ch in n.children:
                mark(ch)
            if n.trained != any(ch.trained for ch in n.children):
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
    s.u_device = [None if u["device"] is None else int(u["device"]) for u in units]
    s.u_j = [int(u["j"]) for u in units]
    s.u_positions = [[int(p) for p in u["positions"]] for u in units]
    for u, ps in enumerate(s.u_positions):
        if not ps or any(not 0 <= p < npos or s.pos_u[p] != u for p in ps):
            raise ValueError("tie table does not match the positions")
        if (s.u_group[u] is None) == (s.u_device[u] is None):
            raise ValueError("a leaf belongs to no group, or to two")
    if sorted(p for ps in s.u_positions for p in ps) != s.trained_pos:
        raise ValueError("tie table does not match the positions")
    return s


def _build(header, data) -> StateTree:
    s = _structure(header)
    groups, expected = [], set()
    for gi, gd in enumerate(header["groups"]):
        rule = dec_rule(gd["rule"])
        members = [int(u) for u in gd["members"]]
        where = f"group {gi}"
        for j, u in enumerate(members):
            if not 0 <= u < s.n_unique or s.u_group[u] != gi or s.u_j[u] != j:
                raise ValueError("group table does not match the leaves")
        flags = [bool(b) for b in gd["masters"]]
        if len(flags) != len(members):
            raise ValueError(f"{where}: master flags do not match its leaves")
        compute = np.dtype(gd["dtype"])
        masters = [_array(data, f"g{gi}_m{j}", (int(np.prod(s.u_shape[u], dtype=np.int64)),), compute, where)
                   if f else None for j, (u, f) in enumerate(zip(members, flags))]
        for j, (u, m) in enumerate(zip(members, masters)):
            if (m is not None) != (s.u_dtype[u] != compute):
                raise ValueError(f"{where}: leaf {j} is {s.u_dtype[u]}, computed in {compute}: its master copy "
                                 "does not match")
        g = Group(rule, compute, members, [s.u_shape[u] for u in members], [s.u_dtype[u] for u in members], masters)
        if g.layout.compute_dtype(s.u_dtype[members[0]]) != compute:
            raise ValueError(f"{where}: {rule!r} does not compute in {compute}")
        g.arenas = tuple(_array(data, f"g{gi}_a{k}", a.shape, a.dtype, where) for k, a in enumerate(g.arenas))
        g.C = _array(data, f"g{gi}_C", g.C.shape, np.int64, where)
        if len(members):
            g.hp[:] = g.hp_at(int(g.C[0, 0]) + 1, int(g.C[1, 0]) + 1)
        expected |= {f"g{gi}_a{k}" for k in range(len(g.arenas))} | {f"g{gi}_C"}
        expected |= {f"g{gi}_m{j}" for j, f in enumerate(flags) if f}
        groups.append(g)
    device_groups = []
    for di, dd in enumerate(header.get("device_groups", [])):
        rule = dec_rule(dd["rule"])
        dtype = np.dtype(dd["dtype"])
        members = sorted((s.u_j[u], u) for u in range(s.n_unique) if s.u_device[u] == di)
        if [j for j, _ in members] != list(range(len(members))) or not members:
            raise ValueError(f"device group {di}: its leaves do not match the leaf table")
        where = f"state{s.paths[s.u_positions[members[0][1]][0]]}"
        sizes = [int(np.prod(s.u_shape[u], dtype=np.int64)) for _, u in members]
        ts = _array(data, f"d{di}_ts", (len(members),), np.int64, where)
        skips = _array(data, f"d{di}_skips", (len(members),), np.int64, where)
        proto = Leaf(rule, (1,), dtype)
        flat = [_array(data, f"d{di}_a{k}", (sum(sizes),), a.dtype, where) for k, a in enumerate(proto.arrays)]
        offs = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        leaves = [Leaf(rule, s.u_shape[u], dtype, arrays=[a[offs[j]:offs[j + 1]] for a in flat], t=int(ts[j]),
                       skipped=int(skips[j])) for j, u in members]
        device_groups.append(_to_device(lambda leaves=leaves: DeviceGroup.from_host(leaves), where))
        expected |= {f"d{di}_a{k}" for k in range(len(flat))} | {f"d{di}_ts", f"d{di}_skips"}
    if any(u is not None and u >= len(groups) for u in s.u_group) or \
            any(u is not None and u >= len(device_groups) for u in s.u_device):
        raise ValueError("a leaf belongs to no group")
    if set(data) != expected:
        raise ValueError(f"unexpected arrays {sorted(set(data) ^ expected)}")
    s.u_compute = [None if s.u_group[u] is None else groups[s.u_group[u]].dtype for u in range(s.n_unique)]
    frozen = np.array([bool(f) for f in header["frozen"]], dtype=np.bool_)
    if frozen.shape != (s.n_unique,):
        raise ValueError("frozen flags do not match the leaves")
    return new_state(s, groups, device_groups, frozen)


# --------------------------------------------------------------------------------------------------
# the entry points


def save(path, state) -> None:
    """Write ``state`` to ``path`` (``.npz``), atomically.

    ``state`` is a tree's state (from :func:`numbaopt.setup` on a model) or one array's
    (:class:`numbaopt.Leaf`, a leaf of a tree's state, a ``DeviceLeaf``: GPU state is copied to the host).
    """
    arrays = {}
    if isinstance(state, (Leaf, DeviceMember)):
        header = {"format": files.FORMAT, "version": files.VERSION, "kind": "leaf",
                  "leaf": _leaf_entry(state, "leaf", arrays)}
    else:
        if not isinstance(state, StateTree):
            raise TypeError(f"save: expected a state from numbaopt.setup (a tree's or one array's), "
                            f"got {type(state).__name__}")
        header = _tree_header(core(state, "save"), arrays)
    files.write(path, header, arrays)


def load(path):
    """Read a state written by :func:`save` (a tree's state, or one array's ``Leaf``/``DeviceLeaf``).

    A corrupt or incompatible file is a ``ValueError``. GPU state goes back to the current device; without
    numba-cuda or a GPU that is :class:`DeviceUnavailable`, naming the state.
    """
    header, data = files.read(path)
    try:
        kind = header.get("kind", "tree")
        if kind == "leaf":
            leaf, names = _leaf_from(header["leaf"], "leaf", data, "the state")
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
