"""The step of a tree, pure or in place, as ONE transaction: everything that can refuse it runs first.

1. :func:`numbaopt.tree.collect.collect` checks the model and gradient leaves (messages name the path);
2. :func:`plan` makes one :class:`Run` per group (and step count, when a schedule needs one): the leaves it
   steps, their addresses, the hyperparameters of their step (schedules evaluated and checked here), and
   for the pure step the new arrays;
3. :func:`execute` *checks*: the reductions of every group that can refuse the step except one (dry passes:
   they write only scratch tables), the tree-scope reductions that span several groups (partial sums of
   every group combined in leaf order, then ``finish`` once), the device groups' reductions; then it
   *commits*: the one unchecked refusing group first (its fused kernel reduces before it writes), then the
   element passes of the others, which cannot refuse. Device groups whose leaves are at several step
   counts cannot be checked ahead: they are copied on the device first and restored if they refuse;
4. write-backs (strided views, master copies into float16 parameters, new leaves for read-only ones) and
   the rebuilt model.

So a refusal (a non-finite norm, a schedule leaving its domain, a bad leaf) leaves every parameter, state
array, counter and hyperparameter as it was, and its message names the leaf or the hyperparameter.
"""
from __future__ import annotations

import numpy as np

from ..backends import abi, pool
from ..backends.alias import aliased_leaves
from ..compiler.layout import ERROR_BASE
from .collect import collect
from .params import ND_READONLY, ND_WRITEABLE
from .passes import device_phased, phased, refusal
from .scopes import domains
from .state import TreeCore
from .structure import rebuild

__all__ = ["Run", "Order", "plan", "execute", "step_tree", "addresses"]


def addresses(arrays) -> np.ndarray:
    """Data pointers of many exact ndarrays (compiled header reads when the layout was verified)."""
    n = len(arrays)
    out = np.empty(n, dtype=np.int64)
    if abi.OK and abi.data_pointers(np.fromiter(map(id, arrays), np.int64, n), abi.ARRAY_TYPE, out) == -1:
        return out
    for i, a in enumerate(arrays):  # no verified layout
        out[i] = a.ctypes.data
    return out


class Run:
    """One call of a group's kernel: ``act`` (1 = step the leaf, 0 = leave it, 2 = another run's),
    ``xaddr``/``gaddr``/``xoaddr`` (per leaf, 0 where not stepped), ``hp``, the scratch tables ``F``/``P``,
    ``out`` = (new arenas, new counters) of a pure step, ``checked`` once its reductions ran."""

    __slots__ = ("grp", "act", "xaddr", "gaddr", "xoaddr", "hp", "F", "P", "out", "checked", "fused", "fresh")

    def __init__(self, grp, act, xaddr, gaddr, hp, F=None, P=None, xoaddr=None, out=None):
        self.grp, self.act, self.xaddr, self.gaddr, self.hp = grp, act, xaddr, gaddr, hp
        self.F = grp.F if F is None else F
        self.P = grp.P if P is None else P
        self.xoaddr, self.out, self.checked = xoaddr, out, False
        self.fused = None  # (kernel, arguments) of the one-call commit, made on first use
        self.fresh = False  # a pure step's new group, stepped in place (ChainLayout.pure_by_copy)

    def set_hp(self, hp) -> None:
        """New hyperparameters for this run (a schedule's values of the next step)."""
        self.hp, self.fused = hp, None

    def fused_call(self):
        """``(kernel, arguments)`` of the fused one-call commit (kept: a fast plan reuses its runs)."""
        f = self.fused
        if f is None:
            mod = self.grp.mod
            if not self.grp.layout.reducers:  # nothing to reduce: the element pass alone (status 0), and the
                # fused wrapper is never compiled (linking it re-optimises the pass: 0.2-1 s a chain, cold)
                f = self.fused = (mod.apply if self.out is None else mod.apply_out, self.args(False))
            else:
                f = self.fused = (mod.multi if self.out is None else mod.multi_out, self.args(False) + (self.P,))
        return f

    def args(self, reduce: bool) -> tuple:
        g = self.grp
        if self.out is None or reduce:
            head = (self.xaddr, self.gaddr, g.sizes, g.offsets, *g.arenas)
        else:
            head = (self.xaddr, self.gaddr, self.xoaddr, g.sizes, g.offsets, *g.arenas, *self.out[0])
        C = g.C if (self.out is None or reduce) else self.out[1]
        return head + (self.hp, C, self.act, self.F) + ((self.P,) if reduce else ())


