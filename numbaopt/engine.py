"""The tree engine: ``setup``/``update``/``update_``/``adjust`` over nested models, and ``freeze_``,
``thaw_``, ``destructure``.

Leaves are grouped by (rule, dtype). A group keeps its state in flat arenas (one array per state
variable, leaves at offsets) with per-leaf step counts, and is updated by ONE call of the generated
``multi`` kernel (see :mod:`numbaopt.codegen`). Two paths feed it:

* the general path (any model): walks model and gradients with path-named validation, sums the
  gradients of tied arrays, skips ``None`` gradients and frozen leaves, copies what cannot be written
  in place (read-only arrays, Python scalars, non-contiguous arrays, every leaf of the pure
  ``update``), then runs the kernel;
* the fast path of ``update_`` (after a general step found every trained leaf to be a writeable
  contiguous array, with no ties, frozen leaves or wrapped rules): a generated function lists the
  parameter and gradient leaves, and :func:`numbaopt._abi.gather_lists` validates them and reads
  their data pointers in compiled code. Anything unexpected falls back to the general path, which
  names the bad leaf.

Everything is validated before anything is written. Rules with a tree-scope reduction must have all
their leaves in one group (one dtype): otherwise ``setup`` raises ``NotImplementedError``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _abi, codegen
from .backends import cpu
from .backends import cuda as _cuda  # device leaves (imports numba.cuda only when it meets one)
from .chain import Chain
from .leaf import Leaf, as_rule, check_param_dtype
from .params import ParamInfo, _new_readonly, param_info
from .rule import Rule
from .tree import StateNode, StateTree, flatten, rebuild, walk_leaves, where

__all__ = ["freeze_", "thaw_", "destructure", "TreeLeaf"]


# --------------------------------------------------------------------------------------------------
# groups and per-leaf views


class Group:
    """Leaves sharing (rule, dtype): flat state arenas, offsets/sizes, step counts, hyperparameters."""

    __slots__ = ("rule", "dtype", "layout", "arenas", "offsets", "sizes", "ts", "skipped", "hp",
                 "scheduled", "reducer", "tree_scope", "members", "_kern")

    def __init__(self, rule, dtype, members, sizes):
        self.rule, self.dtype, self.members = rule, np.dtype(dtype), list(members)
        proto = Leaf(rule, (1,), dtype)  # validates complex support; gives initial state values
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.zeros(len(self.sizes), dtype=np.int64)
        if len(self.sizes) > 1:
            np.cumsum(self.sizes[:-1], out=self.offsets[1:])
        total = int(self.sizes.sum())
        self.arenas = tuple(np.full(total, a[0], dtype=a.dtype) for a in proto.arrays)
        self.ts = np.zeros(len(self.sizes), dtype=np.int64)
        self.skipped = np.zeros(len(self.sizes), dtype=np.int64)
        self._kern = None
        self.hp = None
        self._set_rule(rule)

    def _set_rule(self, rule):
        from .schedules import Schedule
        self.rule = rule
        self.layout = codegen.ChainLayout(rule.rules)
        self.scheduled = any(isinstance(r._values[n], Schedule) for r in rule.rules for n in r._hypers)
        self.reducer = bool(self.layout.reducers)
        self.tree_scope = any(type(r).scope == "tree" for r in rule.rules)
        hp = self.layout.hyper_vector(int(self.ts[0]) + 1 if len(self.ts) else 1, self.dtype)
        if self.hp is None:
            self.hp = hp
        else:
            self.hp[:] = hp  # in place: fast plans and leaf views hold this array

    @property
    def kern(self):
        k = self._kern
        if k is None:
            k = self._kern = codegen.kernels(self.rule.rules, self.dtype)
        return k

    def copy(self) -> "Group":
        new = Group.__new__(Group)
        for s in Group.__slots__:
            setattr(new, s, getattr(self, s))
        new.arenas = tuple(a.copy() for a in self.arenas)
        new.ts, new.skipped, new.hp = self.ts.copy(), self.skipped.copy(), self.hp.copy()
        new.members = list(self.members)
        return new


class TreeLeaf(Leaf):
    """A :class:`Leaf` view of one leaf of a tree's group: its state arrays are views into the
    group's arenas and ``t``/``rule``/``hp`` are read live from the group (``copy()`` detaches)."""

    __slots__ = ("_g", "_j", "_tree", "_u")

    def __init__(self, group, j, shape, tree=None, u=None):
        o, n = int(group.offsets[j]), int(group.sizes[j])
        self._g, self._j, self._tree, self._u = group, j, tree, u
        self.shape, self.dtype = tuple(shape), group.dtype
        self.arrays = tuple(a[o:o + n] for a in group.arenas)
        self.fast = None

    t = property(lambda self: int(self._g.ts[self._j]),
                 lambda self, v: self._g.ts.__setitem__(self._j, v), doc="steps taken (live)")
    skipped = property(lambda self: int(self._g.skipped[self._j]),
                       lambda self, v: self._g.skipped.__setitem__(self._j, v))
    rule = property(lambda self: self._g.rule, lambda self, v: None)
    layout = property(lambda self: self._g.layout, lambda self, v: None)
    hp = property(lambda self: self._g.hp, lambda self, v: None)
    scheduled = property(lambda self: self._g.scheduled, lambda self, v: None)
    kern = property(lambda self: self._g.kern, lambda self, v: None)


