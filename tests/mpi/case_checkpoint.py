"""numbaopt.mpi.save / load under mpiexec (driven by tests/test_mpi.py): resuming on the same ranks, and
loading what N ranks wrote on M ranks (sub-communicators made with ``comm.Split`` inside one run, so the
cases are independent of each other and of other runs).

The reference of every continuation is an ordinary single-process numbaopt state stepped with the average
of the ranks' gradients: gradients are dyadic (k/64), so every average is exact and the comparisons are
bitwise (Adam, AccumGrad + Adam: elementwise rules).
"""
from __future__ import annotations

import copy as copying
import contextlib
import os
import shutil
import tempfile

import numpy as np
from harness import case, main
from mpi4py import MPI

import numbaopt as no
from numbaopt import mpi as nm
from numbaopt.tree.state import core


def model0(extra=None):
    rng = np.random.default_rng(7)
    m = {"enc": {"w": rng.standard_normal((6, 5)), "b": rng.standard_normal(5)},
         "head": rng.standard_normal(9).astype(np.float32),
         "z": rng.standard_normal(4) + 1j * rng.standard_normal(4)}
    m.update(extra or {})
    return m


def copy(m):
    return {k: copy(v) if isinstance(v, dict) else v.copy() for k, v in m.items()}


def arrays(m):
    return [a for v in m.values() for a in (arrays(v) if isinstance(v, dict) else [v])]


def grads(step, rank, m):
    rng = np.random.default_rng(1000 * step + rank)

    def g(x):
        v = rng.integers(-64, 65, size=x.shape) / 64
        if x.dtype.kind == "c":
            v = v + 1j * rng.integers(-64, 65, size=x.shape) / 64
        return v.astype(x.dtype)
    return {k: grads_of(v, g) if isinstance(v, dict) else g(v) for k, v in m.items()}


def grads_of(m, g):
    return {k: grads_of(v, g) if isinstance(v, dict) else g(v) for k, v in m.items()}


def mean_grads(step, n, m):
    gs = [grads(step, r, m) for r in range(n)]

    def mean(parts):
        if isinstance(parts[0], dict):
            return {k: mean([p[k] for p in parts]) for k in parts[0]}
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return (total / n).astype(parts[0].dtype)
    return mean(gs)


def same(a, b, what):
    for x, y in zip(arrays(a), arrays(b), strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}: differ by {np.max(np.abs(x - y))}"


@contextlib.contextmanager
def shared_dir(comm):
    """A fresh directory every rank sees (rank 0 makes it and says where), removed afterwards."""
    d = comm.bcast(tempfile.mkdtemp(prefix="numbaopt-ckpt-") if comm.rank == 0 else None)
    try:
        yield d
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(d, ignore_errors=True)


def first(comm, n):
    """The communicator of world ranks ``0..n-1`` (``COMM_NULL`` on the others); collective over ``comm``."""
    return comm.Split(0 if comm.rank < n else MPI.UNDEFINED, comm.rank)


def state_matches(st, ref):
    """Every element of ``st``'s local state, its counters and hyperparameters equal ``ref``'s (a
    single-process state of the whole model), bitwise."""
    by_path = {str(p): leaf for p, leaf in ref.leaves()}
    s, c = st.structure, core(st.local)
    spans = [(p.u, p.a, p.b, c.leaf(c.structure.pos_u[k])) for k, p in enumerate(st.pieces)] if st.sharded else \
        [(u, 0, int(np.prod(s.u_shape[u])), c.leaf(u)) for u in st.layout.units]
    assert spans or not st.sharded
    for u, a, b, leaf in spans:
        r = by_path[str(s.paths[s.u_positions[u][0]])]
        for x, y in zip(leaf.arrays, r.arrays, strict=True):
            assert np.array_equal(np.asarray(x).reshape(-1), np.asarray(y).reshape(-1)[a:b]), (u, a, b)
        assert np.array_equal(leaf.counters, r.counters), (leaf.counters, r.counters)
        assert np.array_equal(leaf.hp, r.hp), (leaf.hp, r.hp)


