"""Checkpoints of a :class:`~numbaopt.mpi.DistributedState`: ``save(state, path)`` on every rank, and
``load(path, model, comm)`` on any number of ranks, sharded or not, whatever wrote it.

A checkpoint is a directory::

    header.npz                     rank 0: ranks, the flat layout, the rules, the file list (no arrays)
    shard-<id>-00000.npz ...       sharded (ZeRO-1): one per rank, that rank's ``state.local``
    state-<id>.npz                 replicated: rank 0 alone, the whole state (an ordinary numbaopt.save file)

Every data file is an ordinary :func:`numbaopt.save` file of a rank's local state tree (a sharded
rank's is a tree over the list of its 1-D pieces), read with every check of :func:`numbaopt.load`; the
header is a file of the same container (:mod:`numbaopt.persist.files`: its JSON header, of kind
``mpi-checkpoint``, and no arrays). So every file is written crash safe (temporary file, fsync,
``os.replace``, directory fsync) and read without trusting it. ``<id>`` is drawn afresh by every save:
the new files never overwrite the old checkpoint's, and the header, written last, is the commit point: a
save killed at any moment leaves the old checkpoint or the new one, complete; the old files are removed
once the new header is in place.

Loading on M ranks what N ranks wrote: FlatLayout lays the trained arrays end to end in leaf order, so a
global element index means the same element whatever the number of ranks and whether the state was
sharded. Each new piece (unit ``u``, elements ``[a, b)``) is filled from the overlapping ranges of the old
pieces of ``u``; the step counters (the same on every piece of a leaf) and the frozen flags come with
them, the hyperparameters are the rules the header holds (as last adjusted).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets

import numpy as np

from ..compiler import chain_key
from ..persist import files
from ..persist.checks import (as_bool, as_dict, as_int, as_list, as_str, compute_dtype, elements, param_dtype,
                              shape_of)
from ..persist.codec import dec_rule, enc_rule
from ..persist.files import CheckpointError
from ..persist.states import load as load_tree, save as save_tree
from ..tree.state import StateTree, core
from .comm import DistributedError, agree_signature, require_mpi, world
from .state import DistributedState, setup_distributed

__all__ = ["save", "load", "KIND", "VERSION", "HEADER"]

#: the header's kind (its container is numbaopt.persist.files' format, of that module's version)
KIND = "mpi-checkpoint"
VERSION = 1
HEADER = "header.npz"
_TOP = ("format", "version", "kind", "mpi_version", "id", "ranks", "sharded", "average", "balance", "t",
        "untrained", "rules", "leaves", "units", "bounds", "files")
_UNIT = ("path", "positions", "shape", "dtype", "compute", "size", "rule")
_FILE = ("file", "bytes", "pieces")
#: the files a save writes (anything else in the directory is left alone)
_DATA_FILE = re.compile(r"(?:shard|state)-([0-9a-f]{16})(?:-\d{5,})?\.npz")
#: how a failure on one rank is raised on every rank: by the type name its rank sends
_KINDS = {k.__name__: k for k in (TypeError, ValueError, CheckpointError, NotImplementedError, OSError,
                                  FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError)}


def _agree(comm, err, what: str, payload=None) -> list:
    """One ``allgather`` of every rank's ``(error, payload)``: the payloads when no rank failed; else every rank
    raises the same error (the first failing rank's type, every failing rank's message), so no rank is left
    waiting in a collective that another has abandoned."""
    got = comm.allgather((None if err is None else (type(err).__name__, str(err)), payload))
    failed = [(r, e) for r, (e, _) in enumerate(got) if e is not None]
    if not failed:
        return [p for _, p in got]
    cls = _KINDS.get(failed[0][1][0], DistributedError)
    text = "; ".join(f"rank {r}: {m}" for r, (_, m) in failed)
    raise cls(f"{what} refused on every rank ({len(failed)} of {len(got)} failed): {text}") from None


def _local_pieces(state) -> list:
    """``[(i, a, b, pos)]``: elements ``[a, b)`` of the layout's unit ``i`` sit at leaf position ``pos`` of
    ``state.local`` (a sharded rank's pieces are its tree's leaves, in order; replicated: every whole unit)."""
    lay, s = state.layout, state.structure
    index = {u: i for i, u in enumerate(lay.units)}
    if state.sharded:
        return [(index[p.u], p.a, p.b, k) for k, p in enumerate(state.pieces)]
    return [(i, 0, int(lay.sizes[i]), s.u_positions[u][0]) for i, u in enumerate(lay.units)]


def _flat(leaf) -> list:
    """A leaf's per-element arrays, flat: its state arrays, and its MixedPrecision master copy if any."""
    return [np.asarray(a).reshape(-1) for a in leaf.arrays] + ([leaf.master] if leaf.master is not None else [])