class Structure:
    """What ``setup`` learnt about a model; shared by every state derived from it."""

    __slots__ = ("root", "paths", "pos_u", "pos_param", "trained_pos", "n_unique", "u_group", "u_j",
                 "u_shape", "u_dtype", "u_kind", "u_positions", "u_host", "u_tieable", "gather")

    def __init__(self):
        self.gather = {}  # generated gather functions, by the tuple of positions they list


def _is_host(rule) -> bool:
    """Host-level wrappers (MixedPrecision, AccumGrad...) make their own per-leaf state objects."""
    return not isinstance(rule, (Rule, Chain)) and hasattr(rule, "setup_leaf")


def _choose(rule):
    if isinstance(rule, (Rule, Chain)) or hasattr(rule, "setup_leaf"):
        return None, rule
    if callable(rule) and not isinstance(rule, type):
        return rule, None
    return None, as_rule(rule)


def setup(rule, model) -> StateTree:
    """The state of a nested model (see :func:`numbaopt.setup`)."""
    chooser, rule = _choose(rule)
    s = Structure()
    paths, pos_param, pos_rule, values, infos = [], [], [], [], []

    last_rule = [None, None]

    def on_leaf(path, x, trainable):
        try:
            info = param_info(x)
        except TypeError as e:
            raise TypeError(f"model{path}: {e}") from None
        paths.append(path)
        values.append(x)
        infos.append(info)
        pos_param.append(info is not None)
        r = None
        if info is not None and trainable:
            r = chooser(path, x) if chooser is not None else rule
            if r is not None:
                if r is not last_rule[0]:  # as_rule probes attributes: once per distinct rule object
                    last_rule[:] = [r, as_rule(r)]
                r = last_rule[1]
                if not _is_host(r):
                    try:
                        check_param_dtype(info.dtype)
                    except TypeError:  # the path is formatted only for the message
                        check_param_dtype(info.dtype, where=f"model{path}")
                if info.backend not in ("cpu", "cuda"):
                    raise NotImplementedError(f"model{path}: a {info.kind} leaf needs the {info.backend!r} "
                                              "backend, which the tree engine does not drive yet")
        pos_rule.append(r)
        return r is not None

    s.root = flatten(model, on_leaf)
    s.paths, s.pos_param = paths, pos_param
    s.pos_u = [None] * len(paths)
    s.trained_pos = [p for p, r in enumerate(pos_rule) if r is not None]
    u_of_id, u_rule = {}, []
    s.u_shape, s.u_dtype, s.u_kind, s.u_positions, s.u_tieable = [], [], [], [], []
    u_backend = []
    for p in s.trained_pos:
        x, info, r = values[p], infos[p], pos_rule[p]
        u = u_of_id.get(id(x)) if info.tieable else None
        if u is not None:
            if u_rule[u] != r:
                raise ValueError(f"model{paths[p]}: the same array as model{paths[s.u_positions[u][0]]} (tied), "
                                 f"but the rule chooser gave it {r!r} instead of {u_rule[u]!r}")
            s.u_positions[u].append(p)
            s.pos_u[p] = u
            continue
        u = len(u_rule)
        if info.tieable:
            u_of_id[id(x)] = u
        u_rule.append(r)
        s.pos_u[p] = u
        s.u_positions.append([p])
        s.u_shape.append(tuple(info.shape))
        s.u_dtype.append(np.dtype(info.dtype))
        s.u_kind.append(info.kind)
        s.u_tieable.append(info.tieable)
        u_backend.append(info.backend)
    s.n_unique = len(u_rule)
    s.u_group, s.u_j = [None] * s.n_unique, [None] * s.n_unique
    s.u_host = [False] * s.n_unique
    host = {}
    by_key: dict = {}
    distinct, id_map = [], {}  # rules compared once per distinct object, not hashed per leaf
    dev_key: dict = {}
    for u, r in enumerate(u_rule):
        if _is_host(r):
            p = s.u_positions[u][0]
            host[u] = r.setup_leaf(infos[p].to_array(values[p]))
            s.u_host[u] = True
            continue
        ri = id_map.get(id(r))
        if ri is None:
            ri = next((i for i, d in enumerate(distinct) if d == r), None)
            if ri is None:
                ri = len(distinct)
                distinct.append(r)
            id_map[id(r)] = ri
        if u_backend[u] == "cuda":  # device leaves: one DeviceGroup per (rule, dtype), one launch each
            dev_key.setdefault((ri, s.u_dtype[u]), []).append(u)
            continue
        by_key.setdefault((ri, s.u_dtype[u]), []).append(u)
    device_groups = []
    for (ri, dt), members in dev_key.items():
        ps = [s.u_positions[u][0] for u in members]
        grp = _cuda.tree_group(distinct[ri], [values[p] for p in ps], [f"model{paths[p]}" for p in ps])
        device_groups.append(grp)
        for j, u in enumerate(members):
            host[u] = _cuda.DeviceMember(grp, j)
            s.u_host[u] = True
    groups = []
    for (ri, dt), members in by_key.items():
        r = distinct[ri]
        gi = len(groups)
        sizes = [math.prod(s.u_shape[u]) for u in members]
        try:
            groups.append(Group(r, dt, members, sizes))
        except TypeError as e:
            raise TypeError(f"model{paths[s.u_positions[members[0]][0]]}: {e}") from None
        for j, u in enumerate(members):
            s.u_group[u], s.u_j[u] = gi, j
    tree_groups = [g for g in groups if g.tree_scope]
    tree_groups += [g for g in device_groups if any(g.mod.plan.tree.values())]
    if len(tree_groups) > 1:
        raise NotImplementedError(
            "a rule with a tree-scope reduction (e.g. a global-norm clip) would span "
            f"{len(tree_groups)} groups ({', '.join(_group_name(g) for g in tree_groups)}); "
            "the tree engine needs all of its leaves in one group: use one dtype for them, all on the host "
            "or all on the GPU")
    return StateTree(s, groups, np.zeros(s.n_unique, dtype=np.bool_), host)


