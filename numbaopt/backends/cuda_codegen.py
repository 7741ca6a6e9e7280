"""The CUDA kernel generator: the same scalar rule definitions, wrapped in ``@cuda.jit`` kernels.

This module imports ``numba.cuda``; :mod:`numbaopt.backends.cuda` imports it lazily, so importing
numbaopt never does. For a chain of primitive rules and a dtype it writes ONE module (next to the CPU
kernels, in :func:`numbaopt.codegen.cache_dir`, named by the hash of its text) containing

* device functions made from the CPU prelude (``sqrt``, ``abs2``, ``sign``...: the same text, parsed
  and re-decorated as ``@cuda.jit(device=True)``) and each rule's ``step``/``prepare``/``reduce``/
  ``finish``, copied with the same literal rewriting as the CPU kernels (float32 stays float32);
* ``inplace(x, g, *S, hp, t[, fin, st])`` and ``outplace(x, g, *S, hp, t[, fin, st], xo, *O)``:
  grid-stride loops over one flat array, their per-element body produced by
  :func:`numbaopt.codegen.element_lines` exactly as on the CPU;
* ``multi(xaddr, gaddr, sizes, offsets, bleaf, bstart, *A, hp, t[, fin, st])``: many leaves in ONE
  launch. Parameters and gradients are reached through tables of device addresses; the state lives in
  flat arenas (leaf ``j`` at ``offsets[j]``); block ``b`` updates elements ``bstart[b]`` to
  ``bstart[b] + CHUNK`` of leaf ``bleaf[b]`` (a chunk table built once per group);
* for each rule ``r`` with a reduction: ``reduce_kr``/``mreduce_kr`` (a dry pass of the chain up to rule r,
  contributions accumulated in float64 per thread, summed or maxed per block in shared memory, then one
  atomic per block into ``acc[row, col]``) and ``finish_kr`` (one thread per row: the rule's ``finish``
  in float64, finals written to ``fin[row, col]``, the accumulators reset for the next step, and a
  skip/error reported with an atomic minimum into ``st[0]``). A row is a leaf (``scope = "leaf"``) or
  the whole group (``scope = "tree"``).

``st[0]`` holds :data:`NO_STATUS` when every rule lets the step happen; otherwise the key
``(r << 40) + (row << 1) + kind`` of the first blocking rule and row (kind 0 = error, 1 = skip), which
gives the same precedence as the CPU kernels' early returns. Element kernels return at once when it is
set, so nothing is written.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the same text is generated with smaller launch
constants, and :func:`leaf_ptr` turns an address into a NumPy view instead of a device pointer.
"""
from __future__ import annotations

import ast
import ctypes
import threading

import numpy as np
from numba import cuda

from .. import codegen
from ..codegen import ChainLayout, element_lines, _load_lines, _reduction_lines, _reduce_ops, real_dtype

CUDA_GENERATOR_VERSION = "1"

#: ``st[0]`` when no rule blocked the step (int64 max: every real key is smaller)
NO_STATUS = (1 << 63) - 1


def simulator() -> bool:
    """Whether Numba's CUDA simulator is active (``NUMBA_ENABLE_CUDASIM=1`` before importing numba)."""
    return "simulator" in getattr(cuda.jit, "__module__", "")


SIM = simulator()
#: threads per block, and elements per block in the multi-leaf kernels (small in the simulator,
#: where every thread is a Python thread)
TPB = 16 if SIM else 256
CHUNK = TPB * (2 if SIM else 8)

if SIM:
    def leaf_ptr(addr, n, dtype):
        """Simulator: the NumPy array of ``n`` items of ``dtype`` at host address ``addr``."""
        dt = np.dtype(dtype)
        n = int(n)
        if n == 0:
            return np.empty(0, dtype=dt)
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(int(addr))
        return np.frombuffer(buf, dtype=dt)
