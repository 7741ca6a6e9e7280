"""Benchmarks of the tree engine: one ``update_`` of Adam (float32) on many leaves vs one flat array.

``TreeAdam`` is parametrised by the model (10/100/1000 leaves of 1000 elements as a list, 1000 leaves
as a dict of small dataclasses, the 62 ResNet-18 shapes with 11.7M parameters) and by the layout:
``tree`` updates the nested model, ``flat`` one array of the same total size, so one ``asv run`` shows
both side by side. ``benchmarks/tree_compare.py`` prints the same comparison as one interleaved table
with ratios. ``TreeOverhead`` times ``update_`` on a tree with a single 16-element leaf (Python cost).
``TreePure`` times the pure ``update`` next to a hand-written out-of-place step into fresh arrays.
"""
import dataclasses
import math

import numpy as np
from numba import njit

import numbaopt as no


def resnet18_shapes():
    """The 62 parameter shapes of torchvision's ResNet-18 (11,689,512 parameters)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            c_in = cin if block == 0 else cout
            shapes += [(cout, c_in, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
            if block == 0 and (stride != 1 or c_in != cout):
                shapes += [(cout, c_in, 1, 1), (cout,), (cout,)]
        cin = cout
    return shapes + [(1000, 512), (1000,)]


@dataclasses.dataclass
class Param:
    w: np.ndarray


MODELS = {
    "10x1000": [(1000,)] * 10,
    "100x1000": [(1000,)] * 100,
    "1000x1000": [(1000,)] * 1000,
    "1000x1000-dict": [(1000,)] * 1000,
    "resnet18": resnet18_shapes(),
}


class TreeAdam:
    params = (list(MODELS), ["tree", "flat"])
    param_names = ["model", "layout"]
    timeout = 300

    def setup(self, model, layout):
        rng = np.random.default_rng(0)
        shapes = MODELS[model]
        xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        gs = [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes]
        if layout == "flat":
            self.x = np.concatenate([x.ravel() for x in xs])
            self.g = np.concatenate([g.ravel() for g in gs])
        elif model.endswith("-dict"):
            self.x = {f"p{i}": Param(x) for i, x in enumerate(xs)}
            self.g = {f"p{i}": Param(g) for i, g in enumerate(gs)}
        else:
            self.x, self.g = xs, gs
        self.state = no.setup(no.Adam(), self.x)
        no.update_(self.state, self.x, self.g)  # compile/load kernels and build the fast plan
        no.update_(self.state, self.x, self.g)

    def time_update_(self, model, layout):
        no.update_(self.state, self.x, self.g)


class TreeOverhead:
    def setup(self):
        self.x = {"w": np.ones(16, np.float32)}
        self.g = {"w": np.full(16, 1e-3, np.float32)}
        self.state = no.setup(no.Adam(), self.x)
        no.update_(self.state, self.x, self.g)
        no.update_(self.state, self.x, self.g)

    def time_update_one_leaf(self):
        no.update_(self.state, self.x, self.g)


class TreeSetup:
    """Building the state of the 1000-leaf tree (Python work, no compilation after the first run)."""

    def setup(self):
        self.x = [np.ones(1000, np.float32) for _ in range(1000)]

    def time_setup_1000(self):
        no.setup(no.Adam(), self.x)


# no cache=True: asv imports this file under another module name than a direct import does
@njit(error_model="numpy", nogil=True)
def _adam_outplace(x, g, m, v, xo, mo, vo, t, lr, beta1, beta2, eps):
    """The pure step's yardstick: hand-written fused out-of-place Adam into fresh arrays."""
    f = np.float32
    lr, b1, b2, eps = f(lr), f(beta1), f(beta2), f(eps)
    bc1 = -math.expm1(f(t) * math.log(b1))
    bc2 = -math.expm1(f(t) * math.log(b2))
    c1, c2 = f(1) - b1, f(1) - b2
    for i in range(x.shape[0]):
        gi = g[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * (gi * gi)
        mo[i] = mi
        vo[i] = vi
        xo[i] = x[i] - lr * (mi / bc1) / (math.sqrt(vi / bc2) + eps)


PURE_MODELS = {"1000x1000": [(1000,)] * 1000, "16M": [(1 << 24,)], "resnet18": resnet18_shapes()}


class TreePure:
    """Pure ``update`` of a list of arrays (``numbaopt``) against the hand-written out-of-place Adam writing
    into fresh ``np.empty`` arrays per leaf (``hand``): the target is numbaopt / hand <= 1.2
    (``benchmarks/pipeline.py`` prints the ratios, and the peak memory, from one interleaved run)."""

    params = (list(PURE_MODELS), ["numbaopt", "hand"])
    param_names = ["model", "impl"]
    timeout = 300

    def setup(self, model, impl):
        rng = np.random.default_rng(0)
        shapes = PURE_MODELS[model]
        self.x = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        self.g = [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes]
        self.state = no.setup(no.Adam(), self.x)
        self.m = [np.zeros(x.size, np.float32) for x in self.x]
        self.v = [np.zeros(x.size, np.float32) for x in self.x]
        self.time_update(model, impl)  # compile outside the timing

    def time_update(self, model, impl):
        if impl == "numbaopt":
            no.update(self.state, self.x, self.g)
            return
        for x, g, m, v in zip(self.x, self.g, self.m, self.v):
            x1, g1 = x.reshape(-1), g.reshape(-1)
            _adam_outplace(x1, g1, m, v, np.empty_like(x1), np.empty_like(m), np.empty_like(v), 1,
                           1e-3, 0.9, 0.999, 1e-8)
