"""Benchmarks of the catalogue: one in-place step of each rule family on one float32 array, Adam beside them.

Adam is the yardstick (``bench_core.AdamInplace`` holds it against a hand-written kernel): an elementwise rule
with two state arrays costs about what Adam costs at memory-bound sizes; a rule with a per-array reduction
(``ClipByBlockRMS``, ``NormalizeByUpdateNorm``, ``ClipNorm`` with a general ``p``) reads the gradient once more,
in the dry pass, before the fused pass. The rules of 2024 (ADOPT, AdEMAMix) sit here beside their elders, and the
learning-rate-free ones (DAdaptAdamW, Prodigy: a dry pass over the gradient and two states, then the fused pass).
"""
import numpy as np

import numbaopt as no

F32 = np.float32
SIZES = [4096, 1 << 20]

RULES = {
    "Adam": lambda: no.Adam(1e-3),
    "ADOPT": lambda: no.ADOPT(1e-3),
    "AdEMAMix": lambda: no.AdEMAMix(1e-3),
    "Lion": lambda: no.Lion(1e-4),
    "EMA+Descent": lambda: no.chain(no.EMA(0.9), no.Descent(1e-3)),
    "ZeroNaNs+Adam": lambda: no.chain(no.ZeroNaNs(), no.Adam(1e-3)),
    "ClipByBlockRMS+Adam": lambda: no.chain(no.ClipByBlockRMS(1.0), no.Adam(1e-3)),
    "NormalizeByUpdateNorm+Descent": lambda: no.chain(no.NormalizeByUpdateNorm(), no.Descent(1e-3)),
    "ClipNorm(p=3)+Adam": lambda: no.chain(no.ClipNorm(1.0, p=3), no.Adam(1e-3)),
    "DAdaptAdamW": lambda: no.DAdaptAdamW(),
    "Prodigy": lambda: no.Prodigy(),
}

_case = {}


def _build(rule, n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(F32)
    g = rng.standard_normal(n).astype(F32)
    state = no.setup(RULES[rule](), x)
    no.update_(state, x, g)  # compiled (or loaded from the cache) outside the timing
    return dict(x=x, g=g, state=state)


class RuleStep:
    """``update_(state, x, g)`` of each rule on one float32 array (the case is built once per process: asv
    re-runs ``setup`` before every sample, which times a single call)."""

    params = (list(RULES), SIZES)
    param_names = ["rule", "n"]
    repeat = (20, 300, 3.0)
    timeout = 180

    def setup(self, rule, n):
        key = (rule, n)
        if key not in _case:
            _case.clear()
            _case[key] = _build(rule, n)
        self.c = _case[key]

    def time_update_(self, rule, n):
        c = self.c
        no.update_(c["state"], c["x"], c["g"])


AXIS_RULES = {
    "Adam": lambda: no.Adam(1e-3),
    "Adafactor": lambda: no.Adafactor(lr=1e-3),
    "Adafactor(torch)": lambda: no.Adafactor(lr=1e-2, convention="torch"),
    "Centralize+Adam": lambda: no.chain(no.Centralize(), no.Adam(1e-3)),
    "AdaptiveGradClip+Adam": lambda: no.chain(no.AdaptiveGradClip(0.01), no.Adam(1e-3)),
    "Muon": lambda: no.Muon(0.02),
}


class AxisRuleStep:
    """``update_`` of the axis reductions (per row / column statistics) on one float32 1024x1024 matrix, Adam
    beside them; ``peakmem`` of Adafactor's setup (O(rows + cols) state) against Adam's."""

    params = (list(AXIS_RULES),)
    param_names = ["rule"]
    repeat = (10, 100, 3.0)
    timeout = 180

    def setup(self, rule):
        key = ("axis", rule)
        if key not in _case:
            _case.clear()
            rng = np.random.default_rng(0)
            x = rng.standard_normal((1024, 1024)).astype(F32)
            g = rng.standard_normal((1024, 1024)).astype(F32)
            state = no.setup(AXIS_RULES[rule](), x)
            no.update_(state, x, g)
            _case[key] = dict(x=x, g=g, state=state)
        self.c = _case[key]

    def time_update_(self, rule):
        c = self.c
        no.update_(c["state"], c["x"], c["g"])

    def track_state_bytes(self, rule):
        return sum(a.nbytes for a in self.c["state"].state.values())
    track_state_bytes.unit = "bytes"