else:
    from numba.cuda import types as _ctypes_nb
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def leaf_ptr(typingctx, addr, n, dtype):
        """``leaf_ptr(address, n, np.float32) -> float32*`` in a kernel (``n`` is for the simulator)."""
        if isinstance(dtype, _ctypes_nb.NumberClass):
            elem = dtype.instance_type
        elif isinstance(dtype, _ctypes_nb.DType):
            elem = dtype.dtype
        else:
            return None
        if not isinstance(addr, _ctypes_nb.Integer):
            return None
        sig = _ctypes_nb.CPointer(elem)(addr, n, dtype)

        def gen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(_ctypes_nb.CPointer(elem)))

        return sig, gen


@cuda.jit(cache=True)
def fill(a, v):
    """``a[:] = v`` on the device (state initialisation without a host buffer)."""
    i = cuda.grid(1)
    s = cuda.gridsize(1)
    while i < a.shape[0]:
        a[i] = v
        i += s


_DEV = "@cuda.jit(device=True)" if SIM else "@cuda.jit(device=True, forceinline=True)"
_KERN = "@cuda.jit(cache=True)"


def _device_functions(prelude: str) -> list:
    """The functions of a CPU prelude, re-decorated as device functions (the same bodies)."""
    out = []
    for node in ast.parse(prelude).body:
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = []
            out += ["", _DEV, ast.unparse(node)]
    return out


class Plan:
    """Where each reducer's accumulators and finals sit in ``acc``/``fin`` (columns)."""

    def __init__(self, layout: ChainLayout):
        self.abase, self.fbase, self.nops, self.nfin, self.tree = {}, {}, {}, {}, {}
        a = f = 0
        for r in layout.reducers:
            rule = layout.rules[r]
            self.abase[r], self.fbase[r] = a, f
            self.nops[r] = len(_reduce_ops(rule))
            self.nfin[r] = len(type(rule).finals)
            self.tree[r] = type(rule).scope == "tree"
            a += self.nops[r]
            f += self.nfin[r]
        self.acc_cols, self.fin_cols = max(a, 1), max(f, 1)
        self.ops = {r: _reduce_ops(layout.rules[r]) for r in layout.reducers}
        self.status = any(("error" in type(layout.rules[r]).finals or "skip" in type(layout.rules[r]).finals)
                          for r in layout.reducers)


def _finals_lines(layout, plan, upto, indent, row):
    """Load the finals of reducers before ``upto`` (all when None) into ``f{r}_{name}``."""
    out = []
    for r in layout.reducers:
        if upto is not None and r >= upto:
            break
        rr = "0" if plan.tree[r] else row
        for m, n in enumerate(type(layout.rules[r]).finals):
            out.append(f"{indent}f{r}_{n} = _R(fin[{rr}, {plan.fbase[r] + m}])")
    return out


def _block_reduce(plan, r, indent, row):
    """Combine the threads' ``acc{r}_{j}`` in shared memory; one atomic per block."""
    L = []
    for j, op in enumerate(plan.ops[r]):
        L += [f"{indent}sh{j} = cuda.shared.array(TPB, np.float64)",
              f"{indent}sh{j}[tid] = acc{r}_{j}"]
    L += [f"{indent}cuda.syncthreads()", f"{indent}s = TPB // 2", f"{indent}while s > 0:",
          f"{indent}    if tid < s:"]
    for j, op in enumerate(plan.ops[r]):
        L.append(f"{indent}        sh{j}[tid] = sh{j}[tid] + sh{j}[tid + s]" if op == "sum"
                 else f"{indent}        sh{j}[tid] = max(sh{j}[tid], sh{j}[tid + s])")
    L += [f"{indent}    cuda.syncthreads()", f"{indent}    s //= 2", f"{indent}if tid == 0:"]
    for j, op in enumerate(plan.ops[r]):
        fn = "add" if op == "sum" else "max"
        L.append(f"{indent}    cuda.atomic.{fn}(acc, ({row}, {plan.abase[r] + j}), sh{j}[0])")
    return L


def _elem_body(layout, indent, write_x, write_s):
    L = [f"{indent}gi = g[i]", f"{indent}xi = x[i]"]
    L += element_lines(layout, len(layout.rules), "gi", "xi", lambda k: f"S{k}[i]", True, indent)
    L.append(f"{indent}{write_x}[i] = xi - d")
    for k in range(layout.n_state):
        L.append(f"{indent}{write_s(k)}[i] = n_{k}")
    return L