def _group_name(g) -> str:
    return f"{g.rule!r}/{g.dtype.name}" + (" on the GPU" if isinstance(g, _cuda.DeviceGroup) else "")


# --------------------------------------------------------------------------------------------------
# update


def _check_state(state, fname):
    if not isinstance(state, StateTree):
        if isinstance(state, StateNode):
            raise TypeError(f"{fname}: expected the whole state tree (from setup), got a sub-state")
        raise TypeError(f"{fname}: expected a state from numbaopt.setup, got {type(state).__name__}")


def _grad_array(g, dtype, shape, w):
    if type(g) is not np.ndarray:
        if isinstance(g, (numbers.Real, numbers.Complex)) and not isinstance(g, bool) and shape == ():
            if isinstance(g, (int, np.integer)):
                g = np.asarray(g, dtype=dtype)
            else:
                g = np.asarray(g)
        else:
            try:
                info = param_info(g)
            except TypeError as e:
                raise TypeError(f"{w}: {e}") from None
            if info is None:
                raise TypeError(f"{w}: expected a {dtype} array of shape {shape} (or None), "
                                f"got {type(g).__name__}")
            if info.backend != "cpu":
                raise _cuda.host_grad_error(g, w)
            g = np.asarray(info.to_array(g))
    if g.shape != shape:
        raise ValueError(f"{w}: shape {g.shape}, expected {shape}")
    if g.dtype != dtype:
        if g.dtype.kind != dtype.kind or g.dtype.kind not in "fc":
            raise TypeError(f"{w}: dtype {g.dtype}, expected {dtype} (the parameter's dtype or the same kind)")
        g = g.astype(dtype)
    return g


def _prepare(state, model, grads):
    """Validate model and gradients against the state; per trained unique leaf: (x, info, g)."""
    s = state._s
    n = len(s.paths)
    xs = [None] * n
    walk_leaves(s.root, model, "model", xs, False)
    gs = [None] * n
    walk_leaves(s.root, grads, "grads", gs, True)
    U = s.n_unique
    xu, iu, gu = [None] * U, [None] * U, [None] * U
    frozen = state._frozen
    seen = {}
    for p in s.trained_pos:
        u = s.pos_u[p]
        x = xs[p]
        shape, dtype = s.u_shape[u], s.u_dtype[u]
        if type(x) is np.ndarray and x.dtype == dtype and x.shape == shape:
            # the common leaf, classified without the trait's dispatch (same answer as param_info)
            info = _ND_W if x.flags.writeable else _ND_RO
        else:
            w = where("model", s.paths[p])
            try:
                info = param_info(x)
            except TypeError as e:
                raise TypeError(f"{w}: {e}") from None
            _check_leaf(info, x, dtype, shape, w)
        if info.tieable:
            u0 = seen.setdefault(id(x), u)
            if u0 != u:
                w = where("model", s.paths[p])
                raise ValueError(f"{w}: the same array as model{s.paths[s.u_positions[u0][0]]}, but the "
                                 "state was set up for two different arrays (set up a new state)")
        if xu[u] is None:
            xu[u], iu[u] = x, info
        elif xu[u] is not x:
            raise ValueError(f"{where('model', s.paths[p])}: the state was set up with this leaf tied to model"
                             f"{s.paths[s.u_positions[u][0]]} (the same array); now they differ")
        g = gs[p]
        if g is not None and not frozen[u]:  # a frozen leaf's gradient is ignored, as in the fast path
            if info.backend == "cuda":
                g = _cuda.tree_grad(g, dtype, shape, where("grads", s.paths[p]), gu[u] is not None)
            elif not (type(g) is np.ndarray and g.dtype == dtype and g.shape == shape):
                g = _grad_array(g, dtype, shape, where("grads", s.paths[p]))
            # np.add of 0-d arrays gives a NumPy scalar: keep an ndarray (the kernel reads its header)
            gu[u] = g if gu[u] is None else np.asarray(gu[u] + g)
    return xu, iu, gu


