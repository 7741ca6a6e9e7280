"""PennyLane interop: ``step_and_cost`` for a user's training loop, ``qnode_objective`` for
:func:`numbaopt.minimize`, and :class:`PennyLaneAdam`, the Adam of ``qml.AdamOptimizer`` to the last bit.

PennyLane's autograd interface computes gradients of ``pennylane.numpy.tensor`` arguments whose
``requires_grad`` is True. numbaopt steps such a tensor like an ndarray (``setup`` gives a
:class:`numbaopt.Leaf`, ``update_`` writes it in place on the fast path, the pure ``update`` returns a
tensor with its ``requires_grad``), so a PennyLane loop needs no conversion::

    state = numbaopt.setup(PennyLaneAdam(0.1, beta2=0.999), theta)       # theta: a pnp.tensor
    for _ in range(100):
        state, theta, loss = step_and_cost(state, theta, circuit, *args)  # like opt.step_and_cost(circuit, theta)

PennyLane is imported when a function here is first called, never when this module is imported: the
package imports without it (``pip install pennylane`` for these functions). See ``docs/pennylane.md``.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..api import update_
from ..rules.base import UNIT, Rule, hyper, state
from ..rules.ops import abs2, one_minus_pow, sqrt

__all__ = ["PennyLaneAdam", "step_and_cost", "qnode_objective"]


class PennyLaneAdam(Rule):
    """Adam exactly as PennyLane's ``qml.AdamOptimizer`` computes it (same defaults: lr 0.01, beta2 0.99):
    ``m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*|g|^2; d = lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)``.

    Kingma and Ba's Algorithm 1 (:class:`numbaopt.Adam`, ``torch.optim.Adam``, ``optax.adam``) adds ``eps``
    to the bias-corrected ``sqrt(v / (1-b2^t))``. PennyLane (like Keras) uses the paper's "more efficient"
    form (end of its section 2): both corrections folded into the step size and ``eps`` added to the
    uncorrected ``sqrt(v)``, which is Algorithm 1 with ``eps_t = eps / sqrt(1-b2^t)`` (``3.2e-7`` at
    ``t = 1`` for ``eps = 1e-8``, ``beta2 = 0.999``). The two differ by about ``lr * eps_t / |g|`` per step:
    negligible for training, but only this rule reproduces ``qml.AdamOptimizer``'s iterates (to rounding,
    ``examples/pennylane_interop.py``; the bias corrections are ``one_minus_pow`` here, ``1 - beta**t``
    there).

    Kingma and Ba, "Adam: A Method for Stochastic Optimization", 2015. https://arxiv.org/abs/1412.6980;
    ``pennylane.optimize.AdamOptimizer.apply_grad``.
    """
    lr = hyper(0.01, low=0.0)
    beta1 = hyper(0.9, **UNIT)
    beta2 = hyper(0.99, **UNIT)
    eps = hyper(1e-8, low=0.0)
    m = state(0.0)
    v = state(0.0, real=True)
    scalars = ("bc1", "bc2")
    torch = "(none: torch.optim.Adam adds eps after the bias correction, as numbaopt.Adam)"
    optax = "(none: optax.adam adds eps after the bias correction, as numbaopt.Adam)"

    @staticmethod
    def prepare(t, beta1, beta2):
        return one_minus_pow(beta1, t), one_minus_pow(beta2, t)

    @staticmethod
    def step(g, x, m, v, lr, beta1, beta2, eps, bc1, bc2):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * abs2(g)
        # PennyLane's order of operations: (lr * sqrt(bc2) / bc1) * m / (sqrt(v) + eps)
        return lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps), m, v


def _qml():
    """The ``pennylane`` module (imported on first use: numbaopt does not depend on it)."""
    try:
        return importlib.import_module("pennylane")
    except ImportError as e:
        raise ImportError("numbaopt.quantum's PennyLane helpers need PennyLane: pip install pennylane") from e


def _check_callable(what: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be callable (a QNode or a Python function), got {type(fn).__name__}")


def step_and_cost(state: Any, params: Any, cost: Callable[..., Any], *args: Any,
                  grad_fn: Callable[..., Any] | None = None, **kwargs: Any) -> tuple[Any, Any, float]:
    """One in-place step of ``params`` with the loss and gradient of ``cost`` at ``params``:
    ``(state, params, loss)``, ``loss = cost(params, *args, **kwargs)`` *before* the step, as
    ``qml.AdamOptimizer.step_and_cost(cost, params, *args)`` returns it (with :class:`PennyLaneAdam` and the
    same hyperparameters the iterates are PennyLane's, to rounding).

    ``params`` is what ``state`` was set up for (``numbaopt.setup(rule, params)``): a
    ``pennylane.numpy.tensor`` or an ndarray, or a dict, list or tuple of them (autograd differentiates those
    containers); it is written in place (``update_``: the same object comes back; a read-only array gives a
    new one, so use the returned ``params``). Only ``params`` is trained: ``args`` and ``kwargs`` are passed
    to ``cost`` unchanged (the data, the Hamiltonian).

    The gradient is ``qml.grad(cost, argnums=0)`` (one forward and one backward pass; the loss is that
    forward pass, ``cost`` is not evaluated again), or ``grad_fn(params, *args, **kwargs)`` when given (then
    ``cost`` is evaluated once more for the loss, as PennyLane does). A tensor with ``requires_grad=False``
    is a ``ValueError``: ``qml.AdamOptimizer`` would silently leave it as it is.
    """
    _check_callable("cost", cost)
    if getattr(params, "requires_grad", True) is False:
        raise ValueError("step_and_cost: params has requires_grad=False, so PennyLane would not differentiate "
                         "it; set params.requires_grad = True (or pass it as one of args: it is not trained)")
    if grad_fn is None:
        gf = _qml().grad(cost, argnums=0)
        grad = gf(params, *args, **kwargs)
        loss = gf.forward
    else:
        _check_callable("grad_fn", grad_fn)
        grad = grad_fn(params, *args, **kwargs)
        loss = cost(params, *args, **kwargs)
    state, params = update_(state, params, grad)
    return state, params, float(loss)


def qnode_objective(cost: Callable[..., Any], shape: tuple[int, ...] | int | None = None, *,
                    grad_fn: Callable[..., Any] | None = None) -> Callable[..., float]:
    """``fun(x, grad_out, *args) -> loss`` for :func:`numbaopt.minimize` (and ``minimize_batch``) from a
    QNode or any PennyLane cost ``cost(params, *args) -> scalar``.

    ``minimize`` hands ``fun`` a flat float64 ndarray ``x`` (its live iterate) and wants the gradient
    *written into* ``grad_out``; a QNode wants a ``pennylane.numpy.tensor`` that requires grad, of its own
    shape, and returns its gradient. ``fun`` bridges the two: ``x`` viewed with ``shape`` (default: as it is,
    1-D) as a tensor that requires grad (a view: nothing is copied), ``qml.grad(cost, argnums=0)`` once (the
    loss is its forward pass), the gradient flattened into ``grad_out``. With ``grad_fn(params, *args)``
    (e.g. a parameter-shift rule of your own) that gradient is used and ``cost`` is evaluated for the loss.

    ``args`` of ``minimize`` (``minimize(fun, x0, rule, args=(H,))``) arrive after ``x``, as in ``cost``.
    The loop runs in Python (a QNode is not compiled code), with the same iterates as the compiled loop.
    """
    _check_callable("cost", cost)
    if grad_fn is not None:
        _check_callable("grad_fn", grad_fn)
    if shape is not None:
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"qnode_objective: shape {shape} has a negative dimension")
    size = None if shape is None else math.prod(shape)
    qml = _qml()
    pnp = importlib.import_module("pennylane.numpy")

    def fun(x: np.ndarray, grad_out: np.ndarray, *args: Any) -> float:
        if size is not None and x.size != size:
            raise ValueError(f"qnode_objective: minimize passed {x.size} parameters, but the shape given is "
                             f"{shape} ({size}); x0 must hold exactly the circuit's parameters")
        params = pnp.tensor(x if shape is None else x.reshape(shape), requires_grad=True)
        if grad_fn is None:
            gf = qml.grad(cost, argnums=0)
            grad = gf(params, *args)
            loss = gf.forward
        else:
            grad = grad_fn(params, *args)
            loss = cost(params, *args)
        grad = np.asarray(grad, dtype=grad_out.dtype)
        if grad.size != grad_out.size:
            raise ValueError(f"qnode_objective: the gradient has {grad.size} entries for {grad_out.size} "
                             "parameters")
        grad_out[:] = grad.reshape(-1)
        return float(loss)

    fun.__name__ = f"qnode_objective({getattr(cost, '__name__', type(cost).__name__)})"
    fun.__doc__ = f"numbaopt.minimize objective of {cost!r}: fun(x, grad_out, *args) -> loss"
    return fun