# --------------------------------------------------------------------------------------------------
# plan


def _kernel_x(grp, j, x, info, inplace, posts, u):
    """The array the kernel steps for leaf ``j`` (written in place, or read by a pure step), and what to do
    with it afterwards."""
    if inplace and info.after_write is not None and info.writeable:  # called once the step committed (_finish)
        posts.append(("written", u, j, x, info, int(grp.C[0, j])))
    master = grp.masters[j]
    if master is not None:  # MixedPrecision: the kernels run on the master copy
        if inplace:
            posts.append(("master", u, j, x, info, int(grp.C[0, j])))
        return master
    a = x if (info is ND_WRITEABLE or info is ND_READONLY) else info.to_array(x)
    dt = grp.dtype
    if not inplace:
        if type(a) is np.ndarray and a.dtype == dt and a.flags.c_contiguous and a.flags.aligned:
            return a  # read only
        return np.array(a, dtype=dt, order="C")
    if info.writeable:
        if type(a) is np.ndarray and a.flags.carray and a.dtype == dt:  # C-contiguous, aligned, writeable
            return a
        t = np.array(a, dtype=dt, order="C", copy=True)
        posts.append(("back", u, j, a, t, None))
        return t
    t = np.array(a, dtype=dt, order="C", copy=True)
    posts.append(("new", u, j, x, info, t, int(grp.C[0, j])))
    return t