def _single_kernels(layout, plan):
    S = [f"S{k}" for k in range(layout.n_state)]
    O = [f"O{k}" for k in range(layout.n_state)]
    red = ["fin", "st"] if layout.reducers else []
    L = []
    for name, outp in (("inplace", False), ("outplace", True)):
        params = ["x", "g"] + S + ["hp", "t"] + red + (["xo"] + O if outp else [])
        L += [_KERN, f"def {name}({', '.join(params)}):"]
        if red:
            L += ["    if st[0] != NO_STATUS:", "        return"]
        L += ["    n = x.shape[0]"] + _load_lines(layout, "    ", "t")
        L += _finals_lines(layout, plan, None, "    ", "0")
        L += ["    i = cuda.grid(1)", "    stride = cuda.gridsize(1)", "    while i < n:"]
        L += _elem_body(layout, "        ", "xo" if outp else "x", (lambda k: O[k]) if outp else (lambda k: S[k]))
        L += ["        i += stride", ""]
    for r in layout.reducers:
        params = ["x", "g"] + S + ["hp", "t", "fin", "st", "acc"]
        L += [_KERN, f"def reduce_k{r}({', '.join(params)}):", "    n = x.shape[0]", "    tid = cuda.threadIdx.x"]
        if r == layout.reducers[0]:
            L += ["    if cuda.grid(1) == 0:", "        st[0] = NO_STATUS"]
        L += _load_lines(layout, "    ", "t") + _finals_lines(layout, plan, r, "    ", "0")

        def loop(body):
            return (["    i = cuda.grid(1)", "    stride = cuda.gridsize(1)", "    while i < n:",
                     "        gi = g[i]", "        xi = x[i]"] + ["        " + b for b in body]
                    + ["        i += stride"])

        L += _reduction_lines(layout, r, loop, "    ")[:-1]  # the finish call runs in finish_r
        L += _block_reduce(plan, r, "    ", "0") + [""]
    return L


def _multi_kernels(layout, plan):
    A = [f"A{k}" for k in range(layout.n_state)]
    red = ["fin", "st"] if layout.reducers else []
    head = ["xaddr", "gaddr", "sizes", "offsets", "bleaf", "bstart"]

    def leaf_lines():
        out = ["    b = cuda.blockIdx.x", "    tid = cuda.threadIdx.x", "    j = bleaf[b]", "    n = sizes[j]",
               "    o = offsets[j]", "    start = bstart[b]", "    end = min(start + CHUNK, n)",
               "    x = leaf_ptr(xaddr[j], n, _C)", "    g = leaf_ptr(gaddr[j], n, _C)"]
        out += [f"    S{k} = A{k}[o:o + n]" for k in range(layout.n_state)]
        return out

    L = [_KERN, f"def multi({', '.join(head + A + ['hp', 't'] + red)}):"]
    if red:
        L += ["    if st[0] != NO_STATUS:", "        return"]
    L += leaf_lines() + _load_lines(layout, "    ", "t") + _finals_lines(layout, plan, None, "    ", "j")
    L += ["    i = start + tid", "    while i < end:"]
    L += _elem_body(layout, "        ", "x", lambda k: f"S{k}")
    L += ["        i += TPB", ""]
    for r in layout.reducers:
        L += [_KERN, f"def mreduce_k{r}({', '.join(head + A + ['hp', 't', 'fin', 'st', 'acc'])}):"]
        L += leaf_lines()
        if r == layout.reducers[0]:
            L += ["    if b == 0 and tid == 0:", "        st[0] = NO_STATUS"]
        L += _load_lines(layout, "    ", "t") + _finals_lines(layout, plan, r, "    ", "j")

        def loop(body):
            return (["    i = start + tid", "    while i < end:", "        gi = g[i]", "        xi = x[i]"]
                    + ["        " + b for b in body] + ["        i += TPB"])

        L += _reduction_lines(layout, r, loop, "    ")[:-1]
        L += _block_reduce(plan, r, "    ", "0" if plan.tree[r] else "j") + [""]
    return L


