"""Distributed steps against single-process ones (run under mpiexec by tests/test_mpi.py).

The reference of every case is an ordinary single-process numbaopt state stepped with the average of the
ranks' gradients. Gradients are dyadic (k/64 with small k), so their sum over the ranks is exact in any
order and the average is the same correctly rounded value on both sides: the comparison can be bitwise.
"""
from __future__ import annotations

import dataclasses
import zlib

import numpy as np
from harness import case, main

import numbaopt as no
from numbaopt import mpi as nm
from numbaopt.rules.ops import absval


def model0():
    rng = np.random.default_rng(7)
    return {"enc": {"w": rng.standard_normal((6, 5)), "b": rng.standard_normal(5)},
            "head": rng.standard_normal(9).astype(np.float32),
            "z": (rng.standard_normal(4) + 1j * rng.standard_normal(4))}


def copy(m):
    return {"enc": {"w": m["enc"]["w"].copy(), "b": m["enc"]["b"].copy()}, "head": m["head"].copy(),
            "z": m["z"].copy()}


def leaves(m):
    return [m["enc"]["w"], m["enc"]["b"], m["head"], m["z"]]


def grads(step, rank, m, scale=64):
    rng = np.random.default_rng(1000 * step + rank)

    def g(x):
        v = rng.integers(-64, 65, size=x.shape) / scale
        if x.dtype.kind == "c":
            v = v + 1j * rng.integers(-64, 65, size=x.shape) / scale
        return v.astype(x.dtype)
    return {"enc": {"w": g(m["enc"]["w"]), "b": g(m["enc"]["b"])}, "head": g(m["head"]), "z": g(m["z"])}


def mean_grads(step, size, m):
    gs = [grads(step, r, m) for r in range(size)]
    out = gs[0]
    for g in gs[1:]:
        out = {"enc": {"w": out["enc"]["w"] + g["enc"]["w"], "b": out["enc"]["b"] + g["enc"]["b"]},
               "head": out["head"] + g["head"], "z": out["z"] + g["z"]}
    return {"enc": {"w": out["enc"]["w"] / size, "b": out["enc"]["b"] / size}, "head": out["head"] / size,
            "z": out["z"] / size}


def same_on_all_ranks(comm, arrays):
    """Every rank holds bitwise the same arrays."""
    h = zlib.crc32(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays))
    hs = comm.allgather(h)
    assert len(set(hs)) == 1, f"ranks differ: {hs}"


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(leaves(a), leaves(b)))


def run_pair(comm, rule, shard, steps=4, balance="elements", pure=False, model=None):
    """(distributed model, reference model, distributed state, reference state) after ``steps`` steps."""
    m = copy(model or model0())
    ref = copy(model or model0())
    st = nm.setup(rule, m, comm, shard=shard, balance=balance)
    rs = no.setup(rule, ref)
    for k in range(steps):
        g = grads(k, comm.rank, m)
        if pure:
            before = copy(m)
            st2, m2 = no.update(st, m, g)
            assert max_diff(m, before) == 0.0, "a pure update changed the model"
            st, m = st2, m2
        else:
            st, m = no.update_(st, m, g)
        rs, ref = no.update_(rs, ref, mean_grads(k, comm.size, m))
    return m, ref, st, rs


COMPLEX_OK = [no.Adam(0.05), no.Momentum(0.1, 0.9), no.AdamW(0.05, weight_decay=0.1), no.RMSProp(0.01),
              no.Descent(0.1), no.chain(no.AccumGrad(2), no.Adam(0.05)),
              no.Adam(no.schedules.cosine(0.1, 10))]


@case("replicated_equals_single_process")
def _(comm):
    for rule in COMPLEX_OK:
        m, ref, st, _ = run_pair(comm, rule, shard=False)
        assert max_diff(m, ref) == 0.0, (rule, max_diff(m, ref))
        same_on_all_ranks(comm, leaves(m))


