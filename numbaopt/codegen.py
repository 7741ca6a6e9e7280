"""The kernel generator: from the scalar definitions of a chain of rules to compiled kernels.

For a chain of primitive rules and a compute dtype it writes ONE Python module containing

* the prelude (``sqrt``, ``abs2``, ``sign``... specialised for real or complex parameters),
* each rule's ``step`` (and ``prepare``/``reduce``/``finish``) copied from its definition, with every
  numeric literal in ``step``/``reduce`` rewritten to the parameter's real precision (``0.9`` becomes
  ``_R(0.9)``) so that float32 stays float32,
* the kernels built around them (see :data:`KERNELS`): in-place, out-of-place, threaded (``prange``),
  the multi-leaf kernel used by trees, and the step callable from a user's ``@njit`` code.

The module is written to a cache directory under a name that is the hash of its content and imported
from there, so Numba's ``cache=True`` works for generated code: an unchanged chain loads from disk in
every later process; a changed definition produces another file. The CUDA backend reuses
:func:`chain_layout` and :func:`element_lines` to wrap the same fused element body in a ``@cuda.jit``
kernel.

Calling conventions (``S`` = the chain's state arrays, ``hp`` = hyperparameters in the parameters'
real precision, ``t`` = the number of the step being taken, from 1):

* ``inplace(x, g, *S, hp, t) -> status`` (1-D contiguous arrays, written in place)
* ``outplace(x, g, *S, hp, t, xo, *So) -> status`` (reads inputs, writes the ``o`` arrays)
* ``inplace_par`` / ``outplace_par``: the same with ``prange`` (bitwise identical results)
* ``multi(xaddr, gaddr, sizes, offsets, *S, hp, ts) -> status`` (trees: leaves by address, state in
  flat arenas, per-leaf step counts ``ts`` advanced in the kernel)

``status``: 0 stepped, 1 skipped (a rule asked to skip: nothing written), 2 + k: rule k's reduction
reported an error (nothing written).
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

import numpy as np

from .rule import Rule, function_source, step_args

GENERATOR_VERSION = "1"

_lock = threading.RLock()
_modules: dict = {}


def cache_dir() -> str:
    """Where generated kernel modules (and Numba's cache of them) live.

    ``NUMBAOPT_CACHE_DIR`` overrides; default ``$XDG_CACHE_HOME/numbaopt`` (``~/.cache/numbaopt``).
    """
    d = os.environ.get("NUMBAOPT_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "numbaopt")
    return os.path.join(d, f"kernels-v{GENERATOR_VERSION}")


PRELUDE_COMMON = '''
import math
import numpy as np
from numba import njit, prange, carray
from numbaopt._ptr import as_pointer

INF = math.inf
_NJ = dict(error_model="numpy", nogil=True)


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

PRELUDE_REAL = '''
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
def isfinite(a):
    return math.isfinite(a)
'''

PRELUDE_COMPLEX = '''
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
def isfinite(a):
    return math.isfinite(a.real) and math.isfinite(a.imag)
'''


class _Literals(ast.NodeTransformer):
    """Rewrite numeric literals to ``_R(literal)``: Numba types bare literals as float64/int64."""

    def visit_BinOp(self, node):
        if isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant) \
                and type(node.right.value) is int:
            node.left = self.visit(node.left)
            return node  # integer powers stay integer: x ** 2 is a multiplication, not a pow call
        return self.generic_visit(node)

    def visit_Constant(self, node):
        if type(node.value) in (int, float):
            return ast.Call(func=ast.Name("_R", ast.Load()), args=[node], keywords=[])
        return node


def _renamed_source(func, new_name: str, literals: bool) -> str:
    fn = ast.parse(function_source(func)).body[0]
    fn.name = new_name
    if literals:
        fn = _Literals().visit(fn)
    ast.fix_missing_locations(fn)
    return ast.unparse(fn)


def real_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.dtype(dtype.type(0).real.dtype) if dtype.kind == "c" else dtype


class ChainLayout:
    """Where each rule's hyperparameters sit in ``hp`` and its states in the state-array list."""

    def __init__(self, rules):
        self.rules = tuple(rules)
        self.hyper_slots = []   # per rule: {name: index in hp}
        self.state_slots = []   # per rule: list of (state decl, index in S or None)
        self.hyper_names = []   # flat: (rule index, name)
        self.state_decls = []   # flat: (rule index, state decl)
        k = 0
        for r_i, r in enumerate(self.rules):
            slots = {}
            for n in r._hypers:
                slots[n] = k
                self.hyper_names.append((r_i, n))
                k += 1
            self.hyper_slots.append(slots)
            active = set(id(s) for s in r.active_states())
            ss = []
            for s in r._states.values():
                if id(s) in active:
                    ss.append((s, len(self.state_decls)))
                    self.state_decls.append((r_i, s))
                else:
                    ss.append((s, None))
            self.state_slots.append(ss)
        self.n_hyper = k
        self.n_state = len(self.state_decls)
        self.reducers = [i for i, r in enumerate(self.rules) if getattr(type(r), "reduce", None) is not None]

    def hyper_vector(self, t: int = 1, dtype=np.float64) -> np.ndarray:
        """Hyperparameters at step t, stored in the real precision of the parameters (so a float32
        kernel contains no float64 arithmetic at all)."""
        hp = np.empty(max(self.n_hyper, 1), dtype=real_dtype(dtype))
        self.fill_hyper(hp, t)
        return hp

    def fill_hyper(self, hp, t: int):
        from .schedules import Schedule
        k = 0
        for r_i, n in self.hyper_names:
            v = self.rules[r_i]._values[n]
            if isinstance(v, Schedule):
                v = self.rules[r_i]._hypers[n].check(type(self.rules[r_i]).__name__, v(t))
            hp[k] = v
            k += 1

    def state_dtypes(self, dtype):
        dtype = np.dtype(dtype)
        return [real_dtype(dtype) if s.real else dtype for _, s in self.state_decls]


def chain_layout(rules) -> ChainLayout:
    return ChainLayout(rules)


def _opt_literal(v) -> str:
    return repr(v) if not (isinstance(v, float) and v == float("inf")) else "INF"


def _call_args(rule, r_i, fname, lead, state_vars=()):
    """Argument list for rule ``r_i``'s ``fname`` with the kernel's local variable names."""
    f = getattr(type(rule), fname)
    names = step_args(f)
    out = list(lead)
    rest = names[len(lead) + len(state_vars):] if fname == "step" else names[len(lead):]
    out += list(state_vars)
    for n in rest:
        if n in rule._hypers:
            out.append(f"h{r_i}_{n}")
        elif n in rule._options:
            out.append(_opt_literal(rule._values[n]))
        elif n in type(rule).scalars:
            out.append(f"p{r_i}_{n}")
        elif n in type(rule).finals:
            out.append(f"f{r_i}_{n}")
        else:  # pragma: no cover - prevented by _check_step
            raise TypeError(n)
    return ", ".join(out)


def element_lines(layout: ChainLayout, upto: int, gvar: str, xvar: str, sread, writes: bool,
                  indent: str, zero: str = "_Z", real_zero: str = "_R(0)"):
    """Lines computing the fused chain's step for one element, for rules ``0..upto-1``.

    ``sread(k)`` gives the expression reading state array ``k`` at this element. Leaves the step in
    ``d`` and, when ``writes``, the new state of state array k in ``n_k``.
    """
    lines = [f"{indent}d = {gvar}"]
    for r_i in range(upto):
        rule = layout.rules[r_i]
        svars, outs = [], []
        for decl, k in layout.state_slots[r_i]:
            if k is None:
                svars.append(real_zero if decl.real else zero)
                outs.append("_")
            else:
                svars.append(sread(k))
                outs.append(f"n_{k}")
        args = _call_args(rule, r_i, "step", ["d", xvar], svars)
        lines.append(f"{indent}{', '.join(['d'] + outs)}{',' if not outs else ''} = step_{r_i}({args})"
                     if outs else f"{indent}d = step_{r_i}({args})")
    return lines


def _load_lines(layout: ChainLayout, indent: str, tvar: str, hpvar: str = "hp"):
    """Load hyperparameters (cast to the compute precision) and per-step scalars."""
    lines = []
    for r_i, rule in enumerate(layout.rules):
        for n, k in layout.hyper_slots[r_i].items():
            lines.append(f"{indent}h{r_i}_{n} = _R({hpvar}[{k}])")
        cls = type(rule)
        if cls.scalars:
            f = cls.prepare
            args = []
            for n in step_args(f)[1:]:
                if n in rule._hypers:
                    args.append(f"h{r_i}_{n}")
                else:
                    args.append(_opt_literal(rule._values[n]))
            names = [f"q{r_i}_{n}" for n in cls.scalars]
            lines.append(f"{indent}{', '.join(names)}, = prepare_{r_i}(_R({tvar}), {', '.join(args)})")
            for n in cls.scalars:
                lines.append(f"{indent}p{r_i}_{n} = _R(q{r_i}_{n})")
    return lines


def _reduce_ops(rule):
    ops = type(rule).reduce_ops
    return tuple(ops(rule) if callable(ops) else ops)


def _reduction_lines(layout, r_i, loop_lines, indent, init=True, finish_indent=None, hpvar="hp"):
    """A dry pass for reduction rule r_i over the elements produced by ``loop_lines``.

    ``loop_lines(body)`` wraps a body in the element loop(s). The pass computes the chain up to rule
    r_i without writing any state, accumulates rule r_i's contributions in float64, then calls
    ``finish`` (in float64) into ``g{r_i}_*``. Used by the CUDA generator (grid-stride loops); the CPU
    kernels use :func:`_lane_reduction_lines`.
    """
    rule = layout.rules[r_i]
    ops = _reduce_ops(rule)
    lines = []
    if init:
        lines += [f"{indent}acc{r_i}_{j} = {'0.0' if op == 'sum' else '-INF'}" for j, op in enumerate(ops)]
    body = element_lines(layout, r_i, "gi", "xi", lambda k: f"S{k}[i]", False, "")
    rargs = _call_args(rule, r_i, "reduce", ["d", "xi"])
    body.append(f"{', '.join(f'c{j}' for j in range(len(ops)))}, = reduce_t_{r_i}({rargs})")
    for j, op in enumerate(ops):
        body.append(f"acc{r_i}_{j} += np.float64(c{j})" if op == "sum"
                    else f"acc{r_i}_{j} = max(acc{r_i}_{j}, np.float64(c{j}))")
    lines += loop_lines(body)
    lines += _finish_lines(layout, r_i, indent if finish_indent is None else finish_indent, hpvar)
    return lines


def _finish_lines(layout, r_i, fi, hpvar="hp"):
    rule = layout.rules[r_i]
    cls = type(rule)
    ops = _reduce_ops(rule)
    fargs = [f"acc{r_i}_{j}" for j in range(len(ops))]
    for n in step_args(cls.finish)[len(ops):]:
        if n in rule._hypers:
            fargs.append(f"{hpvar}[{layout.hyper_slots[r_i][n]}]")
        else:
            fargs.append(_opt_literal(rule._values[n]))
    fnames = [f"g{r_i}_{n}" for n in cls.finals]
    return [f"{fi}{', '.join(fnames)}, = finish_{r_i}({', '.join(fargs)})"]


#: independent partial accumulators per reduction in the CPU kernels: the element loop is unrolled this
#: many times so that the float64 sums are not one serial dependency chain (the pass is ~2x faster on
#: 1M float32 elements); the order is fixed, so serial and threaded kernels stay bitwise equal
LANES = 4


def _acc_init_lines(r_i, ops, indent):
    return [f"{indent}acc{r_i}_{j}_{u} = {'0.0' if op == 'sum' else '-INF'}"
            for j, op in enumerate(ops) for u in range(LANES)]


def _lane_reduction_lines(layout, r_i, indent, init=True, finish_indent=None, hpvar="hp"):
    """The CPU form of :func:`_reduction_lines`: a dry pass over ``g[i], x[i]`` for ``i < n``.

    The loop is written at ``indent``. The pass computes the chain up to rule r_i without writing any
    state, accumulates rule r_i's contributions in float64 (in :data:`LANES` partial sums, combined in a
    fixed order), then calls ``finish`` (in float64) into ``g{r_i}_*`` at ``finish_indent``. With
    ``init=False`` the caller initialises the partial sums (a tree-scope reduction spans many leaves).
    """
    rule = layout.rules[r_i]
    ops = _reduce_ops(rule)
    lines = _acc_init_lines(r_i, ops, indent) if init else []
    rargs = _call_args(rule, r_i, "reduce", ["d", "xi"])

    def body(u, ind):
        out = [f"{ind}gi = g[i]", f"{ind}xi = x[i]"]
        out += element_lines(layout, r_i, "gi", "xi", lambda k: f"S{k}[i]", False, ind)
        out.append(f"{ind}{', '.join(f'c{j}' for j in range(len(ops)))}, = reduce_t_{r_i}({rargs})")
        for j, op in enumerate(ops):
            a = f"acc{r_i}_{j}_{u}"
            out.append(f"{ind}{a} += np.float64(c{j})" if op == "sum"
                       else f"{ind}{a} = max({a}, np.float64(c{j}))")
        return out

    bi = indent + "    "
    lines.append(f"{indent}m{r_i} = n - n % {LANES}")
    lines.append(f"{indent}for i0 in range(0, m{r_i}, {LANES}):")
    for u in range(LANES):
        lines.append(f"{bi}i = i0 + {u}")
        lines += body(u, bi)
    lines.append(f"{indent}for i in range(m{r_i}, n):")
    lines += body(0, bi)
    fi = indent if finish_indent is None else finish_indent
    for j, op in enumerate(ops):
        a = [f"acc{r_i}_{j}_{u}" for u in range(LANES)]
        while len(a) > 1:  # pairwise, in a fixed order
            a = [(f"({a[k]} + {a[k + 1]})" if op == "sum" else f"max({a[k]}, {a[k + 1]})")
                 for k in range(0, len(a), 2)]
        lines.append(f"{fi}acc{r_i}_{j} = {a[0]}")
    return lines + _finish_lines(layout, r_i, fi, hpvar)


def _status_lines(layout, r_i, indent, fmt="g{r}_{n}"):
    cls = type(layout.rules[r_i])
    out = []
    if "error" in cls.finals:
        out += [f"{indent}if {fmt.format(r=r_i, n='error')} != 0.0:", f"{indent}    return {2 + r_i}"]
    if "skip" in cls.finals:
        out += [f"{indent}if {fmt.format(r=r_i, n='skip')} != 0.0:", f"{indent}    return 1"]
    return out


def _finals_cast(layout, r_i, indent, src="g{r}_{n}"):
    return [f"{indent}f{r_i}_{n} = _R({src.format(r=r_i, n=n)})" for n in type(layout.rules[r_i]).finals]


def _single_kernel(layout, name, par, outplace, inline=False):
    S = [f"S{k}" for k in range(layout.n_state)]
    SO = [f"O{k}" for k in range(layout.n_state)]
    params = ["x", "g"] + S + ["hp", "t"] + (["xo"] + SO if outplace else [])
    if inline:
        deco = '@njit(inline="always", **_NJ)'
    else:
        deco = "@njit(cache=True, parallel=True, **_NJ)" if par else "@njit(cache=True, **_NJ)"
    rng = "prange" if par else "range"
    L = [deco, f"def {name}({', '.join(params)}):", "    n = x.shape[0]"]
    L += _load_lines(layout, "    ", "t")

    for r_i in layout.reducers:
        L += _lane_reduction_lines(layout, r_i, "    ")
        L += _status_lines(layout, r_i, "    ")
        L += _finals_cast(layout, r_i, "    ")
    L += [f"    for i in {rng}(n):", "        gi = g[i]", "        xi = x[i]"]
    L += element_lines(layout, len(layout.rules), "gi", "xi", lambda k: f"S{k}[i]", True, "        ")
    L.append(f"        {'xo' if outplace else 'x'}[i] = xi - d")
    for k in range(layout.n_state):
        L.append(f"        {SO[k] if outplace else S[k]}[i] = n_{k}")
    L.append("    return 0")
    return L


def _multi_kernel(layout, dtype):
    """Trees: many leaves in one call. Leaves by address; state in flat arenas; per-leaf t."""
    S = [f"S{k}" for k in range(layout.n_state)]
    params = ["xaddr", "gaddr", "sizes", "offsets"] + [f"A{k}" for k in range(layout.n_state)] + ["hp", "ts"]
    L = ["@njit(cache=True, **_NJ)", f"def multi({', '.join(params)}):", "    nleaf = sizes.shape[0]"]
    nfin = {r_i: len(type(layout.rules[r_i]).finals) for r_i in layout.reducers}
    for r_i in layout.reducers:
        L.append(f"    F{r_i} = np.empty(({max(nfin[r_i], 1)}, nleaf), dtype=np.float64)")

    def leaf_header(ind):
        out = [f"{ind}n = sizes[j]", f"{ind}o = offsets[j]",
               f"{ind}x = carray(as_pointer(xaddr[j], _C), (n,))",
               f"{ind}g = carray(as_pointer(gaddr[j], _C), (n,))"]
        for k in range(layout.n_state):
            out.append(f"{ind}S{k} = A{k}[o:o + n]")
        out.append(f"{ind}t = ts[j] + 1")
        return out

    for r_i in layout.reducers:
        cls = type(layout.rules[r_i])
        tree = cls.scope == "tree"
        ops = _reduce_ops(layout.rules[r_i])
        inner = []
        inner += _load_lines(layout, "        ", "t")
        for q in layout.reducers:
            if q == r_i:
                break
            for m, n in enumerate(cls_finals(layout, q)):
                inner.append(f"        f{q}_{n} = _R(F{q}[{m}, j])")

        if tree:
            # accumulators span all leaves: initialise before the leaf loop
            L += _acc_init_lines(r_i, ops, "    ")
        L.append("    for j in range(nleaf):")
        L += leaf_header("        ")
        L += inner

        if tree:
            L += _lane_reduction_lines(layout, r_i, "        ", init=False, finish_indent="    ")
            L.append("    for j in range(nleaf):")
            for m, n in enumerate(cls.finals):
                L.append(f"        F{r_i}[{m}, j] = g{r_i}_{n}")
            L += _status_lines(layout, r_i, "    ")
        else:
            L += _lane_reduction_lines(layout, r_i, "        ")
            for m, n in enumerate(cls.finals):
                L.append(f"        F{r_i}[{m}, j] = g{r_i}_{n}")
            L += _status_lines(layout, r_i, "        ")
    L.append("    for j in range(nleaf):")
    L += leaf_header("        ")
    L += _load_lines(layout, "        ", "t")
    for q in layout.reducers:
        for m, n in enumerate(cls_finals(layout, q)):
            L.append(f"        f{q}_{n} = _R(F{q}[{m}, j])")
    L += ["        for i in range(n):", "            gi = g[i]", "            xi = x[i]"]
    L += element_lines(layout, len(layout.rules), "gi", "xi", lambda k: f"S{k}[i]", True, "            ")
    L.append("            x[i] = xi - d")
    for k in range(layout.n_state):
        L.append(f"            S{k}[i] = n_{k}")
    L.append("        ts[j] = t")
    L.append("    return 0")
    return L


def cls_finals(layout, r_i):
    return type(layout.rules[r_i]).finals


def generate_source(rules, dtype) -> str:
    """The full source of the generated module for ``rules`` (a tuple of primitive rules) and dtype."""
    dtype = np.dtype(dtype)
    rdt = real_dtype(dtype)
    layout = ChainLayout(rules)
    out = [f"# generated by numbaopt codegen v{GENERATOR_VERSION}; do not edit",
           f"# chain: {' -> '.join(type(r).__name__ for r in rules)}; dtype {dtype.name}",
           PRELUDE_COMMON,
           f"_R = np.{rdt.name}", f"_C = np.{dtype.name}", f"_Z = _C(0)",
           PRELUDE_COMPLEX if dtype.kind == "c" else PRELUDE_REAL]
    for r_i, r in enumerate(rules):
        cls = type(r)
        # finish works on the float64 totals of a reduction; everything else in the compute precision
        for fname, literals in (("step", True), ("reduce", True), ("prepare", True), ("finish", False)):
            f = getattr(cls, fname, None)
            if f is None or (fname == "prepare" and not cls.scalars):
                continue
            src = _renamed_source(f, f"{fname}_{r_i}", literals)
            out += ["", "@njit(inline=\"always\", **_NJ)", src]
            if fname == "reduce":
                single = _reduce_returns_scalar(f)
                a = ", ".join(step_args(f))  # explicit names: Numba cannot inline a call with *args
                out += ["", "@njit(inline=\"always\", **_NJ)", f"def reduce_t_{r_i}({a}):",
                        f"    return (reduce_{r_i}({a}),)" if single else f"    return reduce_{r_i}({a})"]
    body = []
    body += _single_kernel(layout, "inplace", False, False) + [""]
    body += _single_kernel(layout, "outplace", False, True) + [""]
    body += _single_kernel(layout, "inplace_par", True, False) + [""]
    body += _single_kernel(layout, "outplace_par", True, True) + [""]
    body += _multi_kernel(layout, dtype) + [""]
    body += _jit_step_kernel(layout) + [""]
    return "\n".join(out) + "\n\n" + "\n".join(body)


def _reduce_returns_scalar(f) -> bool:
    fn = ast.parse(function_source(f)).body[0]
    rets = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    return not any(isinstance(r.value, ast.Tuple) for r in rets)


def _write_module(text: str) -> str:
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    d = cache_dir()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"nbo_{digest}.py")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)  # atomic: another process sees the whole file or none
    return path


