"""Pickling and copying states: ``pickle``, ``copy.copy``/``deepcopy``, ``torch.save``/``torch.load`` and a
spawned process work on every state kind before and after steps, and the copy steps bitwise like the
original; compiled objects are not pickled and come back on first use; a state in use is not pickled."""
import copy
import io
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest

import numbaopt as no
from numbaopt.backends.state import StateInUseError
from numbaopt.tree.state import core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Layer:
    w: np.ndarray
    b: np.ndarray


@dataclass(frozen=True)
class Frozen:
    w: np.ndarray
    scale: float


def _tree_model():
    w = np.linspace(-1, 1, 6).reshape(2, 3)
    tied = np.linspace(0, 1, 4)
    return {"enc": Layer(w.copy(), np.zeros(3)), "dec": [tied, tied], "f": Frozen(np.ones(2), 1.5)}


def _mixed_model():
    return {"h": np.linspace(0, 1, 5).astype(np.float16), "s": np.linspace(1, 2, 3).astype(np.float32),
            "d": np.linspace(-1, 0, 4)}


def grads_like(model, rng):
    """Gradients shaped like every array leaf (and the Python float) of ``model``."""
    if isinstance(model, np.ndarray):
        return rng.standard_normal(model.shape).astype(model.dtype)
    if isinstance(model, float):
        return float(rng.standard_normal())
    if isinstance(model, dict):
        return {k: grads_like(v, rng) for k, v in model.items()}
    if isinstance(model, list):
        return [grads_like(v, rng) for v in model]
    return type(model)(**{k: grads_like(v, rng) for k, v in vars(model).items()})


def _per_leaf(path, leaf):  # two groups: a rule per leaf
    return no.Momentum(0.05) if "dec" in str(path) else no.Adam(0.01)


CASES = {
    "leaf": (lambda: no.Adam(0.01), lambda: np.linspace(-1, 1, 7).astype(np.float32)),
    "leaf-2d-scheduled": (lambda: no.Adam(no.warmup_cosine(1e-2, 2, 20)), lambda: np.ones((3, 4))),
    "leaf-accum-clip": (lambda: no.chain(no.AccumGrad(3), no.ClipGlobalNorm(0.5), no.Adam(0.01)),
                        lambda: np.linspace(-1, 1, 9)),
    "leaf-mixed-precision": (lambda: no.chain(no.MixedPrecision(np.float32), no.Adam(0.01)),
                             lambda: np.linspace(0, 1, 6).astype(np.float16)),
    "leaf-lookahead": (lambda: no.Lookahead(no.Adam(0.01), k=3), lambda: np.linspace(-1, 1, 5)),
    "tree": (lambda: no.Adam(0.01), _tree_model),
    "tree-groups": (lambda: _per_leaf, _tree_model),
    "tree-accum-clip-scheduled": (lambda: no.chain(no.AccumGrad(2), no.ClipGlobalNorm(1.0),
                                                   no.Adam(no.warmup_cosine(1e-2, 3, 30))), _tree_model),
    "tree-mixed-precision": (lambda: no.chain(no.MixedPrecision(np.float32), no.ClipGlobalNorm(1.0), no.Adam(0.01)),
                             _mixed_model),
    "tree-lookahead": (lambda: no.Lookahead(no.Adam(0.01), k=2), _tree_model),
}


def setup_case(case, steps, frozen=False, seed=0):
    rule, make = CASES[case]
    model = make()
    state = no.setup(rule(), model)
    if frozen and isinstance(state, no.StateTree):
        no.freeze_(state["enc"].b if "enc" in state.keys() else state["d"])
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        state, model = no.update_(state, model, grads_like(model, rng))
    return state, model


def contents(state, hp=True) -> list:
    """Everything a state holds, as bytes (bitwise comparison: NaNs equal, -0.0 not 0.0). ``hp=False`` leaves
    out the hyperparameters of scheduled rules (refilled before every step: ``load`` computes the next step's)."""
    def hps(x):
        return [x.hp.tobytes()] if hp or not x.layout.scheduled else []

    if isinstance(state, no.Leaf):
        out = [a.tobytes() for a in state.arrays] + [state.counters.tobytes(), repr(state.rule)] + hps(state)
        return out + ([] if state.master is None else [state.master.tobytes()])
    c = core(state)
    out = [c.frozen.tobytes()]
    for g in c.groups:
        out += [a.tobytes() for a in g.arenas] + [g.C.tobytes(), repr(g.rule)] + hps(g)
        out += [m.tobytes() for m in g.masters if m is not None]
    return out


def model_bytes(model) -> list:
    if isinstance(model, np.ndarray):
        return [model.dtype.str, model.tobytes()]
    if isinstance(model, float):
        return [repr(model)]
    if isinstance(model, dict):
        return [b for k in model for b in model_bytes(model[k])]
    if isinstance(model, list):
        return [b for v in model for b in model_bytes(v)]
    return [b for v in vars(model).values() for b in model_bytes(v)]