@case("replicated_scalar_state_equals_single_process")
def _(comm):
    """A tree-wide estimate (a reduction's scalar state) in data-parallel mode: every rank steps the averaged
    gradient as one process would; sharded state refuses it (its partials do not carry the state) before
    anything is set up."""
    for rule in (no.Prodigy(d0=1e-2), no.chain(no.ClipGlobalNorm(0.5), no.DAdaptAdamW(d0=1e-2))):
        m, ref, st, rs = run_pair(comm, rule, shard=False, steps=5)
        assert max_diff(m, ref) == 0.0, (rule, max_diff(m, ref))
        same_on_all_ranks(comm, leaves(m))
        d = [float(leaf.state["d"]) for _, leaf in st.local.leaves()]
        d_ref = float(rs["enc"]["w"].state["d"])  # one estimate (kept in each leaf's precision: float32 rounds)
        assert d_ref >= 1e-2 and all(abs(v - d_ref) <= 1e-6 * d_ref for v in d), (d, d_ref)
        try:
            nm.setup(rule, copy(model0()), comm, shard=True)
        except TypeError as e:
            assert "scalar state" in str(e), e
        else:
            raise AssertionError("shard=True accepted a rule with scalar state")


@case("sharded_equals_single_process_elementwise")
def _(comm):
    for rule in COMPLEX_OK:
        for balance in ("elements", "leaves"):
            m, ref, st, _ = run_pair(comm, rule, shard=True, balance=balance)
            assert max_diff(m, ref) == 0.0, (rule, balance, max_diff(m, ref))
            same_on_all_ranks(comm, leaves(m))


@case("pure_update_equals_in_place")
def _(comm):
    for shard in (False, True):
        rule = no.chain(no.ClipGlobalNorm(0.5), no.Adam(0.05))
        a, _, sa, _ = run_pair(comm, rule, shard, pure=True)
        b, _, sb, _ = run_pair(comm, rule, shard, pure=False)
        assert max_diff(a, b) == 0.0
        la, lb = sa.local.leaves(), sb.local.leaves()
        for (_, x), (_, y) in zip(la, lb):
            for p, q in zip(x.arrays, y.arrays):
                assert np.array_equal(p, q)


class MeanAbsClip(no.Rule):
    """A user's tree-scope reduction with a sum and a max: d = g * min(1, bound / (mean|g| + max|g|))."""
    bound = no.hyper(0.3, low=0.0)
    reduce_ops = ("sum", "max", "sum")
    finals = ("scale",)
    scope = "tree"
    supports_complex = False

    @staticmethod
    def reduce(g, x):
        a = absval(g)
        return a, a, 1.0

    @staticmethod
    def finish(total, mx, count, bound):
        s = total / count + mx if count > 0.0 else 0.0
        return (min(1.0, bound / s) if s > 0.0 else 1.0,)

    @staticmethod
    def step(g, x, scale):
        return g * scale


def real_model():
    rng = np.random.default_rng(3)
    return {"enc": {"w": rng.standard_normal((6, 5)), "b": rng.standard_normal(5)},
            "head": rng.standard_normal(9).astype(np.float32), "z": rng.standard_normal(4)}


REDUCING = [no.chain(no.ClipGlobalNorm(0.5), no.Adam(0.05)), no.chain(no.ClipNorm(0.4), no.Momentum(0.1)),
            no.chain(no.ClipGlobalNorm(0.5, p=float("inf")), no.Descent(0.1)), no.LAMB(0.05),
            no.LARS(0.05), no.SkipNonFinite(no.Adam(0.05)), no.chain(MeanAbsClip(0.2), no.Adam(0.05)),
            no.chain(no.ClipGlobalNorm(0.5), no.LAMB(0.05)),
            no.chain(no.ClipGlobalNorm(0.5), no.AccumGrad(2), no.LAMB(0.05))]


@case("sharded_reductions_bitwise_when_no_array_is_cut")
def _(comm):
    for rule in REDUCING:
        m, ref, _, _ = run_pair(comm, rule, shard=True, balance="leaves", model=real_model())
        assert max_diff(m, ref) == 0.0, (rule, max_diff(m, ref))
        same_on_all_ranks(comm, leaves(m))


