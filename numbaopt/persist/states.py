"""``save(path, state)`` / ``load(path)``: a tree's state or one array's, in a portable ``.npz`` file.

A state is a tree's (from ``setup(rule, model)``) or one array's (a :class:`numbaopt.Leaf`, a leaf of a
tree, or a ``DeviceLeaf``: GPU state is copied to host memory on save and back to the current device on
load). The header holds the rules (by ``module:qualname``, with their hyperparameters and options),
dtypes, the tree structure (container types by name, keys), which leaves are tied, and the frozen flags;
the arrays hold the state, the step counters and the master copies.

What ``load`` promises: every file it refuses is a :class:`CheckpointError` (a ``ValueError``) naming the
file and what is wrong (which leaf, group or array); only a file that cannot be opened raises otherwise
(``FileNotFoundError``, ``PermissionError``), and GPU state without a GPU is :class:`DeviceUnavailable`.
Every table of the header is checked against the others and against the arrays (:mod:`.checks`), and
every size against the arrays the file really holds, before anything is allocated; the step counters
are held to the kernels' invariants; no module is imported. So a state it returns has consistent tables,
arrays of the right dtypes and sizes, and counters the kernels could have reached; the numbers in its
arrays and its hyperparameters (each within its rule's domain) are the file's: they are not, and cannot
be, checked against what training would have produced. ``save`` refuses (``ValueError``, nothing written)
a state ``load`` would refuse, so every file ``save`` writes loads.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np

from ..backends.cuda import DeviceGroup, DeviceLeaf, DeviceMember
from ..backends.cuda.arrays import runtime
from ..backends.state import Leaf, check_param_dtype, enter, leave
from ..compiler import ChainLayout
from ..tree.groups import Group, TreeLeaf
from ..tree.paths import Path
from ..tree.setup import check_scopes
from ..tree.state import StateTree, Structure, core, new_state
from . import files
from .checks import (MAX_COUNT, MAX_ELEMENTS, as_bool, as_dict, as_int, as_list, as_str, check_counters,
                     compute_dtype, counter_problem, elements, param_dtype, shape_of)
from .codec import dec_node, dec_rule, enc_node, enc_rule
from .files import CheckpointError

__all__ = ["save", "load", "DeviceUnavailable", "reading", "encode", "decode", "structure_of", "at",
           "DECODE_ERRORS"]

_LEAF_FILE = ("format", "version", "kind", "leaf")
_TREE_FILE = ("format", "version", "kind", "tree", "pos_u", "pos_param", "units", "groups", "device_groups",
              "frozen")
_UNIT = ("shape", "dtype", "kind", "tieable", "group", "device", "j", "positions")
#: what code reading a damaged header may raise before one of its own checks does (they all become a
#: CheckpointError; MemoryError is not among them: the checks keep a file from causing one)
DECODE_ERRORS = (KeyError, TypeError, IndexError, AttributeError, ValueError, ArithmeticError, RecursionError,
                 NotImplementedError)


class DeviceUnavailable(RuntimeError):
    """The file holds GPU state but this process cannot use a GPU (no numba-cuda, or no device)."""


@contextmanager
def at(where: str):
    """Refusals inside name ``where`` (the leaf, group or table)."""
    try:
        yield
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    except DECODE_ERRORS as e:
        raise CheckpointError(f"{where}: {e}" if isinstance(e, (TypeError, ValueError)) else
                              f"{where}: {type(e).__name__}: {e}") from None


def _to_device(make, where):
    try:
        runtime()
    except (ImportError, RuntimeError) as e:  # no numba-cuda, no GPU: not a problem of the file
        raise DeviceUnavailable(f"load: {where} is GPU state, which goes back to a GPU: {e}") from None
    return make()


def _array(data, name, shape, dtype):
    """``data[name]`` checked to be ``dtype[shape]`` (a fresh array of the file's: no copy needed)."""
    a = data.get(name)
    if a is None:
        raise CheckpointError(f"array {name} is missing")
    if a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
        raise CheckpointError(f"{name} is {a.dtype}{list(a.shape)}, expected {np.dtype(dtype)}{list(shape)}")
    return a


def _same_arrays(data, expected) -> None:
    if set(data) != set(expected):
        missing, extra = sorted(set(expected) - set(data)), sorted(set(data) - set(expected))
        raise CheckpointError("arrays " + "; ".join(([f"missing {missing[:8]}"] if missing else []) +
                                                    ([f"unexpected {extra[:8]}"] if extra else [])))


def _complex_ok(rule, dtype) -> None:
    if dtype.kind == "c":
        bad = [type(r).__name__ for r in rule.rules if not type(r).supports_complex]
        if bad:
            raise CheckpointError(f"{bad[0]} does not support complex parameters (dtype {dtype})")


def _save_check(counters, layout, where) -> None:
    problem = counter_problem(counters, layout)
    if problem is not None:
        raise ValueError(f"save: {where}: {problem}; a file of it would not load")


# --------------------------------------------------------------------------------------------------
# one array


def _leaf_entry(leaf, prefix, arrays) -> dict:
    device = isinstance(leaf, (DeviceLeaf, DeviceMember))
    host = leaf.to_host() if device else (leaf.copy() if isinstance(leaf, TreeLeaf) else leaf)
    _save_check(host.counters, host.layout, "the state")
    saved = _saved(host.arrays, host.layout)
    for k, a in enumerate(saved):
        arrays[f"{prefix}_a{k}"] = np.asarray(a)
    arrays[f"{prefix}_C"] = host.counters
    if host.master is not None:
        arrays[f"{prefix}_master"] = host.master
    return {"rule": enc_rule(host.rule), "shape": list(host.shape), "dtype": host.param_dtype.str,
            "device": device, "n_arrays": len(saved), "master": host.master is not None}


def _saved(arrays, layout) -> tuple:
    """The arrays a file holds: the element and unit states (an axis reduction's geometry table is not state: it
    is made again from the shapes on load)."""
    return tuple(arrays[:layout.n_state + layout.n_unit])


def _unit_arrays(data, name, layout, shapes, compute) -> list:
    """The unit-state arrays of leaves of ``shapes`` from the file (``{name}{k}``, after the element states), each
    checked against the sizes the layout gives those shapes, then the geometry table made afresh."""
    if not layout.units:
        return []
    fresh = layout.new_units([tuple(sh) for sh in shapes], compute)  # O(rows + cols): small
    out = [_array(data, f"{name}{layout.n_state + u}", fresh[u].shape, fresh[u].dtype) for u in range(layout.n_unit)]
    return out + [fresh[-1]]


def _leaf_from(d, data):
    d = as_dict(d, "its description", ("rule", "shape", "dtype", "device", "n_arrays", "master"))
    rule = dec_rule(d["rule"])
    layout = ChainLayout(rule)
    shape = shape_of(d["shape"], "shape")
    size = elements(shape)
    pdt = param_dtype(d["dtype"], "dtype")
    compute = check_param_dtype(pdt, "its parameter", layout)
    _complex_ok(rule, compute)
    n_arrays = as_int(d["n_arrays"], "n_arrays")
    if n_arrays != layout.n_state + layout.n_unit:
        raise CheckpointError(f"{n_arrays} state arrays, {rule!r} has {layout.n_state + layout.n_unit}")
    has_master, device = as_bool(d["master"], "master"), as_bool(d["device"], "device")
    if has_master != (pdt != compute):
        raise CheckpointError(f"a {pdt} parameter computed in {compute} " +
                              ("has no master copy" if pdt != compute else "with a master copy"))
    if device and has_master:
        raise CheckpointError("GPU state with a master copy")
    _same_arrays(data, [f"leaf_a{k}" for k in range(n_arrays)] + ["leaf_C"] + (["leaf_master"] if has_master else []))
    state = [_array(data, f"leaf_a{k}", (size,), dt) for k, dt in enumerate(layout.state_dtypes(compute))]
    state += _unit_arrays(data, "leaf_a", layout, [shape], compute)
    counters = _array(data, "leaf_C", (4,), np.int64)
    check_counters(counters, layout, "leaf_C")
    master = _array(data, "leaf_master", (size,), compute) if has_master else None
    leaf = Leaf(rule, shape, pdt, arrays=state, counters=counters, master=master)  # allocates nothing more
    if device:
        return _to_device(lambda: DeviceLeaf.from_host(leaf), "the state")
    return leaf


# --------------------------------------------------------------------------------------------------
# trees


def _tree_header(c, arrays) -> dict:
    s = c.structure
    for gi, g in enumerate(c.groups):
        for j, u in enumerate(g.members):
            _save_check(g.C[:, j], g.layout, s.where(u, "state"))
        for k, a in enumerate(_saved(g.arenas, g.layout)):
            arrays[f"g{gi}_a{k}"] = a
        arrays[f"g{gi}_C"] = g.C
        for j, m in enumerate(g.masters):
            if m is not None:
                arrays[f"g{gi}_m{j}"] = m
    devices = []
    for di, dg in enumerate(c.device_groups):
        if not all(0 <= int(v) <= MAX_COUNT for v in list(dg.ts) + list(dg.skips)):
            raise ValueError(f"save: device group {di}: a step counter is outside [0, 2**53]")
        host = dg.to_host()  # the device state crosses the bus here, once
        for k in range(dg.layout.n_state + dg.layout.n_unit):  # not the geometry table (made again on load)
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


def _units(s, units, npos) -> None:
    s.n_unique = len(units)
    s.u_shape, s.u_dtype, s.u_kind, s.u_tieable, s.u_group, s.u_device, s.u_j, s.u_positions = \
        [], [], [], [], [], [], [], []
    for u, d in enumerate(units):
        what = f"unit {u}"
        d = as_dict(d, what, _UNIT)
        s.u_shape.append(shape_of(d["shape"], f"{what} shape"))
        s.u_dtype.append(param_dtype(d["dtype"], f"{what} dtype"))
        s.u_kind.append(as_str(d["kind"], f"{what} kind"))
        s.u_tieable.append(as_bool(d["tieable"], f"{what} tieable"))
        s.u_group.append(None if d["group"] is None else as_int(d["group"], f"{what} group"))
        s.u_device.append(None if d["device"] is None else as_int(d["device"], f"{what} device"))
        s.u_j.append(as_int(d["j"], f"{what} j"))
        ps = [as_int(p, f"{what} position", 0, npos - 1) for p in as_list(d["positions"], f"{what} positions")]
        s.u_positions.append(ps)
        if not ps or any(s.pos_u[p] != u for p in ps):
            raise CheckpointError(f"{what}: the tie table does not match the positions")
        if len(ps) > 1 and not s.u_tieable[u]:
            raise CheckpointError(f"{what}: tied at {len(ps)} positions but not tieable")
        if (s.u_group[u] is None) == (s.u_device[u] is None):
            raise CheckpointError(f"{what} belongs to no group, or to two")
    if sorted(p for ps in s.u_positions for p in ps) != s.trained_pos:
        raise CheckpointError("the tie table does not match the positions")


def structure_of(header) -> Structure:
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
    units = as_list(header["units"], "units")
    s.pos_u = [None if u is None else as_int(u, f"pos_u[{p}]", 0, len(units) - 1)
               for p, u in enumerate(as_list(header["pos_u"], "pos_u", npos))]
    s.pos_param = [as_bool(b, f"pos_param[{p}]") for p, b in enumerate(as_list(header["pos_param"], "pos_param",
                                                                                 npos))]
    for p, u in enumerate(s.pos_u):
        if u is not None and not s.pos_param[p]:
            raise CheckpointError(f"state{paths[p]} is trained but not a parameter")

    def mark(n):
        if n.spec is None:
            n.trained = s.pos_u[n.pos] is not None
        else:
            for ch in n.children:
                mark(ch)
            if n.trained != any(ch.trained for ch in n.children):
                raise CheckpointError("the trained flags do not match the positions")

    mark(s.root)
    s.trained_pos = [p for p, u in enumerate(s.pos_u) if u is not None]
    _units(s, units, npos)
    return s


def _group_plan(s, gi, gd, data):
    """Everything of host group ``gi`` checked against the leaf table and the arrays (nothing allocated):
    ``(Group arguments, arenas, counters)`` and the names of its arrays."""
    gd = as_dict(gd, "its description", ("rule", "dtype", "members", "masters"))
    rule = dec_rule(gd["rule"])
    layout = ChainLayout(rule)
    compute = compute_dtype(gd["dtype"], "dtype")
    _complex_ok(rule, compute)
    members = [as_int(u, f"members[{j}]", 0, s.n_unique - 1) for j, u in enumerate(as_list(gd["members"], "members"))]
    if any(s.u_group[u] != gi or s.u_j[u] != j for j, u in enumerate(members)) or \
            len(members) != sum(1 for g in s.u_group if g == gi):
        raise CheckpointError("its members do not match the leaf table")
    flags = [as_bool(b, "masters[]") for b in as_list(gd["masters"], "masters", len(members))]
    for j, u in enumerate(members):
        where = s.where(u, "state")
        got = check_param_dtype(s.u_dtype[u], where, layout)
        if got != compute:
            raise CheckpointError(f"{where} is {s.u_dtype[u]}, which {rule!r} computes in {got}, not {compute}")
        if flags[j] != (s.u_dtype[u] != compute):
            raise CheckpointError(f"{where} is {s.u_dtype[u]}, computed in {compute}: its master copy flag does not "
                                  "match")
    sizes = [elements(s.u_shape[u]) for u in members]
    if sum(sizes) > MAX_ELEMENTS:
        raise CheckpointError(f"its leaves have {sum(sizes)} elements (at most 2**48)")
    arenas = [_array(data, f"g{gi}_a{k}", (sum(sizes),), dt) for k, dt in enumerate(layout.state_dtypes(compute))]
    arenas += _unit_arrays(data, f"g{gi}_a", layout, [s.u_shape[u] for u in members], compute)
    C = _array(data, f"g{gi}_C", (4, len(members)), np.int64)
    for j, u in enumerate(members):
        check_counters(C[:, j], layout, f"{s.where(u, 'state')} (g{gi}_C[:, {j}])")
    masters = [_array(data, f"g{gi}_m{j}", (n,), compute) if f else None for j, (n, f) in enumerate(zip(sizes, flags))]
    names = {f"g{gi}_a{k}" for k in range(layout.n_state + layout.n_unit)} | {f"g{gi}_C"}
    names |= {f"g{gi}_m{j}" for j, f in enumerate(flags) if f}
    args = (rule, compute, members, [s.u_shape[u] for u in members], [s.u_dtype[u] for u in members], masters)
    return (args, arenas, C), names


def _device_plan(s, di, dd, data):
    """Device group ``di`` checked like a host group: the host leaves to send, and its arrays' names."""
    dd = as_dict(dd, "its description", ("rule", "dtype"))
    rule = dec_rule(dd["rule"])
    layout = ChainLayout(rule)
    dtype = compute_dtype(dd["dtype"], "dtype")
    members = sorted((s.u_j[u], u) for u in range(s.n_unique) if s.u_device[u] == di)
    if [j for j, _ in members] != list(range(len(members))) or not members:
        raise CheckpointError("its leaves do not match the leaf table")
    if any(s.u_dtype[u] != dtype for _, u in members):
        raise CheckpointError(f"a leaf that is not {dtype}")
    sizes = [elements(s.u_shape[u]) for _, u in members]
    if sum(sizes) > MAX_ELEMENTS:
        raise CheckpointError(f"its leaves have {sum(sizes)} elements (at most 2**48)")
    ts = _array(data, f"d{di}_ts", (len(members),), np.int64)
    skips = _array(data, f"d{di}_skips", (len(members),), np.int64)
    if not all(0 <= int(v) <= MAX_COUNT for v in list(ts) + list(skips)):
        raise CheckpointError("a step counter is outside [0, 2**53]")
    flat = [_array(data, f"d{di}_a{k}", (sum(sizes),), dt) for k, dt in enumerate(layout.state_dtypes(dtype))]
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    # the unit states (scalar states of reductions, per-unit states of axis reductions): leaf j's where the
    # geometry table of the group says
    shapes = [tuple(s.u_shape[u]) for _, u in members]
    units = _unit_arrays(data, f"d{di}_a", layout, shapes, dtype)

    def arrays_of(j):
        out = [a[offs[j]:offs[j + 1]] for a in flat]
        if units:
            spans = [layout.unit_span(units[-1], j, u) for u in range(layout.n_unit)]
            out += [a[b:e] for a, (b, e) in zip(units[:-1], spans)] + [layout.new_units([shapes[j]], dtype)[-1]]
        return out
    leaves = [(rule, s.u_shape[u], dtype, arrays_of(j), int(ts[j]), int(skips[j])) for j, u in members]
    names = {f"d{di}_a{k}" for k in range(len(flat) + layout.n_unit)} | {f"d{di}_ts", f"d{di}_skips"}
    return (leaves, s.where(members[0][1], "state")), names


def _build(header, data) -> StateTree:
    as_dict(header, "its header", _TREE_FILE)
    with at("the tree"):
        s = structure_of(header)
    group_ds, device_ds = as_list(header["groups"], "groups"), as_list(header["device_groups"], "device_groups")
    if any(g is not None and g >= len(group_ds) for g in s.u_group) or \
            any(d is not None and d >= len(device_ds) for d in s.u_device):
        raise CheckpointError("a leaf belongs to a group the file does not describe")
    plans, device_plans, expected = [], [], set()
    for gi, gd in enumerate(group_ds):
        with at(f"group {gi}"):
            plan, names = _group_plan(s, gi, gd, data)
        plans.append(plan)
        expected |= names
    for di, dd in enumerate(device_ds):
        with at(f"device group {di}"):
            plan, names = _device_plan(s, di, dd, data)
        device_plans.append(plan)
        expected |= names
    _same_arrays(data, expected)
    frozen = np.array([as_bool(f, "frozen[]") for f in as_list(header["frozen"], "frozen", s.n_unique)], np.bool_)
    # everything is checked: what is allocated now is as large as the arrays the file holds
    groups = []
    for gi, (args, arenas, C) in enumerate(plans):
        with at(f"group {gi}"):
            g = Group(*args, arenas=arenas)  # the file's arrays: the state is never allocated twice
            g.C = C
            if len(g.members):
                g.hp[:] = g.hp_at(int(C[0, 0]) + 1, int(C[1, 0]) + 1)
        groups.append(g)
    s.u_compute = [None if s.u_group[u] is None else groups[s.u_group[u]].dtype for u in range(s.n_unique)]
    device_groups = []
    for di, (leaves, where) in enumerate(device_plans):
        with at(f"device group {di}"):
            host = [Leaf(rule, shape, dt, arrays=a, t=t, skipped=k) for rule, shape, dt, a, t, k in leaves]
        device_groups.append(_to_device(lambda host=host: DeviceGroup.from_host(host), where))
    try:  # the scopes of its tree-scope reductions, as setup checks them
        check_scopes(s, groups, device_groups)
    except (ValueError, NotImplementedError) as e:
        raise CheckpointError(f"its groups: {e}") from None
    return new_state(s, groups, device_groups, frozen)


# --------------------------------------------------------------------------------------------------
# the entry points


def save(path: str | os.PathLike[str], state: Leaf | DeviceMember | StateTree) -> None:
    """Write ``state`` to ``path`` (``.npz``), atomically: a crash or kill at any moment leaves the old file
    or the new one, complete (a killed writer's temporary file is removed by the next save or load).

    ``state`` is a tree's state (from :func:`numbaopt.setup` on a model) or one array's
    (:class:`numbaopt.Leaf`, a leaf of a tree's state, a ``DeviceLeaf``: GPU state is copied to the host).
    A state whose file ``load`` would refuse (step counters beyond 2**53 or inconsistent, a model nested
    deeper than a checkpoint holds) is a ``ValueError``, and nothing is written. While it writes, a step of
    the state in another thread is refused (:class:`numbaopt.StateInUseError`): the file is never torn.
    """
    with reading(state, "save"):
        header, arrays = encode(state)
        files.write(path, header, arrays)


def encode(state):
    """``(header, arrays)``: ``state`` as a file holds it (the arrays may be the state's own: call it inside
    :func:`reading`). A state ``load`` would refuse is a ``ValueError``."""
    arrays = {}
    if isinstance(state, (Leaf, DeviceMember)):
        header = {"format": files.FORMAT, "version": files.VERSION, "kind": "leaf",
                  "leaf": _leaf_entry(state, "leaf", arrays)}
    else:
        header = _tree_header(core(state, "save"), arrays)
    return header, arrays


@contextmanager
def reading(state, fname: str):
    """The block runs with ``state`` marked in use by a reader (see :func:`numbaopt.backends.state.enter`): a
    state being stepped by another thread is refused, and none can start stepping it meanwhile, so what
    the block reads is never half-written. Anything but a state is a ``TypeError``."""
    if isinstance(state, (Leaf, DeviceMember)):
        holder = _holder(state)
    elif isinstance(state, StateTree):
        holder = core(state, fname)
    else:
        raise TypeError(f"{fname}: expected a state from numbaopt.setup (a tree's or one array's), "
                        f"got {type(state).__name__}")
    enter(holder, fname, False)
    try:
        yield
    finally:
        leave(holder, False)


class _Unguarded:
    users = 0  # a leaf view whose tree is gone: nothing else can step it


def _holder(state):
    """What carries the in-use mark of ``state`` (see :func:`numbaopt.backends.state.enter`): a leaf itself,
    a tree leaf's tree, a device member's group."""
    if isinstance(state, TreeLeaf):
        c = state.core_ref() if state.core_ref is not None else None
        return c if c is not None else _Unguarded()
    if isinstance(state, DeviceMember):
        return state.group
    return state


def load(path: str | os.PathLike[str]) -> Leaf | StateTree:
    """Read a state written by :func:`save` (a tree's state, or one array's ``Leaf``/``DeviceLeaf``).
    (``numbaopt.load`` also takes a state dict: :func:`numbaopt.persist.statedict.load`.)

    A file that is not a numbaopt state, or is damaged, crafted or inconsistent, is a
    :class:`CheckpointError` (a ``ValueError``) naming the file and what is wrong; a file that cannot be
    opened raises what ``open`` raises (``FileNotFoundError``). GPU state goes back to the current device;
    without numba-cuda or a GPU that is :class:`DeviceUnavailable`, naming the state.
    """
    header, data = files.read(path)
    path = os.fspath(path)
    try:
        return decode(header, data)
    except CheckpointError as e:
        raise CheckpointError(f"load: {path}: {e}") from None


def decode(header, data):
    """The state a file's ``header`` and arrays ``data`` describe (:func:`files.read` checked the format and
    version); every refusal is a :class:`CheckpointError`."""
    try:
        kind = header.get("kind")
        if kind == "leaf":
            as_dict(header, "its header", _LEAF_FILE)
            with at("the state"):
                return _leaf_from(header["leaf"], data)
        if kind != "tree":
            raise CheckpointError(f"unknown state kind {kind!r:.40}")
        return _build(header, data)
    except DECODE_ERRORS as e:  # a check missing above: still the file's fault, still refused
        raise CheckpointError(f"it is inconsistent ({type(e).__name__}: {e})") from None
