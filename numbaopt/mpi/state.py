"""The distributed state and its step: data-parallel (replicated state) or ZeRO-1 (sharded state).

One step of a :class:`DistributedState`, on every rank of its communicator:

1. *check, locally*: the rank's model and gradient tree against the state (the same checks and messages as
   :func:`numbaopt.update_`), without communicating;
2. *agree*: ONE ``Allgather`` of two integers per rank (failed?, which leaves have gradients): when any rank
   failed, every rank raises the same error, naming the rank and the leaf, and nothing moves or is written;
3. *reduce*: the gradients, packed into one reused flat buffer per dtype, are summed over the ranks (divided
   by the number of ranks when ``average``): replicated: one ``Allreduce`` per dtype; sharded: one
   ``Reduce_scatter`` per dtype, so each rank receives the summed gradient of its shard only;
4. *step*: replicated: every rank steps the whole model with the same generated kernels, on the same summed
   gradient, so every rank ends bitwise identical; sharded: each rank steps its shard (its pieces of the
   flat parameters, with its optimiser state only) with the same generated kernels; reductions (global-norm
   clip, non-finite skip, trust ratios, user reductions) combine their partials across the ranks
   (:mod:`.reduce`), so a refusal is decided identically everywhere before anything is written;
5. *gather* (sharded): one ``Allgatherv`` per dtype gives every rank the new parameters, written into its
   model (in place, or into new arrays for a pure step).
"""
from __future__ import annotations

import numpy as np

from ..backends.state import as_rule, check_param_dtype, enter, leave
from ..compiler import ChainLayout, chain_key
from ..rules.basic import Descent
from ..rules.base import Rule
from ..rules.chain import Chain
from ..tree.collect import collect
from ..tree.adjust import adjust_tree, adjust_tree_
from ..tree.params import ND_WRITEABLE
from ..tree.setup import setup_tree
from ..tree.state import StateTree, core
from ..tree.step import step_tree
from ..tree.structure import rebuild
from ..tree.torch_models import setup_model, torch_form
from .comm import agree, agree_signature, pattern_token, require_mpi, world
from .reduce import CrossRankReducer
from .shards import FlatLayout

__all__ = ["DistributedState", "setup_distributed"]


class _Shared:
    """What every state derived from one ``setup`` shares: the communicator, the layout, the structure the
    steps check against, and the flat buffers (reused by every step; a communicator steps one state at a
    time, as its collectives must be called in one order)."""

    __slots__ = ("comm", "MPI", "rank", "size", "sharded", "average", "balance", "flat", "check", "pieces",
                 "xbuf", "gsend", "grecv", "agree_buf", "rule_text", "views", "rs_counts", "ag_specs")

    def __init__(self, comm, MPI, sharded, average, balance):
        self.comm, self.MPI = comm, MPI
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.sharded, self.average, self.balance = sharded, average, balance
        self.agree_buf = np.empty((self.size, 2), dtype=np.int64)


def _host_units(s, what: str) -> list:
    units = [u for u in range(s.n_unique) if s.u_group[u] is not None]
    dev = [u for u in range(s.n_unique) if s.u_device[u] is not None]
    if dev:
        raise NotImplementedError(f"{s.where(dev[0])}: a GPU leaf; numbaopt.mpi steps host arrays ({what}); "
                                  "copy the model to the host, or step each rank's GPU model with numbaopt.update_ "
                                  "after reducing the gradients yourself")
    return units


def _signature(sh: _Shared, s, units, rule_text) -> list:
    lines = [f"{sh.size} ranks", f"shard={sh.sharded} average={sh.average} balance={sh.balance}",
             f"rule {rule_text}", f"{len(s.paths)} leaves, {len(units)} trained arrays"]
    lines += [f"{s.where(u)}: shape {s.u_shape[u]} dtype {s.u_dtype[u]}" for u in units]
    return lines + sh.flat.describe()