def _describe(state) -> dict:
    """The header's description of the model (``leaves``, ``units`` without their rules) and the layout."""
    lay, s = state.layout, state.structure
    units = [{"path": str(s.paths[s.u_positions[u][0]]), "positions": [str(s.paths[p]) for p in s.u_positions[u]],
              "shape": list(s.u_shape[u]), "dtype": s.u_dtype[u].str, "compute": lay.dtypes[i].str,
              "size": int(lay.sizes[i])} for i, u in enumerate(lay.units)]
    return {"leaves": [str(p) for p in s.paths], "units": units}


# --------------------------------------------------------------------------------------------------
# save


def save(state: DistributedState, path) -> None:
    """Write ``state`` to the directory ``path`` (made if missing); collective: every rank of its
    communicator calls it. Sharded: every rank writes its shard; replicated: rank 0 writes the whole state
    (every rank holds the same). Rank 0 then writes the header. When it returns on any rank the whole
    checkpoint is on disk; when any rank fails, every rank raises the same error and the directory still
    holds the previous checkpoint, complete (see the module's description). The model's parameters are
    not part of it: every rank holds them whole, save them as you save the model."""
    if not isinstance(state, DistributedState):
        raise TypeError(f"numbaopt.mpi.save: expected a DistributedState (from numbaopt.mpi.setup), got "
                        f"{type(state).__name__}; numbaopt.save saves a single-process state")
    comm, what, rank = state.comm, "numbaopt.mpi.save", state.comm.Get_rank()
    path = os.fspath(path)
    err, mine = None, None
    try:  # what this rank writes: its pieces, each with its rule (hyperparameters as last adjusted)
        c = core(state.local, "save")
        pieces = [(i, a, b, pos, json.dumps(enc_rule(c.leaf(c.structure.pos_u[pos]).rule)))
                  for i, a, b, pos in _local_pieces(state)]
        if rank == 0:
            os.makedirs(path, exist_ok=True)
        mine = (secrets.token_hex(8) if rank == 0 else None, pieces)
    except (OSError, TypeError, ValueError) as e:
        err = e
    got = _agree(comm, err, what, mine)
    token = got[0][0]
    name = f"shard-{token}-{rank:05d}.npz" if state.sharded else f"state-{token}.npz"
    err, header, nbytes = None, None, None
    try:
        header = _header(state, token, [p for _, p in got])
        if state.sharded or rank == 0:  # an ordinary numbaopt.save file of the rank's local state tree
            save_tree(os.path.join(path, name), state.local)
            nbytes = os.path.getsize(os.path.join(path, name))
    except (OSError, TypeError, ValueError, RuntimeError) as e:  # RuntimeError: the state in use by a thread
        err = e
    sizes = _agree(comm, err, what, nbytes)  # returns only when no rank failed: err is None
    if rank == 0:
        try:
            for f, n in zip(header["files"], sizes if state.sharded else sizes[:1]):
                f["bytes"] = n
            files.write(os.path.join(path, HEADER), header, {})  # atomic; its size and depth checked
            _remove_old(path, token)
        except (OSError, ValueError) as e:
            err = e
    _agree(comm, err, what)  # the barrier: nobody returns before the header is in place


def _header(state, token, shards) -> dict:
    """The header from every rank's pieces (the same on every rank: it is made from the same gathered lists).
    Ranks whose rules (hyperparameters) differ for one array are a ``ValueError``."""
    if not state.sharded:  # every rank holds the whole state; rank 0's is written
        bad = [r for r, p in enumerate(shards) if p != shards[0]]
        if bad:
            raise ValueError(f"ranks {bad} hold other rules (hyperparameters) than rank 0; adjust every rank alike")
        shards = shards[:1]
    rules, unit_rule, entries = [], {}, []
    for r, pieces in enumerate(shards):
        name = f"shard-{token}-{r:05d}.npz" if state.sharded else f"state-{token}.npz"
        entries.append({"file": name, "bytes": None, "pieces": [[i, a, b, pos] for i, a, b, pos, _ in pieces]})
        for i, _, _, _, rule in pieces:
            if rule not in rules:
                rules.append(rule)
            if unit_rule.setdefault(i, rule) != rule:
                raise ValueError(f"the ranks hold different rules for one array (at rank {r}): {rule[:200]} and "
                                 f"{unit_rule[i][:200]}; adjust the hyperparameters identically on every rank")
    desc = _describe(state)
    for i, u in enumerate(desc["units"]):  # an empty array has no piece when sharded: the one rule
        u["rule"] = rules.index(unit_rule.get(i, rules[0]))
    lay, s = state.layout, state.structure
    untrained = [str(p) for k, p in enumerate(s.paths) if s.pos_param[k] and s.pos_u[k] is None]
    return {"format": files.FORMAT, "version": files.VERSION, "kind": KIND, "mpi_version": VERSION, "id": token,
            "ranks": state.comm.Get_size(), "sharded": state.sharded, "average": state.average,
            "balance": lay.balance, "t": state.t, "untrained": untrained, "rules": [json.loads(r) for r in rules],
            **desc, "bounds": lay.bounds.tolist() if state.sharded else [0, lay.n], "files": entries}


