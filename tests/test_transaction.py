"""A refused step is one transaction: whatever refuses it (a gradient, a reduction, a schedule leaving its
domain, a bad leaf), in whichever group, on the fast or the general path, under whichever stage, every
parameter, state array, counter and hyperparameter stays byte for byte as it was, and the message names
the leaf or the hyperparameter. Hypothesis draws the models (dtypes, leaf kinds, rules per leaf, steps
taken before) and where the refusal is injected."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numbaopt as no
from numbaopt.tree.state import core

KINDS = ("array", "readonly", "strided", "scalar", "half")  # half: float16 under MixedPrecision
DTYPES = (np.float32, np.float64)
# a schedule that leaves Adam's lr domain [0, inf) at step 6
FALLING = no.linear(0.05, -0.05, 8)


def make_leaf(kind, dtype, size, rng):
    if kind == "scalar":
        return float(rng.standard_normal())
    if kind == "half":
        return rng.standard_normal(size).astype(np.float16)
    a = rng.standard_normal(size * 2 if kind == "strided" else size).astype(dtype)
    if kind == "strided":
        return a[::2]
    if kind == "readonly":
        a.flags.writeable = False
    return a


def grad_like(x, rng):
    if isinstance(x, float):
        return float(rng.standard_normal())
    return rng.standard_normal(x.shape).astype(x.dtype)


def chooser(rules):
    def choose(path, x):
        k = int(path[-1].key)
        r = rules[k % len(rules)]
        if getattr(x, "dtype", None) == np.float16:
            return no.chain(no.MixedPrecision(np.float32), r)
        return r
    return choose


RULES = {
    "clip": no.chain(no.ClipNorm(1.0), no.Adam(0.05)),  # refuses a non-finite norm (per leaf)
    "global": no.chain(no.ClipGlobalNorm(1.0), no.Momentum(0.05)),  # refuses over the whole tree
    "accum": no.chain(no.AccumGrad(2), no.ClipNorm(1.0), no.Adam(0.05)),
    "skip": no.SkipNonFinite(no.Adam(0.05)),
    "sched": no.chain(no.ClipNorm(1.0), no.Adam(FALLING)),
    "plain": no.Descent(0.1),
}


def snapshot(state, model):
    c = core(state)
    parts = [np.asarray(x).tobytes() for x in model["p"]]
    for g in c.groups:
        parts += [a.tobytes() for a in g.arenas] + [g.C.tobytes(), g.hp.tobytes()]
        parts += [b"-" if m is None else m.tobytes() for m in g.masters]
        parts.append(repr(g.rule).encode())
    parts.append(c.frozen.tobytes())
    return parts


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 5))
    kinds = [draw(st.sampled_from(KINDS)) for _ in range(n)]
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(n)]
    names = draw(st.lists(st.sampled_from(sorted(RULES)), min_size=1, max_size=3))
    before = draw(st.integers(0, 4))  # with the fast path's extra step at most 5: the schedule refuses at 6
    fast = draw(st.booleans())
    frozen = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    where = draw(st.integers(0, n - 1))
    how = draw(st.sampled_from(("inf", "nan", "shape", "dtype", "schedule", "model")))
    seed = draw(st.integers(0, 2**16))
    return n, kinds, dtypes, names, before, fast, frozen, where, how, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_a_refused_step_changes_nothing(sc):
    n, kinds, dtypes, names, before, fast, frozen, where, how, seed = sc
    rng = np.random.default_rng(seed)
    model = {"p": [make_leaf(k, d, 4 + i, rng) for i, (k, d) in enumerate(zip(kinds, dtypes))]}
    rules = [RULES[k] for k in names]
    state = no.setup(chooser(rules), model)
    if frozen is not None:
        no.freeze_(state["p"][frozen])
    for _ in range(before):  # earlier steps: moments, counters, AccumGrad mid-cycle, a fast plan
        state, model = no.update_(state, model, {"p": [grad_like(x, rng) for x in model["p"]]})
    if fast and before:
        state, model = no.update_(state, model, {"p": [grad_like(x, rng) for x in model["p"]]})
    grads = {"p": [grad_like(x, rng) for x in model["p"]]}
    g = grads["p"][where]
    if how in ("inf", "nan"):
        if isinstance(g, float):
            grads["p"][where] = float(how)
        else:
            g = g.copy()
            g.reshape(-1)[0] = np.inf if how == "inf" else np.nan
            grads["p"][where] = g
    elif how == "shape":
        grads["p"][where] = np.ones(17)
    elif how == "dtype":
        grads["p"][where] = np.ones(np.shape(g), np.int64)
    elif how == "model":
        model = {"p": list(model["p"])}
        model["p"][where] = np.ones(23)
    snap = snapshot(state, model)
    t_before = [leaf.t for _, leaf in state.leaves()]
    try:
        state2, model2 = no.update_(state, model, grads)
    except (ValueError, TypeError) as e:
        assert snapshot(state, model) == snap, f"a refused step changed something: {e}"
        msg = str(e)
        assert "grads['p']" in msg or "model['p']" in msg or "hyperparameter" in msg, msg
        return
    # not refused: the bad gradient belongs to a frozen leaf, or its rule does not refuse it (a skip, a plain
    # rule, an AccumGrad cycle still accumulating), or no schedule left its domain
    refusing = names[where % len(names)] in ("clip", "global", "sched")
    assert how == "schedule" or frozen == where or (how in ("inf", "nan") and not refusing), (how, names)
    assert state2 is state and len(t_before) == len(state.leaves()) and model2 is not None


@pytest.mark.parametrize("fast", [False, True])
def test_schedule_leaving_its_domain_in_a_later_group_changes_nothing(fast):
    """Two groups (float32, float64); the float64 group's schedule leaves its domain at step 6: at that step
    nothing is written in either group, and the message names the leaf and the hyperparameter."""
    model = {"a": np.ones(5, np.float32), "b": np.ones(3)}
    rule = lambda path, x: no.Adam(0.05) if x.dtype == np.float32 else no.Adam(FALLING)
    state = no.setup(rule, model)
    grads = {"a": np.ones(5, np.float32), "b": np.ones(3)}
    for _ in range(5):
        state, model = no.update_(state, model, grads)
    if not fast:
        core(state).fast = None
    snap = [model["a"].tobytes(), model["b"].tobytes()] + [a.tobytes() for g in core(state).groups
                                                         for a in (*g.arenas, g.C, g.hp)]
    with pytest.raises(ValueError, match=r"state\['b'\].*lr.*step 6"):
        no.update_(state, model, grads)
    assert snap == [model["a"].tobytes(), model["b"].tobytes()] + [a.tobytes() for g in core(state).groups
                                                                 for a in (*g.arenas, g.C, g.hp)]
    with pytest.raises(ValueError, match=r"lr.*step 6"):  # pure: the same refusal
        no.update(state, model, grads)


def test_two_refusing_groups_the_later_one_refuses():
    """The issue's case: {a: float32, b: float64} under chain(ClipNorm, Adam); the second step's b holds an
    inf. a must not move and its step count must stay at 1."""
    model = {"a": np.ones(3, np.float32), "b": np.ones(3)}
    state = no.setup(no.chain(no.ClipNorm(1.0), no.Adam()), model)
    state, model = no.update_(state, model, {"a": np.ones(3, np.float32), "b": np.ones(3)})
    a0 = model["a"].copy()
    with pytest.raises(ValueError, match=r"grads\['b'\]: ClipNorm"):
        no.update_(state, model, {"a": np.ones(3, np.float32), "b": np.array([1, np.inf, 1])})
    assert model["a"].tobytes() == a0.tobytes() and state["a"].t == 1 and state["b"].t == 1


def test_adjust_is_one_transaction():
    """adjust_ on several groups: when one change is refused (a value out of its domain, a schedule out of
    its domain at the current step), no group changes."""
    model = {"a": np.ones(3, np.float32), "b": np.ones(3), "h": np.ones(2, np.float16)}
    rule = lambda path, x: (no.MixedPrecision(np.float32, no.Adam(0.1)) if x.dtype == np.float16
                            else no.chain(no.AccumGrad(2), no.Adam(0.1)))
    state = no.setup(rule, model)
    for _ in range(9):
        state, model = no.update_(state, model, {"a": np.ones(3, np.float32), "b": np.ones(3),
                                                 "h": np.ones(2, np.float16)})
    before = repr(state), [g.hp.tobytes() for g in core(state).groups]
    with pytest.raises(ValueError, match="lr"):
        no.adjust_(state, lr=-1.0)
    with pytest.raises(ValueError, match=r"lr.*step"):
        no.adjust_(state, lr=no.linear(0.1, -0.1, 4))  # fine at step 1, out of [0, inf) at the current step
    with pytest.raises(ValueError, match="integer"):
        no.adjust_(state, lr=0.5, n=2.5)  # n belongs to the AccumGrad groups only
    assert (repr(state), [g.hp.tobytes() for g in core(state).groups]) == before
    no.adjust_(state, lr=0.5)
    assert all(leaf.rule.rules[-1].lr == 0.5 for _, leaf in state.leaves())


@pytest.mark.parametrize("how", ["inf", "schedule", "shape"])
@pytest.mark.parametrize("kind", ["array", "readonly", "strided", "half"])
def test_one_array_refusals_change_nothing(how, kind):
    rng = np.random.default_rng(3)
    x = make_leaf(kind, np.float32, 6, rng)
    rule = no.chain(no.ClipNorm(1.0), no.Adam(FALLING if how == "schedule" else 0.05))
    if kind == "half":
        rule = no.chain(no.MixedPrecision(np.float32), rule)
    s = no.setup(rule, x)
    for _ in range(5):
        s, x = no.update_(s, x, grad_like(x, rng))
    g = grad_like(x, rng)
    if how == "inf":
        g[1] = np.inf
    elif how == "shape":
        g = np.ones(7, g.dtype)
    snap = [x.tobytes(), s.counters.tobytes(), s.hp.tobytes()] + [a.tobytes() for a in s.arrays] + \
        [b"" if s.master is None else s.master.tobytes()]
    for upd in (no.update_, no.update):
        with pytest.raises(ValueError):
            upd(s, x, g)
        assert snap == [x.tobytes(), s.counters.tobytes(), s.hp.tobytes()] + [a.tobytes() for a in s.arrays] + \
            [b"" if s.master is None else s.master.tobytes()]
