"""The generator's source-level inliner (numbaopt.compiler.inliner), checked without compiling: a small module of
``inline="always"`` functions and kernels that call them is run as plain Python before and after the calls are
written out, and must compute the same values; the written-out text must have lost the calls it can write out and
kept the ones it cannot. The generated kernels themselves are checked by the rest of the suite (bitwise in place
= pure = threaded, against float64, optax and torch references)."""
import ast
import itertools
import re

import numpy as np
import pytest

from numbaopt.compiler.inliner import inline_module

HEAD = '''# generated
# test module

import math
import numpy as np

INF = math.inf
_NJ = dict(error_model="numpy")
_R = np.float32


def njit(*args, **kwargs):
    return lambda f: f


@njit(inline="always", **_NJ)
def abs2(a):
    return a * a


@njit(inline="always", **_NJ)
def sqrt(a):
    return math.sqrt(a)


@njit(inline="always", **_NJ)
def norm(g, p):
    if p == _R(2.0):
        return abs2(g)
    if p == _R(1.0):
        return abs(g)
    if p != INF:
        return float(abs(g)) ** p
    return abs(g) * _R(1.0)


@njit(inline="always", **_NJ)
def step_0(g, x, m, lr, beta, nesterov):
    n = beta * m + g          # a local named like the kernel's size
    if nesterov:
        return (lr * (g + beta * n), n)
    if lr > 1:
        n = n / lr
    else:
        return (lr * n, n)
    return (n, lr * n)


@njit(inline="always", **_NJ)
def swap(a, b):
    return (b, a)


@njit(inline="always", **_NJ)
def first_positive(v):
    for k in range(v.shape[0]):
        if v[k] > 0:
            return v[k]
    return -1.0


@njit(inline="always", **_NJ)
def is_tenth(p):
    if p == _R(0.1):
        return 1.0
    return 0.0


@njit(inline="always", **_NJ)
def keyword(a, b):
    return a - b
'''


def _module(kernels: str) -> str:
    return HEAD + "\n\n" + kernels


def _run(text: str, name: str, *args):
    ns: dict = {}
    exec(compile(text, "<generated>", "exec"), ns)
    return ns[name](*args)


