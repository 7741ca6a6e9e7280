"""The CUDA kernel generator: the same scalar rule definitions, wrapped in ``@cuda.jit`` kernels.

This module only writes text (it does not import ``numba.cuda``); :mod:`numbaopt.backends.cuda.runtime`
imports the modules it writes. For a chain of primitive rules and a dtype it writes ONE module (next to the CPU
kernels, in :func:`numbaopt.compiler.cache_dir`, named by the hash of its text) containing

* device functions made from the CPU prelude (``sqrt``, ``abs2``, ``sign``...: the same text, parsed
  and re-decorated as ``@cuda.jit(device=True)``) and each rule's ``step``/``prepare``/``reduce``/
  ``finish``, copied with the same literal rewriting as the CPU kernels (float32 stays float32);
* ``inplace(x, g, *S, hp, t[, fin, st])`` and ``outplace(x, g, *S, hp, t[, fin, st], xo, *O)``:
  grid-stride loops over one flat array, their per-element body produced by
  :func:`numbaopt.compiler.elements.element_lines` exactly as on the CPU;
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

Axis members (per-unit reductions) add ``axred_k{r}``/``maxred_k{r}`` and ``axfin_k{r}_{a}`` and per-unit tables
passed to every kernel (:mod:`.cuda_axes`); the passes run in chain order (``Plan.phases``).

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the same text is generated with smaller launch
constants, and :func:`leaf_ptr` turns an address into a NumPy view instead of a device pointer.
"""
from __future__ import annotations

import ast

import numpy as np

from .cpu import GENERATOR_VERSION
from .inliner import finish_source
from .axes import array_names
from .cuda_axes import axis_finish_kernels, axis_reduce_body, block_loads, index_lines, table_names, table_specs, \
    unit_commits
from .elements import element_lines, finish_call, load_lines, reduction_lines, rule_functions, scalar_loads
from .layout import ChainLayout, real_dtype, reduce_ops
from . import prelude
__all__ = ["generate_source", "raw_source", "Plan", "NO_STATUS", "CUDA_GENERATOR_VERSION"]

CUDA_GENERATOR_VERSION = "5"

#: ``st[0]`` when no rule blocked the step (int64 max: every real key is smaller)
NO_STATUS = (1 << 63) - 1

_KERN = "@cuda.jit(cache=True)"


def _device_functions(text: str, dev: str) -> list:
    """The functions of a CPU prelude, re-decorated as device functions (the same bodies)."""
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = []
            out += ["", dev, ast.unparse(node)]
    return out


class Plan:
    """Where each reducer's accumulators and finals sit in ``acc``/``fin`` (columns)."""

    def __init__(self, layout: ChainLayout):
        self.abase, self.fbase, self.nops, self.nfin, self.tree, self.units = {}, {}, {}, {}, {}, {}
        a = f = 0
        for r in layout.reducers:
            rule = layout.rules[r]
            self.abase[r], self.fbase[r] = a, f
            self.nops[r] = len(reduce_ops(rule))
            self.nfin[r] = len(type(rule).finals)
            self.tree[r] = type(rule).scope == "tree"
            self.units[r] = layout.scalar_units(r)  # scalar states: the new values follow the finals in fin
            a += self.nops[r]
            f += self.nfin[r] + len(self.units[r])
        self.acc_cols, self.fin_cols = max(a, 1), max(f, 1)
        self.ops = {r: reduce_ops(layout.rules[r]) for r in layout.reducers}
        self.status = any(("error" in type(layout.rules[r]).finals or "skip" in type(layout.rules[r]).finals)
                          for r in layout.reducers)
        #: the passes before the element kernel, in chain order: reductions and axis members (see .cuda_axes)
        self.phases = sorted(layout.reducers + layout.axis_rules)
        self.specs, self.xnames = table_specs(layout), table_names(layout)


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
    for j in range(len(plan.ops[r])):
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
    L = index_lines(layout, indent) + [f"{indent}gi = g[i]", f"{indent}xi = x[i]"]
    L += element_lines(layout, len(layout.rules), "gi", "xi", lambda k: f"S{k}[i]", True, indent)
    L.append(f"{indent}{write_x}[i] = xi - d")
    for k in range(layout.n_state):
        L.append(f"{indent}{write_s(k)}[i] = n_{k}")
    return L


def _state_writes(layout, plan, W, idx, row, indent):
    """The new scalar states (from ``fin``, after every check) into ``{W}u{u}[idx]``: one thread per leaf."""
    L = []
    for r in layout.reducers:
        rr = "0" if plan.tree[r] else row
        L += [f"{indent}{W}u{u}[{idx}] = fin[{rr}, {plan.fbase[r] + plan.nfin[r] + k}]"
              for k, u in enumerate(plan.units[r])]
    return L


