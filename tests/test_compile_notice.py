"""Issue 27, items 4 and 5: the compile notice (one log record per public call that compiled for longer than a
threshold, charged to the outermost call, nothing on a call that compiles nothing) and ``precompile`` (every kernel
a state will need compiled ahead, on stand-ins: the state and the model stay byte-identical, and the first real
steps meet no kernel signature they lack).

Compilation is forced cheaply: a fresh ``@njit`` lambda compiled inside a public call (a ``minimize`` callback, or
a test function registered as a public call). The kernels stepped are the ones other tests use (Adam, Descent,
ClipGlobalNorm+AdamW in float64/float32)."""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit
from numba.core import event

import numbaopt as no
from numbaopt.ahead import precompile
from numbaopt.compiler import notice
from numbaopt.tree.state import core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "numbaopt.compile"


@pytest.fixture
def records(caplog):
    """The notice's records, with the threshold at 0 (every call that compiled anything reports)."""
    caplog.set_level(logging.INFO, logger=NAME)
    old = notice.set_threshold(0.0)
    try:
        yield lambda: [r for r in caplog.records if r.name == NAME]
    finally:
        notice.set_threshold(old)


def _compile_something(k=1):
    """Compile ``k`` fresh functions (a new lambda is a new dispatcher: it always compiles)."""
    for i in range(k):
        f = njit(lambda a: a + 1)
        f(i)


def _loss(x, g):
    g[:] = x
    return 0.5 * float(x @ x)


@contextlib.contextmanager
def new_signatures():
    """Yields a list that ends up holding one entry per time a dispatcher met a signature it had not got in
    memory (compiled, or loaded from the disk cache: both enter Numba's compiler lock)."""
    seen = []

    class L(event.Listener):
        def on_start(self, ev):
            seen.append(ev.kind)

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compiler_lock", L()):
        yield seen


# --------------------------------------------------------------------------------------------------
# the notice


def test_a_call_that_compiles_logs_one_record(records):
    no.minimize(_loss, np.ones(3), no.Descent(0.1), maxiter=3, callback=lambda r: _compile_something(2))
    got = records()
    assert len(got) == 1, [r.getMessage() for r in got]
    r = got[0]
    assert r.levelno == logging.WARNING
    assert r.getMessage().startswith("numbaopt: minimize compiled for ")
    assert "<lambda>" in r.getMessage()
    assert sys.getprofile() is None  # the hook that waited for the call's return is gone


def test_nested_public_calls_report_once_for_the_outermost(records):
    def outer():
        no.minimize(_loss, np.ones(3), no.Descent(0.1), maxiter=2, callback=lambda r: _compile_something())
        _compile_something()

    notice.register(outer, name="outer")
    outer()
    got = records()
    assert [r.getMessage().split(" compiled")[0] for r in got] == ["numbaopt: outer"]


def test_each_call_reports_for_itself_and_a_failing_call_too(records):
    def call(fail, compile=True):
        if compile:
            _compile_something()
        if fail:
            raise RuntimeError("boom")

    notice.register(call, name="call")
    for _ in range(100):  # CPython specialises a hot function's bytecode in place (its code object's hash changes)
        call(False, False)
    call(False)
    with pytest.raises(RuntimeError):
        call(True)
    assert len(records()) == 2
    assert sys.getprofile() is None


def test_below_the_threshold_or_silenced_nothing_is_logged(records, caplog):
    notice.set_threshold(float("inf"))
    no.minimize(_loss, np.ones(3), no.Descent(0.1), maxiter=2, callback=lambda r: _compile_something())
    assert records() == []
    notice.set_threshold(0.0)
    caplog.set_level(logging.ERROR, logger=NAME)  # what a user does: logging's own level
    no.minimize(_loss, np.ones(3), no.Descent(0.1), maxiter=2, callback=lambda r: _compile_something())
    assert records() == []
    with pytest.raises(ValueError):
        notice.set_threshold(-1.0)


def test_a_quiet_call_logs_at_info(records):
    def ahead():
        _compile_something()

    notice.register(ahead, name="ahead", quiet=True)
    ahead()
    assert [r.levelno for r in records()] == [logging.INFO]


def test_another_profiler_is_left_alone_and_the_record_comes_at_once(records):
    seen = []

    def prof(frame, ev, arg):
        seen.append(ev)

    def call():
        _compile_something()

    notice.register(call, name="call")
    sys.setprofile(prof)
    try:
        call()
        assert sys.getprofile() is prof
    finally:
        sys.setprofile(None)
    got = records()
    assert len(got) == 1 and "so far" in got[0].getMessage()
    assert seen