def _finish_kernels(layout, plan):
    L = []
    for r in layout.reducers:
        cls = type(layout.rules[r])
        L += [_KERN, f"def finish_k{r}(acc, hp, fin, st, nrow):", "    row = cuda.grid(1)", "    if row < nrow:"]
        for j, op in enumerate(plan.ops[r]):
            c = plan.abase[r] + j
            L += [f"        acc{r}_{j} = acc[row, {c}]",
                  f"        acc[row, {c}] = {'0.0' if op == 'sum' else '-INF'}"]
        L += _reduction_lines(layout, r, lambda body: [], "        ", init=False)
        for m, n in enumerate(cls.finals):
            L.append(f"        fin[row, {plan.fbase[r] + m}] = g{r}_{n}")
        key = f"({r} << 40) + (row << 1)"
        if "error" in cls.finals:
            L += [f"        if g{r}_error != 0.0:", f"            cuda.atomic.min(st, 0, {key})"]
        if "skip" in cls.finals:
            L += [f"        if g{r}_skip != 0.0:", f"            cuda.atomic.min(st, 0, {key} + 1)"]
        L.append("")
    return L


def _reduce_wrapper(f, r_i):
    """``reduce_t_r``: the rule's ``reduce`` returning a tuple (explicit arguments: no ``*args`` on CUDA)."""
    from ..rule import step_args
    args = ", ".join(step_args(f))
    single = codegen._reduce_returns_scalar(f)
    return ["", _DEV, f"def reduce_t_{r_i}({args}):",
            f"    return (reduce_{r_i}({args}),)" if single else f"    return reduce_{r_i}({args})"]


def generate_source(rules, dtype) -> str:
    """The full source of the CUDA module for ``rules`` (primitive rules) and ``dtype``."""
    dtype = np.dtype(dtype)
    rdt = real_dtype(dtype)
    layout = ChainLayout(rules)
    plan = Plan(layout)
    out = [f"# generated by numbaopt cuda codegen v{CUDA_GENERATOR_VERSION} (cpu v{codegen.GENERATOR_VERSION}); "
           "do not edit",
           f"# chain: {' -> '.join(type(r).__name__ for r in rules)}; dtype {dtype.name}; "
           f"{'simulator' if SIM else 'device'}",
           "import math", "import numpy as np", "from numba import cuda",
           "from numbaopt.backends.cuda_codegen import leaf_ptr", "",
           "INF = math.inf", f"NO_STATUS = {NO_STATUS}", f"TPB = {TPB}", f"CHUNK = {CHUNK}",
           f"_R = np.{rdt.name}", f"_C = np.{dtype.name}", "_Z = _C(0)"]
    out += _device_functions(codegen.PRELUDE_COMMON)
    out += _device_functions(codegen.PRELUDE_COMPLEX if dtype.kind == "c" else codegen.PRELUDE_REAL)
    for r_i, r in enumerate(rules):
        cls = type(r)
        for fname, literals in (("step", True), ("reduce", True), ("prepare", True), ("finish", False)):
            f = getattr(cls, fname, None)
            if f is None or (fname == "prepare" and not cls.scalars):
                continue
            out += ["", _DEV, codegen._renamed_source(f, f"{fname}_{r_i}", literals)]
            if fname == "reduce":
                out += _reduce_wrapper(f, r_i)
    body = _single_kernels(layout, plan) + _multi_kernels(layout, plan) + _finish_kernels(layout, plan)
    return "\n".join(out) + "\n\n\n" + "\n".join(body) + "\n"


_lock = threading.RLock()
_modules: dict = {}


def kernels(rules, dtype):
    """The generated CUDA module for ``rules`` and ``dtype`` (imported once per process)."""
    dtype = np.dtype(dtype)
    key = (tuple(codegen.rule_key(r) for r in rules), dtype.str)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            mod = codegen.import_generated(generate_source(rules, dtype), prefix="cuda_")
            mod.plan = Plan(ChainLayout(rules))
            _modules[key] = mod
    return mod