def _check_leaf(info, x, dtype, shape, w):
    if info is None:
        raise TypeError(f"{w}: expected a {dtype} parameter of shape {shape}, got {type(x).__name__}")
    if info.dtype != dtype:
        raise TypeError(f"{w}: dtype {info.dtype}, but the state was set up for {dtype}")
    if tuple(info.shape) != shape:
        raise ValueError(f"{w}: shape {tuple(info.shape)}, but the state was set up for shape {shape}")
    if info.backend == "cuda":  # contiguous and writeable: checked here, before any group writes
        _cuda._info(x, w, write=True)


# what param_info says of a (writeable / read-only) ndarray, less dtype and shape (checked by the caller)
_ND_W = ParamInfo(dtype=None, shape=(), writeable=True, kind="array")
_ND_RO = ParamInfo(dtype=None, shape=(), writeable=False, from_array=_new_readonly, kind="read-only array")


def _addresses(arrays) -> np.ndarray:
    """Data pointers of many ndarrays (compiled header reads when the layout was verified).

    Every element must be an ``np.ndarray`` (not a NumPy scalar): the callers make sure of it.
    """
    n = len(arrays)
    out = np.empty(n, dtype=np.int64)
    if _abi.OK and _abi.data_pointers(np.fromiter(map(id, arrays), np.int64, n), _ARRAY_TYPE, out) == -1:
        return out
    for i, a in enumerate(arrays):  # no verified layout, or an ndarray subclass
        out[i] = np.asarray(a).ctypes.data
    return out


def _may_refuse(rule) -> bool:
    """Whether a step of ``rule`` (a rule, chain or wrapper) can raise from inside its kernel (a
    reduction with an ``error`` final, e.g. ClipNorm on a non-finite norm)."""
    while rule is not None and not hasattr(rule, "rules"):
        rule = getattr(rule, "rule", None)
    return any("error" in type(r).finals for r in getattr(rule, "rules", ()))


def _host_may_refuse(state, gu) -> bool:
    """Whether stepping the wrapped/device leaves that have a gradient can raise after the groups wrote."""
    frozen = state._frozen
    for u, h in state._host.items():
        if gu[u] is None or frozen[u]:
            continue
        if _may_refuse(getattr(h, "rule", None)):
            return True
        if type(h) is _cuda.DeviceMember and any(h.group.mod.plan.tree.values()):
            return True  # refuses leaves at several step counts
    return False


def _snapshot(grp, js, post, targets):
    """A closure restoring what running this job in place writes: the group's state and step counts for
    leaves ``js`` and the parameters written in place."""
    saved = [(a, a.copy()) for a in grp.arenas]
    ts, skipped = grp.ts.copy(), grp.skipped.copy()
    written = []
    for (u, how, a), t in zip(post, targets):
        if how is None:
            written.append((t, t.copy()))
        elif how == "back":
            written.append((a, a.copy()))

    def restore():
        for a, c in saved:
            a[...] = c
        grp.ts[...] = ts
        grp.skipped[...] = skipped
        for a, c in written:
            a[...] = c
    return restore


def _run_groups(state, groups, xu, iu, gu, inplace, undo=None):
    """Copy what must be copied, run one multi kernel per group; returns {u: new leaf value}.

    In place, a step that a later group (or, with ``undo`` given, a later wrapped or device leaf) may
    refuse would leave the groups before it written: those groups are snapshotted first, restored here
    when a later group refuses, and their restore functions appended to ``undo`` for the caller.
    """
    s = state._s
    frozen = state._frozen
    active = [u for u in range(s.n_unique) if gu[u] is not None and not frozen[u]]
    plans = {}
    for u in active:
        if s.u_host[u]:
            continue
        plans.setdefault(s.u_group[u], []).append(u)
    jobs = []
    for gi, us in plans.items():
        grp = groups[gi]
        js = np.array([s.u_j[u] for u in us], dtype=np.int64)
        targets, grads, post = [], [], []
        dt = grp.dtype
        # the kernel needs only data pointers: contiguous arrays are passed as they are (no views)
        for u in us:
            x, info = xu[u], iu[u]
            a = x if (info is _ND_W or info is _ND_RO) else info.to_array(x)
            if inplace and info.writeable:
                if type(a) is np.ndarray and a.flags.carray and a.dtype == dt:  # C-contiguous, aligned, writeable
                    t = a
                    post.append((u, None, None))
                else:
                    t = np.array(a, dtype=dt, order="C", copy=True)
                    post.append((u, "back", a))
            else:
                t = np.array(a, dtype=dt, order="C", copy=True)
                post.append((u, "new", None))
            targets.append(t)
            g = gu[u]
            if type(g) is not np.ndarray or not (g.flags.c_contiguous and g.flags.aligned and g.dtype == dt):
                g = np.array(g, dtype=dt, order="C")  # an exact, contiguous ndarray: _addresses reads headers
            grads.append(g)
        tsub = grp.ts[js]
        if grp.scheduled and tsub.size and tsub.min() != tsub.max() and grp.tree_scope:
            raise NotImplementedError(f"{grp.rule!r}: scheduled hyperparameters with a tree-scope reduction "
                                      "need every leaf at the same step count")
        jobs.append((gi, grp, js, targets, grads, post))
    # rules that may refuse a step (reductions) run first, so a refusal comes before other writes
    jobs.sort(key=lambda j: not j[1].reducer)
    last_risky = -1
    if inplace:
        risky = [k for k, j in enumerate(jobs) if _may_refuse(j[1].rule)]
        last_risky = len(jobs) if undo is not None else max(risky, default=-1)
    restores = []
    try:
        new = _run_jobs(s, jobs, iu, xu, inplace, last_risky, restores)
    except BaseException:
        for f in reversed(restores):
            f()
        raise
    if undo is not None:
        undo += restores
    return active, new


