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


# -- the schedules of issue 15: polynomial, warmup_constant, warmup_exponential, linear_one_cycle, sgdr ----------
def _optax_at(sched, n):
    """optax's values at the counts 0..n-1, fed as float64 (one vectorised call: fast)."""
    import jax
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    return np.asarray(jax.vmap(sched)(jnp.arange(n, dtype=jnp.float64)), dtype=np.float64)


def _new_optax_cases():
    import optax
    sgdr_kw = [dict(init_value=0.3, peak_value=0.3, warmup_steps=0, decay_steps=4 * 2 ** k, end_value=0.01)
               for k in range(3)]
    return [
        (no.polynomial(1.0, 0.01, 2, 20), optax.polynomial_schedule(1.0, 0.01, 2, 20)),
        (no.polynomial(0.5, 0.1, 0.5, 13, begin=7), optax.polynomial_schedule(0.5, 0.1, 0.5, 13, 7)),
        (no.polynomial(0.1, 0.9, 3.0, 1), optax.polynomial_schedule(0.1, 0.9, 3.0, 1)),
        (no.warmup_constant(0.2, 9, start=0.02), optax.warmup_constant_schedule(0.02, 0.2, 9)),
        (no.warmup_exponential(0.5, 6, 0.7, every=4, start=0.05),
         optax.warmup_exponential_decay_schedule(0.05, 0.5, 6, 4, 0.7)),
        (no.warmup_exponential(0.5, 6, 0.7, every=4, begin=5, staircase=True, end=0.2),
         optax.warmup_exponential_decay_schedule(0.0, 0.5, 6, 4, 0.7, transition_begin=5, staircase=True,
                                                 end_value=0.2)),
        (no.warmup_exponential(0.1, 3, 1.2, every=2, end=0.3),  # growing: end is a cap
         optax.warmup_exponential_decay_schedule(0.0, 0.1, 3, 2, 1.2, end_value=0.3)),
        (no.warmup_exponential(-0.5, 0, 0.9), optax.warmup_exponential_decay_schedule(0.0, -0.5, 0, 1, 0.9)),
        (no.linear_one_cycle(0.4, 40), optax.linear_onecycle_schedule(40, 0.4)),
        (no.linear_one_cycle(0.4, 17, pct_start=0.25, pct_final=0.7, div_factor=5.0, final_div_factor=50.0),
         optax.linear_onecycle_schedule(17, 0.4, 0.25, 0.7, 5.0, 50.0)),
        (no.linear_one_cycle(0.4, 10, pct_start=0.05, pct_final=0.5),  # int(0.5) = 0: starts at the peak
         optax.linear_onecycle_schedule(10, 0.4, 0.05, 0.5)),
        (no.sgdr(0.3, 4, mult=2, end=0.01), optax.sgdr_schedule(sgdr_kw)),
        (no.sgdr_cycles([dict(peak=0.3, steps=4 * 2 ** k, end=0.01) for k in range(3)]),
         optax.sgdr_schedule(sgdr_kw)),
        (no.sgdr_cycles([dict(peak=1.0, warmup=3, steps=10, start=0.1, end=0.05), dict(peak=0.5, steps=7),
                         dict(peak=0.25, warmup=1, steps=5, end=0.01)]),
         optax.sgdr_schedule([dict(init_value=0.1, peak_value=1.0, warmup_steps=3, decay_steps=10, end_value=0.05),
                              dict(init_value=0.0, peak_value=0.5, warmup_steps=0, decay_steps=7, end_value=0.0),
                              dict(init_value=0.0, peak_value=0.25, warmup_steps=1, decay_steps=5,
                                   end_value=0.01)])),
    ]


def test_new_schedules_equal_optax_at_every_count_and_boundary():
    n = 60  # every boundary above lies within the first 60 counts, and the values after the last one
    ts = np.arange(1, n + 1)
    for ours, theirs in _new_optax_cases():
        want = _optax_at(theirs, n)
        # sgdr restarts for ever where optax's cycles end (after 4 + 8 + 16 = 28 steps): compared up to there
        m = 28 if isinstance(ours, S.sgdr) else n
        np.testing.assert_allclose(ours.values(ts)[:m], want[:m], rtol=1e-14, atol=1e-16, err_msg=repr(ours))


