"""Hyperparameters: functions driving them (the step-count convention, against optax and torch), their
validation, save/adjust with them, the torch/optax spellings of keywords, and the constructors' signatures."""
import inspect
import math
import pydoc

import jax
import numpy as np
import optax
import pytest
import torch
from numba import njit

import numbaopt as no
from numbaopt.rules import BUILTIN

jax.config.update("jax_enable_x64", True)  # optax in float64: its schedules then divide in float64
jnp = jax.numpy

STEPS = 12


def grads(n=5, steps=STEPS, seed=3):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n) for _ in range(steps)]


def run(rule, x0, gs):
    x = np.array(x0, dtype=np.float64)
    s = no.setup(rule, x)
    xs = []
    for g in gs:
        s, x = no.update_(s, x, g)
        xs.append(x.copy())
    return s, xs


def run_optax(tx, x0, gs):
    x = jnp.asarray(x0, dtype=jnp.float64)
    st = tx.init(x)
    xs = []
    for g in gs:
        u, st = tx.update(jnp.asarray(g), st, x)
        x = optax.apply_updates(x, u)
        xs.append(np.asarray(x))
    return xs


# -- functions as schedules: the count convention ------------------------------------------------------
def test_a_function_receives_the_count_of_steps_taken():
    seen = []

    def lr(c):
        seen.append(c)
        return 1e-2 * 0.9 ** c

    x0, gs = np.linspace(-1, 1, 5), grads()
    s, xs = run(no.Adam(lr=lr), x0, gs)
    # once at construction and once at setup (count 0, validated), then once per step: 0, 1, 2, ...
    assert seen[:2] == [0, 0] and seen[2:] == list(range(STEPS)) and all(type(c) is int for c in seen)
    # the reference: the same lr set by hand before each step
    y, st = x0.copy(), no.setup(no.Adam(), x0.copy())
    for c, g in enumerate(gs):
        st = no.adjust(st, lr=1e-2 * 0.9 ** c)
        st, y = no.update(st, y, g)
    assert y.tobytes() == xs[-1].tobytes()
    assert no.Adam(lr=lr).value_at("lr", 1) == 1e-2 and no.Adam(lr=lr).value_at("lr", 3) == 1e-2 * 0.9 ** 2


def test_a_function_never_recompiles_and_leaves_the_unscheduled_path_alone():
    x0, gs = np.linspace(-1, 1, 5), grads()
    s = no.setup(no.Adam(lr=lambda c: 0.1 / (1 + c)), x0.copy())
    assert s.scheduled and not no.setup(no.Adam(0.1), x0.copy()).scheduled
    kern, x = s.kernels(), x0.copy()
    for g in gs:
        s, x = no.update_(s, x, g)
    assert len(kern.inplace.signatures) == 1
    assert no.setup(no.Adam(0.1), x0.copy()).kernels() is kern  # same options: the same generated module
    assert no.Adam(0.1).value_at("lr", 10 ** 9) == 0.1  # a constant is returned as stored, for any t


@pytest.mark.parametrize("make", [
    lambda: optax.cosine_decay_schedule(0.1, 7, alpha=0.1),
    lambda: optax.warmup_cosine_decay_schedule(0.0, 0.2, 3, 10, end_value=0.01),
    lambda: optax.piecewise_constant_schedule(0.1, {4: 0.5, 8: 0.1}),
    lambda: optax.exponential_decay(0.1, 3, 0.5, staircase=True),
], ids=["cosine", "warmup_cosine", "piecewise_constant", "exponential_staircase"])
def test_an_optax_schedule_takes_the_steps_of_optax_adam(make):
    sched = make()
    x0, gs = np.linspace(-1, 1, 5), grads()
    _, xs = run(no.Adam(lr=sched), x0, gs)
    # optax counts in int32, and some of its schedules then compute in float32 even under x64 (linear and
    # exponential parts): feed it its own count as a float64 for a float64 comparison. numbaopt passes a
    # Python int, which JAX computes with in float64 here.
    ref = run_optax(optax.adam(lambda count: sched(jnp.asarray(count, jnp.float64))), x0, gs)
    for a, b in zip(xs, ref):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    # and a numbaopt schedule shifted by one step would not: the convention is what makes them agree
    _, off = run(no.Adam(lr=lambda c: sched(c + 1)), x0, gs)
    assert not np.allclose(off[-1], ref[-1], rtol=1e-9)