def _runs_of(c, grp, xu, iu, gu, inplace, posts, news):
    """The runs of one group (one per step count when a schedule needs it); pure: also its new arrays."""
    n = len(grp.members)
    active = [j for j, u in enumerate(grp.members) if gu[u] is not None]
    if not active:
        if not inplace:
            news.append(grp.copy())
        return []
    members, masters, dt = grp.members, grp.masters, grp.dtype
    targets, grads = [], []
    for j in active:
        u = members[j]
        x, info = xu[u], iu[u]
        # the common leaf, a plain C-contiguous array of the compute dtype, without a call
        if (info is ND_WRITEABLE or (info is ND_READONLY and not inplace)) and masters[j] is None \
                and x.dtype == dt and (x.flags.carray or (not inplace and x.flags.c_contiguous and x.flags.aligned)):
            targets.append(x)
        else:
            targets.append(_kernel_x(grp, j, x, info, inplace, posts, u))
        g = gu[u]
        if not (type(g) is np.ndarray and g.dtype == dt
                and (g.flags.carray or (g.flags.c_contiguous and g.flags.aligned))):
            g = np.array(g, dtype=dt, order="C")
        grads.append(g)
    every = len(active) == n
    js = grp.act_all if every else np.array(active, dtype=np.int64)
    if every:
        xaddr, gaddr = addresses(targets), addresses(grads)
    else:
        xaddr, gaddr = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        xaddr[js], gaddr[js] = addresses(targets), addresses(grads)
    xoaddr = out = None
    target = grp  # the group the runs step: a pure step by copy steps the new group in place
    if not inplace:
        by_copy = grp.layout.pure_by_copy  # the in-place kernels on copies (ChainLayout.pure_by_copy)
        outs = []
        new_masters = list(masters)
        shapes = c.structure.u_shape
        for j, t_ in zip(active, targets):
            u = members[j]
            if masters[j] is not None:
                xo = new_masters[j] = pool.empty(grp.sizes[j], dt)
                posts.append(("newmaster", u, j, xu[u], iu[u], xo))
            else:
                xo = pool.empty(shapes[u], dt)
                posts.append(("new", u, j, xu[u], iu[u], xo, None))
            if by_copy:
                xo.reshape(-1)[:] = t_.reshape(-1)
            outs.append(xo)
        for j, m in enumerate(new_masters):
            if m is not None and m is masters[j]:
                new_masters[j] = m.copy()  # a leaf not stepped: its master copied into the new state
        if every:
            xoaddr = addresses(outs)
        else:
            xoaddr = np.zeros(n, dtype=np.int64)
            xoaddr[js] = addresses(outs)
        arenas = [pool.empty_like(a) for a in grp.arenas]
        if by_copy:
            for a, b in zip(grp.arenas, arenas):
                b[...] = a
        new = grp.derive(arenas, grp.C.copy(), new_masters)
        news.append(new)
        if by_copy:
            target, xaddr, xoaddr = new, xoaddr, None
        else:
            out = (new.arenas, new.C)
    # alive until the kernels ran: the addresses point into them; by leaf j (None: not stepped)
    keep = [None] * n
    for j, t_, g_ in zip(active, targets, grads):
        keep[j] = (t_, g_)
    # the hyperparameters of each step count (one run unless a schedule meets leaves at different counts)
    if grp.layout.scheduled:
        keys = sorted({(int(grp.C[0, j]), int(grp.C[1, j])) for j in active})
    else:
        keys = [None]
    runs = []
    for k, key in enumerate(keys):
        if key is None:
            if every:
                act = grp.act  # all ones
            else:
                act = np.zeros(n, dtype=np.int64)
                act[js] = 1
            hp = grp.hp
        else:
            sel = [j for j in active if (int(grp.C[0, j]), int(grp.C[1, j])) == key]
            # the first run leaves the other runs' leaves (2) and copies the inactive ones (0, pure step)
            act = np.zeros(n, dtype=np.int64) if k == 0 else np.full(n, 2, dtype=np.int64)
            act[js] = 2
            act[sel] = 1
            try:
                hp = grp.hp_at(key[0] + 1, key[1] + 1)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{c.structure.where(grp.members[sel[0]], 'state')}: {e}") from None
        F = P = None
        if k:  # several runs of one group: each its own scratch tables
            F, P = np.zeros_like(grp.F), np.zeros_like(grp.P)
        run = Run(target, act, xaddr, gaddr, hp, F, P, xoaddr, out)
        run.fresh = target is not grp
        runs.append(run)
    return runs, keep


def _copy_aliased(c: TreeCore, runs, keep) -> None:
    """In place: a gradient that overlaps a parameter the kernels write (other than by being its own
    parameter) or a state arena is replaced by a copy before anything runs (see
    :mod:`numbaopt.backends.alias`). Checked on the kernels' own addresses, in one compiled call: strided and
    read-only parameters are stepped through copies, written back after every gradient was read."""
    groups = {id(run.grp): (run.grp, run.xaddr, run.gaddr) for run in runs}
    if len(groups) == 1:
        (grp, xaddr, gaddr), = groups.values()
        nbytes, owner = grp.nbytes, grp.units
    else:
        grps = list(groups.values())
        xaddr, gaddr = np.concatenate([v[1] for v in grps]), np.concatenate([v[2] for v in grps])
        nbytes, owner = np.concatenate([v[0].nbytes for v in grps]), np.concatenate([v[0].units for v in grps])
    alo, ahi = c.arena_spans()
    bad = np.zeros(len(xaddr), dtype=np.bool_)
    if not aliased_leaves(xaddr, gaddr, nbytes, owner, alo, ahi, bad):
        return
    k0 = 0
    for grp, _, ga in groups.values():
        entries = keep[id(grp)]
        for j in np.nonzero(bad[k0:k0 + len(ga)])[0]:
            target, g = entries[j]
            fresh = g.copy()
            entries[j] = (target, fresh)  # kept alive with the others until the kernels ran
            ga[j] = addresses([fresh])[0]
        k0 += len(ga)