def test_sgdr_equals_torch_cosine_annealing_warm_restarts():
    import torch
    L = torch.optim.lr_scheduler
    n, lr = 70, 0.5
    ts = np.arange(1, n + 1)
    for period, mult, end in [(5, 1, 0.0), (3, 2, 0.01), (2, 3, 0.1), (1, 1, 0.02)]:
        ours = no.sgdr(lr, period, mult, end)
        ref = _torch_values(lambda o, p=period, m=mult, e=end: L.CosineAnnealingWarmRestarts(o, p, m, e), n, lr)
        np.testing.assert_allclose(ours.values(ts), ref, rtol=1e-12, atol=1e-15, err_msg=repr(ours))
    # huge steps: the cycle is found in integers (no float logarithm), vectorised and scalar alike
    s = no.sgdr(1.0, 3, 2)
    first = 3 * (2 ** 40 - 1)  # the count at which the cycle of 3 * 2**40 steps begins
    far = np.array([first, first + 1, first + 3 * 2 ** 39 + 1], dtype=np.int64)  # its step before, first, middle
    v = s.values(far)
    assert v[0] < 1e-20 and v[1] == 1.0 and v[2] == pytest.approx(0.5, abs=1e-15) and s(int(far[2])) == v[2]


def test_new_schedules_scalar_vector_repr_and_checkpoint(tmp_path):
    scheds = [no.polynomial(1.0, 0.0, 2.5, 9, begin=2), no.warmup_constant(1.0, 4),
              no.warmup_exponential(1.0, 3, 0.8, every=2, begin=1, staircase=True, start=0.1, end=0.5),
              no.warmup_exponential(1.0, 0, 0.9), no.linear_one_cycle(1.0, 20), no.sgdr(1.0, 3, 2, 0.1),
              no.sgdr_cycles([dict(peak=1.0, steps=3), dict(peak=0.5, warmup=1, steps=4, start=0.1)])]
    ts = np.arange(1, 40)
    ns = {n: getattr(S, n) for n in S.__all__}
    for s in scheds:
        assert [s(int(t)) for t in ts] == list(s.values(ts))
        assert eval(repr(s), ns) == s and hash(eval(repr(s), ns)) == hash(s)
        assert type(s).__module__ == "numbaopt.schedules"  # checkpoints name numbaopt.schedules:<class>
    x = np.ones(3)
    st = no.setup(no.chain(no.WeightDecay(no.warmup_exponential(1e-3, 2, 0.5)), no.Adam(lr=no.sgdr(0.1, 3, 2))), x)
    st, x = no.update_(st, x, np.ones(3))
    no.save(tmp_path / "s.npz", st)
    back = no.load(tmp_path / "s.npz")
    assert back.rule == st.rule
    # every name of numbaopt.schedules still resolves as before the split into modules
    import numbaopt.schedules as mod
    assert mod.cosine is no.cosine and mod.schedule_value(no.cosine(1.0, 2), 1) == 1.0


@pytest.mark.parametrize("make,err,match", [
    (lambda: no.polynomial(1.0, 0.0, 2, 0), ValueError, "steps"),
    (lambda: no.polynomial(1.0, 0.0, -1, 10), ValueError, "power"),
    (lambda: no.polynomial(1.0, 0.0, 2, 10, begin=-1), ValueError, "begin"),
    (lambda: no.polynomial(1.0, 0.0, 2, 10.5), ValueError, "integer"),
    (lambda: no.warmup_constant(1.0, 0), ValueError, "warmup"),
    (lambda: no.warmup_exponential(1.0, 5, 0.0), ValueError, "decay=0"),
    (lambda: no.warmup_exponential(1.0, 5, 0.5, every=0), ValueError, "every"),
    (lambda: no.warmup_exponential(1.0, 5, 0.5, staircase=1), TypeError, "staircase"),
    (lambda: no.warmup_exponential(1.0, 5, 0.5, end=float("nan")), ValueError, "end"),
    (lambda: no.linear_one_cycle(1.0, 10, pct_start=0.5, pct_final=0.5), ValueError, "must increase"),
    (lambda: no.linear_one_cycle(1.0, 10, pct_final=1.0), ValueError, "must increase"),
    (lambda: no.linear_one_cycle(1.0, 10, div_factor=0.5), ValueError, "div_factor"),
    (lambda: no.sgdr(1.0, 0), ValueError, "period"),
    (lambda: no.sgdr(1.0, 5, mult=1.5), ValueError, "mult"),
    (lambda: no.sgdr_cycles([]), ValueError, "no cycle"),
    (lambda: no.sgdr_cycles([dict(peak_value=1.0, decay_steps=5)]), ValueError, "optax's peak_value is peak"),
    (lambda: no.sgdr_cycles([dict(peak=1.0)]), ValueError, "needs peak and steps"),
    (lambda: no.sgdr_cycles([dict(peak=1.0, warmup=5, steps=5)]), ValueError, "steps"),
    (lambda: no.sgdr_cycles([(1.0, 5)]), TypeError, "dict"),
])
def test_bad_new_schedules(make, err, match):
    with pytest.raises(err, match=match):
        make()