def setup_distributed(rule, model, comm=None, *, shard: bool = False, average: bool = True,
                      balance: str = "elements") -> DistributedState:
    """The distributed optimiser state of ``model`` on every rank of ``comm`` (collective: every rank calls
    it, with its own copy of the same model).

    Parameters
    ----------
    rule
        A rule or chain (``shard=False`` also takes a rule chooser ``fn(path, leaf)``).
    model
        The model, as for :func:`numbaopt.setup` (arrays, nested containers, torch modules); host arrays.
    comm
        An mpi4py communicator (default ``MPI.COMM_WORLD``).
    shard
        ``False``: every rank holds the whole state (data parallel, one ``Allreduce`` per dtype a step).
        ``True``: ZeRO-1, each rank holds the state of its contiguous shard of the flattened parameters
        (``Reduce_scatter``, a step of the shard, ``Allgatherv``).
    average
        Average the ranks' gradients (default), or sum them.
    balance
        ``"elements"``: shards differ by at most one element, arrays are cut where the cut falls;
        ``"leaves"``: cuts only between arrays (reductions are then bitwise those of one process).

    Every rank checks its model first; then one collective compares the ranks: a rank that failed, or that
    differs from rank 0 (structure, shapes, dtypes, rule, options), makes every rank raise the same
    ``ValueError``/``TypeError`` naming it. See docs/mpi.md.
    """
    MPI = require_mpi()
    comm = world(comm)
    sh = _Shared(comm, MPI, bool(shard), bool(average), balance)
    err, sig, inner = None, [], None
    try:  # everything that can fail, without communicating: then one collective says whether any rank failed
        view = setup_model(model)
        what = type(model).__name__
        if shard:
            inner = _setup_sharded(sh, rule, view, what)
        else:
            inner = _setup_replicated(sh, rule, view, what)
        s = sh.check.structure
        sig = _signature(sh, s, sh.flat.units, sh.rule_text)
    except (TypeError, ValueError, NotImplementedError) as e:
        err = e
    agree_signature(comm, err, sig, "numbaopt.mpi.setup")
    return DistributedState(sh, inner)


def _setup_replicated(sh, rule, view, what):
    inner = setup_tree(rule, view, what)
    sh.check = c = core(inner, "setup")
    s = c.structure
    units = _host_units(s, "shard=False")
    sh.rule_text = repr(rule) if isinstance(rule, (Rule, Chain)) else \
        "; ".join(f"{s.where(u)}: {c.groups[s.u_group[u]].rule!r}" for u in units)
    sh.flat = FlatLayout(units, [int(np.prod(s.u_shape[u], dtype=np.int64)) for u in units],
                         [s.u_compute[u] for u in units], 1)
    sh.gsend = {d: np.zeros(n, dtype=d) for d, n in sh.flat.total.items()}
    sh.pieces, sh.xbuf, sh.grecv = [], {}, {}
    return inner


def _sharded_rules(rule, view, what):
    """``(one rule or None, the rule of each trained leaf by path)``: a rule chooser's choices must run the same
    kernels on every leaf (they may differ in hyperparameters: parameter groups), so that every rank steps its
    pieces of any leaf with the kernels of one chain and combines one table of partials per reduction."""
    if isinstance(rule, (Rule, Chain)) or not callable(rule) or isinstance(rule, type):
        return as_rule(rule), {}
    by_path = {}

    def choose(path, x):
        r = by_path[str(path)] = rule(path, x)
        return None if r is None else Descent()

    setup_tree(choose, view, what)  # the chooser's checks (and messages) as setup has them
    chosen = [r for r in by_path.values() if r is not None]
    first = as_rule(chosen[0])
    for path, r in by_path.items():
        if r is not None and (chain_key(as_rule(r)) != chain_key(first) or _spans(r) != _spans(first)):
            raise TypeError(f"numbaopt.mpi.setup(shard=True): the rule chooser gave model{path} {r!r} and another "
                            f"leaf {first!r}; a sharded state steps every leaf with one chain's kernels, so the "
                            "chosen rules may differ in hyperparameters only (not in members, options or span "
                            "names); use shard=False for other choices")
    return None, by_path