def _torch_roundtrip(obj):
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"opt": obj}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)["opt"]


METHODS = {
    "pickle-2": lambda s: pickle.loads(pickle.dumps(s, protocol=2)),
    "pickle-5": lambda s: pickle.loads(pickle.dumps(s, protocol=5)),
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "torch": _torch_roundtrip,
}


def step_both(a, ma, b, mb, n, seed, pure=False):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        g = grads_like(ma, rng)
        if pure:
            a, ma = no.update(a, ma, g)
            b, mb = no.update(b, mb, copy.deepcopy(g))
        else:
            a, ma = no.update_(a, ma, g)
            b, mb = no.update_(b, mb, copy.deepcopy(g))
    return a, ma, b, mb


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("steps", [0, 3])
def test_copies_step_bitwise_like_the_original(case, steps):
    for name, method in METHODS.items():
        orig, m0 = setup_case(case, steps, frozen=True)
        twin = method(orig)
        assert type(twin) is type(orig), name
        assert contents(twin) == contents(orig), name
        m1 = copy.deepcopy(m0)
        a, ma, b, mb = step_both(orig, m0, twin, m1, 5, seed=steps + 1)
        assert contents(a) == contents(b), (case, name)
        assert model_bytes(ma) == model_bytes(mb), (case, name)
        a, ma, b, mb = step_both(a, ma, b, mb, 2, seed=9, pure=True)  # the pure step too
        assert contents(a) == contents(b) and model_bytes(ma) == model_bytes(mb), (case, name)


@pytest.mark.parametrize("case", ["leaf", "tree-groups"])
def test_copies_are_independent(case):
    state, model = setup_case(case, 2)
    for method in METHODS.values():
        twin = method(state)
        before = contents(twin)
        m = copy.deepcopy(model)
        no.update_(state, m, grads_like(m, np.random.default_rng(5)))
        assert contents(twin) == before and contents(state) != before


def test_compiled_objects_are_dropped_and_come_back():
    x = np.linspace(-1, 1, 8).astype(np.float32)
    state, x = no.update_(no.setup(no.Adam(0.01), x), x, np.ones_like(x))
    assert state.fast is not None and state.kern is not None  # what made pickling fail before
    twin = pickle.loads(pickle.dumps(state))
    assert twin.fast is None and twin.kern is None
    assert twin.dtype is np.dtype(np.float32)  # NumPy's own descriptor: the fast path compares identity
    twin, _ = no.update_(twin, x.copy(), np.ones_like(x))
    assert twin.fast is not None  # the bound fast call, made again

    model = {"enc": [np.ones(3), np.ones((2, 2))], "dec": np.ones(2)}  # writeable arrays, no ties: the fast path
    tree = no.setup(_per_leaf, model)
    rng = np.random.default_rng(1)
    for _ in range(2):
        tree, model = no.update_(tree, model, grads_like(model, rng))
    assert core(tree).fast is not None and core(tree).structure.gather
    twin = pickle.loads(pickle.dumps(tree))
    c = core(twin)
    assert c.fast is None and not c.structure.gather and not c.leafcache and c.users == 0
    assert all(d is np.dtype(d.str) for d in c.structure.u_dtype)
    assert len(c.groups) == 2 and all(g.kern is None and g.F.shape[0] == len(g.members) for g in c.groups)
    for _ in range(2):
        twin, model = no.update_(twin, model, grads_like(model, rng))
    fp = core(twin).fast
    assert fp is not None  # the fast path's plan, made again: the next step takes it
    g = grads_like(model, rng)
    assert fp.run(core(twin), model, g)


def test_leaf_views_and_sub_states_pickle_detached():
    tree, model = setup_case("tree", 2)
    view = tree["enc"].w
    for method in METHODS.values():
        leaf = method(view)
        assert type(leaf) is no.Leaf and leaf.shape == (2, 3) and leaf.t == 2
        assert [a.tobytes() for a in leaf.arrays] == [a.tobytes() for a in view.arrays]
    sub = pickle.loads(pickle.dumps(tree["enc"]))
    assert type(sub) is no.StateNode and sub.w.t == 2
    assert sub.w.arrays[0].tobytes() == view.arrays[0].tobytes()


def test_a_state_in_use_is_not_pickled_or_copied():
    state, model = setup_case("leaf", 1)
    tree, tmodel = setup_case("tree", 1)
    for s, holder in ((state, state), (tree, core(tree)), (tree["enc"].w, core(tree))):
        holder.users = -1  # what another thread's update_ holds while its kernel runs
        try:
            for method in METHODS.values():
                with pytest.raises(StateInUseError, match="in use by another call"):
                    method(s)
        finally:
            holder.users = 0
        holder.users = 1  # another reader (a pure update): pickling reads too, it is admitted
        try:
            pickle.dumps(s)
            assert holder.users == 1
        finally:
            holder.users = 0