def _kernel_calls(text: str, kernel: str) -> set:
    fn = next(f for f in ast.parse(text).body if isinstance(f, ast.FunctionDef) and f.name == kernel)
    return {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


KERNEL = '''
@njit(cache=True, **_NJ)
def kernel(xs, gs, ms, lr, beta):
    n = xs.shape[0]
    total = 0.0
    for i in range(n):
        d = gs[i]
        c0 = norm(d, 2.0)
        c1 = norm(d, 1.0)
        c2 = norm(d, 3.0)
        c3 = norm(d, INF)
        total += c0 + c1 + c2 + c3 + sqrt(abs2(d))
        d, m0 = step_0(d, xs[i], ms[i], lr, beta, False)
        e, m1 = step_0(d, xs[i], ms[i], _R(lr), beta, True)
        d, e = swap(d, e)
        xs[i] = xs[i] - d - e
        ms[i] = m0 + m1
    return total, n
'''


@pytest.mark.parametrize("lr", [0.5, 2.0])
def test_written_out_kernel_computes_what_the_calls_computed(lr):
    text = _module(KERNEL)
    out = inline_module(text, np.float32)
    assert _kernel_calls(out, "kernel") & {"norm", "sqrt", "abs2", "step_0", "swap"} == set()
    rng = np.random.default_rng(1)
    for _ in range(5):
        xs, gs, ms = (rng.standard_normal(7) for _ in range(3))
        a = [xs.copy(), gs.copy(), ms.copy()]
        b = [xs.copy(), gs.copy(), ms.copy()]
        ra = _run(text, "kernel", *a, lr, 0.9)
        rb = _run(out, "kernel", *b, lr, 0.9)
        assert ra == rb
        for u, v in zip(a, b):
            assert np.array_equal(u, v)


def test_constant_options_keep_only_the_branch_taken():
    out = inline_module(_module(KERNEL), np.float32)
    body = out[out.index("def kernel("):]
    assert "** 3.0" in body and "** 2.0" not in body  # norm(d, 3.0) keeps its pow; norm(d, 2.0) is d * d
    assert body.count("_R(1.0)") == 1  # only norm(d, INF) reaches its last return
    # step_0 with nesterov=False: no trace of the nesterov branch; with True: nothing but it
    assert body.count("g + beta") == 0 and body.count("* (d + beta *") == 1


def test_locals_are_renamed_and_do_not_touch_the_kernels_names():
    out = inline_module(_module(KERNEL), np.float32)
    body = out[out.index("def kernel("):]
    assert not re.search(r"^ +n = beta", body, re.M) and re.search(r"^ +_k\d+_n = beta", body, re.M)
    assert _run(out, "kernel", np.ones(3), np.ones(3), np.ones(3), 0.5, 0.9)[1] == 3


def test_calls_it_cannot_write_out_stay_calls():
    kernels = '''
@njit(cache=True, **_NJ)
def loops(v):
    return first_positive(v)


@njit(cache=True, **_NJ)
def keywords(a):
    y = keyword(a, b=1.0)
    return y


@njit(cache=True, **_NJ)
def shadow(a):
    math = 3.0
    y = sqrt(a)
    return y + math


@njit(cache=True, **_NJ)
def one_line(a):
    y = 0.0
    if a > 0: y = norm(a, 1.0)
    z = norm(a, 2.0); w = 1.0
    return y + z + w
'''
    text = _module(kernels)
    out = inline_module(text, np.float32)
    body = out[out.index("def one_line("):]
    assert "norm(a, 1.0)" in body and "norm(a, 2.0)" in body  # the rewrite replaces whole lines
    assert _run(out, "one_line", 2.0) == _run(text, "one_line", 2.0)
    assert "first_positive" in _kernel_calls(out, "loops")  # a return inside a loop
    assert "keyword" in _kernel_calls(out, "keywords")
    assert "sqrt" in _kernel_calls(out, "shadow")  # sqrt's global `math` is a local of this kernel
    assert _run(out, "loops", np.array([-1.0, 2.0])) == 2.0
    assert _run(out, "keywords", 3.0) == 2.0


def test_tuple_targets_read_by_later_elements_are_not_split():
    kernels = '''
@njit(cache=True, **_NJ)
def rotate(a, b):
    a, b = swap(a, b)
    b, a = swap(b, a + b)
    return a, b
'''
    text = _module(kernels)
    out = inline_module(text, np.float32)
    assert "swap" not in _kernel_calls(out, "rotate")
    for a, b in itertools.product([1.0, -2.5], [0.25, 7.0]):
        assert _run(out, "rotate", a, b) == _run(text, "rotate", a, b)


def test_tests_are_decided_as_numba_decides_them():
    # 0.1 is not a float32: in Numba p == _R(0.1) with the literal p = 0.1 compares float64 with float32 promoted
    # (False), in float64 it is True (NumPy 2's Python-scalar rules would say True for both: compiled here)
    kernels = '''
@njit(cache=True, **_NJ)
def pick():
    y = is_tenth(0.1)
    return y
'''
    real = _module(kernels).replace("def njit(*args, **kwargs):\n    return lambda f: f\n", "from numba import njit\n")
    real = real.replace("cache=True, ", "")
    for dtype, expected in ((np.float32, 0.0), (np.float64, 1.0)):
        text = real.replace("_R = np.float32", f"_R = np.{np.dtype(dtype).name}")
        out = inline_module(text, dtype)
        assert "if " not in out[out.index("def pick("):]  # decided while writing it out
        assert _run(out, "pick") == _run(text, "pick") == expected


def test_the_written_out_module_is_written_once_and_later_imports_skip_the_inliner(tmp_path, monkeypatch):
    from numbaopt.compiler.cache import import_generated
    monkeypatch.setenv("NUMBAOPT_CACHE_DIR", str(tmp_path))
    calls = []

    def finish(text):
        calls.append(text)
        return text + "Y = 2\n"

    first = import_generated("X = 1\n", prefix="inl_a_", finish=finish, stamp=b"one")
    again = import_generated("X = 1\n", prefix="inl_b_", finish=finish, stamp=b"one")  # as a new process would
    assert first.Y == again.Y == 2 and len(calls) == 1 and first.source_path == again.source_path
    other = import_generated("X = 1\n", prefix="inl_c_", finish=finish, stamp=b"two")  # a changed inliner
    assert len(calls) == 2 and other.source_path != first.source_path


def test_the_kernel_modules_on_disk_are_the_written_out_source():
    import numbaopt as no
    from numbaopt.compiler import cache, cpu
    rule = no.chain(no.ClipGlobalNorm(1.0), no.Adam())
    mod = cache.kernels(rule, np.float32)
    with open(mod.source_path) as fh:
        assert fh.read() == cpu.generate_source(rule, np.float32)
    assert "reduce_t_0(" not in cpu.generate_source(rule, np.float32).split("def partial_0(")[1]
