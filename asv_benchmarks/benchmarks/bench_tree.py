"""Benchmarks of the tree engine: one ``update_`` of Adam (float32) on many leaves vs one flat array.

``TreeAdam`` is parametrised by the model (10/100/1000 leaves of 1000 elements as a list, 1000 leaves
as a dict of small dataclasses, the 62 ResNet-18 shapes with 11.7M parameters) and by the layout:
``tree`` updates the nested model, ``flat`` one array of the same total size, so one ``asv run`` shows
both side by side. ``benchmarks/tree_compare.py`` prints the same comparison as one interleaved table
with ratios. ``TreeOverhead`` times ``update_`` on a tree with a single 16-element leaf (Python cost).
"""
import dataclasses

import numpy as np

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