def all_same_error(comm, fn, kind, *words):
    """``fn()`` raises ``kind`` on every rank, with the same message, naming ``words``."""
    try:
        fn()
    except kind as e:
        msg = str(e)
    else:
        raise AssertionError(f"no {kind.__name__}")
    msgs = comm.allgather(msg)
    assert len(set(msgs)) == 1, msgs
    for w in words:
        assert w in msg, (w, msg)
    return msg


def run(comm, rule, m, steps, start=0, shard=True, st=None, adjust_at=None):
    """``steps`` distributed steps from ``start`` (a new state unless ``st``); ``(st, m)``."""
    st = st or nm.setup(rule, m, comm, shard=shard)
    for k in range(start, start + steps):
        if k == adjust_at:
            no.adjust_(st, lr=0.03)
        st, m = no.update_(st, m, grads(k, comm.rank, m))
    return st, m


def run_ref(rs, m, n, steps, start=0, adjust_at=None):
    for k in range(start, start + steps):
        if k == adjust_at:
            no.adjust_(rs, lr=0.03)
        rs, m = no.update_(rs, m, mean_grads(k, n, m))
    return rs, m


RULES = [no.Adam(0.05), no.chain(no.AccumGrad(2), no.Adam(0.05)), no.Adam(no.schedules.cosine(0.1, 10)),
         no.chain(no.ClipGlobalNorm(0.5), no.Adam(0.05))]


@case("resume_on_the_same_ranks_is_bitwise_continuing")
def _(comm):
    with shared_dir(comm) as d:
        for shard in (True, False):
            for k, rule in enumerate(RULES):
                path = os.path.join(d, f"{shard}-{k}")
                st, m = run(comm, rule, copy(model0()), 3, shard=shard, adjust_at=1 if k == 0 else None)
                nm.save(st, path)
                saved, t = copy(m), st.t
                st, m = run(comm, rule, m, 3, start=3, st=st)
                st2 = nm.load(path, saved, comm)
                assert st2.sharded == shard and st2.t == t > 0 and st2.layout.bounds.tolist() == \
                    nm.setup(rule, model0(), comm, shard=shard).layout.bounds.tolist()
                st2, m2 = run(comm, rule, saved, 3, start=3, st=st2)
                same(m2, m, f"{rule!r} shard={shard}")
                for (_, x), (_, y) in zip(st.local.leaves(), st2.local.leaves(), strict=True):
                    for p, q in zip(x.arrays, y.arrays, strict=True):
                        assert np.array_equal(p, q)
                    assert np.array_equal(x.counters, y.counters)


@case("n_ranks_to_m_ranks_matches_single_process")
def _(comm):
    """Written by 1..size ranks (sharded or not), read by 1..size ranks (sharded or not; COMM_SELF for 1):
    the loaded state equals the reference's, element by element, and so does every continuation."""
    with shared_dir(comm) as d:
        for k, rule in enumerate(RULES[:2]):
            for n_src in range(1, comm.size + 1):
                for src_shard in (True, False):
                    path = os.path.join(d, f"{k}-{n_src}-{src_shard}")
                    src = first(comm, n_src)
                    writer = src != MPI.COMM_NULL
                    if writer:
                        st, m = run(src, rule, copy(model0()), 3, shard=src_shard, adjust_at=2)
                        nm.save(st, path)
                        src.Free()
                    rs, ref = run_ref(no.setup(rule, copy(model0())), copy(model0()), n_src, 3, adjust_at=2)
                    if writer:
                        same(m, ref, "the source against the reference")
                    comm.Barrier()  # the checkpoint is complete for every rank
                    targets = [(n, sh, "elements") for n in range(1, comm.size + 1) for sh in (True, False)]
                    for n_tgt, shard, balance in targets + [(comm.size, True, "leaves")]:
                        tgt = MPI.COMM_SELF if n_tgt == 1 else first(comm, n_tgt)
                        if tgt == MPI.COMM_NULL:
                            continue
                        what = f"{rule!r}: {n_src} -> {n_tgt} ranks, shard {src_shard} -> {shard} ({balance})"
                        st2 = nm.load(path, copy(ref), tgt, shard=shard, balance=balance)
                        t = max(g.t for g in core(rs).groups)
                        assert st2.sharded == shard and st2.t == t > 0 and st2.comm.Get_size() == n_tgt, what
                        state_matches(st2, rs)
                        st2, m2 = run(tgt, rule, copy(ref), 3, start=3, st=st2)
                        rs2, ref2 = run_ref(copying.deepcopy(rs), copy(ref), n_tgt, 3, start=3)
                        same(m2, ref2, what)
                        state_matches(st2, rs2)
                        if tgt is not MPI.COMM_SELF:
                            tgt.Free()