@case("sharded_reductions_close_when_arrays_are_cut")
def _(comm):
    for rule in REDUCING:
        m, ref, st, _ = run_pair(comm, rule, shard=True, balance="elements", model=real_model())
        # float32 leaf: its own rounding; the float64 leaves: 1e-12
        d64 = max(float(np.max(np.abs(m[k1][k2] - ref[k1][k2]))) for k1, k2 in (("enc", "w"), ("enc", "b")))
        d32 = float(np.max(np.abs(m["head"] - ref["head"])))
        assert d64 <= 1e-12 and d32 <= 1e-6, (rule, d64, d32)
        same_on_all_ranks(comm, leaves(m))
        assert any(p.a > 0 or p.b < int(np.prod(st.structure.u_shape[p.u])) for p in st.pieces) or comm.size == 1 \
            or comm.rank == comm.size - 1, "no array was cut: the case tests nothing"


def groups(path, x):
    """Parameter groups under one global clip (torch's param groups; tests/test_param_groups.py): weight decay
    and a larger lr for the matrix, a scheduled lr for the float32 leaf, the defaults elsewhere."""
    keys = ".".join(str(k) for k in path.keys)  # enc.w, enc.b, head, z
    lr = {"enc.w": 0.05, "head": no.schedules.exponential(0.04, 0.9)}.get(keys, 0.02)
    return no.chain(no.ClipGlobalNorm(0.5), no.AdamW(lr, weight_decay=0.1 if keys == "enc.w" else 0.0))


@case("param_groups_one_norm_across_groups_and_ranks")
def _(comm):
    """A global clip over groups of different hyperparameters: one norm over every leaf of every rank, replicated
    or sharded (bitwise one process when no array is cut, 1e-12 when one is); an adjust mid-run (of a subtree when
    replicated; a sharded state's leaves are pieces: of the whole state)."""
    model = real_model()
    for shard, balance in ((False, "elements"), (True, "leaves"), (True, "elements")):
        m, ref = copy(model), copy(model)
        st = nm.setup(groups, m, comm, shard=shard, balance=balance)
        rs = no.setup(groups, ref)
        for k in range(5):
            if k == 3:
                if shard:
                    no.adjust_(st, lr=0.01)
                    no.adjust_(rs, lr=0.01)
                else:
                    no.adjust_(st.local["enc"], lr=0.01)
                    no.adjust_(rs["enc"], lr=0.01)
            st, m = no.update_(st, m, grads(k, comm.rank, m))
            rs, ref = no.update_(rs, ref, mean_grads(k, comm.size, m))
        same_on_all_ranks(comm, leaves(m))
        d64 = max(float(np.max(np.abs(m[k1][k2] - ref[k1][k2]))) for k1, k2 in (("enc", "w"), ("enc", "b")))
        d32 = float(np.max(np.abs(m["head"] - ref["head"])))
        if balance == "leaves" or not shard:
            assert max_diff(m, ref) == 0.0, (shard, balance, max_diff(m, ref))
        assert d64 <= 1e-12 and d32 <= 1e-6, (shard, balance, d64, d32)
    try:
        nm.setup(lambda p, x: no.chain(no.ClipGlobalNorm(0.5), no.Adam() if x.ndim == 2 else no.Momentum()),
                 copy(model), comm, shard=True)
    except TypeError as e:
        assert "hyperparameters only" in str(e), e
    else:
        raise AssertionError("shard=True accepted chains of different kernels")


@case("sharded_state_memory_divides_by_ranks")
def _(comm):
    rng = np.random.default_rng(0)
    m = {"a": rng.standard_normal(10_001), "b": rng.standard_normal((100, 37))}
    full = no.setup(no.Adam(), m)
    full_bytes = sum(a.nbytes for _, leaf in full.leaves() for a in leaf.arrays)
    st = nm.setup(no.Adam(), m, comm, shard=True)
    mine = st.state_bytes
    total = sum(comm.allgather(mine))
    assert total == full_bytes, (total, full_bytes)
    assert mine <= full_bytes / comm.size + 16 + 2 * 8, (mine, full_bytes / comm.size)
    rep = nm.setup(no.Adam(), m, comm, shard=False)
    assert rep.state_bytes == full_bytes


