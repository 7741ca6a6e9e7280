"""The prelude of every generated module: the compiled forms of :mod:`numbaopt.rules.ops`.

:data:`COMMON` (imports, ``clamp``, ``exp``, ``log``, ``hypot``, ``one_minus_pow``) comes first, then
:data:`REAL` or :data:`COMPLEX` (``sqrt``, ``abs2``, ``absval``, ``sign``, ``conj``, ``real``, ``isfinite``)
after the module defines ``_R`` (the parameters' real scalar type) and ``_C`` (their scalar type). The
functions are ``inline="always"`` so that a step body costs what its arithmetic costs. The CUDA emitter
re-decorates the same functions as device functions.
"""

__all__ = ["COMMON", "REAL", "COMPLEX"]

COMMON = '''
import math
import numpy as np
from numba import njit, prange, carray
from numbaopt.compiler.intrinsics import as_pointer, data_address

INF = math.inf
_NJ = dict(error_model="numpy", nogil=True)


@njit(inline="always", **_NJ)
def precision(a):
    return _R(a)


@njit(inline="always", **_NJ)
def epsilon():
    return _R(np.finfo(_R).eps)


@njit(inline="always", **_NJ)
def clamp(a, lo, hi):
    return min(max(a, lo), hi)


@njit(inline="always", **_NJ)
def exp(a):
    return math.exp(a)


@njit(inline="always", **_NJ)
def log(a):
    return math.log(a)


@njit(inline="always", **_NJ)
def hypot(a, b):
    return math.hypot(a, b)


@njit(inline="always", **_NJ)
def one_minus_pow(b, t):
    # 1 - b**t as -expm1(t*log(b)): exact where 1 - pow() cancels (b near 1, small t), and ~5x
    # cheaper than pow(), which dominates a step on a few dozen parameters
    return -math.expm1(t * math.log(b))
'''

REAL = '''
@njit(inline="always", **_NJ)
def sqrt(a):
    return math.sqrt(a)


@njit(inline="always", **_NJ)
def abs2(a):
    return a * a


@njit(inline="always", **_NJ)
def absval(a):
    return abs(a)


@njit(inline="always", **_NJ)
def sign(a):
    if a > 0:
        return _R(1)
    if a < 0:
        return _R(-1)
    return a * _R(0)


@njit(inline="always", **_NJ)
def conj(a):
    return a


@njit(inline="always", **_NJ)
def real(a):
    return a


@njit(inline="always", **_NJ)
def imag(a):
    return _R(0)


@njit(inline="always", **_NJ)
def number(re, im):
    return _C(re)


@njit(inline="always", **_NJ)
def isfinite(a):
    return math.isfinite(a)
'''

COMPLEX = '''
@njit(inline="always", **_NJ)
def sqrt(a):
    return math.sqrt(a)


@njit(inline="always", **_NJ)
def abs2(a):
    return a.real * a.real + a.imag * a.imag


@njit(inline="always", **_NJ)
def absval(a):
    return math.sqrt(a.real * a.real + a.imag * a.imag)


@njit(inline="always", **_NJ)
def conj(a):
    return a.conjugate()


@njit(inline="always", **_NJ)
def real(a):
    return a.real


@njit(inline="always", **_NJ)
def imag(a):
    return a.imag


@njit(inline="always", **_NJ)
def number(re, im):
    return _C(complex(re, im))


@njit(inline="always", **_NJ)
def isfinite(a):
    return math.isfinite(a.real) and math.isfinite(a.imag)
'''