def test_a_call_that_compiles_nothing_runs_no_notice_code(monkeypatch):
    x, g = np.zeros(16), np.ones(16)
    s = no.setup(no.Adam(1e-3), x)
    m = {"a": np.zeros(4), "b": np.zeros(3)}
    gm = {"a": np.ones(4), "b": np.ones(3)}
    st = no.setup(no.Adam(1e-3), m)
    for _ in range(2):
        s, x = no.update_(s, x, g)
        st, m = no.update_(st, m, gm)
    calls = []
    monkeypatch.setattr(notice, "_public_frame", lambda: calls.append(1) or (None, None))
    for _ in range(3):
        s, x = no.update_(s, x, g)
        st, m = no.update_(st, m, gm)
    assert calls == [] and sys.getprofile() is None


# --------------------------------------------------------------------------------------------------
# precompile


def _snapshot(state, model):
    if isinstance(state, no.Leaf):
        arrays = [*state.arrays, state.counters, state.hp]
    else:
        c = core(state)
        arrays = [a for grp in c.groups for a in (*grp.arenas, grp.C, grp.hp, grp.F, grp.P)]
    leaves = list(model.values()) if isinstance(model, dict) else [model]
    return [(a.dtype, a.shape, a.tobytes()) for a in arrays + leaves]


def _tree(dtype=np.float64):
    m = {"w": np.linspace(-1, 1, 12, dtype=dtype).reshape(4, 3), "b": np.linspace(0, 1, 3, dtype=dtype)}
    g = {"w": np.full((4, 3), 0.25, dtype), "b": np.full(3, -0.5, dtype)}
    return m, g


CASES = {
    "leaf_float32_threaded": lambda: (no.Adam(1e-2), np.linspace(0, 1, 16, dtype=np.float32), {"threaded": True}),
    "leaf_float64_2d": lambda: (no.Descent(0.1), np.linspace(0, 1, 12).reshape(3, 4), {}),
    "tree_adam": lambda: (no.Adam(1e-2), _tree()[0], {}),
    "tree_groups": lambda: (lambda p, x: no.chain(no.ClipGlobalNorm(1.0), no.AdamW(0.05 if np.ndim(x) == 2 else 0.02)),
                            _tree()[0], {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_precompile_writes_nothing_and_the_first_steps_need_no_new_kernel(case):
    rule, model, kw = CASES[case]()
    grads = _tree()[1] if isinstance(model, dict) else np.full_like(model, 0.25)
    state = no.setup(rule, model)
    before = _snapshot(state, model)
    fast = state.fast if isinstance(state, no.Leaf) else core(state).fast
    assert precompile(state, model, **kw) is state
    assert _snapshot(state, model) == before  # parameters, state arrays, counters, hyperparameters
    assert (state.fast if isinstance(state, no.Leaf) else core(state).fast) is fast
    with new_signatures() as seen:
        state, model = no.update_(state, model, grads)
        state, model = no.update_(state, model, grads)
        no.update(state, model, grads)
        state, model = no.update_(state, model, grads)
    assert seen == [], f"{case}: a step after precompile met a kernel signature it lacked"


def test_precompile_refuses_what_is_no_host_state():
    assert no.precompile is precompile
    with pytest.raises(TypeError, match="expected a state"):
        precompile({"w": np.zeros(3)}, None)


def test_in_a_fresh_process_precompile_loads_what_the_steps_would_have_loaded():
    """The acceptance test proper: in a fresh process no kernel is in memory, so the first steps would enter the
    compiler lock (to compile, or to load from the disk cache); after precompile they do not. The control: a
    state of another dtype, not precompiled, does."""
    code = textwrap.dedent("""
        import numpy as np, numbaopt as no
        from numba.core import event
        from numbaopt.ahead import precompile
        n = [0]
        class L(event.Listener):
            def on_start(self, ev): n[0] += 1
            def on_end(self, ev): pass
        event.register("numba:compiler_lock", L())
        def steps(state, model, grads):
            n[0] = 0
            state, model = no.update_(state, model, grads)
            state, model = no.update_(state, model, grads)
            no.update(state, model, grads)
            return n[0]
        m = {"w": np.ones((4, 3)), "b": np.ones(3)}
        g = {"w": np.full((4, 3), 0.5), "b": np.full(3, 0.5)}
        x = np.ones(16, np.float32)
        out = []
        for model, grads in ((m, g), (x, np.full(16, 0.5, np.float32))):
            state = no.setup(no.Adam(1e-2), model)
            n[0] = 0
            precompile(state, model, threaded=True)
            out += [n[0], steps(state, model, grads)]
        control = no.setup(no.Adam(1e-2), {"w": np.ones(3, np.float32)})
        out.append(steps(control, {"w": np.ones(3, np.float32)}, {"w": np.ones(3, np.float32)}))
        print(*out)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    tree_ahead, tree_steps, leaf_ahead, leaf_steps, control = map(int, r.stdout.split())
    assert tree_ahead > 0 and leaf_ahead > 0 and control > 0
    assert tree_steps == 0 and leaf_steps == 0