@case("setup_mismatch_same_error_on_every_rank")
def _(comm):
    for bad in ("shape", "dtype", "rule", "structure"):
        m = real_model()
        rule = no.Adam(0.05)
        if comm.rank == 1:
            if bad == "shape":
                m["enc"]["b"] = np.zeros(6)
            elif bad == "dtype":
                m["head"] = m["head"].astype(np.float64)
            elif bad == "rule":
                rule = no.Adam(0.06)
            else:
                m["extra"] = np.zeros(2)
        for shard in (False, True):
            try:
                nm.setup(rule, m, comm, shard=shard)
            except ValueError as e:
                msgs = comm.allgather(str(e))
                assert len(set(msgs)) == 1, msgs
                assert "rank 1" in msgs[0], msgs[0]
            else:
                raise AssertionError(f"{bad}: no error")


@case("bad_gradient_on_one_rank_refused_everywhere")
def _(comm):
    for shard in (False, True):
        m = real_model()
        st = nm.setup(no.Adam(0.05), m, comm, shard=shard)
        st, m = no.update_(st, m, grads(0, comm.rank, m))
        before = copy(m)
        state_before = [a.copy() for _, leaf in st.local.leaves() for a in leaf.arrays]
        for bad in ("shape", "dtype", "missing", "nan-free-but-none"):
            g = grads(1, comm.rank, m)
            if comm.rank == comm.size - 1:
                if bad == "shape":
                    g["enc"]["w"] = g["enc"]["w"][:, :4]
                elif bad == "dtype":
                    g["head"] = g["head"].astype(np.complex64)
                elif bad == "missing":
                    del g["enc"]
                else:
                    g["enc"]["b"] = None  # a None gradient on one rank only
            try:
                no.update_(st, m, g)
            except (TypeError, ValueError) as e:
                kinds = comm.allgather((type(e).__name__, str(e)))
                assert len(set(kinds)) == 1, kinds
                assert f"rank {comm.size - 1}" in kinds[0][1] or "ranks [" in kinds[0][1], kinds[0][1]
            else:
                raise AssertionError(f"{bad}: not refused")
            assert max_diff(m, before) == 0.0
            now = [a for _, leaf in st.local.leaves() for a in leaf.arrays]
            assert all(np.array_equal(p, q) for p, q in zip(state_before, now))
            assert st.t == 1
        st, m = no.update_(st, m, grads(1, comm.rank, m))  # a good step after the refusals
        assert st.t == 2


@case("non_finite_gradient_refused_or_skipped_everywhere")
def _(comm):
    for shard in (False, True):
        for balance in ("elements", "leaves"):
            m = real_model()
            st = nm.setup(no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.05)), m, comm, shard=shard, balance=balance)
            g = grads(0, comm.rank, m)
            if comm.rank == 0:
                g["enc"]["b"][2] = np.nan
            before = copy(m)
            try:
                no.update_(st, m, g)
            except ValueError as e:
                msgs = comm.allgather(str(e))
                assert len(set(msgs)) == 1 and "not finite" in msgs[0], msgs
                assert "['enc']['b']" in msgs[0], msgs[0]
            else:
                raise AssertionError("a NaN gradient was not refused")
            assert max_diff(m, before) == 0.0 and st.t == 0
            sk = nm.setup(no.SkipNonFinite(no.Adam(0.05)), m, comm, shard=shard, balance=balance)
            sk, m = no.update_(sk, m, g)
            assert max_diff(m, before) == 0.0
            assert sum(comm.allgather(int(max(leaf.skipped for _, leaf in sk.local.leaves())))) == comm.size