@pytest.mark.parametrize("case", ["polynomial", "warmup_exponential", "linear_one_cycle", "sgdr"])
def test_a_new_schedule_drives_adam_as_optax_adam(case):
    import jax
    import optax
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    ours, theirs = {
        "polynomial": (no.polynomial(0.1, 0.001, 2, 20, begin=3), optax.polynomial_schedule(0.1, 0.001, 2, 20, 3)),
        "warmup_exponential": (no.warmup_exponential(0.1, 5, 0.8, every=3, start=0.01, end=0.02),
                               optax.warmup_exponential_decay_schedule(0.01, 0.1, 5, 3, 0.8, end_value=0.02)),
        "linear_one_cycle": (no.linear_one_cycle(0.1, 25), optax.linear_onecycle_schedule(25, 0.1)),
        "sgdr": (no.sgdr(0.1, 4, 2, 0.001), optax.sgdr_schedule([dict(init_value=0.1, peak_value=0.1, warmup_steps=0,
                                                                      decay_steps=4 * 2 ** k, end_value=0.001)
                                                                 for k in range(3)])),
    }[case]
    rng = np.random.default_rng(3)
    x0, gs = rng.standard_normal(6), [rng.standard_normal(6) for _ in range(28 if case == "sgdr" else 30)]
    state, x = no.setup(no.Adam(lr=ours), x0.copy()), x0.copy()
    tx = optax.adam(lambda count: theirs(jnp.asarray(count, jnp.float64)))
    p = jnp.asarray(x0)
    ost = tx.init(p)
    for g in gs:
        state, x = no.update_(state, x, g)
        u, ost = tx.update(jnp.asarray(g), ost, p)
        p = optax.apply_updates(p, u)
        np.testing.assert_allclose(x, np.asarray(p), rtol=1e-12, atol=1e-14)


def test_the_docstring_examples_run():
    """The Examples of every schedule and of ReduceOnPlateau (test_docs.py finds only objects whose module is
    ``numbaopt`` itself); they assume ``import numpy as np, numbaopt as no``."""
    import doctest
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    ran = 0
    for name in S.__all__ + ["ReduceOnPlateau"]:
        obj = getattr(no, name, None) or getattr(S, name)
        for t in finder.find(obj, name, module=False, globs={"np": np, "no": no}):
            if t.examples:
                ran += 1
                assert runner.run(t).failed == 0, f"{name}: its Examples fail (see stdout)"
    assert ran >= 7


# -- ReduceOnPlateau: optax.contrib.reduce_on_plateau's state machine on the host ------------------------------
def _plateau_losses():
    rng = np.random.default_rng(7)
    down = 2.0 / (1 + np.arange(12.0))
    flat = 0.2 + 0.01 * rng.standard_normal(30)
    creep = 0.15 * (1 - 1e-5) ** np.arange(10)  # improvements smaller than rtol: a plateau
    again = 0.15 - 0.01 * np.arange(8) + 0.02 * rng.standard_normal(8)
    return np.concatenate([down, flat, creep, [np.nan, 0.1, np.inf], again, flat[::-1]])


