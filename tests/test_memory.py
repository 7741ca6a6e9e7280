"""Where results and state live: the pool of large result buffers and the placement of state arrays."""
import numpy as np
import pytest

import numbaopt as no
from numbaopt.backends import pool
from numbaopt.compiler.placement import PAGE


@pytest.fixture
def fresh_pool():
    old = pool.set_pool_limit(1 << 30)
    pool.clear_pool()
    yield
    pool.set_pool_limit(old)


def test_a_buffer_is_reused_only_when_no_array_refers_to_it(fresh_pool):
    a = pool.empty(100_000, np.float32)
    a[:] = 1
    view = a[10:20]
    addr = a.ctypes.data
    del a
    b = pool.empty(100_000, np.float32)  # a's buffer is still seen through `view`
    assert not np.shares_memory(b, view) and b.ctypes.data != addr
    b_addr = b.ctypes.data
    del b
    c = pool.empty((200, 500), np.float32)  # same byte size: b's free buffer
    assert c.ctypes.data == b_addr and c.shape == (200, 500) and c.flags.c_contiguous and c.flags.aligned
    assert (view == 1).all()
    small = pool.empty(10, np.float64)  # below MIN_BYTES: a plain allocation
    assert small.base is None


def test_the_pool_keeps_at_most_its_bound(fresh_pool):
    held = [pool.empty(100_000, np.float64) for _ in range(pool.KEEP + 2)]  # more live than KEEP: plain ones too
    assert pool.pool_bytes() == pool.KEEP * 800_000
    del held
    pool.clear_pool()
    assert pool.pool_bytes() == 0
    pool.set_pool_limit(0)
    x = pool.empty(100_000, np.float64)
    assert x.base is None and pool.pool_bytes() == 0
    with pytest.raises(ValueError):
        pool.set_pool_limit(-1)


@pytest.mark.parametrize("tree", [False, True])
def test_pure_results_stay_valid_while_kept(fresh_pool, tree):
    """A functional loop that keeps every step's results: no pooled buffer is handed out while an earlier
    result lives, so each kept parameter and state still holds its own step's values (compared with the
    same loop without the pool)."""
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(50_000).astype(np.float32)
    gs = [rng.standard_normal(50_000).astype(np.float32) for _ in range(6)]

    def run():
        m = [x0.copy()] if tree else x0.copy()
        s = no.setup(no.Adam(0.1), m)
        kept = []
        for g in gs:
            s, m = no.update(s, m, [g] if tree else g)
            kept.append((s, m))
        leaf = (lambda st: st[0]) if tree else (lambda st: st)
        return [(np.asarray(mm[0] if tree else mm).copy(), leaf(ss).state["m"].copy(), mm) for ss, mm in kept]

    with_pool = run()
    pool.set_pool_limit(0)
    without = run()
    for (x1, m1, live), (x2, m2, _) in zip(with_pool, without):
        assert x1.tobytes() == x2.tobytes() and m1.tobytes() == m2.tobytes()
        np.testing.assert_array_equal(np.asarray(live[0] if tree else live), x1)  # untouched since
    assert len({r[0].tobytes() for r in with_pool}) == len(gs)


def test_large_state_arrays_start_apart_within_a_page():
    x = np.zeros(1 << 18, np.float32)
    s = no.setup(no.Adam(), x)
    offsets = [a.ctypes.data % PAGE for a in s.arrays] + [x.ctypes.data % PAGE]
    gaps = [(offsets[i] - offsets[j]) % PAGE for i in range(3) for j in range(3) if i != j]
    assert len(set(offsets)) == len(offsets) and min(gaps) >= 512, offsets
    assert all(a.ctypes.data % 64 == 0 for a in s.arrays)
