"""Parameter groups composed with every path of a tree step, against an independent NumPy reference.

Three groups (two matrices and a vector, each its own learning rate, or a schedule) under one global-norm clip
(and a non-finite guard): the cross-product of the chain's stages (none, ``AccumGrad`` before the clip,
``MixedPrecision`` master copies), pure and in place (the fast path included), and a checkpoint mid-run (none,
``save``/``load``, ``state_dict``/``load_state_dict``, pickle); every run meets a ``None`` gradient, frozen
leaves, a refused (non-finite) step and schedules per group. The reference steps Adam per leaf in float64 with
ONE norm over the leaves stepping at each call. Kernels: three chains (the groups share them: hyperparameters
are runtime values).
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import numbaopt as no
from numbaopt.tree.state import core

B1, B2, EPS, MAX_NORM = 0.9, 0.999, 1e-8, 1.0
LR = {"enc.w": no.exponential(0.05, 0.9), "enc.b": 0.02, "dec.w": 0.01}
KEYS = list(LR)
NAN_AT, NONE_AT, FROZEN = 5, 3, range(2, 4)  # the call with a NaN, a None gradient (enc.b), enc.w frozen
CALLS, CHECKPOINT_AT = 8, 4


def value(lr, t):
    return float(lr(t)) if callable(lr) else lr


def chain_of(stage, lr):
    if stage == "accum":  # the guard would skip whole cycles: AccumGrad's own tests cover that
        return no.chain(no.AccumGrad(2), no.ClipGlobalNorm(MAX_NORM), no.Adam(lr, B1, B2, EPS))
    head = (no.MixedPrecision(np.float64),) if stage == "mixed" else ()
    return no.chain(*head, no.NonFiniteGuard(), no.ClipGlobalNorm(MAX_NORM), no.Adam(lr, B1, B2, EPS))


def model(stage):
    rng = np.random.default_rng(3)
    enc_dt = np.float32 if stage == "mixed" else np.float64
    return {"enc": {"w": rng.standard_normal((4, 3)).astype(enc_dt), "b": rng.standard_normal(3).astype(enc_dt)},
            "dec": {"w": rng.standard_normal((3, 2))}}


def flat(m):
    return {"enc.w": m["enc"]["w"], "enc.b": m["enc"]["b"], "dec.w": m["dec"]["w"]}


def gradients(stage, k, m):
    rng = np.random.default_rng(100 + k)
    g = {key: 2.0 * rng.standard_normal(x.shape).astype(x.dtype) for key, x in flat(m).items()}
    if k == NONE_AT:
        g["enc.b"] = None
    if k == NAN_AT and stage != "accum":
        g["dec.w"] = g["dec.w"].copy()
        g["dec.w"][0, 0] = np.nan
    return {"enc": {"w": g["enc.w"], "b": g["enc.b"]}, "dec": {"w": g["dec.w"]}}


class Reference:
    """Adam per leaf (float64), after ONE clip over the leaves that step at this call (and a non-finite guard)."""

    def __init__(self, m, stage):
        self.stage = stage
        self.x = {k: np.asarray(v, dtype=np.float64).copy() for k, v in flat(m).items()}
        self.m = {k: np.zeros_like(v) for k, v in self.x.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.x.items()}
        self.acc = {k: np.zeros_like(v) for k, v in self.x.items()}
        self.t = dict.fromkeys(self.x, 0)
        self.cnt = dict.fromkeys(self.x, 0)
        self.skipped = dict.fromkeys(self.x, 0)

    def step(self, grads, frozen):
        g = {k: None if v is None or k in frozen else np.asarray(v, dtype=np.float64) for k, v in flat(grads).items()}
        live = [k for k in KEYS if g[k] is not None]
        if self.stage == "accum":
            for k in live:
                self.acc[k] += g[k]
                self.cnt[k] += 1
            live = [k for k in live if self.cnt[k] == 2]
            for k in live:
                g[k], self.acc[k], self.cnt[k] = self.acc[k] / 2, np.zeros_like(self.acc[k]), 0
        if self.stage != "accum" and not all(np.all(np.isfinite(g[k])) for k in live):
            for k in live:
                self.skipped[k] += 1
            return
        n = np.sqrt(sum(float(np.sum(g[k] ** 2)) for k in live))
        scale = min(MAX_NORM / n, 1.0) if n > 0 else 1.0
        for k in live:
            self.t[k] += 1
            t, d = self.t[k], g[k] * scale
            self.m[k] = B1 * self.m[k] + (1 - B1) * d
            self.v[k] = B2 * self.v[k] + (1 - B2) * d * d
            self.x[k] -= value(LR[k], t) * (self.m[k] / (1 - B1 ** t)) / (np.sqrt(self.v[k] / (1 - B2 ** t)) + EPS)


def checkpoint(how, state, m, stage, tmp_path):
    if how == "save":
        no.save(tmp_path / "s.npz", state)
        return no.load(tmp_path / "s.npz")
    if how == "state_dict":
        fresh = no.setup(chooser(stage), m)
        return no.load_state_dict(fresh, no.state_dict(state))
    if how == "pickle":
        return pickle.loads(pickle.dumps(state))
    return state


def chooser(stage):
    rules = {k: chain_of(stage, lr) for k, lr in LR.items()}
    return lambda path, x: rules[".".join(path.keys)]


@pytest.mark.parametrize("how", ["none", "save", "state_dict", "pickle"])
@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize("stage", ["plain", "accum", "mixed"])
def test_groups_under_one_clip_against_the_reference(stage, inplace, how, tmp_path):
    m = model(stage)
    ref = Reference(m, stage)
    state = no.setup(chooser(stage), m)
    assert len(core(state).groups) == 3
    fast = 0
    for k in range(CALLS):
        if k == CHECKPOINT_AT:
            state = checkpoint(how, state, m, stage, tmp_path)
        if k == FROZEN.start:
            no.freeze_(state["enc"]["w"])
        if k == FROZEN.stop:
            no.thaw_(state["enc"]["w"])
        g = gradients(stage, k, m)
        state, m = (no.update_ if inplace else no.update)(state, m, g)
        fast += core(state).fast is not None
        ref.step(g, {"enc.w"} if k in FROZEN else set())
    if inplace and stage != "mixed":  # (master copies take the general path)
        assert fast > 0  # some steps took the fast path
    rtol = 1e-12
    for key, x in flat(m).items():
        leaf = state[key.split(".")[0]][key.split(".")[1]]
        assert leaf.t == ref.t[key] and leaf.skipped == ref.skipped[key], key
        got = x if leaf.master is None else leaf.master.reshape(x.shape)
        np.testing.assert_allclose(got, ref.x[key], rtol=rtol, atol=rtol, err_msg=key)
        np.testing.assert_allclose(leaf.state["m"], ref.m[key], rtol=rtol, atol=1e-15, err_msg=key)
        if x.dtype == np.float32:
            np.testing.assert_allclose(x, ref.x[key].astype(np.float32), rtol=2e-7, err_msg=key)