def _spans(rule) -> list:
    return [r.span for r in as_rule(rule).rules]


def _setup_sharded(sh, rule, view, what):
    one, by_path = _sharded_rules(rule, view, what)
    lay = ChainLayout(one if one is not None else as_rule(next(r for r in by_path.values() if r is not None)))
    lay.refuse_axes("numbaopt.mpi.setup(shard=True)")
    if lay.master is not None:
        raise NotImplementedError("numbaopt.mpi.setup(shard=True) with MixedPrecision: not supported yet (the "
                                  "master copies would be sharded too); use shard=False")
    sh.rule_text = repr(one) if one is not None else "; ".join(f"model{p}: {r!r}" for p, r in by_path.items()
                                                              if r is not None)
    # the structure of the whole model, for the checks of every step: a stateless rule (no state arrays)
    trained = (lambda path, x: None if by_path[str(path)] is None else Descent()) if one is None else Descent()
    sh.check = c = core(setup_tree(trained, view, what), "setup")
    s = c.structure
    units = _host_units(s, "shard=True")
    rule_of = [one if one is not None else by_path[str(s.paths[s.u_positions[u][0]])] for u in range(s.n_unique)]
    for u in units:
        check_param_dtype(s.u_dtype[u], s.where(u), lay)
    sh.flat = flat = FlatLayout(units, [int(np.prod(s.u_shape[u], dtype=np.int64)) for u in units],
                                [s.u_compute[u] for u in units], sh.size, sh.balance)
    sh.pieces = pieces = flat.pieces(sh.rank)
    # one flat buffer per dtype serves twice in a step: the gradients sent by the Reduce_scatter, then (it is
    # free once that returned) the parameters of the Allgatherv: N elements per rank, not 2N
    sh.gsend = {d: np.zeros(n, dtype=d) for d, n in flat.total.items()}
    sh.xbuf = sh.gsend
    sh.grecv = {d: np.zeros(int(flat.counts[d][sh.rank]), dtype=d) for d in flat.buffer_dtypes}
    arrays = [sh.xbuf[p.dtype][p.pos:p.pos + p.b - p.a] for p in pieces]
    # made once: per piece its parameter region and its gradient in the received shard; the collectives'
    # count lists and buffer specifications
    sh.views = [(region, sh.grecv[p.dtype][p.pos - int(flat.displs[p.dtype][sh.rank]):][:p.b - p.a])
                for p, region in zip(pieces, arrays)]
    sh.rs_counts = {d: flat.counts[d].tolist() for d in flat.buffer_dtypes}
    sh.ag_specs = {d: [sh.xbuf[d], (flat.counts[d].tolist(), flat.displs[d].tolist())] for d in flat.buffer_dtypes}
    inner = setup_tree(one if one is not None else (lambda path, x: rule_of[pieces[path[0].key].u]), arrays, "shard")
    rows, dtype0 = _single_process_rows(s, units, rule_of)
    core(inner).reducer = CrossRankReducer(sh.comm, rows, [p.u for p in pieces], dtype0,
                                           lambda u: s.where(u, "grads"))
    return inner


def _single_process_rows(s, units, rule_of) -> tuple:
    """The table row of every trained unit in the order one process's groups hold them (by rule, then compute
    dtype, each in order of first appearance: the order its reductions combine leaves in), and the compute dtype
    of its first group."""
    distinct, groups = [], {}
    for u in units:
        r = rule_of[u]
        ri = next((i for i, d in enumerate(distinct) if d == r), None)
        if ri is None:
            ri = len(distinct)
            distinct.append(r)
        groups.setdefault((ri, s.u_compute[u]), []).append(u)
    rows = {u: i for i, u in enumerate(u for members in groups.values() for u in members)}
    return rows, next(iter(groups))[1]


