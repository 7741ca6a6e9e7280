"""The names a rule's ``step``, ``prepare``, ``reduce`` and ``finish`` may use, besides their arguments.

A rule file imports them from here (``from .ops import sqrt, abs2``), so linters and IDEs resolve every
name of a step body and the definitions can be read and called in plain Python (float semantics). The
kernel generator (:mod:`numbaopt.compiler.prelude`) does not use these functions: it emits compiled
versions with the same meaning, specialised for real or complex parameters and computed in the
parameters' precision. :data:`STEP_NAMESPACE` is the whole set a body may name.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["sqrt", "abs2", "sign", "clamp", "absval", "conj", "real", "imag", "number", "precision", "epsilon",
           "isfinite",
           "hypot", "exp", "log",
           "one_minus_pow", "INF", "STEP_NAMESPACE"]

INF = math.inf


def sqrt(a):
    """Square root (of a real number; second moments stay real for complex parameters)."""
    return math.sqrt(a)


def abs2(a):
    """``|a|^2``: ``a * a`` for a real number, ``re^2 + im^2`` for a complex one."""
    if isinstance(a, complex):
        return a.real * a.real + a.imag * a.imag
    return a * a


def absval(a):
    """``|a|`` (the modulus of a complex number)."""
    return abs(a)


def sign(a):
    """-1, 0 or 1 (real parameters only); ``sign(-0.0)`` is ``-0.0``, ``sign(nan)`` NaN."""
    if a > 0:
        return 1.0
    if a < 0:
        return -1.0
    return a * 0.0


def clamp(a, lo, hi):
    """``min(max(a, lo), hi)``."""
    return min(max(a, lo), hi)


def conj(a):
    """The complex conjugate (``a`` itself for a real number)."""
    return a.conjugate()


def real(a):
    """The real part."""
    return a.real


def imag(a):
    """The imaginary part (0 for a real number)."""
    return a.imag


def number(re, im):
    """The parameters' scalar ``re + i*im`` (``re`` for real parameters, where ``im`` is dropped): how a step
    rebuilds a complex value from real totals (``Centralize``'s mean)."""
    return complex(re, im) if im else re


def precision(a):
    """``a`` as a real number of the parameters' precision (float32 for float32 parameters): how a matrix rule
    keeps its array code in that precision (a float64 scalar times a float32 array is a float64 array)."""
    return float(a)


def epsilon():
    """The machine epsilon of the parameters' real precision (``np.finfo(float32).eps`` for float32 parameters):
    torch's default floors, which depend on the dtype."""
    return float(np.finfo(np.float64).eps)


def isfinite(a):
    """Whether ``a`` (both parts of a complex number) is neither NaN nor infinite."""
    if isinstance(a, complex):
        return math.isfinite(a.real) and math.isfinite(a.imag)
    return math.isfinite(a)


def hypot(a, b):
    """``sqrt(a^2 + b^2)`` without overflow."""
    return math.hypot(a, b)


def exp(a):
    """``e^a``."""
    return math.exp(a)


def log(a):
    """The natural logarithm."""
    return math.log(a)


def one_minus_pow(b, t):
    """``1 - b**t`` computed as ``-expm1(t * log(b))``: exact where ``1 - pow()`` cancels (b near 1, small
    t), and about five times cheaper than ``pow`` in compiled code. Use it for bias corrections."""
    return -math.expm1(t * math.log(b))


#: every name a step/prepare/reduce/finish body may use besides its arguments
STEP_NAMESPACE = frozenset(set(__all__) - {"STEP_NAMESPACE"}) | frozenset({
    "min", "max", "abs", "float", "math", "np", "True", "False", "None"})

assert np  # the generated modules provide ``np`` too: a body may name it