def _single_kernels(layout, plan):
    S = array_names(layout, "S")  # element states, then (with unit states) unit arrays and the geometry row
    O = array_names(layout, "O")
    red = ["fin", "st"] if plan.phases else []
    X = plan.xnames  # an axis member's tables (see .cuda_axes)
    L = []
    for name, outp in (("inplace", False), ("outplace", True)):
        params = ["x", "g"] + S + ["hp", "t"] + red + X + (["xo"] + O if outp else [])
        L += [_KERN, f"def {name}({', '.join(params)}):"]
        if red:
            L += ["    if st[0] != NO_STATUS:", "        return"]
        L += ["    n = x.shape[0]"] + load_lines(layout, "    ", "t")
        L += _finals_lines(layout, plan, None, "    ", "0") + block_loads(layout, "Sg[0, {}]", "0", "    ")
        writes = _state_writes(layout, plan, "O" if outp else "S", "0", "0", "        ")
        if writes:
            L += ["    if cuda.grid(1) == 0:"] + writes
        L += unit_commits(layout, "O" if outp else "S", False, "    ")  # the elements read the finals, not these
        L += ["    i = cuda.grid(1)", "    stride = cuda.gridsize(1)", "    while i < n:"]
        L += _elem_body(layout, "        ", "xo" if outp else "x", (lambda k: O[k]) if outp else (lambda k: S[k]))
        L += ["        i += stride", ""]

    def loop(body, ind="    "):
        return ([f"{ind}i = cuda.grid(1)", f"{ind}stride = cuda.gridsize(1)", f"{ind}while i < n:",
                 f"{ind}    gi = g[i]", f"{ind}    xi = x[i]"] + [f"{ind}    {b}" for b in body]
                + [f"{ind}    i += stride"])

    for r in plan.phases:
        axis = r in layout.axis_rules
        params = ["x", "g"] + S + ["hp", "t", "fin", "st"] + ([] if axis else ["acc"]) + X
        L += [_KERN, f"def {'axred' if axis else 'reduce'}_k{r}({', '.join(params)}):", "    n = x.shape[0]",
              "    tid = cuda.threadIdx.x"]
        if r == plan.phases[0]:
            L += ["    if cuda.grid(1) == 0:", "        st[0] = NO_STATUS"]
        L += load_lines(layout, "    ", "t") + _finals_lines(layout, plan, r, "    ", "0")
        L += block_loads(layout, "Sg[0, {}]", "0", "    ")
        if axis:
            L += axis_reduce_body(layout, r, loop, "    ") + [""]
            continue
        L += scalar_loads(layout, r, lambda u: f"Su{u}[0]", "    ")
        L += reduction_lines(layout, r, _indexed_loop(layout, r, loop), "    ")  # finish runs in finish_r
        L += _block_reduce(plan, r, "    ", "0") + [""]
    return L


def _indexed_loop(layout, r, loop):
    """``loop`` with the unit indices of every element computed first when an axis member precedes member r."""
    if not any(q < r for q in layout.axis_rules):
        return loop
    return lambda body: loop(index_lines(layout, "") + body)


def _multi_kernels(layout, plan):
    A = array_names(layout, "A")
    red = ["fin", "st"] if plan.phases else []
    X = plan.xnames
    head = ["xaddr", "gaddr", "sizes", "offsets", "bleaf", "bstart"]

    def leaf_lines():
        out = ["    b = cuda.blockIdx.x", "    tid = cuda.threadIdx.x", "    j = bleaf[b]", "    n = sizes[j]",
               "    o = offsets[j]", "    start = bstart[b]", "    end = min(start + CHUNK, n)",
               "    x = leaf_ptr(xaddr[j], n, _C)", "    g = leaf_ptr(gaddr[j], n, _C)"]
        out += [f"    S{k} = A{k}[o:o + n]" for k in range(layout.n_state)]
        return out + block_loads(layout, "Ag[j, {}]", "j", "    ")

    L = [_KERN, f"def multi({', '.join(head + A + ['hp', 't'] + red + X)}):"]
    if red:
        L += ["    if st[0] != NO_STATUS:", "        return"]
    L += leaf_lines() + load_lines(layout, "    ", "t") + _finals_lines(layout, plan, None, "    ", "j")
    writes = _state_writes(layout, plan, "A", "j", "j", "        ")  # a leaf's scalar states: index j
    if writes:
        L += ["    if start == 0 and tid == 0:"] + writes
    L += unit_commits(layout, "A", True, "    ")
    L += ["    i = start + tid", "    while i < end:"]
    L += _elem_body(layout, "        ", "x", lambda k: f"S{k}")
    L += ["        i += TPB", ""]

    def loop(body, ind="    "):
        return ([f"{ind}i = start + tid", f"{ind}while i < end:", f"{ind}    gi = g[i]", f"{ind}    xi = x[i]"]
                + [f"{ind}    {b}" for b in body] + [f"{ind}    i += TPB"])

    for r in plan.phases:
        axis = r in layout.axis_rules
        params = head + A + ["hp", "t", "fin", "st"] + ([] if axis else ["acc"]) + X
        L += [_KERN, f"def {'maxred' if axis else 'mreduce'}_k{r}({', '.join(params)}):"]
        L += leaf_lines()
        if r == plan.phases[0]:
            L += ["    if b == 0 and tid == 0:", "        st[0] = NO_STATUS"]
        L += load_lines(layout, "    ", "t") + _finals_lines(layout, plan, r, "    ", "j")
        if axis:
            L += axis_reduce_body(layout, r, loop, "    ") + [""]
            continue
        L += scalar_loads(layout, r, lambda u: f"Au{u}[j]", "    ")
        L += reduction_lines(layout, r, _indexed_loop(layout, r, loop), "    ")
        L += _block_reduce(plan, r, "    ", "0" if plan.tree[r] else "j") + [""]
    return L