class DistributedState:
    """The optimiser state of one rank in a data-parallel (``sharded=False``) or ZeRO-1 (``sharded=True``)
    run; made by :func:`numbaopt.mpi.setup`, stepped by :func:`numbaopt.update_` / :func:`numbaopt.update`
    (or :func:`numbaopt.mpi.update_`) on every rank at once.

    ``local``: this rank's state (a state tree: of the whole model when replicated, of this rank's pieces
    when sharded); ``pieces``: this rank's shard (unit, element range) pieces; ``state_bytes``: the bytes of
    optimiser state this rank holds."""

    __slots__ = ("_sh", "local")

    def __init__(self, sh: _Shared, inner: StateTree):
        self._sh, self.local = sh, inner

    comm = property(lambda self: self._sh.comm, doc="the communicator")
    sharded = property(lambda self: self._sh.sharded, doc="whether the optimiser state is sharded (ZeRO-1)")
    average = property(lambda self: self._sh.average, doc="whether gradients are averaged (else summed)")
    layout = property(lambda self: self._sh.flat, doc="the flat layout (numbaopt.mpi.shards.FlatLayout)")
    pieces = property(lambda self: list(self._sh.pieces), doc="this rank's shard: its pieces")

    @property
    def structure(self):
        """The structure of the whole model (paths, shapes, dtypes of its trained arrays)."""
        return self._sh.check.structure

    @property
    def t(self) -> int:
        """Steps taken."""
        gs = core(self.local).groups
        return max((g.t for g in gs), default=0)

    @property
    def state_bytes(self) -> int:
        """Bytes of optimiser state arrays on this rank (not counting the flat buffers)."""
        return int(sum(a.nbytes for g in core(self.local).groups for a in g.arenas))

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the reused flat buffers of this rank (gradients, and when sharded the gathered parameters)."""
        sh = self._sh
        bufs = {id(b): b for d in (sh.xbuf, sh.gsend, sh.grecv) for b in d.values()}
        return int(sum(b.nbytes for b in bufs.values()))

    def __repr__(self) -> str:
        sh = self._sh
        kind = "sharded (ZeRO-1)" if sh.sharded else "replicated"
        return (f"DistributedState(rank {sh.rank} of {sh.size}, {kind}, {sh.rule_text}, "
                f"{sh.flat.owned(sh.rank) if sh.sharded else sh.flat.n} of {sh.flat.n} elements, t={self.t})")

    # -- hyperparameters (every rank must call these identically) -----------------------------------
    def _adjust(self, inplace: bool, **hyper):
        if inplace:
            adjust_tree_(self.local, **hyper)
            return self
        new = adjust_tree(self.local, **hyper)
        core(new).reducer = core(self.local).reducer
        return DistributedState(self._sh, new)

    # the protocol numbaopt.update/update_/adjust/adjust_ dispatch to (numbaopt.api)
    def _numbaopt_step_(self, model, grads, inplace: bool):
        return step(self, model, grads, inplace)

    def _numbaopt_adjust_(self, inplace: bool, hyper: dict):
        return self._adjust(inplace, **hyper)

    def __reduce__(self):
        raise TypeError("a DistributedState belongs to its communicator and does not pickle; save it with "
                        "numbaopt.mpi.save (every rank its shard), and load it with numbaopt.mpi.load")


# --------------------------------------------------------------------------------------------------
# the step


def step(state: DistributedState, model, grads, inplace: bool):
    """One distributed step (see the module docstring): ``(state, model)``."""
    fname = "update_" if inplace else "update"
    form = None
    if type(model) is not dict or grads is model:
        form = torch_form(model, grads)
        if form is not None:
            model, grads = form.view, form.grads
    sh = state._sh
    c, inner = sh.check, core(state.local, fname)
    err, token, entered = None, 0, False
    try:
        enter(inner, fname, inplace)
        entered = True
        xu, iu, gu = collect(c, model, grads)
        token = pattern_token([gu[u] is not None for u in sh.flat.units])
    except (TypeError, ValueError, RuntimeError) as e:
        err = e
    try:
        agree(sh.comm, err, token, f"numbaopt.{fname}", sh.agree_buf)
        if sh.sharded:
            new_inner, new = _sharded(sh, inner, xu, iu, gu, inplace)
        else:
            new_inner, new = _replicated(sh, inner, model, xu, iu, gu, inplace)
    finally:
        if entered:
            leave(inner, inplace)
    if not sh.sharded:
        out = new
    else:
        npos = {p: v for u, v in new.items() for p in c.structure.u_positions[u]}
        out = rebuild(c.structure.root, model, npos, inplace)
    if form is not None:
        out = form.result(out, inplace)
    return (state if inplace else DistributedState(sh, StateTree(new_inner))), out


def _pack(sh, gu) -> list:
    """The gradients into the flat send buffers (zeros for a leaf without one); the active units."""
    flat, active = sh.flat, []
    for u, n, d in zip(flat.units, flat.sizes, flat.dtypes):
        o = flat.pos[u]
        g = gu[u]
        if g is None:
            sh.gsend[d][o:o + n] = 0
        else:
            sh.gsend[d][o:o + n] = g.reshape(-1)
            active.append(u)
    return active


def _scale(sh, buf):
    if sh.average and sh.size > 1:
        np.true_divide(buf, sh.size, out=buf)


def _replicated(sh, inner, model, xu, iu, gu, inplace):
    MPI = sh.MPI
    active = _pack(sh, gu)
    for buf in sh.gsend.values():
        sh.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        _scale(sh, buf)
    s, flat = inner.structure, sh.flat
    g2 = [None] * s.n_unique
    for u in active:
        o, n = flat.pos[u], flat.size_of[u]
        g2[u] = sh.gsend[s.u_compute[u]][o:o + n].reshape(s.u_shape[u])
    new_core, out, _ = step_tree(inner, model, None, inplace, collected=(xu, iu, g2))
    return new_core, out


def _sharded(sh, inner, xu, iu, gu, inplace):
    MPI, comm, flat = sh.MPI, sh.comm, sh.flat
    active = _pack(sh, gu)
    for d, buf in sh.gsend.items():
        comm.Reduce_scatter(buf, sh.grecv[d], recvcounts=sh.rs_counts[d], op=MPI.SUM)
        _scale(sh, sh.grecv[d])
    live = set(active)
    xs, gs = [], []
    for p, (region, g) in zip(sh.pieces, sh.views):  # this rank's shard of the parameters, into the buffer
        x, info = xu[p.u], iu[p.u]
        a = x if info is ND_WRITEABLE else info.to_array(x)
        region[...] = np.asarray(a).reshape(-1)[p.a:p.b]
        xs.append(region)
        gs.append(g if p.u in live else None)
    reducer = inner.reducer
    reducer.calls = 0
    new_core, out, _ = step_tree(inner, xs, None, inplace, collected=(xs, [ND_WRITEABLE] * len(xs), gs))
    if reducer.calls == 0 and active:  # none of this rank's pieces was stepped: it still takes part
        reducer.participate(inner.groups[0])
    if not inplace:
        new_core.reducer = reducer
        for region, piece in zip(xs, out):
            if piece is not region:
                region[...] = piece
    for spec in sh.ag_specs.values():
        comm.Allgatherv(MPI.IN_PLACE, spec)
    s = sh.check.structure
    new = {}
    for u in active:  # the gathered parameters into the model (a leaf without a gradient did not change)
        d, o = s.u_compute[u], flat.pos[u]
        vals = sh.xbuf[d][o:o + flat.size_of[u]].reshape(s.u_shape[u])
        x, info = xu[u], iu[u]
        if inplace and info.writeable:
            a = x if info is ND_WRITEABLE else info.to_array(x)
            if isinstance(a, np.ndarray) and a.flags.writeable:
                a[...] = vals
                if info.after_write is not None:
                    info.after_write(x)
                continue
        new[u] = vals.copy() if info is ND_WRITEABLE else info.from_array(vals.copy(), x)
    return new_core, new