def test_the_value_returned_is_used_as_it_is():
    # fed optax's own int32 count, optax computes in float32: that float32 value is what the step uses
    sched = optax.exponential_decay(0.1, 3, 0.7)
    v = no.Adam(lr=lambda c: sched(jnp.asarray(c, jnp.int32))).value_at("lr", 5)
    assert v == float(sched(jnp.asarray(4, jnp.int32))) and v == float(np.float32(0.1 * 0.7 ** (4 / 3)))
    assert isinstance(v, float)


def test_a_function_matches_torch_lambda_lr():
    x0, gs = np.linspace(-1, 1, 5), grads()
    p = torch.tensor(x0.copy(), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([p], lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.8 ** e)
    ref = []
    for g in gs:
        p.grad = torch.tensor(g)
        opt.step()
        sched.step()
        ref.append(p.detach().numpy().copy())
    _, xs = run(no.Adam(lr=lambda c: 0.05 * 0.8 ** c), x0, gs)
    for a, b in zip(xs, ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_minimize_schedule_and_a_rule_function_are_the_same_convention():
    @njit(cache=True)
    def fg(x, g):
        s = 0.0
        for i in range(x.shape[0]):
            g[i] = 2.0 * (x[i] - 1.0)
            s += (x[i] - 1.0) ** 2
        return s

    f = lambda c: 0.2 / (1 + c)
    a = no.minimize(fg, np.zeros(4), no.Adam(lr=f), maxiter=15, gtol=None)
    b = no.minimize(fg, np.zeros(4), no.Adam(), maxiter=15, gtol=None, schedule=f)
    x, g, s = np.zeros(4), np.empty(4), no.setup(no.Adam(lr=f), np.zeros(4))
    for _ in range(15):
        fg(x, g)
        s, x = no.update_(s, x, g)
    assert a.x.tobytes() == b.x.tobytes() == x.tobytes()


# -- validation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("f,err,match", [
    (lambda c: float("nan"), ValueError, "lr is NaN"),
    (lambda c: math.inf, ValueError, "not finite"),
    (lambda c: 1e-3 + 0j, TypeError, "complex"),
    (lambda c: np.ones(2), TypeError, "array of shape \\(2,\\)"),
    (lambda c: True, TypeError, "True"),
    (lambda c: "0.1", TypeError, "str"),
    (lambda c: -1e-3, ValueError, "outside \\[0.0, inf\\)"),
    (lambda c: 1 / 0, ValueError, "ZeroDivisionError"),
])
def test_bad_values_name_the_rule_the_hyperparameter_and_the_step(f, err, match):
    with pytest.raises(err, match=match) as e:
        no.Adam(lr=f)
    assert "Adam" in str(e.value) and "lr" in str(e.value) and "step 1, called with count 0" in str(e.value)