@case("leaf_without_gradient_and_idle_rank")
def _(comm):
    # two arrays of equal size: with balance="leaves" on 2 ranks each rank owns one; the second has no gradient
    m = {"a": np.linspace(-1, 1, 8), "b": np.linspace(2, 3, 8), "c": np.linspace(0, 1, 8)}
    rule = no.chain(no.ClipGlobalNorm(0.5), no.Adam(0.05))
    for shard in (False, True):
        for balance in ("elements", "leaves"):
            x = {k: v.copy() for k, v in m.items()}
            ref = {k: v.copy() for k, v in m.items()}
            st = nm.setup(rule, x, comm, shard=shard, balance=balance)
            rs = no.setup(rule, ref)
            for k in range(3):
                gs = [{"a": np.full(8, (r + 1) / 8), "b": None, "c": None if k == 1 else np.full(8, -1 / 4)}
                      for r in range(comm.size)]
                st, x = no.update_(st, x, gs[comm.rank])
                mean = {"a": sum(g["a"] for g in gs) / comm.size, "b": None,
                        "c": None if k == 1 else sum(g["c"] for g in gs) / comm.size}
                rs, ref = no.update_(rs, ref, mean)
            for key in m:
                assert np.array_equal(x[key], ref[key]), (shard, balance, key, x[key], ref[key])


@dataclasses.dataclass(frozen=True)
class Frozen:
    w: np.ndarray
    s: float


@case("immutable_leaves_and_containers")
def _(comm):
    for shard in (False, True):
        ro = np.linspace(0, 1, 7)
        ro.flags.writeable = False
        m = (Frozen(np.linspace(-1, 1, 5), 0.5), ro)
        ref = (Frozen(m[0].w.copy(), 0.5), ro.copy())
        st = nm.setup(no.Adam(0.1), m, comm, shard=shard)
        rs = no.setup(no.Adam(0.1), ref)
        for k in range(3):
            gs = [(Frozen(np.full(5, (r + k) / 4), (r + 1) / 8), np.full(7, (r + 1) / 8)) for r in range(comm.size)]
            st, m = no.update_(st, m, gs[comm.rank])
            mean = (Frozen(sum(g[0].w for g in gs) / comm.size, sum(g[0].s for g in gs) / comm.size),
                    sum(g[1] for g in gs) / comm.size)
            rs, ref = no.update_(rs, ref, mean)
        assert isinstance(m[0], Frozen) and isinstance(m[0].s, float) and not m[1].flags.writeable
        assert np.array_equal(m[0].w, ref[0].w) and m[0].s == ref[0].s and np.array_equal(m[1], ref[1])
        assert not np.array_equal(ro, m[1])  # the read-only input was not written: a new array came back


@case("adjust_and_sum_mode")
def _(comm):
    for shard in (False, True):
        m, ref = real_model(), real_model()
        st = nm.setup(no.Adam(0.05), m, comm, shard=shard, average=False)
        rs = no.setup(no.Adam(0.05), ref)
        for k in range(3):
            if k == 1:
                st = no.adjust(st, lr=0.01)
                no.adjust_(rs, lr=0.01)
            st, m = no.update_(st, m, grads(k, comm.rank, m))
            s = mean_grads(k, comm.size, m)
            total = {"enc": {"w": s["enc"]["w"] * comm.size, "b": s["enc"]["b"] * comm.size},
                     "head": s["head"] * comm.size, "z": s["z"] * comm.size}
            rs, ref = no.update_(rs, ref, total)
        for a, b in zip(leaves(m), leaves(ref)):
            assert np.array_equal(a, b)


@case("not_a_communicator_and_too_few_elements")
def _(comm):
    try:
        nm.setup(no.Adam(), {"a": np.zeros(3)}, comm="world")
    except TypeError as e:
        assert "communicator" in str(e)
    else:
        raise AssertionError("no TypeError")
    try:
        nm.setup(no.Adam(), {"a": np.zeros(1)}, comm, shard=True)
    except ValueError as e:
        assert "per rank" in str(e) or comm.size == 1
    else:
        assert comm.size == 1


if __name__ == "__main__":
    main()
