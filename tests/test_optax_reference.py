"""Compositions against optax (the real package, float64): what a tree-scope reduction sees under AccumGrad and
MixedPrecision is what it sees in optax's composition, to 1e-12.

Each case is spelled the Optimisers.jl way (``chain(AccumGrad(n), ClipGlobalNorm(1.0), Adam())``) and run pure
and in place on a nested model with leaves of several shapes, over several accumulation cycles; gradients are
large enough that the global-norm clip is active.
"""
import jax
import numpy as np
import optax
import pytest

import numbaopt as no

jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

STEPS = 9


def model(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return {"enc": {"w": rng.standard_normal((3, 4)).astype(dtype), "b": rng.standard_normal(4).astype(dtype)},
            "dec": [rng.standard_normal(5).astype(dtype), rng.standard_normal((2, 2)).astype(dtype)]}


def gradients(dtype=np.float64, seed=1, steps=STEPS, nan_at=None):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(steps):
        g = {"enc": {"w": 3 * rng.standard_normal((3, 4)), "b": 3 * rng.standard_normal(4)},
             "dec": [3 * rng.standard_normal(5), 3 * rng.standard_normal((2, 2))]}
        if nan_at is not None and k == nan_at:
            g["dec"][0][2] = np.nan  # one leaf of one micro-batch
        out.append(jax.tree_util.tree_map(lambda a: a.astype(dtype), g))
    return out


def run_numbaopt(rule, m, gs, inplace):
    m = jax.tree_util.tree_map(np.copy, m)
    state = no.setup(rule, m)
    upd = no.update_ if inplace else no.update
    for g in gs:
        state, m = upd(state, m, g)
    return state, m


def run_optax(tx, m, gs):
    params = jax.tree_util.tree_map(jnp.asarray, m)
    st = tx.init(params)
    # jitted: one compile per transformation; run eagerly, every lax.cond of MultiSteps and apply_if_finite
    # compiles its branches again at every step (seconds a test)
    update = jax.jit(tx.update)
    for g in gs:
        updates, st = update(jax.tree_util.tree_map(jnp.asarray, g), st, params)
        params = optax.apply_updates(params, updates)
    return jax.tree_util.tree_map(np.asarray, params)


def assert_trees_close(a, b, rtol=1e-12, atol=1e-14):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def multisteps(inner, n):
    return optax.MultiSteps(inner, every_k_schedule=n, accumulator_dtype=jnp.float64)


@pytest.mark.parametrize("inplace", [True, False])
def test_global_norm_clip_under_accumgrad_is_optax_multisteps(inplace):
    rule = no.chain(no.AccumGrad(3), no.ClipGlobalNorm(1.0), no.Adam(0.05))
    assert rule == no.AccumGrad(3, no.chain(no.ClipGlobalNorm(1.0), no.Adam(0.05)))  # the shorthand
    m, gs = model(), gradients()
    _, ours = run_numbaopt(rule, m, gs, inplace)
    ref = run_optax(multisteps(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.05)), 3), m, gs)
    assert_trees_close(ours, ref)
    # the per-leaf clip of the old host-level wrapper would differ by far more than the tolerance
    per_leaf = run_optax(multisteps(optax.chain(optax.clip_by_block_rms(1e9), optax.adam(0.05)), 3), m, gs)
    assert max(np.max(np.abs(a - b)) for a, b in zip(jax.tree_util.tree_leaves(ours),
                                                       jax.tree_util.tree_leaves(per_leaf))) > 1e-6


@pytest.mark.parametrize("inplace", [True, False])
def test_global_norm_clip_on_a_master_copy_is_optax_on_float64_params(inplace):
    """float32 parameters, float64 master copies: optax's chain on float64 parameters (gradients cast to
    float64), the parameters its values rounded to float32."""
    rule = no.chain(no.MixedPrecision(np.float64), no.ClipGlobalNorm(1.0), no.Adam(0.05))
    m32, gs32 = model(np.float32), gradients(np.float32)
    state, ours = run_numbaopt(rule, m32, gs32, inplace)
    m64 = jax.tree_util.tree_map(lambda a: a.astype(np.float64), m32)
    gs64 = [jax.tree_util.tree_map(lambda a: a.astype(np.float64), g) for g in gs32]
    ref = run_optax(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.05)), m64, gs64)
    masters = {"enc": {"w": state.enc.w.master.reshape(3, 4), "b": state.enc.b.master},
               "dec": [state.dec[0].master, state.dec[1].master.reshape(2, 2)]}
    assert_trees_close(masters, ref)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b.astype(np.float32))  # the master rounded into the parameter