def _finish_kernels(layout, plan):
    L = []
    for r in layout.reducers:
        cls = type(layout.rules[r])
        U = [f"U{k}" for k in range(len(plan.units[r]))]
        # the scalar states of a row: its leaf's (leaf scope) or the first stepped leaf's copy (tree scope)
        L += [_KERN, f"def finish_k{r}({', '.join(['acc', 'hp', 'fin', 'st', 'nrow', 'first'] + U)}):",
              "    row = cuda.grid(1)", "    if row < nrow:"]
        for j, op in enumerate(plan.ops[r]):
            c = plan.abase[r] + j
            L += [f"        acc{r}_{j} = acc[row, {c}]",
                  f"        acc[row, {c}] = {'0.0' if op == 'sum' else '-INF'}"]
        idx = "first" if plan.tree[r] else "row"
        accs = [f"acc{r}_{j}" for j in range(len(plan.ops[r]))] + [f"np.float64({u}[{idx}])" for u in U]
        outs = [f"g{r}_{n}" for n in cls.finals] + [f"w{r}_{k}" for k in range(len(U))]
        L.append(f"        {', '.join(outs)}, = {finish_call(layout, r, accs)}")
        L += [f"        fin[row, {plan.fbase[r] + plan.nfin[r] + k}] = w{r}_{k}" for k in range(len(U))]
        for m, n in enumerate(cls.finals):
            L.append(f"        fin[row, {plan.fbase[r] + m}] = g{r}_{n}")
        key = f"({r} << 40) + (row << 1)"
        if "error" in cls.finals:
            L += [f"        if g{r}_error != 0.0:", f"            cuda.atomic.min(st, 0, {key})"]
        if "skip" in cls.finals:
            L += [f"        if g{r}_skip != 0.0:", f"            cuda.atomic.min(st, 0, {key} + 1)"]
        L.append("")
    return L


def generate_source(rule, dtype, sim: bool, tpb: int, chunk: int) -> str:
    """The full source of the CUDA module for ``rule`` (a chain without stages) and ``dtype``; ``sim``
    generates for Numba's simulator, ``tpb``/``chunk`` are the launch constants. The kernels' calls to the
    device functions are written out (:mod:`.inliner`), as on the CPU."""
    return finish_source(raw_source(rule, dtype, sim, tpb, chunk))


def raw_source(rule, dtype, sim: bool, tpb: int, chunk: int) -> str:
    """:func:`generate_source` before the calls are written out."""
    dtype = np.dtype(dtype)
    layout = ChainLayout(rule)
    if layout.accum is not None or layout.master is not None:
        raise NotImplementedError("the CUDA backend does not run AccumGrad or MixedPrecision yet")
    layout.refuse_axes("the CUDA backend", scalar=False, axes=False)
    plan = Plan(layout)
    dev = "@cuda.jit(device=True)" if sim else "@cuda.jit(device=True, forceinline=True)"
    out = [f"# generated by numbaopt.compiler.cuda v{CUDA_GENERATOR_VERSION} (cpu v{GENERATOR_VERSION}); do not edit",
           f"# chain: {' -> '.join(type(r).__name__ for r in layout.rules) or '(identity)'}; dtype {dtype.name}; "
           f"{'simulator' if sim else 'device'}",
           "import math", "import numpy as np", "from numba import cuda",
           "from numbaopt.backends.cuda.runtime import leaf_ptr", "",
           "INF = math.inf", f"NO_STATUS = {NO_STATUS}", f"TPB = {tpb}", f"CHUNK = {chunk}",
           f"_R = np.{real_dtype(dtype).name}", f"_C = np.{dtype.name}", "_Z = _C(0)"]
    out += _device_functions(prelude.COMMON, dev)
    out += _device_functions(prelude.COMPLEX if dtype.kind == "c" else prelude.REAL, dev)
    out += rule_functions(layout, dev)
    body = _single_kernels(layout, plan) + _multi_kernels(layout, plan) + _finish_kernels(layout, plan)
    body += axis_finish_kernels(layout, _KERN)
    return "\n".join(out) + "\n\n\n" + "\n".join(body) + "\n"