def test_a_bad_value_later_raises_before_anything_is_written():
    x = np.ones(3)
    s = no.setup(no.chain(no.WeightDecay(1e-3), no.Adam(lr=lambda c: 0.1 - 0.05 * c)), x)
    for _ in range(3):  # counts 0, 1, 2: lr 0.1, 0.05, 0.0
        s, x = no.update_(s, x, np.ones(3))
    before, m = x.copy(), s.state["m"].copy()
    with pytest.raises(ValueError, match=r"Adam: hyperparameter lr=-0.05.* at step 4, called with count 3"):
        no.update_(s, x, np.ones(3))
    assert x.tobytes() == before.tobytes() and s.t == 3 and s.state["m"].tobytes() == m.tobytes()

    def boom(c):
        if c == 1:
            raise RuntimeError("no data for this step")
        return 0.1

    s = no.setup(no.Adam(lr=boom), {"w": np.ones(2)})
    s, m = no.update_(s, {"w": np.ones(2)}, {"w": np.ones(2)})
    with pytest.raises(ValueError, match="hyperparameter lr: the function .*boom at step 2.* raised RuntimeError"):
        no.update_(s, m, {"w": np.ones(2)})
    leaf, x = no.setup(no.Adam(lr=boom), np.ones(2)), np.ones(2)
    leaf, x = no.update_(leaf, x, np.ones(2))
    with pytest.raises(ValueError, match="raised RuntimeError: no data") as e:
        no.update_(leaf, x, np.ones(2))
    assert isinstance(e.value.__cause__, RuntimeError) and leaf.t == 1  # the user's traceback is kept


def test_jax_and_torch_scalars_are_values():
    sched = optax.linear_schedule(0.1, 0.0, 10)
    r = no.Adam(lr=sched, beta1=lambda c: torch.tensor(0.8, dtype=torch.float64))
    assert r.value_at("lr", 6) == pytest.approx(0.05) and r.value_at("beta1", 2) == 0.8
    with pytest.raises(TypeError, match="beta1: returned an array of shape \\(2,\\)"):
        no.Adam(beta1=lambda c: jnp.ones(2))


# -- adjust and save ----------------------------------------------------------------------------------
def test_adjust_to_a_function_continues_the_count():
    x0, gs = np.linspace(-1, 1, 5), grads()
    f = lambda c: 0.01 * (c + 1)
    s, x = no.setup(no.Adam(0.01), x0.copy()), x0.copy()
    for g in gs[:4]:
        s, x = no.update_(s, x, g)
    s2 = no.adjust(s, lr=f)
    no.adjust_(s, lr=f)
    assert s.rule.lr is f and s2.rule.lr is f and s.scheduled
    y = x.copy()
    s, x = no.update_(s, x, gs[4])
    ref = no.adjust(s2, lr=f(4))  # the fifth step: count 4
    ref, y = no.update_(ref, y, gs[4])
    assert x.tobytes() == y.tobytes()
    with pytest.raises(ValueError, match="lr=-0.01 is outside"):  # checked before anything changes
        no.adjust_(s, lr=lambda c: -0.01)
    assert s.rule.lr is f


def test_save_refuses_a_function_and_names_it(tmp_path):
    m = {"w": np.ones(2)}
    s = no.setup(no.chain(no.WeightDecay(1e-4), no.Adam(lr=lambda c: 0.1)), m)
    with pytest.raises(ValueError, match="save: Adam: hyperparameter lr is driven by the function .*<lambda>"):
        no.save(tmp_path / "s.npz", s)
    assert not list(tmp_path.iterdir())
    leaf = no.setup(no.Adam(beta2=optax.constant_schedule(0.99)), np.ones(2))
    with pytest.raises(ValueError, match="hyperparameter beta2 is driven by the function"):
        no.save(tmp_path / "l.npz", leaf)
    no.save(tmp_path / "ok.npz", no.adjust(s, lr=no.cosine(0.1, 10)))  # a numbaopt schedule is saved by value
    no.save(tmp_path / "ok_leaf.npz", no.adjust(leaf, beta2=no.constant(0.99)))
    assert no.load(tmp_path / "ok_leaf.npz").rule == no.Adam(beta2=no.constant(0.99))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.npz", "ok_leaf.npz"]