def _run_jobs(s, jobs, iu, xu, inplace, last_risky, restores):
    new = {}
    for k, (gi, grp, js, targets, grads, post) in enumerate(jobs):
        if k < last_risky:  # a later step may still refuse: keep what this one overwrites
            restores.append(_snapshot(grp, js, post, targets))
        xaddr = _addresses(targets)
        gaddr = _addresses(grads)
        status = _call(grp, js, xaddr, gaddr)
        if status == 0:
            for (u, how, a), t in zip(post, targets):
                if how == "back":
                    a[...] = t
                elif how == "new":
                    new[u] = iu[u].from_array(t.reshape(s.u_shape[u]), xu[u])
        elif status == 1:
            grp.skipped[js] += 1
            for (u, how, a), t in zip(post, targets):
                if how == "new" and not inplace:
                    new[u] = iu[u].from_array(t.reshape(s.u_shape[u]), xu[u])
        else:
            cpu.raise_status(grp, status)
    return new


def _call(grp, js, xaddr, gaddr):
    """One multi-kernel call on the group's leaves ``js`` (several when scheduled step counts differ)."""
    full = len(js) == len(grp.sizes)
    sizes, offsets = (grp.sizes, grp.offsets) if full else (grp.sizes[js], grp.offsets[js])
    ts = grp.ts[js]
    multi = grp.kern.multi
    if grp.scheduled:
        status = 0
        for t in np.unique(ts):
            sel = np.nonzero(ts == t)[0]
            grp.layout.fill_hyper(grp.hp, int(t) + 1)
            tsel = ts[sel]
            st = multi(xaddr[sel], gaddr[sel], sizes[sel], offsets[sel], *grp.arenas, grp.hp, tsel)
            if st == 0:
                grp.ts[js[sel]] = tsel
            elif st == 1:
                status = 1
            else:
                return st
        return status if status != 1 else 1
    status = multi(xaddr, gaddr, sizes, offsets, *grp.arenas, grp.hp, ts)
    if status == 0:
        grp.ts[js] = ts
    return status


def _run_host(state, host, xu, gu, active, inplace, new):
    from . import api
    s = state._s
    batches = {}  # device groups: one launch for all their stepped leaves
    for u in active:
        if not s.u_host[u]:
            continue
        h, x = host[u], xu[u]
        if type(h) is _cuda.DeviceMember:
            batches.setdefault(id(h.group), (h.group, []))[1].append(u)
            continue
        h2, x2 = (api.update_ if inplace else api.update)(h, x, gu[u])
        host[u] = h2
        if x2 is not x:
            new[u] = x2
    for grp, us in batches.values():
        n = len(grp.shapes)
        xs, gs = [None] * n, [None] * n
        js = []
        for u in us:
            j = host[u].j
            xs[j], gs[j] = xu[u], gu[u]
            js.append(j)
        if not inplace:  # the group is this new state's copy (see update); the parameters are copied here
            xs = grp.copy_params(xs, js)
        grp._step(xs, gs, js)
        if not inplace:
            for u in us:
                new[u] = xs[host[u].j]


def _new_model(state, model, new, inplace):
    s = state._s
    npos = {}
    for u, v in new.items():
        for p in s.u_positions[u]:
            npos[p] = v
    return rebuild(s.root, model, npos, inplace)


def update_(state, model, grads):
    """In place: see :func:`numbaopt.update_`."""
    fp = state._fast if type(state) is StateTree else None
    if fp is not None and fp.run(model, grads):
        return state, model
    _check_state(state, "update_")
    xu, iu, gu = _prepare(state, model, grads)
    undo = [] if state._host and _host_may_refuse(state, gu) else None
    active, new = _run_groups(state, state._groups, xu, iu, gu, True, undo)
    try:
        _run_host(state, state._host, xu, gu, active, True, new)
    except BaseException:
        for f in reversed(undo or ()):
            f()
        raise
    out = _new_model(state, model, new, True)
    if _abi.OK:  # (re)plan for this model: the next step on it can take the fast path
        object.__setattr__(state, "_fast", _FastPlan.build(state, xu, iu, out))
    return state, out


def update(state, model, grads):
    """Pure: see :func:`numbaopt.update`."""
    _check_state(state, "update")
    xu, iu, gu = _prepare(state, model, grads)
    groups = [g.copy() for g in state._groups]
    host = dict(state._host)
    _copy_device_groups(host)
    new_state = StateTree(state._s, groups, state._frozen.copy(), host)
    active, new = _run_groups(new_state, groups, xu, iu, gu, False)
    _run_host(new_state, new_state._host, xu, gu, active, False, new)
    return new_state, _new_model(state, model, new, False)


