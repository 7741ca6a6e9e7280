"""Threads: a state used by two calls at once refuses the second (StateInUseError, nothing done); separate
states in separate threads run lock-free and give the bits of a serial run."""
import threading
import time

import numpy as np
import pytest

import numbaopt as no
from numbaopt.backends.state import StateInUseError
from numbaopt.tree.state import core


def _hammer(step_once, seconds=3.0, threads=2, min_conflicts=5):
    """Run ``step_once`` from several threads until some calls were refused (or time is up):
    ``(successes, refusals)``."""
    ok, refused = [0] * threads, [0] * threads
    stop = time.monotonic() + seconds
    start = threading.Barrier(threads)

    def worker(k):
        start.wait()
        while time.monotonic() < stop and sum(refused) < min_conflicts:
            try:
                step_once()
                ok[k] += 1
            except StateInUseError:
                refused[k] += 1

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(ok), sum(refused)


def test_two_threads_one_array_state():
    n = 200_000
    x = np.zeros(n)
    g = np.ones(n)
    s = no.setup(no.Descent(0.5), x)
    no.update_(s, x, g)  # compiled and bound before the threads start
    done, refused = _hammer(lambda: no.update_(s, x, g))
    assert refused > 0, "no call overlapped in 3 s: the test did not exercise the guard"
    assert s.t == done + 1
    np.testing.assert_array_equal(x, -0.5 * (done + 1))  # every admitted step whole, none lost


def test_two_threads_one_tree_state():
    m = {"a": np.zeros(100_000), "b": [np.zeros(50_000), np.zeros(3)]}
    g = {"a": np.ones(100_000), "b": [np.ones(50_000), np.ones(3)]}
    s = no.setup(no.Descent(0.5), m)
    no.update_(s, m, g)
    done, refused = _hammer(lambda: no.update_(s, m, g))
    assert refused > 0
    c = core(s)
    assert (c.groups[0].C[0] == done + 1).all()
    for a in (m["a"], m["b"][0], m["b"][1]):
        np.testing.assert_array_equal(a, -0.5 * (done + 1))


def test_pure_steps_may_share_a_state_but_not_with_a_writer():
    x = np.zeros(100_000)
    g = np.ones(100_000)
    s = no.setup(no.Adam(), x)
    no.update_(s, x, g)
    before = [a.copy() for a in s.arrays]
    outs = []

    def reader():
        for _ in range(30):
            outs.append(no.update(s, x, g))

    ts = [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(outs) == 60  # readers never refuse each other
    for _, xn in outs:
        np.testing.assert_array_equal(xn, outs[0][1])
    for a, b in zip(s.arrays, before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("tree", [False, True])
def test_every_entry_point_refuses_a_state_in_use(tree):
    model = {"w": np.ones(4)} if tree else np.ones(4)
    grads = {"w": np.full(4, 0.5)} if tree else np.full(4, 0.5)
    s = no.setup(no.Adam(), model)
    s, model = no.update_(s, model, grads)
    holder = core(s) if tree else s
    snapshot = repr(s), [a.copy() for a in (core(s).groups[0].arenas if tree else s.arrays)]
    holder.users = -1  # what another thread's update_ holds while its kernel runs
    calls = [lambda: no.update_(s, model, grads), lambda: no.update(s, model, grads),
             lambda: no.adjust_(s, lr=0.5), lambda: no.adjust(s, lr=0.5)]
    if tree:
        calls += [lambda: no.freeze_(s), lambda: no.thaw_(s)]
    for call in calls:
        with pytest.raises(StateInUseError, match="in use by another call"):
            call()
    holder.users = 2  # two readers: a writer is refused, a reader admitted
    with pytest.raises(StateInUseError):
        no.update_(s, model, grads)
    no.update(s, model, grads)
    assert holder.users == 2
    holder.users = 0
    assert repr(s) == snapshot[0]
    for a, b in zip(core(s).groups[0].arenas if tree else s.arrays, snapshot[1]):
        np.testing.assert_array_equal(a, b)
    no.update_(s, model, grads)  # usable again


def test_separate_states_in_threads_equal_serial():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(5000) for _ in range(50)]
    rule = no.chain(no.ClipNorm(1.0), no.Adam(1e-2))

    def run(out, k):
        x = np.linspace(-1, 1, 5000) * (k + 1)
        s = no.setup(rule, x)
        for g in grads:
            s, x = no.update_(s, x, g * (k + 1))
        out[k] = (x, s)

    serial, threaded = {}, {}
    for k in range(4):
        run(serial, k)
    ts = [threading.Thread(target=run, args=(threaded, k)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in range(4):
        np.testing.assert_array_equal(serial[k][0], threaded[k][0])
        for a, b in zip(serial[k][1].arrays, threaded[k][1].arrays):
            np.testing.assert_array_equal(a, b)


def test_error_is_exported_and_a_runtime_error():
    assert no.StateInUseError is StateInUseError and issubclass(StateInUseError, RuntimeError)


def test_save_refuses_a_state_being_stepped(tmp_path):
    x = np.ones(4)
    s = no.setup(no.Adam(), x)
    tree = no.setup(no.Adam(), {"w": np.ones(4)})
    for held, saved in ((s, s), (core(tree), tree), (core(tree), tree["w"])):
        held.users = -1
        with pytest.raises(StateInUseError, match="save"):
            no.save(tmp_path / "s.npz", saved)
        assert not (tmp_path / "s.npz").exists()
        held.users = 1  # a reader (a pure step) does not stop a save
        no.save(tmp_path / "s.npz", saved)
        assert held.users == 1
        held.users = 0
        (tmp_path / "s.npz").unlink()