def _remove_old(path: str, token: str) -> None:
    """Remove the data files of earlier saves (the new header no longer names them)."""
    for name in os.listdir(path):
        m = _DATA_FILE.fullmatch(name)
        if m is not None and m.group(1) != token:
            with contextlib.suppress(OSError):  # removed meanwhile, or not ours: no part of the checkpoint
                os.unlink(os.path.join(path, name))


# --------------------------------------------------------------------------------------------------
# load


def load(path, model, comm=None, *, shard: bool | None = None, average: bool | None = None,
         balance: str | None = None) -> DistributedState:
    """A :class:`DistributedState` for ``model`` on ``comm`` (default ``COMM_WORLD``) holding the state of the
    checkpoint directory ``path``, written by :func:`save` on any number of ranks, sharded or replicated;
    collective: every rank of ``comm`` calls it with its model. ``shard``/``average``/``balance``: as
    :func:`numbaopt.mpi.setup` (default: the checkpoint's).

    Checked: the header (consistency, every size); the model against it (every leaf path, every trained
    array's path, tied positions, shape and dtype: a ``ValueError`` naming the first difference); each data
    file with every check of :func:`numbaopt.load`, and against the header (its size, its pieces' shapes,
    dtypes and rules). A failure on any rank raises the same error on every rank (a missing file: a
    ``FileNotFoundError`` naming it)."""
    require_mpi()
    comm, what = world(comm), "numbaopt.mpi.load"
    path = os.fspath(path)
    err, header = None, None
    try:  # one reader of the header: every rank gets the same
        header = _read_header(path) if comm.Get_rank() == 0 else None
    except (OSError, CheckpointError) as e:
        err = e
    header = _agree(comm, err, what, header)[0]
    err, rule = None, None
    sharded = header["sharded"] if shard is None else bool(shard)
    try:  # a rule class defined in a module one rank has not imported fails there only: agreed below
        rule = _rule_for(header, [dec_rule(r, f"{path}: rule {k}") for k, r in enumerate(header["rules"])], sharded)
    except (CheckpointError, ValueError, TypeError) as e:
        err = e
    _agree(comm, err, what)
    state = setup_distributed(rule, model, comm, shard=sharded,
                              average=header["average"] if average is None else average,
                              balance=header["balance"] if balance is None else balance)
    lines = _lines(_describe(state))
    diff = next(((a, b) for a, b in zip(lines, _lines(header)) if a != b), None)
    err = None if diff is None else ValueError(f"{path}: the model does not match the checkpoint: the model has "
                                               f"{diff[0]}, the checkpoint {diff[1]}")
    agree_signature(comm, err, lines, what)
    try:
        _fill(state, header, path)
    except (OSError, CheckpointError) as e:
        err = e
    _agree(comm, err, what)
    return state


def _lines(d) -> list:
    """What the model and the checkpoint must agree on, one line each (the counts first, so that a missing
    leaf is named as such rather than as a shifted path)."""
    units = d["units"]
    out = [f"{len(d['leaves'])} leaves", f"{len(units)} trained arrays"]
    out += [f"leaf {k} at model{p}" for k, p in enumerate(d["leaves"])]
    return out + [f"a trained array at model{u['path']}: shape {tuple(u['shape'])} dtype {u['dtype']}, at "
                  f"{['model' + p for p in u['positions']]}" for u in units]


def _rule_for(header, rules, sharded):
    """The rule to set up: the checkpoint's one rule; or, where it has several, or parameters it leaves
    untrained (a rule chooser's), a chooser by path (the checkpoint's rule per array, None elsewhere)."""
    per_unit = [rules[u["rule"]] for u in header["units"]]
    several = len({u["rule"] for u in header["units"]}) > 1
    kernels = {chain_key(rule) for rule in per_unit}
    if sharded and len(kernels) > 1:
        raise ValueError("the checkpoint holds rules of different kernels per leaf (set up with a rule chooser); a "
                         "sharded state steps one chain's kernels (its rules may differ in hyperparameters only): "
                         "load it with shard=False")
    if per_unit and not (several or header["untrained"]):
        return per_unit[0]
    by_path = {p: r for u, r in zip(header["units"], per_unit) for p in u["positions"]}
    return lambda path, x: by_path.get(str(path))