# --------------------------------------------------------------------------------------------------
# the fast path


class _Miss(Exception):
    pass


def _gen_gather(s, order):
    """Source of ``gather(m, g) -> (model leaves, grad leaves)`` for the trained positions ``order``.

    Gradient containers are checked (exact type, and length for dict/list/tuple) so that the fast
    path accepts exactly what the general path accepts; model containers are not: the model's leaves
    are compared by identity with the plan's in compiled code, which is what in-place writing needs.
    Containers used by several leaves get a local variable; the others are inlined.
    """
    consts = {"_Miss": _Miss}
    lines = ["def gather(m, g):"]
    root = s.root
    if root.spec is not None and root.type is list and len(root.children) == len(order) and \
            order == list(range(len(order))) and all(c.spec is None for c in root.children):
        # a flat list of trained leaves: the lists themselves (their lengths are checked in compiled code)
        lines += ["    if type(g) is not list:", "        raise _Miss", "    return m, g"]
        return "\n".join(lines), consts
    want = set(order)
    exprs = {}
    counter = [0]

    def access(node, i, e, var, k):
        if node.spec.name not in ("dict", "list", "tuple", "namedtuple", "dataclass", "frozen dataclass"):
            return f"{var}_c{k}[{i}][1]"
        if e.kind == "attr":
            return f"{var}.{e.key}"
        if e.kind == "index":
            return f"{var}[{e.key}]"
        if type(e.key) in (str, int, float, bool) or e.key is None:
            return f"{var}[{e.key!r}]"
        kn = f"K{k}_{i}"
        consts[kn] = e.key
        return f"{var}[{kn}]"

    def emit(node, mv, gv):
        if node.spec is None:
            exprs[node.pos] = (mv, gv)
            return
        k = counter[0]
        counter[0] += 1
        consts[f"T{k}"] = node.type
        lines.append(f"    if type({gv}) is not T{k}:")
        lines.append("        raise _Miss")
        name = node.spec.name
        if name in ("dict", "list", "tuple"):
            lines.append(f"    if len({gv}) != {len(node.children)}:")
            lines.append("        raise _Miss")
        if name not in ("dict", "list", "tuple", "namedtuple", "dataclass", "frozen dataclass"):
            consts[f"C{k}"] = node.spec.children
            lines.append(f"    m{k}_c{k} = C{k}({mv})")
            lines.append(f"    g{k}_c{k} = C{k}({gv})")
            mv, gv = f"m{k}", f"g{k}"
        for i, (e, c) in enumerate(zip(node.entries, node.children)):
            if not any(p in want for p in range(c.lo, c.hi)):
                continue
            am, ag = access(node, i, e, mv, k), access(node, i, e, gv, k)
            if c.spec is not None:
                v = counter[0]
                lines.append(f"    g{v}_ = {ag}")
                ag = f"g{v}_"
                if sum(1 for p in range(c.lo, c.hi) if p in want) > 1:
                    lines.append(f"    m{v}_ = {am}")
                    am = f"m{v}_"
            emit(c, am, ag)

    emit(root, "m", "g")
    lines.append(f"    return [{', '.join(exprs[p][0] for p in order)}], [{', '.join(exprs[p][1] for p in order)}]")
    return "\n".join(lines), consts


