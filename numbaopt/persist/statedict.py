"""``state_dict(state)`` / ``load_state_dict(state, sd)``: a state as a dict of plain values keyed by the
model's paths, and back; ``load`` of such a dict.

A state dict holds what a checkpoint file holds (:mod:`.states`): NumPy arrays, Python ints, floats, bools,
strings, lists and dicts, nothing else (so ``torch.save``, ``pickle``, or JSON plus an ``.npz`` of its arrays
can keep it). Its ``"leaves"`` are keyed by each trained array's path as every numbaopt message spells it
(``"['enc'].w"`` for ``model['enc'].w``, ``"[0]"``, ``".w"``; ``""`` for a single array's state); a tied array
appears once, under its first path. Each entry holds the rule's description, the step counters, the frozen
flag, the state arrays by name, shaped like the parameter, and the MixedPrecision master copy; ``"header"``
holds the rest of the file's header (the tree's structure, the rules to rebuild, the groups).

Reading one back builds the arrays a file would hold from the entries, each checked against the header's
shapes and dtypes by path, and hands them to the same decoder as a file (:func:`.states.decode`), so a state
dict is held to every check of ``load`` and makes the state a ``save`` and ``load`` of that state makes.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..backends.cuda import DeviceLeaf, DeviceMember
from ..backends.state import Leaf, check_param_dtype, enter, leave
from ..compiler import ChainLayout, chain_key
from ..tree.groups import TreeLeaf
from ..tree.state import StateTree, core
from . import files
from .checks import MAX_COUNT, as_bool, as_dict, as_int, as_list, as_str, compute_dtype, param_dtype, shape_of
from .codec import dec_rule
from .files import CheckpointError
from .states import DECODE_ERRORS, at, decode, encode, load as load_file, reading, structure_of

__all__ = ["FORMAT", "VERSION", "state_dict", "load_state_dict", "from_state_dict", "load"]

FORMAT = "numbaopt-state-dict"
VERSION = 1
_TOP = ("format", "version", "kind", "header", "leaves")
_ENTRY = ("rule", "shape", "dtype", "t", "tp", "count", "skipped", "frozen", "state", "master")
_COUNTERS = ("t", "tp", "count", "skipped")


def state_dict(state: Leaf | DeviceMember | StateTree) -> dict[str, Any]:
    """The state as a dict of NumPy arrays (copies: later steps do not change it) and plain Python values,
    keyed by the model's paths (see the module's description). ``numbaopt.load(sd)`` rebuilds the state;
    :func:`load_state_dict` restores it into a state set up on the same model. A state being stepped by
    another thread is :class:`numbaopt.StateInUseError`."""
    with reading(state, "state_dict"):
        header, arrays = encode(state)
        kind = header.pop("kind")
        del header["format"], header["version"]
        if kind == "leaf":
            h = header["leaf"]
            leaves = {"": _entry(h["rule"], h["shape"], h["dtype"], arrays["leaf_C"],
                                 [arrays[f"leaf_a{k}"] for k in range(h["n_arrays"])],
                                 arrays.get("leaf_master"), False)}
        else:
            leaves = _tree_entries(header, arrays)
    return {"format": FORMAT, "version": VERSION, "kind": kind, "header": header, "leaves": leaves}


def _entry(rule_d, shape, dtype, counters, flat, master, frozen) -> dict:
    rule = dec_rule(rule_d)
    layout = ChainLayout(rule)
    shape = tuple(shape)
    out = {"rule": repr(rule), "shape": list(shape), "dtype": dtype}
    out.update({n: int(v) for n, v in zip(_COUNTERS, counters)})
    out["frozen"] = bool(frozen)
    # copies, shaped like x (an axis reduction's unit states like x without the axes summed over)
    out["state"] = {n: np.array(a).reshape(s) for n, a, s in
                    zip(layout.saved_names(), flat, layout.saved_shapes(shape), strict=True)}
    out["master"] = None if master is None else np.array(master).reshape(shape)
    return out


def _tree_entries(header, arrays) -> dict:
    units, frozen = header["units"], header.pop("frozen")
    s = structure_of(dict(header))
    leaves = {}
    for gi, gd in enumerate(header["groups"]):
        layout = ChainLayout(dec_rule(gd["rule"]))
        off, uoff = 0, [0] * layout.n_unit
        for j, u in enumerate(gd["members"]):
            n = int(np.prod(units[u]["shape"], dtype=np.int64))
            flat = [arrays[f"g{gi}_a{k}"][off:off + n] for k in range(layout.n_state)]
            for k, m in enumerate(layout.unit_sizes(units[u]["shape"])):  # the unit states: their own offsets
                flat.append(arrays[f"g{gi}_a{layout.n_state + k}"][uoff[k]:uoff[k] + m])
                uoff[k] += m
            leaves[str(s.paths[s.u_positions[u][0]])] = _entry(
                gd["rule"], units[u]["shape"], units[u]["dtype"], arrays[f"g{gi}_C"][:, j], flat,
                arrays.get(f"g{gi}_m{j}"), frozen[u])
            off += n
    for di, dd in enumerate(header["device_groups"]):
        layout = ChainLayout(dec_rule(dd["rule"]))
        n_arrays = layout.n_state
        members = sorted((s.u_j[u], u) for u in range(s.n_unique) if s.u_device[u] == di)
        geo = layout.new_units([tuple(units[u]["shape"]) for _, u in members], np.float64)[-1] if layout.units else None
        off = 0
        for j, u in members:
            n = int(np.prod(units[u]["shape"], dtype=np.int64))
            t, k = int(arrays[f"d{di}_ts"][j]), int(arrays[f"d{di}_skips"][j])
            flat = [arrays[f"d{di}_a{a}"][off:off + n] for a in range(n_arrays)]
            spans = [layout.unit_span(geo, j, a) for a in range(layout.n_unit)]  # where the geometry table says
            flat += [arrays[f"d{di}_a{n_arrays + a}"][b:e] for a, (b, e) in enumerate(spans)]
            leaves[str(s.paths[s.u_positions[u][0]])] = _entry(dd["rule"], units[u]["shape"], units[u]["dtype"],
                                                               (t, t, 0, k), flat, None, frozen[u])
            off += n
    return leaves


# --------------------------------------------------------------------------------------------------
# reading


class _Target:
    """What the header says one entry must hold: its path, shape, parameter and compute dtypes, the state
    names and dtypes of its rule, whether it has a master copy."""

    def __init__(self, where, shape, pdt, compute, layout, master):
        self.where, self.shape, self.pdt, self.compute, self.master = where, shape, pdt, compute, master
        self.rule = None
        self.names = layout.saved_names()
        self.dtypes = layout.saved_dtypes(compute)
        self.shapes = layout.saved_shapes(shape)


def _rule_of(d, what):
    with at(what):
        rule = dec_rule(d["rule"])
        return rule, ChainLayout(rule), compute_dtype(d["dtype"], "dtype")


def _arrays_of(e, t: _Target) -> tuple:
    """``(state arrays, flat, copied; master or None)`` of entry ``e``, checked against ``t`` by name."""
    st = as_dict(e["state"], "state", t.names)
    out = []
    for name, dt, shape in zip(t.names, t.dtypes, t.shapes):
        out.append(_checked(st[name], f"state[{name!r}]", shape, dt))
    if t.master != (e["master"] is not None):
        raise CheckpointError(f"a {t.pdt} parameter computed in {t.compute} " +
                              ("needs its master copy" if t.master else "has no master copy"))
    master = None if e["master"] is None else _checked(e["master"], "master", t.shape, t.compute)
    return out, master


def _checked(a, what, shape, dtype) -> np.ndarray:
    if type(a) is not np.ndarray:
        raise CheckpointError(f"{what} is {type(a).__name__}, expected a numpy array")
    if a.shape != tuple(shape) or a.dtype != dtype:
        raise CheckpointError(f"{what} is {a.dtype}{list(a.shape)}, expected {np.dtype(dtype)}{list(shape)}")
    return np.array(a, copy=True).reshape(-1)  # the state owns its arrays: later changes of the dict do not reach it


def _counters(e) -> np.ndarray:
    return np.array([as_int(e[n], n, 0, MAX_COUNT) for n in _COUNTERS], dtype=np.int64)


def _entry_of(leaves, key, t: _Target) -> dict:
    e = as_dict(leaves[key], "its entry", _ENTRY)
    as_str(e["rule"], "rule")
    if e["rule"] != repr(t.rule):
        raise CheckpointError(f"rule {e['rule']!r:.200} is not the header's {t.rule!r:.200} (the entry's rule is "
                              "its description; the header's is what is loaded)")
    if tuple(as_list(e["shape"], "shape")) != t.shape:
        raise CheckpointError(f"shape {e['shape']!r:.80}, the header's is {list(t.shape)}")
    if param_dtype(e["dtype"], "dtype") != t.pdt:
        raise CheckpointError(f"dtype {e['dtype']!r:.40}, the header's is {t.pdt.str!r}")
    as_bool(e["frozen"], "frozen")
    return e


def _keys(leaves, expected) -> None:
    missing = [k for k in expected if k not in leaves]
    extra = [k for k in leaves if k not in set(expected)]
    if missing:
        raise CheckpointError(f"no entry for the trained leaf state{missing[0]}" +
                              (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if extra:
        bad = extra[0]
        raise CheckpointError(f"an entry {bad!r:.120}, which is not a trained leaf of the state (the leaves are "
                              f"{list(expected)[:6]}{'...' if len(expected) > 6 else ''})")


def _tree_data(header, leaves):
    """The file's arrays (``g{i}_a{k}``, ``g{i}_C``, ``g{i}_m{j}``, ``d{i}_...``) and frozen flags of a tree's
    entries, each checked by path."""
    with at("the tree"):
        s = structure_of(header)
    key = [str(s.paths[s.u_positions[u][0]]) for u in range(s.n_unique)]
    _keys(leaves, key)
    data, frozen = {}, [False] * s.n_unique
    groups = [(f"g{gi}", gd, [u for _, u in sorted((s.u_j[u], u) for u in range(s.n_unique) if s.u_group[u] == gi)])
              for gi, gd in enumerate(as_list(header["groups"], "groups"))]
    groups += [(f"d{di}", dd, [u for _, u in sorted((s.u_j[u], u) for u in range(s.n_unique) if s.u_device[u] == di)])
               for di, dd in enumerate(as_list(header["device_groups"], "device_groups"))]
    for name, gd, members in groups:
        gd = as_dict(gd, f"group {name}")
        rule, layout, compute = _rule_of(gd, f"group {name}")
        per = [[] for _ in range(layout.n_state + layout.n_unit)]
        counters = []
        for j, u in enumerate(members):
            where = f"state{key[u]}"
            t = _Target(where, s.u_shape[u], s.u_dtype[u], compute, layout, s.u_dtype[u] != compute)
            t.rule = rule
            with at(where):
                e = _entry_of(leaves, key[u], t)
                arrays, master = _arrays_of(e, t)
                counters.append(_counters(e))
                if name[0] == "d" and (counters[-1][1] != counters[-1][0] or counters[-1][2]):
                    raise CheckpointError("GPU state steps on every call: tp must equal t, and count be 0")
            frozen[u] = e["frozen"]
            for k, a in enumerate(arrays):
                per[k].append(a)
            if master is not None:
                data[f"{name}_m{j}"] = master
        for k, dt in enumerate(layout.saved_dtypes(compute)):
            data[f"{name}_a{k}"] = np.concatenate(per[k]) if per[k] else np.zeros(0, dt)
        C = np.array(counters, dtype=np.int64).reshape(-1, 4).T.copy()
        if name[0] == "g":
            data[f"{name}_C"] = C
        else:
            data[f"{name}_ts"], data[f"{name}_skips"] = C[0].copy(), C[3].copy()
    return data, frozen


def _leaf_data(header, leaves) -> dict:
    if list(leaves) != [""]:
        raise CheckpointError(f"one array's state has one entry, keyed '', not {list(leaves)[:4]!r:.120}")
    h = as_dict(header["leaf"], "its header", ("rule", "shape", "dtype", "device", "n_arrays", "master"))
    with at("the state"):
        rule = dec_rule(h["rule"])
        layout = ChainLayout(rule)
        pdt = param_dtype(h["dtype"], "dtype")
        compute = check_param_dtype(pdt, "its parameter", layout)
        shape = shape_of(h["shape"], "shape")
    t = _Target("state", shape, pdt, compute, layout, pdt != compute)
    t.rule = rule
    with at("the state"):
        e = _entry_of(leaves, "", t)
        arrays, master = _arrays_of(e, t)
        data = {f"leaf_a{k}": a for k, a in enumerate(arrays)}
        data["leaf_C"] = _counters(e)
    if master is not None:
        data["leaf_master"] = master
    return data


def from_state_dict(sd):
    """The state a :func:`state_dict` describes: a :class:`CheckpointError` (a ``ValueError``) naming the
    path and what is wrong for anything ``load`` would refuse of a file, or that does not match its header."""
    try:
        sd = as_dict(sd, "it", _TOP)
        if sd["format"] != FORMAT:
            raise CheckpointError(f"format {sd['format']!r:.40}, expected {FORMAT!r}")
        if sd["version"] != VERSION:
            raise CheckpointError(f"version {sd['version']!r:.40}, this numbaopt reads {VERSION}")
        kind = sd["kind"]
        header = dict(as_dict(sd["header"], "its header"))
        leaves = as_dict(sd["leaves"], "its leaves")
        if any(not isinstance(k, str) for k in leaves):
            raise CheckpointError("its leaves are keyed by something other than path strings")
        header.update(format=files.FORMAT, version=files.VERSION, kind=kind)
        if kind == "tree":
            if "frozen" in header:
                raise CheckpointError("its header has frozen flags; they belong in the entries")
            data, frozen = _tree_data(header, leaves)
            header["frozen"] = frozen
        elif kind == "leaf":
            data = _leaf_data(header, leaves)
        else:
            raise CheckpointError(f"unknown state kind {kind!r:.40}")
        return decode(header, data)
    except CheckpointError as e:
        raise CheckpointError(f"load: state dict: {e}") from None
    except DECODE_ERRORS as e:  # a check missing above: still the dict's fault, still refused
        raise CheckpointError(f"load: state dict: it is inconsistent ({type(e).__name__}: {e})") from None


def load(path_or_state_dict: str | os.PathLike[str] | dict[str, Any]) -> Leaf | StateTree:
    """Read a state: from a file written by :func:`numbaopt.save` (see :func:`numbaopt.persist.states.load`),
    or from a dict made by :func:`state_dict` (the same checks; the same state as ``save`` + ``load``)."""
    if isinstance(path_or_state_dict, dict):
        return from_state_dict(path_or_state_dict)
    return load_file(path_or_state_dict)


# --------------------------------------------------------------------------------------------------
# restoring into a state


def _same_kernel(a, b) -> bool:
    """Whether two rules run the same kernels (the same member classes and options; hyperparameters may
    differ: they are the state dict's after a restore)."""
    return chain_key(a) == chain_key(b)


def _mismatch(what, mine, theirs) -> ValueError:
    return ValueError(f"load_state_dict: {what}: {theirs} in the state dict, {mine} in the state (a state dict "
                      "restores into a state set up on the same model with the same rules; numbaopt.load(sd) "
                      "makes a new state)")


def _check_leaf(leaf, new) -> None:
    if isinstance(new, StateTree):
        raise ValueError("load_state_dict: the state dict holds a tree's state, the state is one array's")
    if type(new) is not type(leaf):
        raise _mismatch("state", type(leaf).__name__, type(new).__name__)
    for what, a, b in (("shape", leaf.shape, new.shape), ("dtype", leaf.param_dtype, new.param_dtype),
                       ("compute dtype", leaf.dtype, new.dtype)):
        if a != b:
            raise _mismatch(f"state: {what}", a, b)
    if not _same_kernel(leaf.rule, new.rule):
        raise _mismatch("state: rule", repr(leaf.rule), repr(new.rule))


def _check_tree(c, nc) -> None:
    s, ns = c.structure, nc.structure
    if [str(p) for p in s.paths] != [str(p) for p in ns.paths] or s.pos_param != ns.pos_param:
        mine, theirs = [str(p) for p in s.paths], [str(p) for p in ns.paths]
        k = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        raise _mismatch(f"the model's leaf {k}", f"state{mine[k]}" if k < len(mine) else "no leaf",
                        f"state{theirs[k]}" if k < len(theirs) else "no leaf")
    for p in range(len(s.paths)):
        u, nu = s.pos_u[p], ns.pos_u[p]
        where = f"state{s.paths[p]}"
        if (u is None) != (nu is None):
            mine, theirs = ("trained", "not trained") if nu is None else ("not trained", "trained")
            raise _mismatch(where, mine, theirs)
        if u is None:
            continue
        for what, a, b in (("shape", s.u_shape[u], ns.u_shape[nu]), ("dtype", s.u_dtype[u], ns.u_dtype[nu]),
                           ("tied positions", s.u_positions[u], ns.u_positions[nu]),
                           ("group", (s.u_group[u], s.u_device[u], s.u_j[u]),
                            (ns.u_group[nu], ns.u_device[nu], ns.u_j[nu]))):
            if a != b:
                raise _mismatch(f"{where}: {what}", a, b)
    if len(c.groups) != len(nc.groups) or len(c.device_groups) != len(nc.device_groups):
        raise _mismatch("groups", len(c.groups) + len(c.device_groups), len(nc.groups) + len(nc.device_groups))
    firsts = [g.members[0] for g in c.groups]
    firsts += [next(u for u in range(s.n_unique) if s.u_device[u] == di) for di in range(len(c.device_groups))]
    for u, g, ng in zip(firsts, list(c.groups) + list(c.device_groups), list(nc.groups) + list(nc.device_groups)):
        if g.dtype != ng.dtype:
            raise _mismatch(f"{s.where(u, 'state')}: compute dtype", g.dtype, ng.dtype)
        if not _same_kernel(g.rule, ng.rule):
            raise _mismatch(f"{s.where(u, 'state')}: rule", repr(g.rule), repr(ng.rule))


def _write_group(g, ng) -> None:
    device = not hasattr(g, "members")
    for a, b in zip(g.arenas, ng.arenas):
        if device:
            a.copy_to_device(b)
        else:
            a[...] = b
    if device:
        g.ts[...], g.skips[...] = ng.ts, ng.skips
    else:
        g.C[...] = ng.C
        for m, nm in zip(g.masters, ng.masters):
            if m is not None:
                m[...] = nm
    g.set_rule_(ng.rule, ng.hp)  # hp in place: plans and leaf views hold it


def load_state_dict(state, sd):
    """Restore the state dict ``sd`` (from :func:`state_dict`) into ``state``, set up on the same model with
    the same rules (the hyperparameters may differ: afterwards they are the state dict's, as the step
    counters, state arrays, master copies and frozen flags). Returns ``state``.

    ``sd`` is held to every check of ``load`` (a :class:`CheckpointError` naming the path), then to the
    state's model: every path, shape, dtype, tie and group, and the rules' kernels (a ``ValueError`` naming
    the path). Nothing is written unless all of it passes. A state in use by another thread is
    :class:`numbaopt.StateInUseError`.
    """
    if isinstance(state, TreeLeaf):
        raise TypeError("load_state_dict: expected a whole state (a tree's, or one array's), got a leaf of a "
                        "tree; restore the tree's state")
    if isinstance(state, Leaf):
        holder = state
    elif isinstance(state, StateTree):
        holder = core(state, "load_state_dict")
    else:
        raise TypeError(f"load_state_dict: expected a state from numbaopt.setup, got {type(state).__name__}")
    new = from_state_dict(sd)
    enter(holder, "load_state_dict")
    try:
        if isinstance(state, Leaf):
            _check_leaf(state, new)
            for a, b in zip(state.arrays, new.arrays):
                a.copy_to_device(b) if isinstance(state, DeviceLeaf) else np.copyto(a, b)
            state.counters[...] = new.counters
            if state.master is not None:
                state.master[...] = new.master
            state.rule, state.layout = new.rule, new.layout
            state.hp[...] = new.hp
            state.fast = None
            return state
        if not isinstance(new, StateTree):
            raise ValueError("load_state_dict: the state dict holds one array's state, the state is a tree's")
        c, nc = holder, core(new)
        _check_tree(c, nc)
        for g, ng in zip(list(c.groups) + list(c.device_groups), list(nc.groups) + list(nc.device_groups)):
            _write_group(g, ng)
        c.frozen[...] = nc.frozen
        c.fast = None  # the plan leaves frozen leaves out: made again
        return state
    finally:
        leave(holder)