@pytest.mark.parametrize("kw", [
    {}, dict(factor=0.5, patience=2), dict(factor=0.5, patience=3, cooldown=2, min_scale=0.05),
    dict(factor=0.3, patience=1, rtol=0.0, atol=0.01, accumulation_size=3),
    dict(factor=0.9, patience=2, rtol=0.05, cooldown=1, accumulation_size=2, min_scale=2.0),
])
def test_reduce_on_plateau_follows_optax_state_machine(kw):
    import jax
    import optax
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    tx = optax.contrib.reduce_on_plateau(**kw)
    upd = jax.jit(lambda st, v: tx.update(jnp.ones(1), st, value=v)[1])
    st = tx.init(jnp.zeros(1, jnp.float64))
    ours = no.ReduceOnPlateau(**kw)
    for k, loss in enumerate(_plateau_losses()):
        st = upd(st, jnp.float64(loss))
        scale = ours.update(loss)
        got = ours.state_dict()
        want = {f: getattr(st, f).item() for f in got}
        assert scale == got["scale"] and got == pytest.approx(want, rel=0, abs=0, nan_ok=True), (k, got, want)


def test_reduce_on_plateau_scales_adam_as_optax_chain():
    """A training loop: the same losses (computed at numbaopt's parameters) fed to both; the scale sequences
    are equal, the parameters equal to rounding (lr * scale in numbaopt, scale * update in optax)."""
    import jax
    import optax
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    kw = dict(factor=0.5, patience=3, cooldown=1, rtol=1e-3)
    rng = np.random.default_rng(11)
    a = rng.uniform(0.5, 2.0, 8)
    x0 = rng.standard_normal(8)
    noise = 0.05 * rng.standard_normal(80)
    tx = optax.chain(optax.adam(0.2), optax.contrib.reduce_on_plateau(**kw))
    step = jax.jit(lambda g, ost, p, v: tx.update(g, ost, p, value=v))  # eager lax.cond steps are slow
    p = jnp.asarray(x0)
    ost = tx.init(p)
    x = x0.copy()
    state = no.setup(no.Adam(lr=0.2), x)
    plateau = no.ReduceOnPlateau(**kw)
    calls = []
    import numbaopt.plateau as mod
    real = mod.adjust_
    mod_adjust = lambda s, **h: (calls.append(h), real(s, **h))[1]
    mod.adjust_ = mod_adjust
    try:
        scales, theirs = [], []
        for k in range(80):
            loss = float(np.sum(a * x ** 2) * (1 + noise[k]))
            g = 2 * a * x * (1 + noise[k])
            state = plateau.adjust_(state, loss, lr=0.2)
            state, x = no.update_(state, x, g)
            u, ost = step(jnp.asarray(g), ost, p, jnp.float64(loss))
            p = optax.apply_updates(p, u)
            scales.append(plateau.scale)
            theirs.append(float(ost[1].scale))
            np.testing.assert_allclose(x, np.asarray(p), rtol=1e-12, atol=1e-13)
    finally:
        mod.adjust_ = real
    assert scales == theirs and len(set(scales)) >= 3  # reduced at least twice
    assert len(calls) == len(set(scales))  # adjusted once at the start, then only when the scale changed
    assert state.rule.value_at("lr", state.t) == 0.2 * scales[-1]


def test_reduce_on_plateau_matches_torch_with_patience_plus_one():
    import torch
    losses = _plateau_losses()
    losses = losses[np.isfinite(losses)]
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.5)
    sch = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=2, threshold=1e-4, cooldown=1,
                                                     min_lr=0.5 * 0.01, eps=0.0)
    ours = no.ReduceOnPlateau(factor=0.5, patience=3, cooldown=1, min_scale=0.01)
    for loss in losses:
        sch.step(float(loss))
        assert 0.5 * ours.update(loss) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-15)