def _fill(state, header, path: str) -> None:
    """This rank's new pieces from the overlapping ranges of the old ones (see the module's description)."""
    c = core(state.local, "load")
    old = {}  # unit -> [(a, b, file index, pos)], in element order
    for f, fd in enumerate(header["files"]):
        for i, a, b, pos in fd["pieces"]:
            old.setdefault(i, []).append((a, b, f, pos))
    cur, oc = None, None  # the old file open now: new pieces come in element order, so files in file order
    unfilled = []
    for i, a, b, pos in _local_pieces(state):
        u = c.structure.pos_u[pos]
        leaf = c.leaf(u)  # a TreeLeaf: its arrays and counters are views into its group's arenas and C
        dst, counters, frozen = _flat(leaf), None, False
        for oa, ob, f, opos in sorted(old.get(i, ())):
            lo, hi = max(a, oa), min(b, ob)
            if hi < lo or (hi == lo and b > a):  # no overlap (an empty array's one piece is taken, for its counters)
                continue
            if f != cur:  # the previous file's arrays go before the next is read
                cur, oc = f, None
                oc = _open_data(path, header, f)
            ou = oc.structure.pos_u[opos]
            oleaf = oc.leaf(ou)
            src = _flat(oleaf)
            if len(src) != len(dst):
                raise CheckpointError(f"{path}: {header['files'][f]['file']}: {len(src)} state arrays at "
                                      f"model{header['units'][i]['path']}, the state set up has {len(dst)}")
            for x, y in zip(dst, src):
                x[lo - a:hi - a] = y[lo - oa:hi - oa]
            if counters is None:
                counters, frozen = oleaf.counters.copy(), bool(oc.frozen[ou])
            elif not np.array_equal(counters, oleaf.counters):
                raise CheckpointError(f"{path}: the step counters of model{header['units'][i]['path']} differ "
                                      f"between its shards ({counters.tolist()} and {oleaf.counters.tolist()})")
        if counters is None:  # an empty array of a sharded checkpoint: no shard holds it
            unfilled.append(leaf)
            continue
        leaf.counters[...] = counters
        c.frozen[u] = frozen
    for leaf in unfilled:  # no state to fill: the counters of a non-empty leaf of its group (all were filled)
        g = leaf.group
        full = [j for j in range(len(g.members)) if g.sizes[j] > 0]
        if full:
            g.C[:, leaf.j] = g.C[:, full[0]]
    for g in c.groups:  # scheduled hyperparameters at the loaded step counts, as numbaopt.load sets them
        if len(g.members):
            g.hp[:] = g.hp_at(int(g.C[0, 0]) + 1, int(g.C[1, 0]) + 1)
    c.fast = None


def _open_data(path: str, header, f: int):
    """Data file ``f``, read with every check of :func:`numbaopt.load` and held to the header: its size, and
    at each of its pieces' positions a leaf of the right shape, dtype and rule. Its tree's core."""
    fd = header["files"][f]
    full = os.path.join(path, fd["file"])
    try:
        got = os.path.getsize(full)
    except FileNotFoundError:
        raise FileNotFoundError(f"{full} is missing: the checkpoint's file of rank {f} of {header['ranks']} "
                                "(the directory is incomplete, or was copied in part)") from None
    if got != fd["bytes"]:
        raise CheckpointError(f"{full} is {got} bytes, the header says {fd['bytes']}: not the file this "
                              "checkpoint wrote")
    st = load_tree(full)
    if not isinstance(st, StateTree):
        raise CheckpointError(f"{full} holds one array's state, not a tree's")
    c = core(st, "load")
    s = c.structure
    for i, a, b, pos in fd["pieces"]:
        unit = header["units"][i]
        shape, dtype = ((b - a,), unit["compute"]) if header["sharded"] else (tuple(unit["shape"]), unit["dtype"])
        u = s.pos_u[pos] if pos < len(s.paths) else None
        if u is None or s.u_group[u] is None or s.u_shape[u] != shape or s.u_dtype[u].str != dtype:
            raise CheckpointError(f"{full}: leaf {pos} is not the state of model{unit['path']}[{a}:{b}] "
                                  f"({dtype}{list(shape)}) that the header describes")
        if enc_rule(c.leaf(u).rule) != header["rules"][unit["rule"]]:
            raise CheckpointError(f"{full}: leaf {pos} has rule {c.leaf(u).rule!r:.200}, the header another")
    return c