def plan(c: TreeCore, model, grads, inplace: bool, collected=None):
    """Check the leaves and make the runs: ``(runs, devices, posts, (new groups, new device groups), keep,
    (xu, iu))``; ``keep`` holds the temporaries the runs' addresses point into. ``collected``: the result of
    :func:`collect` for this model and gradient, when the caller has it (``grads`` is then not read)."""
    xu, iu, gu = collect(c, model, grads) if collected is None else collected
    posts, news, keep = [], [], {}
    runs = []
    for grp in c.groups:
        got = _runs_of(c, grp, xu, iu, gu, inplace, posts, news)
        if got:
            runs += got[0]
            keep[id(grp)] = got[1]
    if inplace and runs:
        _copy_aliased(c, runs, keep)
    devices, new_devices = [], []
    s = c.structure
    for di, dg in enumerate(c.device_groups):
        members = [u for u in range(s.n_unique) if s.u_device[u] == di]
        js = [s.u_j[u] for u in members if gu[u] is not None]
        target = dg if inplace else dg.copy()
        if not js:
            new_devices.append(target)
            continue
        xs, gs = [None] * len(dg.shapes), [None] * len(dg.shapes)
        for u in members:
            if gu[u] is not None:
                xs[s.u_j[u]], gs[s.u_j[u]] = xu[u], gu[u]
        if not inplace:  # the copy steps copies of the parameters
            xs = target.copy_params(xs, js)
            for u in members:
                if gu[u] is not None:
                    posts.append(("device", u, None, xs[s.u_j[u]], None, None, None))
        else:
            for u in members:
                if gu[u] is not None and iu[u].after_write is not None:
                    posts.append(("written", u, None, xu[u], iu[u], None))
        devices.append((target, xs, gs, js))
        new_devices.append(target)
    return runs, devices, posts, (news, new_devices), keep, (xu, iu)


# --------------------------------------------------------------------------------------------------
# the transaction


def _commit(s, run):
    if run.checked:
        mod = run.grp.mod
        (mod.apply if run.out is None else mod.apply_out)(*run.args(False))
        return
    kernel, args = run.fused_call()
    status = kernel(*args)
    if status:
        raise refusal(s, run, status - ERROR_BASE)


class Order:
    """How the runs of a step are checked and committed (see :func:`execute`); a fast plan keeps its own.

    ``reducer``: a function ``(structure, runs)`` that does the reductions of a domain's runs in place of
    :func:`numbaopt.tree.passes.phased` (same contract: partials, finals in ``F``, a refusal raised before
    anything is written).
    The distributed step (:mod:`numbaopt.mpi`) combines the partials of every rank there; with a reducer,
    every run with a reduction goes through it."""

    __slots__ = ("runs", "domains", "risky", "first", "simple", "reducer")

    def __init__(self, runs, may_defer: bool = True, reducer=None):
        self.runs, self.reducer = runs, reducer
        self.domains = domains(runs, reducer is not None)
        phased = {id(r) for d in self.domains for r in d}
        risky = [r for r in runs if id(r) not in phased and r.grp.layout.refusing()]
        self.first = risky.pop(0) if risky and may_defer else None
        self.risky = risky
        #: nothing to check ahead: at most one run can refuse, and it goes first (fast plans use this)
        self.simple = not self.domains and not risky


def execute(s, order: Order, devices=()) -> None:
    """Check, then commit, the runs and device steps of one tree step (see the module docstring)."""
    if order.simple and not devices:
        first = order.first
        if first is not None:
            _commit(s, first)  # refuses, if it does, before it writes
        for run in order.runs:
            if run is not first:
                kernel, args = run.fused_call()
                kernel(*args)  # cannot refuse: no run but the first has a refusing reduction
        _keep_hp(order.runs)
        return
    for run in order.runs:
        run.checked = False
    reduce_domain = order.reducer or phased
    for dom in order.domains:
        reduce_domain(s, dom)
    linked = domains([dg for dg, *_ in devices], group=lambda dg: dg) if len(devices) > 1 else []
    together = {id(dg) for dom in linked for dg in dom}
    preps = [(dg, dg.prepare(xs, gs, js, id(dg) not in together)) for dg, xs, gs, js in devices]
    for dom in linked:
        device_phased(dom, dict((id(dg), p) for dg, p in preps))
    undo = [(dg, p) for dg, p in preps if p.undo_needed]
    first = order.first
    if first is not None and undo:  # a device step that can refuse late goes first: check this one too
        order = Order(order.runs, may_defer=False, reducer=order.reducer)
        first = None
    for run in order.risky:  # dry: their refusal comes before anything is written
        status = run.grp.mod.reductions(*run.args(True))
        if status:
            raise refusal(s, run, status - ERROR_BASE)
        run.checked = True
    if first is not None:
        _commit(s, first)  # refuses, if it does, before it writes
    snaps = []
    try:
        for dg, p in undo:
            snaps.append((dg, dg.snapshot()))
            dg.commit(p)
    except BaseException:
        for dg, saved in reversed(snaps):
            dg.restore(saved)
        raise
    for run in order.runs:
        if run is not first:
            _commit(s, run)
    for dg, p in preps:
        if not p.undo_needed:
            dg.commit(p)
    _keep_hp(order.runs)


