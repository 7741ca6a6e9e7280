"""Schedules: values, validation, printing, and driving hyperparameters without recompiling."""
import math

import numpy as np
import pytest

import numbaopt as no
from numbaopt import schedules as S


def test_values_match_closed_forms():
    ts = np.arange(1, 31)
    assert (no.constant(0.3).values(ts) == 0.3).all()
    lin = no.linear(1.0, 0.0, 10)
    assert lin(1) == 1.0 and lin(6) == pytest.approx(0.5) and lin(11) == 0.0 and lin(50) == 0.0
    ex = no.exponential(2.0, 0.5)
    assert [ex(t) for t in (1, 2, 3)] == [2.0, 1.0, 0.5]
    st = no.exponential(1.0, 0.1, every=3, staircase=True)
    assert [st(t) for t in (1, 3, 4, 7)] == pytest.approx([1.0, 1.0, 0.1, 0.01])
    assert no.exponential(1.0, 0.5, end=0.2)(10) == 0.2
    assert no.step_decay(1.0, 0.1, 3) == st
    pc = no.piecewise_constant([3.0, 2.0, 1.0], [5, 10])
    assert [pc(t) for t in (1, 4, 5, 9, 10, 99)] == [3.0, 3.0, 2.0, 2.0, 1.0, 1.0]
    cos = no.cosine(1.0, 100, end=0.1)
    assert cos(1) == 1.0 and cos(51) == pytest.approx(0.55) and cos(101) == pytest.approx(0.1) and cos(500) == 0.1
    t = np.arange(1, 102)
    assert np.allclose(cos.values(t), 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (t - 1) / 100)))


def test_join_warmup_and_one_cycle():
    wc = no.warmup_cosine(1.0, 10, 110)
    assert wc(1) == 0.0 and wc(11) == 1.0 and wc(6) == pytest.approx(0.5)
    assert wc(61) == pytest.approx(0.5) and wc(111) == pytest.approx(0.0, abs=1e-15)
    j = no.join([no.constant(1.0), no.linear(2.0, 3.0, 2)], [4])
    assert [j(t) for t in (1, 3, 4, 5, 6, 9)] == [1.0, 1.0, 2.0, 2.5, 3.0, 3.0]
    oc = no.one_cycle(0.1, 100, pct_start=0.3)
    v = oc.values(np.arange(1, 102))
    assert v[0] == pytest.approx(0.1 / 25) and v.max() == pytest.approx(0.1)
    assert np.argmax(v) == 30 and v[-1] == pytest.approx(0.1 / 25 / 1e4)
    assert (np.diff(v[:31]) > 0).all() and (np.diff(v[30:]) < 0).all()


def test_scalar_and_vector_forms_agree_and_repr_rebuilds():
    scheds = [no.constant(1.0), no.linear(0.0, 1.0, 7), no.exponential(1.0, 0.9, 2, staircase=True),
              no.piecewise_constant([1.0, 0.5], [3]), no.cosine(1.0, 9), no.warmup_cosine(1.0, 3, 12),
              no.one_cycle(1.0, 20)]
    ts = np.arange(1, 25)
    ns = {n: getattr(S, n) for n in S.__all__}
    for s in scheds:
        assert [s(int(t)) for t in ts] == list(s.values(ts))
        assert eval(repr(s), ns) == s
    with pytest.raises(ValueError, match="t=0"):
        no.cosine(1.0, 10)(0)


@pytest.mark.parametrize("make,err,match", [
    (lambda: no.linear(1.0, 0.0, 0), ValueError, "steps"),
    (lambda: no.piecewise_constant([1.0], [3]), ValueError, "boundaries"),
    (lambda: no.piecewise_constant([1.0, 2.0, 3.0], [5, 3]), ValueError, "increase"),
    (lambda: no.join([no.constant(1.0), 2.0], [3]), TypeError, "schedules"),
    (lambda: no.cosine("a", 10), TypeError, "start"),
    (lambda: no.exponential(1.0, -0.5), ValueError, "decay"),
    (lambda: no.Adam(lr=no.linear(-1.0, 1.0, 10)), ValueError, "outside"),
])
def test_bad_schedules(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_a_bad_value_later_in_the_schedule_raises_before_writing():
    x = np.ones(3)
    s = no.setup(no.Adam(lr=no.linear(0.1, -0.1, 2)), x)
    s, x = no.update_(s, x, np.ones(3))
    s, x = no.update_(s, x, np.ones(3))  # lr = 0 at t = 2
    before = x.copy()
    with pytest.raises(ValueError, match="outside"):
        no.update_(s, x, np.ones(3))
    assert (x == before).all() and s.t == 2


def test_schedule_drives_any_hyperparameter_without_recompiling():
    rule = no.chain(no.WeightDecay(no.linear(0.1, 0.0, 5)), no.Adam(lr=no.cosine(0.1, 10), beta1=no.constant(0.8)))
    x0 = np.linspace(-1, 1, 8)
    grads = [np.cos(np.arange(8.0) + k) for k in range(12)]
    s, x = no.setup(rule, x0), x0.copy()
    kern = s.kernels()
    s, x = no.update_(s, x, grads[0])
    s, x = no.update(s, x, grads[1])
    n_sig = (len(kern.inplace.signatures), len(kern.outplace.signatures))
    assert n_sig == (1, 1)
    for g in grads[2:7]:
        s, x = no.update_(s, x, g)
    for g in grads[7:]:
        s, x = no.update(s, x, g)
    # the reference: constant hyperparameters changed by hand each step
    y = x0.copy()
    st = no.setup(no.chain(no.WeightDecay(0.1), no.Adam(0.1, 0.8)), y)
    assert st.kernels() is kern  # same options: the same generated module
    for t, g in enumerate(grads, 1):
        st = no.adjust(st, weight_decay=no.linear(0.1, 0.0, 5)(t), lr=no.cosine(0.1, 10)(t))
        st, y = no.update(st, y, g)
    assert x.tobytes() == y.tobytes()
    assert (len(kern.inplace.signatures), len(kern.outplace.signatures)) == n_sig


def test_plot_needs_only_matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        with pytest.raises(ImportError, match="matplotlib"):
            no.cosine(1.0, 10).plot()
        return
    ax = no.warmup_cosine(1.0, 5, 50).plot(60)
    line = ax.get_lines()[0]
    assert len(line.get_xdata()) == 60 and math.isclose(max(line.get_ydata()), 1.0)
