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
    # a boundary counts steps taken: values[1] from t = 6 (count 5), as optax and torch's MultiStepLR
    assert [pc(t) for t in (1, 5, 6, 10, 11, 99)] == [3.0, 3.0, 2.0, 2.0, 1.0, 1.0]
    cos = no.cosine(1.0, 100, end=0.1)
    assert cos(1) == 1.0 and cos(51) == pytest.approx(0.55) and cos(101) == pytest.approx(0.1) and cos(500) == 0.1
    t = np.arange(1, 102)
    assert np.allclose(cos.values(t), 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (t - 1) / 100)))


def test_join_warmup_and_one_cycle():
    wc = no.warmup_cosine(1.0, 10, 110)
    assert wc(1) == 0.0 and wc(11) == 1.0 and wc(6) == pytest.approx(0.5)
    assert wc(61) == pytest.approx(0.5) and wc(111) == pytest.approx(0.0, abs=1e-15)
    j = no.join([no.constant(1.0), no.linear(2.0, 3.0, 2)], [4])
    assert [j(t) for t in (1, 4, 5, 6, 7, 9)] == [1.0, 1.0, 2.0, 2.5, 3.0, 3.0]
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


# -- against the real optax and torch schedules: s(t) == optax_counterpart(count = t - 1) ---------------------
def _optax_values(sched, n):
    import jax
    jax.config.update("jax_enable_x64", True)  # float64 counts: optax's int32 counts compute in float32
    jnp = jax.numpy
    return np.array([float(sched(jnp.asarray(c, jnp.float64))) for c in range(n)])


def _torch_values(make, n, lr):
    import torch
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr)
    sched = make(opt)
    out = []
    for _ in range(n):  # the lr each optimizer.step() uses, torch's documented loop order
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(out)


def _optax_cases():
    import optax
    return [
        (no.constant(0.3), optax.constant_schedule(0.3)),
        (no.linear(0.5, 0.1, 7), optax.linear_schedule(0.5, 0.1, 7)),
        (no.exponential(0.5, 0.8), optax.exponential_decay(0.5, 1, 0.8)),
        (no.exponential(0.5, 0.8, every=3), optax.exponential_decay(0.5, 3, 0.8)),
        (no.exponential(0.5, 0.8, every=3, staircase=True), optax.exponential_decay(0.5, 3, 0.8, staircase=True)),
        (no.exponential(0.5, 0.5, end=0.1), optax.exponential_decay(0.5, 1, 0.5, end_value=0.1)),
        (no.piecewise_constant([1.0, 0.5, 0.05], [4, 9]), optax.piecewise_constant_schedule(1.0, {4: 0.5, 9: 0.1})),
        (no.cosine(0.4, 9, end=0.04), optax.cosine_decay_schedule(0.4, 9, alpha=0.1)),
        (no.warmup_cosine(1.0, 4, 15, start=0.1, end=0.01),
         optax.warmup_cosine_decay_schedule(0.1, 1.0, 4, 15, end_value=0.01)),
        (no.one_cycle(0.2, 17), optax.cosine_onecycle_schedule(17, 0.2)),
        (no.one_cycle(0.2, 10, pct_start=0.25, div_factor=10.0, final_div_factor=100.0),
         optax.cosine_onecycle_schedule(10, 0.2, pct_start=0.25, div_factor=10.0, final_div_factor=100.0)),
        (no.join([no.constant(0.1), no.linear(0.2, 0.0, 4), no.cosine(0.3, 5)], [3, 8]),
         optax.join_schedules([optax.constant_schedule(0.1), optax.linear_schedule(0.2, 0.0, 4),
                               optax.cosine_decay_schedule(0.3, 5)], [3, 8])),
    ]


def test_every_schedule_equals_its_optax_counterpart():
    n = 25
    ts = np.arange(1, n + 1)
    for ours, theirs in _optax_cases():
        np.testing.assert_allclose(ours.values(ts), _optax_values(theirs, n), rtol=1e-14, atol=1e-16,
                                   err_msg=repr(ours))


def test_schedules_equal_torch_lr_schedulers():
    import torch
    L = torch.optim.lr_scheduler
    n, lr = 20, 0.5
    cases = [
        (no.linear(lr * 0.2, lr * 1.0, 6), lambda o: L.LinearLR(o, start_factor=0.2, end_factor=1.0, total_iters=6)),
        (no.exponential(lr, 0.8), lambda o: L.ExponentialLR(o, gamma=0.8)),
        (no.step_decay(lr, 0.5, 4), lambda o: L.StepLR(o, step_size=4, gamma=0.5)),
        (no.piecewise_constant([lr, lr * 0.1, lr * 0.01], [5, 12]),
         lambda o: L.MultiStepLR(o, milestones=[5, 12], gamma=0.1)),
        (no.cosine(lr, 19, end=0.01), lambda o: L.CosineAnnealingLR(o, T_max=19, eta_min=0.01)),
        # torch's OneCycleLR(total_steps=N) peaks at count pct*N - 1 and ends at N - 1: with N = 20 and
        # pct = 0.3 it peaks at 5 = int(0.3 * 19) and ends at 19, which is one_cycle(peak, 19, 0.3)
        (no.one_cycle(lr, 19, pct_start=0.3),
         lambda o: L.OneCycleLR(o, max_lr=lr, total_steps=20, pct_start=0.3, cycle_momentum=False)),
    ]
    ts = np.arange(1, n + 1)
    for ours, make in cases:
        np.testing.assert_allclose(ours.values(ts), _torch_values(make, n, lr), rtol=1e-12, atol=1e-15,
                                   err_msg=repr(ours))


def test_the_boundary_convention_is_optax_and_torch_not_one_step_earlier():
    pc = no.piecewise_constant([1.0, 0.1], [3])
    assert [pc(t) for t in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, 0.1]  # three steps at 1.0, as MultiStepLR([3])
    assert no.piecewise_constant([1.0, 0.1], [0])(1) == 0.1  # boundary 0: from the start, as optax
    j = no.join([no.constant(1.0), no.constant(2.0)], [2])
    assert [j(t) for t in (1, 2, 3)] == [1.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="boundaries"):
        no.join([no.constant(1.0), no.constant(2.0)], [0])