@pytest.mark.parametrize("inplace", [True, False])
def test_skip_non_finite_under_accumgrad_is_multisteps_of_apply_if_finite(inplace):
    """A NaN in one leaf of one micro-batch (cycle 2 of 4): that cycle's step is skipped in every leaf and its
    sum dropped. Up to the end of that cycle this is optax's MultiSteps(apply_if_finite(adam)). optax then
    keeps a NaN in its accumulator (it resets it as ``0 * acc``) and skips every later step; here the later
    cycles step as if the dropped cycle had never been: optax's MultiSteps(adam) without it."""
    rule = no.chain(no.AccumGrad(2), no.SkipNonFinite(no.Adam(0.05)))
    m, gs = model(), gradients(nan_at=2, steps=8)
    guarded = multisteps(optax.apply_if_finite(optax.adam(0.05), max_consecutive_errors=10**6), 2)
    _, ours = run_numbaopt(rule, m, gs[:4], inplace)
    assert_trees_close(ours, run_optax(guarded, m, gs[:4]))
    state, ours = run_numbaopt(rule, m, gs, inplace)
    assert_trees_close(ours, run_optax(multisteps(optax.adam(0.05), 2), m, gs[:2] + gs[4:]))
    assert all(leaf.skipped == 1 and leaf.t == 3 and leaf.count == 0 for _, leaf in state.leaves())


@pytest.mark.parametrize("inplace", [True, False])
def test_skip_non_finite_before_accumgrad_is_multisteps_skip_not_finite(inplace):
    """The guard before the accumulation skips the one bad micro-batch (optax: MultiSteps(adam,
    should_skip_update_fn=skip_not_finite)): its cycle completes with the next gradient."""
    rule = no.SkipNonFinite(no.chain(no.AccumGrad(2), no.Adam(0.05)))
    m, gs = model(), gradients(nan_at=2, steps=9)
    state, ours = run_numbaopt(rule, m, gs, inplace)
    tx = optax.MultiSteps(optax.adam(0.05), every_k_schedule=2, accumulator_dtype=jnp.float64,
                          should_skip_update_fn=optax.skip_not_finite)
    assert_trees_close(ours, run_optax(tx, m, gs))
    assert all(leaf.skipped == 1 and leaf.t == 4 for _, leaf in state.leaves())


@pytest.mark.parametrize("inplace", [True, False])
def test_lamb_under_accumgrad_is_optax_multisteps_of_lamb(inplace):
    rule = no.chain(no.AccumGrad(2), no.LAMB(1e-2, weight_decay=0.1))
    m, gs = model(), gradients(steps=8)
    _, ours = run_numbaopt(rule, m, gs, inplace)
    ref = run_optax(multisteps(optax.lamb(1e-2, weight_decay=0.1), 2), m, gs)
    assert_trees_close(ours, ref)


def test_global_norm_clip_across_dtypes_is_one_norm():
    """Leaves of two dtypes are two groups; the global norm still spans both (float64 reference)."""
    rule = no.chain(no.ClipGlobalNorm(1.0), no.Descent(0.5))
    m = {"a": np.array([3.0, 0.0], np.float32), "b": np.array([0.0, 4.0])}
    _, out = no.update(no.setup(rule, m), m, m)
    ref = run_optax(optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.5)),
                    {k: v.astype(np.float64) for k, v in m.items()}, [{k: v.astype(np.float64) for k, v in m.items()}])
    np.testing.assert_allclose(out["a"], ref["a"], rtol=1e-7)
    np.testing.assert_allclose(out["b"], ref["b"], rtol=1e-15)