# -- foreign spellings --------------------------------------------------------------------------------
@pytest.mark.parametrize("make,match", [
    (lambda: no.Adam(betas=(0.9, 0.99)), r"Adam has no keyword 'betas'.*torch's betas=\(b1, b2\) is beta1=0.9, "
                                         r"beta2=0.99: write Adam\(beta1=0.9, beta2=0.99\)"),
    (lambda: no.Adan(betas=(0.9, 0.9, 0.99)), r"write Adan\(beta1=0.9, beta2=0.9, beta3=0.99\)"),
    (lambda: no.Adam(weight_decay=0.01), r"chain\(WeightDecay\(0.01\), Adam\(...\)\).*AdamW\(weight_decay=0.01\)"),
    (lambda: no.Lion(weight_dcay=0.1), r"did you mean 'weight_decay'"),
    (lambda: no.Momentum(nesterov=True), r"Nesterov\(lr, momentum=mu\)"),
    (lambda: no.RMSProp(alpha=0.99), r"torch's alpha is rho: write RMSProp\(rho=0.99\)"),
    (lambda: no.RMSProp(decay=0.99), r"optax's decay is rho"),
    (lambda: no.RMSProp(centered=True), r"centered is centred: write RMSProp\(centred=True\)"),
    (lambda: no.RMSProp(eps_root=1e-8), r"eps_in_sqrt=True"),
    (lambda: no.Adam(eps_root=0.0), r"drop eps_root"),
    (lambda: no.Adam(b1=0.8), r"optax's b1 is beta1: write Adam\(beta1=0.8\)"),
    (lambda: no.Adam(learning_rate=0.1), r"optax's learning_rate is lr: write Adam\(lr=0.1\)"),
    (lambda: no.AdaDelta(lr=0.5), r"AdaDelta has no learning rate.*chain\(AdaDelta\(...\), Descent\(0.5\)\)"),
    (lambda: no.Adam(amsgrad=True), r"AMSGrad\(.*correction='torch'"),
    (lambda: no.Rprop(etas=(0.4, 1.1)), r"Rprop\(eta_minus=0.4, eta_plus=1.1\)"),
    (lambda: no.Rprop(step_sizes=(1e-5, 1.0)), r"Rprop\(step_min=1e-05, step_max=1.0\)"),
    (lambda: no.AdaGrad(initial_accumulator_value=0.1), r"AdaGrad\(initial_accumulator=0.1\)"),
    (lambda: no.AdaGrad(lr_decay=0.01), r"lr=lambda c: LR / \(1 \+ c \* 0.01\)"),
    (lambda: no.Descent(momentum=0.9), r"Momentum\(lr, momentum=0.9\)"),
    (lambda: no.Adam(foreach=True), r"torch implementation switch"),
    (lambda: no.Adam(lrr=0.1), r"Adam has no keyword 'lrr'.*did you mean 'lr'\? valid: lr, beta1, beta2, eps"),
    (lambda: no.Adam(0.1).replace(bata1=0.8), r"did you mean 'beta1'"),
    (lambda: no.Adam(0.1).replace(betas=(0.8, 0.9)), r"write Adam\(beta1=0.8, beta2=0.9\)"),
])
def test_foreign_and_misspelt_keywords_say_what_to_write(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_every_foreign_hint_applies_to_some_builtin_rule():
    from numbaopt.rules.spellings import FOREIGN
    classes = [getattr(no, n) for n in BUILTIN if isinstance(getattr(no, n), type)]
    for name, hint in FOREIGN.items():
        assert any(name not in c._hypers and name not in c._options and hint(c, 0.5) for c in classes), name


# -- signatures ---------------------------------------------------------------------------------------
def test_signatures_show_the_constructor():
    assert str(inspect.signature(no.Adam)) == "(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08)"
    assert str(inspect.signature(no.RMSProp)) == ("(lr=0.001, rho=0.9, eps=1e-08, *, centred=False, eps_in_sqrt=False, "
                                                  "bias_correction=False)")
    assert str(inspect.signature(no.ClipGlobalNorm)) == ("(max_norm=1.0, eps=0.0, *, p=2.0, error_if_nonfinite=True, "
                                                         "span=None)")  # span: tree-scope reductions only
    assert "span" not in inspect.signature(no.ClipNorm).parameters
    assert list(inspect.signature(no.AccumGrad).parameters)[:2] == ["n", "rule"]
    assert "master" in inspect.signature(no.MixedPrecision).parameters
    assert "Adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08)" in pydoc.render_doc(no.Adam, renderer=pydoc.plaintext)


def test_every_signature_binds_to_the_constructor():
    for name in BUILTIN:
        cls = getattr(no, name)
        if not isinstance(cls, type):
            continue
        sig = inspect.signature(cls)
        kw = {p.name: p.default for p in sig.parameters.values() if p.default is not inspect.Parameter.empty}
        assert cls(**kw) == cls(), name  # the defaults shown are the constructor's
        pos = [p for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        if pos and "rule" not in sig.parameters:
            assert cls(*[p.default for p in pos]) == cls(), name  # in the constructor's positional order
        for p in sig.parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name in cls._options:
                with pytest.raises(TypeError, match="positional"):
                    cls(*[q.default for q in pos], p.default)
                break

    class Mine(no.Rule):
        lr = no.rules.hyper(0.5, low=0.0)
        flip = no.rules.option(False)

        @staticmethod
        def step(g, x, lr, flip):
            return lr * g

    assert str(inspect.signature(Mine)) == "(lr=0.5, *, flip=False)"


# -- Rprop: optax's lags one step ---------------------------------------------------------------------
def test_optax_rprop_lags_one_step():
    rng = np.random.default_rng(0)
    gs = [rng.standard_normal(6) for _ in range(10)]  # fixed gradients: the updates compare directly
    x0 = np.zeros(6)
    _, xs = run(no.Rprop(0.01), x0, gs)
    d = [-(b - a) for a, b in zip([x0] + xs[:-1], xs)]  # numbaopt's step d_t (x_t = x_{t-1} - d_t)
    ys = run_optax(optax.rprop(0.01), x0, gs)
    u = [-(b - a) for a, b in zip([x0] + ys[:-1], ys)]
    np.testing.assert_array_equal(u[0], 0.0)  # nothing at the first step
    flips = 0
    for t in range(1, len(gs)):
        flip = gs[t] * d[t - 1] < 0  # optax's sign test: the gradient against its previous update
        expect = np.where(flip, 0.0, d[t - 1])
        np.testing.assert_allclose(u[t], expect, rtol=1e-14, atol=0)
        flips += int(flip.sum())
    assert flips > 0 and not np.allclose(u[1:], d[1:])  # the flips were exercised; unshifted they differ


def test_schedules_are_served_from_a_table_equal_to_their_values_and_fault_at_their_own_step():
    """A numbaopt Schedule is evaluated in blocks of steps (one vectorised call) and served one step at a
    time: every value equals ``s(t)``, across block boundaries, and a schedule that fails (or leaves its
    domain) at step k refuses step k, not the step that computed the block."""
    s = no.cosine(0.1, 1000)
    rule = no.Descent(s)
    for t in list(range(1, 600)) + [5, 3000, 2999]:  # forwards, backwards, far ahead
        assert rule.value_at("lr", t) == s(t)

    class Breaks(no.Schedule):  # a user schedule that cannot go beyond step 5
        def values(self, ts):
            ts = np.asarray(ts)
            if ts.max() > 5 and ts.min() <= 5:
                return np.where(ts <= 5, 0.1, -1.0)  # leaves lr's domain from step 6
            if ts.min() > 5:
                raise RuntimeError("no values beyond step 5")
            return np.full(ts.shape, 0.1)

    x = np.ones(3)
    state = no.setup(no.Descent(Breaks()), x)
    for _ in range(5):
        state, x = no.update_(state, x, np.ones(3))
    np.testing.assert_allclose(x, 0.5)
    with pytest.raises(ValueError, match="lr"):
        no.update_(state, x, np.ones(3))
    np.testing.assert_allclose(x, 0.5)
    assert state.t == 5
    with pytest.raises(ValueError, match="no values beyond step 5"):
        no.Descent(Breaks()).value_at("lr", 7)