def test_reduce_on_plateau_checks_and_state():
    with pytest.raises(ValueError, match="factor"):
        no.ReduceOnPlateau(factor=1.0)
    with pytest.raises(ValueError, match="patience=0"):
        no.ReduceOnPlateau(patience=0)
    with pytest.raises(ValueError, match="both 0"):
        no.ReduceOnPlateau(rtol=0.0)
    with pytest.raises(ValueError, match="rtol"):
        no.ReduceOnPlateau(rtol=1.5)
    with pytest.raises(ValueError, match="accumulation_size"):
        no.ReduceOnPlateau(accumulation_size=0)
    with pytest.raises(TypeError, match="loss"):
        no.ReduceOnPlateau().update(np.ones(2))
    r = no.ReduceOnPlateau(factor=0.5, patience=1)
    assert eval(repr(r), {"ReduceOnPlateau": no.ReduceOnPlateau}).__dict__.keys() == r.__dict__.keys()
    for loss in (1.0, 2.0, 3.0):
        r.update(loss)
    assert r.scale == 0.25
    sd = r.state_dict()
    r2 = no.ReduceOnPlateau(factor=0.5, patience=1)
    r2.load_state_dict(sd)
    assert r2.state_dict() == sd and r2.update(4.0) == r.update(4.0) == 0.125
    r.reset()
    assert r.scale == 1.0 and r.best_value == math.inf
    with pytest.raises(ValueError, match="missing"):
        r.load_state_dict({"scale": 1.0})
    x = np.ones(2)
    st = no.setup(no.Adam(), x)
    with pytest.raises(ValueError, match="lr"):
        r.adjust_(st, 1.0, lr=float("nan"))


# ---- AdEMAMix's warmups (Pagliardini et al. 2024), written from the paper's appendix and the authors' code -----------
def _paper_alpha(t, alpha, T, start=0.0):
    if t < T:
        return (1 - t / T) * start + (t / T) * alpha
    return alpha


def _paper_beta3(t, beta3, T, start):
    def half_life(b):  # steps until a weight decays to 1/2, minus one (eps as the authors' code)
        return math.log(0.5) / math.log(b + 1e-8) - 1

    if t < T:
        f = (1 - t / T) * half_life(start) + (t / T) * half_life(beta3)
        return math.pow(0.5, 1 / (f + 1))
    return beta3


@pytest.mark.parametrize("T", [1, 7, 1000])
def test_ademamix_warmups_follow_the_paper(T):
    ts = np.arange(1, 3 * T + 3)
    a, b = no.ademamix_alpha(5.0, T, start=1.0), no.ademamix_beta3(0.9999, T, start=0.9)
    np.testing.assert_allclose(a.values(ts), [_paper_alpha(t, 5.0, T, 1.0) for t in ts], rtol=1e-15, atol=0)
    np.testing.assert_allclose(b.values(ts), [_paper_beta3(t, 0.9999, T, 0.9) for t in ts], rtol=1e-15, atol=0)
    assert a(T) == 5.0 and b(T) == 0.9999 and (T == 1 or b(1) < b(2) <= 0.9999)  # reached at t = T, rising before
    assert eval("no." + repr(b)) == b and eval("no." + repr(a)) == a


def test_ademamix_warmups_reject_bad_values():
    with pytest.raises(ValueError, match="must be < 1"):
        no.ademamix_beta3(1.0, 10)
    with pytest.raises(ValueError, match="warmup"):
        no.ademamix_alpha(5.0, 0)
    with pytest.raises(ValueError, match="alpha"):
        no.ademamix_alpha(-1.0, 10)


def test_ademamix_driven_by_its_warmups_equals_the_same_rule_driven_by_functions_of_the_count():
    """The schedules reach the kernel as any hyperparameter does; a function receives the count t - 1."""
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal(9)
    grads = [rng.standard_normal(9) for _ in range(30)]
    runs = []
    for alpha, beta3 in ((no.ademamix_alpha(5.0, 20), no.ademamix_beta3(0.999, 20)),
                         (lambda c: _paper_alpha(c + 1, 5.0, 20), lambda c: _paper_beta3(c + 1, 0.999, 20, 0.9))):
        x, s = x0.copy(), no.setup(no.AdEMAMix(0.01, beta3=beta3, alpha=alpha), x0)
        for g in grads:
            s, x = no.update_(s, x, g)
        runs.append(x)
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-14, atol=1e-15)
    assert np.abs(runs[0] - x0).max() > 1e-3
