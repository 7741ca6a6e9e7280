"""A user's script, fully annotated, over numbaopt's public API: ``tests/test_typing.py`` runs mypy (strict,
``--no-implicit-reexport``) over it, and runs it, so the types mypy accepts are the ones the code returns.

Not collected by pytest (its name does not start with ``test_``). ``assert_type`` checks the exact inferred
type under mypy; the ``isinstance`` checks beside them check the same at run time.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from typing import Any

import numpy as np
from numpy.typing import NDArray

import numbaopt as no
from numbaopt import schedules

if sys.version_info >= (3, 11):
    from typing import assert_type
else:  # pragma: no cover - the test runs on 3.11+
    from typing_extensions import assert_type


@dataclasses.dataclass
class Layer:
    w: NDArray[np.float64]
    b: NDArray[np.float64]
    bn_mean: NDArray[np.float64] = no.not_trainable(default_factory=lambda: np.zeros(3))


class Pair:
    """A container of the user's own, registered."""

    def __init__(self, left: NDArray[np.float64], right: NDArray[np.float64]) -> None:
        self.left, self.right = left, right


def pair_children(p: Pair) -> list[tuple[str, NDArray[np.float64]]]:
    return [("left", p.left), ("right", p.right)]


def pair_rebuild(p: Pair, values: list[Any]) -> Pair:
    return Pair(values[0], values[1])


def quadratic(x: NDArray[np.float64], g: NDArray[np.float64]) -> float:
    g[:] = 2.0 * x
    return float(x @ x)


def loss_only(x: NDArray[np.float64]) -> float:
    return float(x @ x)


def choose(path: no.Path, leaf: Any) -> no.RuleLike | None:
    return None if path.keys[-1] == "b" else no.Descent(0.1)


def one_array() -> None:
    x = np.zeros(16, dtype=np.float32)
    g = np.ones_like(x)
    state = no.setup(no.Adam(lr=1e-3), x)
    assert_type(state, no.Leaf)
    state, x = no.update_(state, x, g)
    assert_type(x, "np.ndarray[tuple[int], np.dtype[np.float32]]")
    new_state, x2 = no.update(state, x, g)
    assert_type(new_state, no.Leaf)
    assert isinstance(new_state, no.Leaf) and x2.dtype == np.float32
    state, x = no.update_(state, x, None)  # a None gradient skips the step
    state = no.adjust(state, lr=1e-4)
    state = no.adjust_(state, lr=schedules.cosine(1e-3, 100))
    assert_type(state, no.Leaf)
    assert state.t == 1 and isinstance(state, no.State)  # the pure step and the skipped one left it at 1
    step = no.jit_step(no.chain(no.ClipGrad(1.0), no.Momentum()), x)
    assert_type(step, no.JitStep)
    assert step.hyper_index("lr") >= 0


def trees() -> None:
    model = {"enc": Layer(np.ones((4, 3)), np.zeros(3)), "scale": 1.0}
    state = no.setup(no.Adam(1e-2), model)
    assert_type(state, no.StateTree)
    grads = {"enc": Layer(np.ones((4, 3)), np.ones(3)), "scale": 0.5}
    state, model = no.update_(state, model, grads)
    assert_type(model, "dict[str, object]")
    state, model = no.update(state, model, grads)
    assert isinstance(state, no.StateTree) and isinstance(model["enc"], Layer)
    leaf = state["enc"].w
    assert isinstance(leaf, no.TreeLeaf) and leaf.t == 2
    no.freeze_(state["enc"])
    no.thaw_(state["enc"])
    state = no.adjust(state, lr=1e-3)
    assert_type(state, no.StateTree)
    info = no.param_info(np.ones(3))
    assert info is not None and info.writeable
    flat, restructure = no.destructure(model)
    assert_type(flat, np.ndarray)
    again = restructure(flat)
    assert_type(again, "dict[str, object]")
    chosen = no.setup(choose, {"a": np.ones(2), "b": np.ones(2)})
    assert_type(chosen, no.StateTree)

    no.register_container(Pair, pair_children, pair_rebuild)
    p = Pair(np.ones(2), np.ones(2))
    ps = no.setup(no.Descent(0.5), p)
    ps, p = no.update_(ps, p, Pair(np.ones(2), np.ones(2)))
    assert_type(p, Pair)
    np.testing.assert_allclose(p.left, 0.5)


def schedules_and_loops() -> None:
    s: no.Schedule = no.warmup_cosine(1e-3, 10, 100)
    for sched in (s, no.join([no.constant(1.0), no.linear(1.0, 0.0, 10)], [5]), no.one_cycle(1e-2, 100),
                  no.step_decay(1.0, 0.5, 10), no.exponential(1.0, 0.9), no.piecewise_constant([1.0, 0.1], [50])):
        assert 0.0 <= sched(1) <= 1.0
    res = no.minimize(quadratic, np.ones(3), no.Adam(lr=0.1), maxiter=50, compiled=False)
    assert_type(res, no.OptimizeResult)
    x: NDArray[Any] = res.x
    fun: float = res.fun
    assert x.shape == (3,) and fun < 3.0 and res.nit == 50
    est = no.minimize(loss_only, np.ones(3), no.Descent(1.0), jac=no.SPSA(c=0.1, seed=0), maxiter=5,
                      compiled=False)
    assert est.nit == 5
    batch = no.minimize_batch(quadratic, np.ones((2, 3)), [no.Adam(lr=0.1), no.Adam(lr=0.01)], maxiter=10,
                              compiled=False)
    assert_type(batch, no.BatchResult)
    assert batch.row(0).nit == 10


def persistence() -> None:
    x = np.zeros(4)
    state = no.setup(no.Adam(), x)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "opt.npz")
        no.save(path, state)
        back = no.load(path)
        assert_type(back, "no.Leaf | no.StateTree")
        assert isinstance(back, no.Leaf)
        back, x = no.update_(back, x, np.ones(4))  # a union of states steps like either


if __name__ == "__main__":
    one_array()
    trees()
    schedules_and_loops()
    persistence()
    print("typing_user: ok")
