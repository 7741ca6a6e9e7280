"""Many device arrays under one rule: :class:`DeviceGroup` (one launch per step; one leaf of it, as a tree's
state shows it, is a :class:`numbaopt.backends.cuda.member.DeviceMember`).

A step is split in two for the tree pipeline's transaction: :meth:`DeviceGroup.prepare` checks the arrays,
uploads their addresses and runs the reductions (which write only scratch buffers) and reads their status
back, so a refusal raises before anything is written; :meth:`DeviceGroup.commit` launches the element
kernel. ``update_`` does both.
"""
from __future__ import annotations

import numpy as np

from ...compiler import ChainLayout
from ..alias import aliased_leaves
from ..state import Leaf, as_reader, adjusted_rule, as_rule, check_param_dtype, raise_status
from .arrays import (Scratch, check_device_grad, decode, device_copies, device_state, empty_like, finish_phase, flat,
                     info, is_device_array, kind, reduce_phase, run_reductions, runtime, table_stale,
                     unpickling_runtime)
from .leaf import check_device_rule

__all__ = ["DeviceGroup", "setup_device_group", "tree_group"]


class DeviceGroup:
    """Optimiser state of many device arrays of one dtype under one rule, stepped with ONE launch.

    The state of every leaf lives in flat device arenas (leaf ``i`` at ``offsets[i]``); parameters and
    gradients are reached through tables of device addresses, uploaded only when an address changes.
    A chunk table (built once) maps each block to one leaf and a range of its elements. Rules with a
    reduction add one reduce and one finish launch each (per leaf, or over the whole group for
    ``scope = "tree"`` rules such as global-norm clipping). ``update`` (pure) copies the parameters and
    arenas on the device, then steps the copies.

    Each leaf has its own step count (``ts``; ``t`` is the largest): called directly, every leaf steps
    every time; in a tree, leaves with a ``None`` gradient or frozen are left out of the launch (their
    blocks are not in its chunk table) and keep their step count. Leaves at different step counts are
    stepped with one launch per distinct count (the kernels take one ``t``).
    """

    def __init__(self, rule, params, *, _arenas=None, t=0, hp=None, skipped=0, _shapes=None, _dtype=None):
        from numba import cuda
        self.users = 0  # the in-use guard of numbaopt.backends.state.enter
        rt = runtime()
        rule = as_rule(rule)
        check_device_rule(rule, "params")
        if params is None:  # rebuilt from host state (load): shapes and dtype given
            shapes, dtype = [tuple(sh) for sh in _shapes], np.dtype(_dtype)
        else:
            params = list(params)
            shapes, dtype = [], None
            for i, p in enumerate(params):
                if not is_device_array(p):
                    raise TypeError(f"params[{i}]: expected a device array, got {type(p).__name__}")
                _, shape, dt, _ = info(p, f"params[{i}]")
                check_param_dtype(dt, f"params[{i}]")
                if dtype is None:
                    dtype = dt
                elif dt != dtype:
                    raise TypeError(f"params[{i}]: dtype {dt}; a group has one dtype ({dtype}): make one group "
                                    "per dtype")
                shapes.append(tuple(shape))
        if not shapes:
            raise ValueError("setup_device_group: needs at least one device array")
        self.rule, self.dtype, self.shapes = rule, np.dtype(dtype), shapes
        for r in rule.rules:
            if self.dtype.kind == "c" and not type(r).supports_complex:
                raise TypeError(f"{type(r).__name__} does not support complex parameters (dtype {self.dtype})")
        self.layout = ChainLayout(rule)
        self.layout.refuse_axes("GPU parameters", scalar=False, axes=False)
        n = len(shapes)
        self.ts = np.zeros(n, dtype=np.int64) + np.asarray(t, dtype=np.int64)
        self.skips = np.zeros(n, dtype=np.int64) + np.asarray(skipped, dtype=np.int64)
        self.hp = self.layout.hyper_vector(self.t + 1, self.t + 1, self.dtype) if hp is None else hp
        self.sizes = np.array([int(np.prod(s, dtype=np.int64)) for s in shapes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.total = int(self.sizes.sum())
        self.mod = rt.kernels(rule, self.dtype)
        # the element states in flat arenas (leaf i at offsets[i]); with scalar states, one unit array each
        # (leaf i at index i) and the geometry table (not read by the kernels: checkpoints and host copies)
        self.arenas = tuple(device_state(self.layout, self.dtype, self.total, shapes)
                            if _arenas is None else _arenas)
        self._sizes_dev = cuda.to_device(self.sizes)
        self._offsets_dev = cuda.to_device(self.offsets)
        self._chunks = {}  # chunk tables by the leaves they cover (shared by copies: never written)
        # the geometry table on the host: where each leaf's unit states sit in their arenas
        self.geo = self.layout.new_units(shapes, self.dtype)[-1] if self.layout.units else None
        self.scratch = self.new_scratch(self.hp)
        self._new_tables()

    def new_scratch(self, hp) -> Scratch:
        """Device buffers for stepping the group (the axis members' tables over every leaf's units)."""
        return Scratch(self.mod.plan, len(self.shapes), hp, (self.layout, self.geo, self.dtype))

    def _new_tables(self):
        from numba import cuda
        n = len(self.shapes)
        self._xaddr = np.zeros(n, dtype=np.int64)
        self._gaddr = np.zeros(n, dtype=np.int64)
        self._xaddr_dev = cuda.to_device(self._xaddr)
        self._gaddr_dev = cuda.to_device(self._gaddr)
        self._params = None  # the parameter objects whose addresses are in the table
        self._grads = None  # the gradient objects whose addresses are in the table

    t = property(lambda self: int(self.ts.max()), doc="steps taken (the largest per-leaf count, ``ts``)")
    scheduled = property(lambda self: self.layout.scheduled)
    skipped = property(lambda self: int(self.skips.max()), doc="steps refused by the rule (e.g. SkipNonFinite)")

    def __len__(self):
        return len(self.shapes)

    def __repr__(self):
        return f"DeviceGroup({self.rule!r}, t={self.t}, {len(self)} leaves, {self.dtype.name}[{self.total}])"

    def state(self, i: int) -> dict:
        """State arrays of leaf ``i`` by name (device views into the arenas, shaped like the leaf)."""
        o, n = int(self.offsets[i]), int(self.sizes[i])
        lay = self.layout
        out = {name: a[o:o + n].reshape(self.shapes[i]) for name, a in zip(lay.state_names(), self.arenas)}
        for u, (name, a) in enumerate(zip(lay.unit_names(), lay.unit_arrays(self.arenas))):
            start, stop = lay.unit_span(self.geo, i, u)
            out[name] = a[start:stop].reshape(lay.unit_shapes(self.shapes[i])[u])
        return out

    def host_arrays(self, i, host=None) -> list:
        """Leaf i's state arrays as a host :class:`numbaopt.Leaf` holds them (element states, unit arrays, a
        geometry row of its own), in host memory: sliced from ``host`` (the arenas copied to the host) or, without
        it, copied slice by slice from the device."""
        lay = self.layout
        o, n = int(self.offsets[i]), int(self.sizes[i])
        src = self.arenas if host is None else host
        get = (lambda a: a.copy_to_host()) if host is None else (lambda a: a.copy())
        out = [get(h[o:o + n]) for h in src[:lay.n_state]]
        if lay.units:
            spans = [lay.unit_span(self.geo, i, u) for u in range(lay.n_unit)]
            out += [get(h[a:b]) for h, (a, b) in zip(lay.unit_arrays(src), spans)]
            out.append(lay.new_units([self.shapes[i]], self.dtype)[-1])
        return out

    def _chunk_table(self, leaves):
        """``(bleaf, bstart, nblocks)`` on the device for the blocks of ``leaves`` (built once per set)."""
        key = leaves.tobytes()
        tab = self._chunks.get(key)
        if tab is None:
            from numba import cuda
            chunk = runtime().CHUNK
            bleaf, bstart = [], []
            for j in leaves:
                for st in range(0, max(int(self.sizes[j]), 1), chunk):
                    bleaf.append(int(j))
                    bstart.append(st)
            tab = self._chunks[key] = (cuda.to_device(np.array(bleaf, dtype=np.int64)),
                                       cuda.to_device(np.array(bstart, dtype=np.int64)), len(bleaf))
        return tab

    def _table(self, objs, what, table, dev, leaves=None):
        """Check ``objs`` (those of ``leaves``; all when None) against the group's leaves and upload
        their addresses when they changed (a leaf not stepped gets address 0)."""
        if len(objs) != len(self.shapes):
            raise ValueError(f"{what}: {len(objs)} arrays for a group of {len(self.shapes)}")
        addr = np.zeros(len(objs), dtype=np.int64)
        for i in (range(len(objs)) if leaves is None else leaves):
            o = objs[i]
            if what == "grads":
                addr[i] = check_device_grad(o, self.dtype, self.shapes[i], f"grads[{i}]", "device parameters")[1]
                continue
            if not is_device_array(o):
                raise TypeError(f"{what}[{i}]: expected a device array, got {type(o).__name__}")
            _, shape, dt, a = info(o, f"{what}[{i}]")
            if tuple(shape) != self.shapes[i]:
                raise ValueError(f"{what}[{i}]: shape {tuple(shape)}, expected {self.shapes[i]}")
            if dt != self.dtype:
                raise TypeError(f"{what}[{i}]: dtype {dt}, expected {self.dtype}")
            addr[i] = a
        if not np.array_equal(addr, table):
            table[:] = addr
            dev.copy_to_device(table)

    def prepare(self, params, grads, active=None, reduce=True):
        """Check and run everything of a step on the leaves ``active`` (all when None) that can refuse it,
        writing nothing but scratch buffers; returns what :meth:`commit` launches. Raises the rule's error
        (or a bad array's) before anything is written. Leaves at several step counts need one launch each:
        their reductions then run in :meth:`commit` (``prepared.undo_needed`` tells the caller to keep a copy).
        ``reduce=False``: the caller runs the reductions pass by pass (:meth:`reduce_pass`, :meth:`finish_pass`,
        then :meth:`reduced`), with other groups' (a tree-scope reduction over several device groups)."""
        params, grads = list(params), list(grads)
        n = len(self.shapes)
        every = active is None or len(active) == n
        leaves = np.arange(n, dtype=np.int64) if active is None else np.asarray(active, dtype=np.int64)
        if every:
            # the same objects as last step (persistent buffers): nothing to check or upload; the
            # references held here keep their addresses from being reused by other arrays
            if table_stale(params, self._params, self._xaddr):
                self._params = None
                self._table(params, "params", self._xaddr, self._xaddr_dev)
                self._params = params
            if table_stale(grads, self._grads, self._gaddr):
                self._grads = None
                self._table(grads, "grads", self._gaddr, self._gaddr_dev)
                self._grads = grads
        else:  # a subset (a tree with None gradients or frozen leaves): tables made for this step
            self._params = self._grads = None
            self._table(params, "params", self._xaddr, self._xaddr_dev, leaves)
            self._table(grads, "grads", self._gaddr, self._gaddr_dev, leaves)
        keep = self._copy_aliased(grads, leaves)
        tvals = self.ts[leaves]
        if tvals.min() == tvals.max():  # the usual case: one launch
            steps = [np.sort(leaves)]
        else:
            steps = [np.sort(leaves[tvals == t]) for t in np.unique(tvals)]
        if len(steps) > 1 and any(self.mod.plan.tree.values()):
            raise NotImplementedError(f"{self.rule!r}: a reduction over the whole group needs its leaves at one "
                                      f"step count; they are at {sorted(set(tvals.tolist()))}")
        launches = [(sub, self.layout.hyper_vector(int(self.ts[sub[0]]) + 1, None, self.dtype)
                     if self.scheduled else self.hp) for sub in steps]  # schedules checked here
        prepared = _Prepared(launches)
        prepared.keep = keep
        if len(launches) == 1:
            prepared.status = self._reduce(*launches[0]) if reduce else 0
        else:
            prepared.undo_needed = bool(self.layout.reducers)
        return prepared

    def _copy_aliased(self, grads, leaves):
        """Gradients overlapping a parameter (other than their own, exactly) or the state arenas: their
        table entries point to device copies for this step (the copies are returned, to be kept alive until
        the launch; the table is rebuilt next step, when the gradients may hold new values)."""
        nbytes = self.sizes[leaves] * self.dtype.itemsize
        x, g = self._xaddr[leaves], self._gaddr[leaves]
        spans = self.__dict__.get("_arena_spans")
        if spans is None:  # the arenas never move: measured once
            lo = [info(a, "state", write=False)[3] for a in self.arenas]
            spans = self._arena_spans = (np.array(lo, dtype=np.int64),
                                         np.array([b + a.size * a.dtype.itemsize for b, a in zip(lo, self.arenas)],
                                                  dtype=np.int64))
        flags = np.zeros(len(leaves), dtype=np.bool_)
        aliased_leaves(x, g, nbytes, leaves, spans[0], spans[1], flags)
        bad = leaves[flags]
        if not len(bad):
            return []
        copies = []
        for i in bad:
            c = device_copies([flat(info(grads[i], f"grads[{i}]", write=False)[0], int(self.sizes[i]))])[0]
            copies.append(c)
            self._gaddr[i] = info(c, f"grads[{i}]", write=False)[3]
        self._gaddr_dev.copy_to_device(self._gaddr)
        self._grads = None  # the user's arrays again next step
        return copies

    def _reduce(self, sub, hp):
        """Run the reductions of one launch; raise a refusal; returns the status (0, or 1 = skip)."""
        rt = runtime()
        if not self.mod.plan.phases:
            return 0
        sc = self.scratch
        sc.sync_hp(hp)
        nb = self._chunk_table(sub)[2]
        run_reductions(self.mod, self.layout, sc, self._args(sub), len(self.shapes), lambda k: k[nb, rt.TPB],
                       self.arenas, first=int(sub[0]))
        status, row = decode(int(sc.st.copy_to_host()[0])) if self.mod.plan.status else (0, None)
        raise_status(self.rule, status, "" if row is None else f"leaf {row}")
        return status

    # -- reductions pass by pass, with other device groups (a tree-scope reduction spanning several) --------
    def reduce_pass(self, prepared, r) -> None:
        """The dry pass of member ``r`` over the one launch of ``prepared`` (its totals in the scratch table)."""
        sub, hp = prepared.launches[0]
        self.scratch.sync_hp(hp)
        nb = self._chunk_table(sub)[2]
        rt = runtime()
        reduce_phase(self.mod, self.layout, self.scratch, self._args(sub), len(self.shapes), lambda k: k[nb, rt.TPB],
                     self.arenas, r)

    def finish_pass(self, prepared, r) -> None:
        """The finish of reducer ``r`` from the totals in the scratch table."""
        sub, _ = prepared.launches[0]
        finish_phase(self.mod, self.layout, self.scratch, self._args(sub), len(self.shapes), self.arenas,
                     int(sub[0]), r)

    def totals(self, r) -> np.ndarray:
        """Tree-scope reducer ``r``'s totals over this group's leaves (a host copy)."""
        plan = self.mod.plan
        return self.scratch.acc[0:1, plan.abase[r]:plan.abase[r] + plan.nops[r]].copy_to_host()[0]

    def set_totals(self, r, tot) -> None:
        """Replace tree-scope reducer ``r``'s totals (with those of every group it spans)."""
        plan = self.mod.plan
        self.scratch.acc[0:1, plan.abase[r]:plan.abase[r] + plan.nops[r]].copy_to_device(
            np.ascontiguousarray(tot, dtype=np.float64).reshape(1, -1))

    def reduced(self, prepared) -> None:
        """After the passes: the status of the step (a refusal raised, a skip kept for :meth:`commit`)."""
        status, row = decode(int(self.scratch.st.copy_to_host()[0])) if self.mod.plan.status else (0, None)
        raise_status(self.rule, status, "" if row is None else f"leaf {row}")
        prepared.status = status

    def _args(self, sub):
        bleaf, bstart, _ = self._chunk_table(sub)
        return [self._xaddr_dev, self._gaddr_dev, self._sizes_dev, self._offsets_dev, bleaf, bstart, *self.arenas,
                self.scratch.hp_dev, int(self.ts[sub[0]]) + 1]

    def commit(self, prepared):
        """Launch the element kernels of a prepared step and advance the counters."""
        rt = runtime()
        sc = self.scratch
        for _k, (sub, hp) in enumerate(prepared.launches):
            status = prepared.status if len(prepared.launches) == 1 else self._reduce(sub, hp)
            sc.sync_hp(hp)
            if hp is not self.hp:
                self.hp[:] = hp
            if status == 0:
                args = self._args(sub) + ([sc.fin, sc.st, *sc.tables] if self.mod.plan.phases else [])
                self.mod.multi[self._chunk_table(sub)[2], rt.TPB](*args)
                self.ts[sub] += 1
            else:
                self.skips[sub] += 1

    def _step(self, params, grads, active=None):
        """Step the leaves ``active`` (all when None) in place; raises what the rule refuses (then nothing
        is written, also when the leaves are at several step counts)."""
        prepared = self.prepare(params, grads, active)
        if not prepared.undo_needed:
            self.commit(prepared)
            return
        saved = self.snapshot()
        try:
            self.commit(prepared)
        except BaseException:
            self.restore(saved)
            raise

    def snapshot(self):
        """A copy of what a step writes (arenas on the device, counters and hyperparameters on the host)."""
        return device_copies(self.arenas), self.ts.copy(), self.skips.copy(), self.hp.copy()

    def restore(self, saved):
        """Put back a :meth:`snapshot`."""
        arenas, ts, skips, hp = saved
        for a, b in zip(self.arenas, arenas):
            a.copy_to_device(b)
        self.ts[...], self.skips[...], self.hp[...] = ts, skips, hp

    def update_(self, params, grads):
        """One step on every leaf in place; returns ``(self, params)``."""
        self._step(params, grads)
        return self, params

    def copy(self) -> DeviceGroup:
        """An independent copy (device-to-device copies of the arenas)."""
        g = DeviceGroup.__new__(DeviceGroup)
        g.__dict__.update(self.__dict__)
        g.arenas = tuple(device_copies(self.arenas))
        g.__dict__.pop("_arena_spans", None)  # measured again for the new arenas
        g.users = 0
        g.ts, g.skips, g.hp = self.ts.copy(), self.skips.copy(), self.hp.copy()
        g.scratch = g.new_scratch(g.hp)
        g._new_tables()
        return g

    # Pickling copies the state to host memory (under the in-use guard: never half-written); unpickling puts
    # it on the current device, and needs one. copy.copy/deepcopy copy on the device.
    def __reduce__(self):
        return (_group_from_host, (as_reader(self, "pickle", self.to_host),))

    def __copy__(self) -> DeviceGroup:
        return as_reader(self, "copy", self.copy)

    def __deepcopy__(self, memo) -> DeviceGroup:
        return self.__copy__()

    def copy_params(self, params, leaves=None):
        """New device arrays (of each parameter's kind) holding copies of ``params`` (those of ``leaves``)."""
        outs = list(params)
        for i in (range(len(outs)) if leaves is None else leaves):
            p = outs[i]
            if not is_device_array(p):
                raise TypeError(f"params[{i}]: expected a device array, got {type(p).__name__}")
            src, shape, dt, _ = info(p, f"params[{i}]", write=False)
            o = empty_like(kind(p), p, shape, dt)
            size = int(np.prod(shape, dtype=np.int64))
            flat(info(o, "out")[0], size).copy_to_device(flat(src, size))
            outs[i] = o
        return outs

    def update(self, params, grads):
        """Pure step: returns ``(new_group, new_params)``; the inputs are untouched."""
        new = self.copy()
        outs = self.copy_params(params)
        new._step(outs, grads)
        new._params = new._grads = None  # the caller's arrays now: do not keep their addresses
        return new, outs

    def set_rule_(self, rule, hp=None) -> None:
        """Switch to ``rule`` (same options) in place, with its checked hyperparameters ``hp`` (computed
        here when not given); checks everything before changing anything."""
        layout = ChainLayout(rule)
        if hp is None:
            hp = layout.hyper_vector(self.t + 1, self.t + 1, self.dtype)
        self.rule, self.layout = rule, layout
        self.hp[:] = hp

    def adjust(self, hyper: dict, inplace: bool) -> DeviceGroup:
        """The group with hyperparameters changed (``numbaopt.adjust``/``adjust_`` call this)."""
        rule = adjusted_rule(self.rule, hyper)
        target = self if inplace else self.copy()
        target.set_rule_(rule)
        return target

    def to_host(self) -> list:
        """One host :class:`numbaopt.Leaf` per leaf (state copied to host memory)."""
        host = [a.copy_to_host() for a in self.arenas]
        out = []
        for i, shape in enumerate(self.shapes):
            t = int(self.ts[i])
            hp = self.layout.hyper_vector(t + 1, t + 1, self.dtype) if self.scheduled else self.hp.copy()
            out.append(Leaf(self.rule, shape, self.dtype, arrays=self.host_arrays(i, host),
                            t=t, hp=hp, skipped=int(self.skips[i])))
        return out

    @classmethod
    def from_host(cls, leaves, params=None) -> DeviceGroup:
        """A group with the state of host leaves (as from :meth:`to_host`), for the device arrays ``params``
        (checked against the leaves' shapes and dtype) or, without them, for the leaves' shapes."""
        from numba import cuda
        leaves = list(leaves)
        if not leaves:
            raise ValueError("from_host: no leaves")
        first = leaves[0]
        for i, lf in enumerate(leaves):
            if lf.rule != first.rule or lf.dtype != first.dtype:
                raise ValueError(f"leaves[{i}]: a group needs one rule and one dtype")
        lay = first.layout
        k = lay.n_state + lay.n_unit  # the geometry table is made again from the shapes
        arenas = tuple(cuda.to_device(np.concatenate([np.ascontiguousarray(lf.arrays[a]).reshape(-1)
                                                      for lf in leaves])) for a in range(k))
        if lay.units:
            arenas += (cuda.to_device(lay.new_units([lf.shape for lf in leaves], first.dtype)[-1]),)
        ts = np.array([lf.t for lf in leaves], dtype=np.int64)
        hp = first.layout.hyper_vector(int(ts.max()) + 1, None, first.dtype)
        g = cls(first.rule, params, _arenas=arenas, t=ts, hp=hp,
                skipped=np.array([lf.skipped for lf in leaves], dtype=np.int64),
                _shapes=[lf.shape for lf in leaves], _dtype=first.dtype)
        if g.shapes != [tuple(lf.shape) for lf in leaves]:
            raise ValueError(f"from_host: parameter shapes {g.shapes}, the leaves' {[lf.shape for lf in leaves]}")
        return g


def _group_from_host(leaves) -> DeviceGroup:
    """Unpickling a :class:`DeviceGroup`: its host state back on the current device."""
    unpickling_runtime("DeviceGroup")
    return DeviceGroup.from_host(leaves)


def setup_device_group(rule, params) -> DeviceGroup:
    """One :class:`DeviceGroup` for a list of device arrays (one dtype): one launch per step."""
    return DeviceGroup(rule, params)


class _Prepared:
    """A checked step of a group: ``launches`` = (leaves, hyperparameters) per step count."""

    __slots__ = ("launches", "status", "undo_needed", "keep")

    def __init__(self, launches):
        self.launches, self.status, self.undo_needed, self.keep = launches, 0, False, []


def tree_group(rule, xs, wheres):
    """The state of a tree's device leaves under one rule and dtype: one :class:`DeviceGroup` (one launch
    per step for all of them). ``wheres`` name the leaves' paths for errors."""
    rule = as_rule(rule)
    check_device_rule(rule, wheres[0])
    try:
        runtime()
    except (ImportError, RuntimeError) as e:  # in a tree, as every bad leaf: a TypeError naming the path
        raise TypeError(f"{wheres[0]}: {e}") from None
    for x, where in zip(xs, wheres):
        try:
            _, _, dtype, _ = info(x, where)
            check_param_dtype(dtype, where)
        except (TypeError, ValueError) as e:
            raise type(e)(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
    try:
        return DeviceGroup(rule, xs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{wheres[0]}: {e}") from None