@case("a_rule_chooser_and_an_empty_array_round_trip")
def _(comm):
    """Replicated with a rule per leaf and one leaf left untrained: loads replicated on any ranks, refuses to
    load sharded; an empty array keeps its counters through a sharded checkpoint."""
    rules = {"['enc']['w']": no.Adam(0.05), "['enc']['b']": no.Momentum(0.1, 0.9), "['z']": no.Adam(0.05)}
    chooser = lambda path, x: rules.get(str(path))  # ['head'] untrained
    with shared_dir(comm) as d:
        st, m = run(comm, chooser, copy(model0()), 3, shard=False)
        nm.save(st, os.path.join(d, "chooser"))
        rs, ref = run_ref(no.setup(chooser, copy(model0())), copy(model0()), comm.size, 3)
        same(m, ref, "the source")
        for tgt in (MPI.COMM_SELF, comm):
            st2 = nm.load(os.path.join(d, "chooser"), copy(ref), tgt)
            state_matches(st2, rs)
            st2, m2 = run(tgt, None, copy(ref), 2, start=3, st=st2)
            same(m2, run_ref(copying.deepcopy(rs), copy(ref), tgt.Get_size(), 2, start=3)[1], "chooser continued")
        all_same_error(comm, lambda: nm.load(os.path.join(d, "chooser"), copy(ref), comm, shard=True), ValueError,
                       "shard=False")
        extra = {"e": np.zeros(0)}
        st, m = run(comm, no.Adam(0.05), copy(model0(extra)), 3, shard=True)
        nm.save(st, os.path.join(d, "empty"))
        rs, ref = run_ref(no.setup(no.Adam(0.05), copy(model0(extra))), copy(model0(extra)), comm.size, 3)
        state_matches(nm.load(os.path.join(d, "empty"), copy(ref), MPI.COMM_SELF, shard=False), rs)


@case("param_groups_sharded_round_trip")
def _(comm):
    """Sharded parameter groups (rules of one chain's kernels, different hyperparameters, one global clip): saved,
    loaded sharded on the same ranks and replicated on one process, each continuing as one process does."""
    lrs = {"['enc']['w']": 0.05, "['enc']['b']": 0.02, "['head']": 0.01}  # ['z'] untrained
    rules = {p: no.chain(no.ClipGlobalNorm(0.5), no.Adam(lr)) for p, lr in lrs.items()}
    chooser = lambda path, x: rules.get(str(path))
    m0 = {k: v for k, v in model0().items() if k != "z"} | {"z": model0()["z"].real.copy()}
    with shared_dir(comm) as d:
        st, m = run(comm, chooser, copy(m0), 3, shard=True)
        nm.save(st, os.path.join(d, "groups"))
        rs, ref = run_ref(no.setup(chooser, copy(m0)), copy(m0), comm.size, 3)
        close(m, ref, "the source")  # arrays cut between ranks: the clip's norm within rounding
        for tgt, shard in ((comm, True), (MPI.COMM_SELF, False)):
            st2 = nm.load(os.path.join(d, "groups"), copy(m), tgt, shard=shard)
            got = {leaf.rule.rules[1].lr for _, leaf in st2.local.leaves()}  # the groups' own lr (pieces: some)
            assert st2.sharded == shard and got <= set(lrs.values()) and (shard or got == set(lrs.values())), got
            st2, m2 = run(tgt, None, copy(m), 2, start=3, st=st2)
            close(m2, run_ref(copying.deepcopy(rs), copy(m), tgt.Get_size(), 2, start=3)[1], f"continued {shard}")