def rule_key(rule: Rule):
    cls = type(rule)
    return (cls.__module__, cls.__qualname__, cls.source_fingerprint(),
            tuple(sorted(rule.option_values().items())))


def kernels(rules, dtype):
    """The generated module for ``rules`` and ``dtype`` (imported once per process)."""
    dtype = np.dtype(dtype)
    key = (tuple(rule_key(r) for r in rules), dtype.str)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            mod = _modules[key] = import_generated(generate_source(rules, dtype))
    return mod


def import_generated(text: str, prefix: str = ""):
    """Write generated source to the cache (content-hashed file name) and import it once per process.

    The module is named after the file (plus ``prefix``, for generators whose text could coincide);
    ``module.source_path`` is the file.
    """
    path = _write_module(text)
    name = prefix + os.path.splitext(os.path.basename(path))[0]
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mod.source_path = path
    return mod


def _jit_step_kernel(layout):
    """``step(x, g, S, hp, t)``: the in-place kernel with the state as one tuple, for user ``@njit`` code.

    ``inplace_inline`` is the serial in-place kernel inlined into its caller (by Numba, at IR level):
    the compiled loops call it too. A call between separately compiled functions is not inlined by
    LLVM and cost ~60 ns, a third of an Adam step on 16 parameters.
    """
    args = ", ".join(["x", "g"] + [f"S[{k}]" for k in range(layout.n_state)] + ["hp", "t"])
    return (_single_kernel(layout, "inplace_inline", False, False, inline=True)
            + ["", "", "@njit(cache=True, **_NJ)", "def step(x, g, S, hp, t):",
               f"    return inplace_inline({args})"])