def _read_header(path: str) -> dict:
    """The header of checkpoint ``path``, every field checked (types, sizes, the pieces tiling every array);
    a ``FileNotFoundError`` when there is none, else a :class:`CheckpointError` naming what is wrong."""
    target = os.path.join(path, HEADER)
    try:
        h, arrays = files.read(target)  # the container's checks: zip, JSON size and depth, format and version
    except FileNotFoundError:
        raise FileNotFoundError(f"{target} is missing: {path} is not a numbaopt.mpi checkpoint (or its save "
                                "never completed)") from None
    try:
        if arrays:
            raise CheckpointError(f"it holds arrays {sorted(arrays)[:4]}; a checkpoint's header holds none")
        _check_header(h)
    except CheckpointError as e:
        raise CheckpointError(f"numbaopt.mpi.load: {target}: {e}") from None
    return h


def _strings(v, what: str) -> list:
    return [as_str(p, f"{what}[{k}]") for k, p in enumerate(as_list(v, what))]


def _check_header(h) -> None:
    as_dict(h, "the header", _TOP)
    if h["kind"] != KIND or h["mpi_version"] != VERSION:
        raise CheckpointError(f"kind {h['kind']!r:.40} version {h['mpi_version']!r:.20}, this numbaopt reads "
                              f"{KIND!r} version {VERSION}")
    ranks, sharded = as_int(h["ranks"], "ranks", 1), as_bool(h["sharded"], "sharded")
    as_bool(h["average"], "average")
    as_int(h["t"], "t")
    _strings(h["untrained"], "untrained")
    if as_str(h["balance"], "balance") not in ("elements", "leaves") or _DATA_FILE.fullmatch(
            f"state-{as_str(h['id'], 'id')}.npz") is None:
        raise CheckpointError(f"balance {h['balance']!r:.20} or id {h['id']!r:.40} is not one save writes")
    nrules, sizes = len(as_list(h["rules"], "rules")), []
    _strings(h["leaves"], "leaves")
    for k, u in enumerate(as_list(h["units"], "units")):
        what = f"units[{k}]"
        as_dict(u, what, _UNIT)
        _strings([u["path"], *as_list(u["positions"], f"{what} positions")], f"{what} paths")
        shape = shape_of(u["shape"], f"{what} shape")
        param_dtype(u["dtype"], f"{what} dtype")
        compute_dtype(u["compute"], f"{what} compute")
        as_int(u["rule"], f"{what} rule", 0, nrules - 1)
        sizes.append(as_int(u["size"], f"{what} size", elements(shape), elements(shape)))
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
    bounds = [as_int(b, "bounds[]") for b in as_list(h["bounds"], "bounds", ranks + 1 if sharded else 2)]
    if bounds[0] != 0 or bounds[-1] != starts[-1] or bounds != sorted(bounds):
        raise CheckpointError(f"bounds {bounds[:8]} do not cut the {starts[-1]} elements in order")
    covered = [[] for _ in sizes]
    for r, fd in enumerate(as_list(h["files"], "files", ranks if sharded else 1)):
        as_int(as_dict(fd, f"files[{r}]", _FILE)["bytes"], f"files[{r}] bytes")
        m = _DATA_FILE.fullmatch(as_str(fd["file"], f"files[{r}] file"))
        if m is None or m.group(1) != h["id"]:
            raise CheckpointError(f"files[{r}] {fd['file']!r:.80} is not a name this checkpoint's save writes")
        for q in as_list(fd["pieces"], f"files[{r}] pieces"):
            i, a, b, _ = [as_int(v, f"files[{r}] piece") for v in as_list(q, f"files[{r}] piece", 4)]
            if i >= len(sizes) or not (a < b <= sizes[i] or (not sharded and a == b == sizes[i] == 0)) or \
                    (sharded and not bounds[r] <= starts[i] + a < starts[i] + b <= bounds[r + 1]):
                raise CheckpointError(f"files[{r}]: piece {q} lies outside its array or its shard")
            covered[i].append((a, b))
    for i, spans in enumerate(covered):  # the pieces of every array tile it: each element exactly once
        ends = [0] + [b for _, b in sorted(spans)]
        if [a for a, _ in sorted(spans)] != ends[:-1] or ends[-1] != sizes[i]:
            raise CheckpointError(f"the pieces of units[{i}] do not cover its {sizes[i]} elements exactly once")