class _FastPlan:
    """``update_`` on a model whose trained, unfrozen leaves are all writeable arrays (no ties, no
    wrapped rules). Frozen leaves are left out of the gather and of the kernel calls."""

    __slots__ = ("gather", "params", "tab", "dims", "out", "calls")

    @staticmethod
    def build(state, xu, iu, model):
        s = state._s
        frozen = state._frozen
        if s.n_unique == 0 or any(s.u_host) or len(s.trained_pos) != s.n_unique:
            return None
        # position order; one unique leaf per position (no ties)
        order = [p for p in s.trained_pos if not frozen[s.pos_u[p]]]
        if not order:
            return None
        us = [s.pos_u[p] for p in order]
        for u in us:
            x = xu[u]
            if type(x) is not np.ndarray or not iu[u].writeable:
                return None
        old = state._fast
        if old is not None and len(old.params) == len(us) and all(a is xu[u] for a, u in zip(old.params, us)):
            return old  # the same arrays: the plan stands
        key = tuple(order)
        gather = s.gather.get(key)
        if gather is None:
            src, consts = _gen_gather(s, order)
            ns = dict(consts)
            exec(compile(src, "<numbaopt tree gather>", "exec"), ns)
            gather = s.gather[key] = ns["gather"]
        fp = _FastPlan()
        fp.gather = gather
        n = len(order)
        fp.params = [xu[u] for u in us]  # strong references: an id in the plan is never reused
        ndims = [len(s.u_shape[u]) for u in us]
        dimstart = np.zeros(n, dtype=np.int64)
        if n > 1:
            np.cumsum(ndims[:-1], out=dimstart[1:])
        fp.dims = np.array([d for u in us for d in s.u_shape[u]] or [0], dtype=np.int64)
        # destination slot: group-major, so each group's addresses are one contiguous slice
        members = {}
        for u in us:
            members.setdefault(s.u_group[u], []).append(u)
        start, acc, slot = {}, 0, {}
        for gi in sorted(members):
            start[gi] = acc
            for k, u in enumerate(sorted(members[gi], key=lambda u: s.u_j[u])):
                slot[u] = acc + k
            acc += len(members[gi])
        fp.tab = np.empty((n, 6), dtype=np.int64)
        fp.tab[:, 0] = [id(x) for x in fp.params]
        fp.tab[:, 1] = 1
        fp.tab[:, 2] = ndims
        fp.tab[:, 3] = dimstart
        fp.tab[:, 4] = [id(np.dtype(s.u_dtype[u])) for u in us]
        fp.tab[:, 5] = [slot[u] for u in us]
        fp.out = np.zeros((2, n), dtype=np.int64)
        calls = []
        for gi in sorted(members):
            g = state._groups[gi]
            k = len(members[gi])
            a = start[gi]
            if k == len(g.sizes):
                js = None
            else:
                js = np.array(sorted(s.u_j[u] for u in members[gi]), dtype=np.int64)
            calls.append((g, fp.out[0, a:a + k], fp.out[1, a:a + k], js,
                          g.sizes if js is None else g.sizes[js], g.offsets if js is None else g.offsets[js]))
        calls.sort(key=lambda c: not c[0].reducer)
        fp.calls = calls
        return fp

    def run(self, model, grads) -> bool:
        """True when the step was done here; False sends the caller to the general path."""
        try:
            pl, gl = self.gather(model, grads)
        except Exception:
            return False
        if _abi.gather_lists(id(pl), id(gl), self.tab, self.dims, _ARRAY_TYPE, self.out) != -1:
            return False
        for g, xa, ga, js, sizes, offsets in self.calls:
            if g.scheduled:
                ts = g.ts if js is None else g.ts[js]
                if ts.min() != ts.max():
                    return False
        for g, xa, ga, js, sizes, offsets in self.calls:
            ts = g.ts if js is None else g.ts[js]
            if g.scheduled:
                g.layout.fill_hyper(g.hp, int(ts[0]) + 1)
            status = g.kern.multi(xa, ga, sizes, offsets, *g.arenas, g.hp, ts)
            if status == 0:
                if js is not None:
                    g.ts[js] = ts
            elif status == 1:
                if js is None:
                    g.skipped += 1
                else:
                    g.skipped[js] += 1
            else:
                cpu.raise_status(g, status)
        return True


_ARRAY_TYPE = id(np.ndarray)


# --------------------------------------------------------------------------------------------------
# adjust, freeze, destructure


def _adjusted_rules(state, hyper):
    groups = state._groups
    valid, options = set(), set()
    for g in groups:
        for r in g.rule.rules:
            valid |= set(r._hypers)
            options |= set(r._options)
    for h in state._host.values():
        valid |= _host_hypers(h)
    for n in hyper:
        if n not in valid:
            if n in options:
                raise ValueError(f"{n} is a compile-time option; set up a new state to change it")
            raise ValueError(f"unknown hyperparameter {n!r}; valid: {sorted(valid)}")
    out = []
    for g in groups:
        names = {n for r in g.rule.rules for n in r._hypers}
        kw = {k: v for k, v in hyper.items() if k in names}
        out.append(g.rule.replace(**kw) if kw else g.rule)
    return out


def _host_hypers(h) -> set:
    """Hyperparameter names of the rule a wrapped or device leaf's state runs (``state.rule``, a rule
    or chain; a wrapper's ``.rule`` is followed)."""
    rule = getattr(h, "rule", None)
    while rule is not None and not hasattr(rule, "rules"):
        rule = getattr(rule, "rule", None)
    return {n for r in getattr(rule, "rules", ()) for n in getattr(r, "_hypers", ())}


def adjust_(state, **hyper):
    """Change hyperparameters in place (see :func:`numbaopt.adjust_`); never recompiles."""
    _check_state(state, "adjust_")
    rules = _adjusted_rules(state, hyper)
    done = set()
    for u, h in state._host.items():
        kw = {k: v for k, v in hyper.items() if k in _host_hypers(h)}
        if not kw:
            continue
        if type(h) is _cuda.DeviceMember:  # the group, once
            if id(h.group) not in done:
                done.add(id(h.group))
                h.group._numbaopt_adjust(kw, True)
            continue
        hook = getattr(h, "_numbaopt_adjust", None)  # the convention of numbaopt.api.adjust_
        if hook is not None:
            state._host[u] = hook(kw, True)
        elif getattr(h, "inner", None) is not None:
            from . import api
            api.adjust_(h.inner, **kw)
        else:
            raise NotImplementedError(f"state{state._s.paths[state._s.u_positions[u][0]]}: "
                                      f"{type(h).__name__} cannot be adjusted (no _numbaopt_adjust)")
    for g, r in zip(state._groups, rules):
        if r is not g.rule:
            g._set_rule(r)
    object.__setattr__(state, "_fast", None)
    return state