def _child_steps(state, model, n, seed):
    """In a spawned process: step the state received ``n`` times and send it back."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        state, model = no.update_(state, model, grads_like(model, rng))
    return state, model


def test_a_stepped_state_goes_to_a_spawned_process_and_back():
    ctx = multiprocessing.get_context("spawn")
    for case in ("leaf-accum-clip", "tree-accum-clip-scheduled"):
        state, model = setup_case(case, 3, frozen=True)
        mine, mm = copy.deepcopy(state), copy.deepcopy(model)
        with ctx.Pool(1) as pool:
            theirs, tm = pool.apply(_child_steps, (state, model, 4, 11))
        mine, mm = _child_steps(mine, mm, 4, 11)
        assert contents(theirs) == contents(mine) and model_bytes(tm) == model_bytes(mm)
        theirs, tm = _child_steps(theirs, tm, 2, 12)  # and it steps on here
        mine, mm = _child_steps(mine, mm, 2, 12)
        assert contents(theirs) == contents(mine)


def test_registered_container_pickles_by_its_registration():
    state = no.setup(no.Adam(0.01), {"p": Pair(np.ones(3), np.zeros(2))})
    state, m = no.update_(state, {"p": Pair(np.ones(3), np.zeros(2))}, {"p": Pair(np.ones(3), np.ones(2))})
    twin = pickle.loads(pickle.dumps(state))
    twin, m2 = no.update_(twin, m, {"p": Pair(np.ones(3), np.ones(2))})
    assert isinstance(m2["p"], Pair) and twin["p"]["a"].t == 2


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


no.register_container(Pair, lambda p: [("a", p.a), ("b", p.b)], lambda p, v: Pair(*v),
                      setitem=lambda p, k, v: setattr(p, k, v))


def _has_numba_cuda() -> bool:
    import importlib.util
    return importlib.util.find_spec("numba_cuda") is not None


@pytest.mark.skipif(not _has_numba_cuda(), reason="numba-cuda (the simulator) is not installed")
def test_device_states_pickle_through_the_host(tmp_path):
    """Under the CUDA simulator (its own process): a DeviceLeaf, a DeviceGroup and a tree with device leaves
    pickle (their state copied to the host) and step on like the original; unpickled where no GPU is
    usable, they are a RuntimeError saying so."""
    out = tmp_path / "device.pkl"
    code = textwrap.dedent(f"""
        import copy, pickle, numpy as np, numbaopt as no
        from numba import cuda
        def host(a):
            return a.copy_to_host().tobytes()
        x = cuda.to_device(np.linspace(-1, 1, 5).astype(np.float32))
        g = cuda.to_device(np.full(5, 0.5, np.float32))
        s, x = no.update_(no.setup(no.Adam(0.1), x), x, g)
        for twin in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
            assert type(twin) is no.DeviceLeaf and twin.t == 1
            a, xa, b, xb = copy.deepcopy(s), cuda.to_device(x.copy_to_host()), twin, cuda.to_device(x.copy_to_host())
            for _ in range(3):
                a, xa = no.update_(a, xa, g)
                b, xb = no.update_(b, xb, g)
            assert host(xa) == host(xb) and [host(p) for p in a.arrays] == [host(p) for p in b.arrays]
        grp = no.setup_device_group(no.Adam(0.1), [x])
        grp, _ = no.update_(grp, [x], [g])
        twin = pickle.loads(pickle.dumps(grp))
        assert type(twin) is no.DeviceGroup and list(twin.ts) == [1]
        model = {{"gpu": cuda.to_device(np.ones(4, np.float32)), "cpu": np.ones(3)}}
        grads = {{"gpu": cuda.to_device(np.full(4, 0.25, np.float32)), "cpu": np.full(3, 0.5)}}
        t, model = no.update_(no.setup(no.Adam(0.1), model), model, grads)
        t2 = pickle.loads(pickle.dumps(t))
        m2 = {{"gpu": cuda.to_device(model["gpu"].copy_to_host()), "cpu": model["cpu"].copy()}}
        for _ in range(3):
            t, model = no.update_(t, model, grads)
            t2, m2 = no.update_(t2, m2, grads)
        assert host(model["gpu"]) == host(m2["gpu"]) and model["cpu"].tobytes() == m2["cpu"].tobytes()
        member = pickle.loads(pickle.dumps(t["gpu"]))
        assert type(member) is no.DeviceLeaf and member.t == 4
        open({str(out)!r}, "wb").write(pickle.dumps(s))
        print("ok")
    """)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    if no.cuda_available():
        return
    with pytest.raises(RuntimeError, match="unpickling a DeviceLeaf: its state goes back to a GPU"):
        pickle.loads(out.read_bytes())
