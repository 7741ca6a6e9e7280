"""Matrix rules: a step that needs the whole matrix of each 2-D leaf (Muon's Newton-Schulz orthogonalisation).

A matrix rule is an axis reduction over ``"elements"`` (see :mod:`.base`): its ``reduce`` gives each element's
contribution, ``matrix`` turns the matrix of contributions into the matrix of finals (array code compiled into
the same kernel; ``np.dot`` is BLAS through SciPy), and the step reads its element's final.
"""
from __future__ import annotations

import math

import numpy as np

from .adaptive import Adam
from .base import Rule, hyper, option, state, UNIT
from .factored import SizeOption
from .ops import one_minus_pow, precision

__all__ = ["Muon", "muon"]


class Muon(Rule):
    """Muon for one matrix: momentum ``m = beta*m + (1-beta)*g``, the nesterov direction ``u = (1-beta)*g + beta*m``
    (``u = m`` without), its orthogonalisation by ``ns_steps`` quintic Newton-Schulz iterations
    ``X = a*X + (b*A + c*A@A) @ X``, ``A = X @ X^T`` (``(a, b, c) = (3.4445, -4.7750, 2.0315)``, from
    ``X = u / ||u||_F``), a shape scale ``s`` and ``d = lr * (s*O + weight_decay*x)``.

    ``convention="torch"`` (``torch.optim.Muon``): ``X = u / max(||u||, eps)``, ``s = sqrt(max(1, rows/cols))``.
    ``convention="optax"`` (``optax.contrib.muon``): bias-corrected momentum (``u = beta*m/(1-beta^(t+1)) +
    (1-beta)*g/(1-beta^t)``), ``X = u / (||u|| + eps)``, ``s = sqrt(max(1, cols/rows))`` (optax's kernels are
    (in, out)). torch orthogonalises in bfloat16; here it is the parameters' precision. Only 2-D leaves:
    :func:`numbaopt.muon` gives the others a fallback rule.

    Jordan et al., "Muon: An optimizer for hidden layers in neural networks", 2024.
    https://kellerjordan.github.io/posts/muon/
    Examples
    --------
    >>> x = np.zeros((2, 3)); state = no.setup(no.Muon(lr=0.1), x)
    >>> state, x = no.update_(state, x, np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))
    >>> print(x.round(3))   # the quintic iteration leaves singular values in about (0.7, 1.2), not all at 1
    [[-0.111  0.     0.   ]
     [ 0.    -0.069  0.   ]]
    """
    lr = hyper(0.02, low=0.0)
    beta = hyper(0.95, **UNIT)
    eps = hyper(1e-7, low=0.0)
    weight_decay = hyper(0.0, low=0.0)
    nesterov = option(True)
    ns_steps = SizeOption(5, doc="Newton-Schulz iterations")
    convention = option("torch", choices=("torch", "optax"))
    mu = state(0.0)
    axes = ("elements",)
    reduce_ops = ("keep",)
    finals = ("o",)
    scalars = ("bc", "bc_next")
    supports_complex = False
    fallback_hint = "numbaopt.muon(lr, ..., fallback=rule) chooses Muon for matrices and the fallback elsewhere"
    torch = "Muon(lr, weight_decay, momentum=beta, nesterov, eps=eps, ns_steps): convention='torch'"
    optax = "contrib.muon(lr, beta=beta, eps, weight_decay, nesterov): convention='optax'"

    def validate(self):
        try:  # here, not at the first compile: Numba's np.dot needs SciPy's BLAS
            import scipy.linalg.cython_blas  # noqa: F401
        except ImportError:
            raise ImportError("Muon multiplies matrices with Numba's np.dot, which needs SciPy: "
                              "pip install 'numbaopt[muon]' (or scipy)") from None

    @staticmethod
    def geometry(shape):
        return (0, 1, 1, 2) if len(shape) == 2 else None

    @staticmethod
    def prepare(t, beta):
        return one_minus_pow(beta, t), one_minus_pow(beta, t + 1)

    @staticmethod
    def reduce(g, x, mu, beta, nesterov, convention, bc, bc_next):
        m = beta * mu + (1 - beta) * g
        if convention == "optax":
            if nesterov:
                return beta * m / bc_next + (1 - beta) * g / bc
            return m / bc
        if nesterov:
            return (1 - beta) * g + beta * m
        return m

    @staticmethod
    def matrix(U, eps, ns_steps, convention):
        # the quintic coefficients of Keller Jordan's Muon (torch.optim.Muon's and optax's defaults)
        rows, cols = U.shape
        X = np.ascontiguousarray(U.T) if rows > cols else U.copy()
        norm = precision(math.sqrt(np.sum(X * X)))
        X = X / (norm + eps if convention == "optax" else max(norm, eps))
        for _ in range(ns_steps):
            A = np.dot(X, X.T)
            B = -4.7750 * A + 2.0315 * np.dot(A, A)
            X = 3.4445 * X + np.dot(B, X)
        if rows > cols:
            X = np.ascontiguousarray(X.T)
        ratio = rows / cols if convention == "torch" else cols / rows
        return X * precision(math.sqrt(max(1.0, ratio)))

    @staticmethod
    def step(g, x, mu, lr, beta, weight_decay, o_elements):
        return lr * (o_elements + weight_decay * x), beta * mu + (1 - beta) * g


def muon(lr=0.02, beta=0.95, eps=1e-7, weight_decay=0.0, *, nesterov=True, ns_steps=5, convention="torch",
         fallback=None):
    """A rule chooser for :func:`numbaopt.setup`: :class:`Muon` for every 2-D parameter, ``fallback`` (default
    ``Adam(lr)``) for the others. optax's ``contrib.muon`` gives its non-matrix leaves ``adamw(lr, eps=eps,
    nesterov=nesterov)``: ``fallback=NAdam(lr, eps=eps, b2_factor=False)`` for ``nesterov=True``.

    Jordan et al., "Muon: An optimizer for hidden layers in neural networks", 2024.
    https://kellerjordan.github.io/posts/muon/
    Examples
    --------
    >>> model = {"w": np.ones((3, 2)), "b": np.ones(2)}
    >>> state = no.setup(no.muon(0.1), model)
    >>> print(type(state["w"].rule).__name__, type(state["b"].rule).__name__)
    Muon Adam
    """
    rule = Muon(lr, beta, eps, weight_decay, nesterov=nesterov, ns_steps=ns_steps, convention=convention)
    other = Adam(lr) if fallback is None else fallback

    def choose(path, x):
        return rule if np.ndim(x) == 2 else other
    choose.__qualname__ = choose.__name__ = f"muon({rule!r}, fallback={other!r})"
    return choose