def adjust(state, **hyper):
    """A new state with new hyperparameters; moments and step counts are kept."""
    _check_state(state, "adjust")
    _adjusted_rules(state, hyper)  # validate before copying
    new = copy_state(state)
    return adjust_(new, **hyper)


def copy_state(state) -> StateTree:
    """A deep copy of a state tree (new arenas, step counts, frozen flags)."""
    host = {u: h if type(h) is _cuda.DeviceMember else _copy_host(h) for u, h in state._host.items()}
    _copy_device_groups(host)
    return StateTree(state._s, [g.copy() for g in state._groups], state._frozen.copy(), host)


def _copy_device_groups(host):
    """Point the device leaves of ``host`` at copies of their groups (each group copied once)."""
    copies = {}
    for u, h in host.items():
        if type(h) is _cuda.DeviceMember:
            g = copies.get(id(h.group))
            if g is None:
                g = copies[id(h.group)] = h.group.copy()
            host[u] = _cuda.DeviceMember(g, h.j)


def _copy_host(h):
    """A wrapped leaf's state with its arrays and inner state copied (the wrapper rule is shared)."""
    import copy as _copy
    hook = getattr(h, "_numbaopt_copy", None)
    if hook is not None:
        return hook()
    new = _copy.copy(h)
    names = [n for c in type(h).__mro__ for n in getattr(c, "__slots__", ())] + list(getattr(h, "__dict__", {}))
    for n in names:
        v = getattr(h, n, None)
        if isinstance(v, np.ndarray):
            setattr(new, n, v.copy())
        elif isinstance(v, Leaf) or hasattr(v, "_numbaopt_update"):
            setattr(new, n, v.copy() if isinstance(v, Leaf) else _copy_host(v))
    return new


def _units_of(sub, fname):
    if isinstance(sub, TreeLeaf) and sub._tree is not None:
        return sub._tree, [sub._u]
    if isinstance(sub, StateNode):
        tree, node = sub._tree, sub._node
        s = tree._s
        return tree, sorted({s.pos_u[p] for p in range(node.lo, node.hi) if s.pos_u[p] is not None})
    raise TypeError(f"{fname}: expected a state tree, a part of one (state.layer) or one of its leaves, "
                    f"got {type(sub).__name__}")


def freeze_(sub):
    """Freeze every leaf of ``sub`` (a state tree, ``state.part`` or a leaf): not updated, state untouched."""
    tree, us = _units_of(sub, "freeze_")
    tree._frozen[us] = True
    object.__setattr__(tree, "_fast", None)
    return sub


def thaw_(sub):
    """Undo :func:`freeze_` on ``sub``."""
    tree, us = _units_of(sub, "thaw_")
    tree._frozen[us] = False
    object.__setattr__(tree, "_fast", None)
    return sub


def destructure(model):
    """``flat, restructure = destructure(model)``: all trainable parameters in one flat vector.

    A tied array appears once. ``flat``'s dtype is the common dtype of the parameters (e.g. float64
    for float32 and float64 leaves); ``restructure(flat)`` returns a new model of the same structure
    with the original dtypes and shapes (a wrong length is a ``ValueError``).
    """
    recs = []

    def on_leaf(path, x, trainable):
        info = param_info(x)
        if info is None or not trainable:
            return False
        recs.append((path, x, info))
        return True

    root = flatten(model, on_leaf)
    units, pos_unit, by_id = [], [], {}
    pos = 0
    positions = {}

    def number(n):
        if n.spec is None:
            return [n.pos] if n.trained else []
        return [p for c in n.children for p in number(c)]

    trained = number(root)
    for p, (path, x, info) in zip(trained, recs):
        u = by_id.get(id(x)) if info.tieable else None
        if u is None:
            u = len(units)
            units.append((x, info))
            if info.tieable:
                by_id[id(x)] = u
        positions.setdefault(u, []).append(p)
    dtypes = [np.dtype(info.dtype) for _, info in units]
    dt = np.result_type(*dtypes) if dtypes else np.dtype(np.float64)
    sizes = [int(np.prod(info.shape, dtype=np.int64)) for _, info in units]
    total = int(sum(sizes))
    flat = np.empty(total, dtype=dt)
    o = 0
    for (x, info), n in zip(units, sizes):
        flat[o:o + n] = np.asarray(info.to_array(x)).reshape(-1)
        o += n

    def restructure(v):
        v = np.asarray(v)
        if v.ndim != 1 or v.shape[0] != total:
            raise ValueError(f"restructure: expected a flat vector of length {total}, got shape {v.shape}")
        new, o = {}, 0
        for u, ((x, info), n) in enumerate(zip(units, sizes)):
            seg = v[o:o + n]
            o += n
            if info.dtype.kind != "c" and seg.dtype.kind == "c":
                seg = seg.real
            a = np.array(seg, dtype=info.dtype, copy=True).reshape(info.shape)
            val = a if (type(x) is np.ndarray and info.writeable) else info.from_array(a, x)
            for p in positions[u]:
                new[p] = val
        return rebuild(root, model, new, False)

    return flat, restructure