def _keep_hp(runs):
    """A schedule's values of this step into the groups stepped in place, as their leaf views show them."""
    for run in runs:
        if run.out is None and not run.fresh and run.hp is not run.grp.hp:
            run.grp.hp[:] = run.hp


# --------------------------------------------------------------------------------------------------
# the whole step


def _finish(c, posts, inplace) -> dict:
    """The write-backs after the kernels ran; returns {unit: new leaf value}. Then the ``after_write`` of
    every leaf written in place (a leaf whose step count did not move, accumulating or skipped, was not)."""
    new, written = {}, []
    for post in posts:
        kind, u, j = post[0], post[1], post[2]
        if kind == "written":
            written.append(post)
        elif kind == "back":
            post[3][...] = post[4].reshape(post[3].shape)  # through to the base of a strided view
        elif kind == "device":
            new[u] = post[3]
        elif kind == "new":
            _, _, j, x, info, t, t0 = post
            grp = c.groups[c.structure.u_group[u]] if t0 is not None else None
            if t0 is None or grp.C[0, j] != t0:
                shape = c.structure.u_shape[u]
                t = t if t.shape == shape else t.reshape(shape)
                new[u] = t if info is ND_WRITEABLE else info.from_array(t, x)
        elif kind == "newmaster":
            _, _, j, x, info, xo = post
            new[u] = info.from_array(xo.astype(c.structure.u_dtype[u]).reshape(c.structure.u_shape[u]), x)
        elif kind == "master":
            _, _, j, x, info, t0 = post
            grp = c.groups[c.structure.u_group[u]]
            if grp.C[0, j] == t0:
                continue  # not stepped (accumulating, skipped): the parameter stays
            m = grp.masters[j].reshape(c.structure.u_shape[u])
            a = x if (info is ND_WRITEABLE or info is ND_READONLY) else (info.to_array(x) if info.writeable else None)
            if info.writeable and type(a) is np.ndarray:
                a[...] = m  # rounded to the parameter's dtype
            else:
                new[u] = info.from_array(m.astype(c.structure.u_dtype[u]), x)
    for _, u, j, x, info, t0 in written:
        if t0 is None or c.groups[c.structure.u_group[u]].C[0, j] != t0:
            info.after_write(x)
    return new


def step_tree(c: TreeCore, model, grads, inplace: bool, collected=None):
    """One step of a tree: ``(core, new_model, (xu, iu))``; pure: ``core`` is the new state's; ``xu``/``iu``
    are the unit values seen (the fast path plans from them). ``collected``: see :func:`plan`."""
    s = c.structure
    runs, devices, posts, (news, new_devices), keep, seen = plan(c, model, grads, inplace, collected)
    # pure: the runs read the old state and write the new groups' arrays
    execute(s, Order(runs, reducer=c.reducer), devices)
    out = c if inplace else TreeCore(s, news, new_devices, c.frozen.copy())
    new = _finish(out, posts, inplace)
    del keep
    npos = {p: v for u, v in new.items() for p in s.u_positions[u]}
    return out, rebuild(s.root, model, npos, inplace), seen