def close(a, b, what):
    for x, y in zip(arrays(a), arrays(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6 if x.dtype == np.float32 else 1e-12, atol=1e-12, err_msg=what)


@case("a_model_that_does_not_match_is_the_same_value_error_on_every_rank")
def _(comm):
    with shared_dir(comm) as d:
        st, m = run(comm, no.Adam(0.05), copy(model0()), 2, shard=True)
        nm.save(st, d)
        wrong = {"shape": {"head": np.zeros(10, np.float32)}, "dtype": {"head": np.zeros(9)},
                 "extra leaf": {"extra": np.zeros(3)}}
        for what, change in wrong.items():
            bad = copy(m)
            bad.update(change)
            for shard in (True, False):
                msg = all_same_error(comm, lambda bad=bad, shard=shard: nm.load(d, bad, comm, shard=shard),
                                     ValueError, "does not match the checkpoint")
                assert "head" in msg or "leaves" in msg, (what, msg)
        missing = copy(m)
        del missing["z"]
        all_same_error(comm, lambda: nm.load(d, missing, comm), ValueError, "3 leaves", "4 leaves")
        bad = copy(m)
        if comm.rank == comm.size - 1:  # one rank's model differs: refused by every rank, naming that rank
            bad["head"] = np.zeros(10, np.float32)
        all_same_error(comm, lambda: nm.load(d, bad, comm), ValueError, f"rank {comm.size - 1}")
        st2 = nm.load(d, copy(m), comm)  # the communicator is still in step
        assert st2.t == 2


@case("a_missing_or_damaged_file_is_the_same_error_on_every_rank")
def _(comm):
    with shared_dir(comm) as d:
        st, m = run(comm, no.Adam(0.05), copy(model0()), 2, shard=True)
        nm.save(st, d)
        names = sorted(f for f in os.listdir(d) if f.startswith("shard-"))
        assert len(names) == comm.size and os.listdir(d).count(nm.checkpoint.HEADER) == 1, names
        comm.Barrier()
        if comm.rank == 0:
            os.rename(os.path.join(d, names[-1]), os.path.join(d, "aside"))
        comm.Barrier()
        all_same_error(comm, lambda: nm.load(d, copy(m), comm), FileNotFoundError, names[-1], "missing")
        all_same_error(comm, lambda: nm.load(d, copy(m), comm, shard=False), FileNotFoundError, names[-1])
        comm.Barrier()
        if comm.rank == 0:
            os.rename(os.path.join(d, "aside"), os.path.join(d, names[-1]))
            with open(os.path.join(d, names[0]), "r+b") as f:  # same size, damaged content
                f.seek(os.path.getsize(os.path.join(d, names[0])) // 2)
                f.write(b"\x00\xff" * 8)
        comm.Barrier()
        all_same_error(comm, lambda: nm.load(d, copy(m), comm), no.CheckpointError, names[0])
        comm.Barrier()
        if comm.rank == 0:
            os.remove(os.path.join(d, nm.checkpoint.HEADER))
        comm.Barrier()
        all_same_error(comm, lambda: nm.load(d, copy(m), comm), FileNotFoundError, "header")
        target = os.path.join(d, "a-file")
        if comm.rank == 0:
            open(target, "w").close()
        comm.Barrier()
        all_same_error(comm, lambda: nm.save(st, target), OSError, "rank 0")


@case("files_of_a_save_and_of_saving_again")
def _(comm):
    """Replicated: rank 0 writes one ordinary numbaopt.save file (numbaopt.load reads it) and the header;
    saving again to the same directory leaves the new files only, and loads the new state."""
    with shared_dir(comm) as d:
        st, m = run(comm, no.Adam(0.05), copy(model0()), 2, shard=False)
        nm.save(st, d)
        files = sorted(os.listdir(d))
        assert len(files) == 2 and files[0] == nm.checkpoint.HEADER and files[1].startswith("state-"), files
        plain = no.load(os.path.join(d, files[1]))
        for (p, x), (q, y) in zip(plain.leaves(), st.local.leaves(), strict=True):
            assert str(p) == str(q) and all(np.array_equal(a, b) for a, b in zip(x.arrays, y.arrays, strict=True))
        comm.Barrier()
        st, m = run(comm, no.Adam(0.05), m, 1, start=2, st=st)
        sharded, _ = run(comm, no.Adam(0.05), copy(model0()), 3, shard=True)
        nm.save(sharded, d)
        now = sorted(os.listdir(d))
        assert files[1] not in now and len(now) == comm.size + 1, now
        assert nm.load(d, copy(m), comm).t == 3
        assert nm.load(d, copy(m), comm).sharded


if __name__ == "__main__":
    main()
