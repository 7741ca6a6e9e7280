"""The CPU emitter: the source of one generated module per (chain, compute dtype).

The module holds the prelude, each member's functions (:func:`.elements.rule_functions`) and these
kernels (``S`` = the chain's state arrays, ``hp`` = hyperparameters, ``C`` = step counters, see
:mod:`.layout`):

one array (1-D contiguous), returning a status (:data:`.layout.STEPPED` ...), counters advanced in ``C``;
a gradient that overlaps an array the call writes (other than by being that array) returns
:data:`.layout.ALIASED` before anything is read or written (the caller steps on a copy of the gradient):

* ``inplace(x, g, *S, hp, C)``, ``inplace_par`` (``prange``; bitwise the same);
* ``outplace(x, g, *S, hp, C, xo, *O)``, ``outplace_par``: reads the inputs, writes ``xo`` and ``O``
  (every element, also when the step is skipped or only accumulates);
* ``step(x, g, S, hp, t)`` and ``step_inline`` (inlined into compiled callers) for user ``@njit`` code and the
  compiled loops, for chains without an AccumGrad (``t`` is the step number; nothing is counted).

many leaves (trees; leaves by data address, state in flat arenas ``A`` at ``offsets``, counters ``C`` of
shape (4, leaves), ``act[j]`` = 1 to step leaf j, 0 to leave it (a pure step copies its state), 2 to leave
it entirely (another call handles it); ``F``/``P`` = per-leaf finals and partial accumulators, float64):

* ``partial_{r}``, ``combine_{r}``, ``finish_row_{r}``, ``put_finals_{r}``, ``finish_leaves_{r}``: the
  phases of reduction rule r, so that a tree-scope reduction can span several groups (the pipeline
  combines the partials of every group, in leaf order, before ``finish``);
* ``reductions(...) -> status``: every reduction of the chain over one group, no writes;
* ``apply(...)`` / ``apply_out(xaddr, gaddr, xoaddr, sizes, offsets, *A, *B, hp, C, act, F)``: the element
  pass with the finals in ``F``, writing in place / into the new arenas ``B`` and new parameters;
* ``multi`` / ``multi_out``: ``reductions`` then ``apply``'s code in ONE call (a step that nothing else can
  refuse; a chain without reductions calls ``apply``/``apply_out`` directly).

Reduction passes accumulate in float64, in :data:`LANES` partial sums combined in a fixed order; they are
serial in every kernel, so threaded and serial kernels give the same bits. Every reduction of a call runs
before its first write: a refusal (status ``ERROR_BASE + r``) leaves everything as it was.
"""
from __future__ import annotations

import numpy as np

from .axes import array_names, axis_phase, geo_loop, memo_loop, unit_copies, unit_views, unit_writes
from .cpu_reduce import (TG, fin_src, has, head, in_leaf, inline_reducers, lane_reduction, reduce_phase, reductions,
                         split)
from .elements import LANES, element_lines, finals_lines, finish_call, load_lines, rule_functions, scalar_loads
from .layout import ALIASED, ERROR_BASE, ChainLayout, real_dtype, reduce_ops
from . import prelude
from .inliner import finish_source
from .intrinsics import NO_NRT

__all__ = ["generate_source", "raw_source", "LANES", "GENERATOR_VERSION"]

#: bump when the generated text changes meaning (it is part of the cache directory's name)
GENERATOR_VERSION = "5"

#: the options of the serial single-array kernels (``inplace``, ``outplace``). They allocate nothing and make
#: no views: every array is the caller's, alive for the call, so they need no reference counting. Without NRT
#: a call on 16 elements costs ~0.6 instead of ~1.0 us (the atomic increments and decrements of the array
#: arguments; a branch before the element loop, such as the aliasing check, adds more). The threaded kernels
#: keep NRT (their parfor runtime uses it), and so do the tree kernels (``carray`` needs it). ``_nrt`` is
#: Numba's own flag; a Numba without it keeps the default.
_KERNEL_OPTIONS = "dict(_NJ, _nrt=False)" if NO_NRT else "_NJ"

#: the threaded kernels' ``parallel=`` option: Numba's parallel-loop pass without its loop fusion and without
#: turning NumPy calls into loops on threads. Each kernel has one loop on threads per element pass, written where it
#: belongs (``prange``); fusion only searched for neighbours to merge (Numba's diagnostics for Adafactor's kernel,
#: with its seven loops on threads before: "Parallel structure is already optimal"; about 0.5 s of its ~6.5 s
#: compile), and an axis member's ``np.zeros`` totals (a few rows or columns) would each become a loop on threads
#: of its own, compiled as a function of its own (~0.15 s each).
_PARALLEL_OPTIONS = "dict(fusion=False, numpy=False)"

# --------------------------------------------------------------------------------------------------
# pieces


def _loop(layout: ChainLayout, kind: str, rng: str, outplace: bool, indent: str, G: str = "", flat=False,
          memo=None) -> list:
    """The element loop of one kind: ``full`` (the whole chain, parameter written), ``accumulate`` (the
    members before the AccumGrad, then the sum), ``reset`` (those members, then the sum cleared: a cycle
    whose step was skipped) or ``copy`` (a pure step that changes nothing). With axis members (``G`` reads
    the geometry row) the full loop runs over the geometry and writes the new unit states after it; when an
    earlier pass of the kernel body kept the step through the last axis member (``memo``, see
    :func:`.axes.geo_reduction`), it is a flat loop from there."""
    ind = indent + "    "
    L = [f"{indent}for i in {rng}(n):"]
    if kind == "copy":
        L += [f"{ind}xo[i] = x[i]"] + [f"{ind}O{k}[i] = S{k}[i]" for k in range(layout.n_state)]
        return L + (unit_copies(layout, "S", "O", indent) if layout.units else [])
    if kind == "full" and layout.axis_rules and not flat:
        W = "O" if outplace else "S"
        if memo and memo.get("D"):
            writes = [f"{'xo' if outplace else 'x'}[i] = xi - d"]
            writes += [f"{W}{k}[i] = n_{k}" for k in range(layout.n_state)]
            return memo_loop(layout, len(layout.rules), writes, indent, rng, True) + unit_writes(layout, W, indent)
        body = [line[len(ind):] for line in _loop(layout, kind, rng, outplace, indent, flat=True)[1:]]
        return geo_loop(layout, body, indent, G, rng=rng) + unit_writes(layout, W, indent)
    L += [f"{ind}gi = g[i]", f"{ind}xi = x[i]"]
    upto = len(layout.rules) if kind == "full" else layout.accum
    L += element_lines(layout, upto, "gi", "xi", lambda k: f"S{k}[i]", True, ind)
    W = "O" if outplace else "S"
    if kind == "full":
        L.append(f"{ind}{'xo' if outplace else 'x'}[i] = xi - d")
        return L + [f"{ind}{W}{k}[i] = n_{k}" for k in range(layout.n_state)]
    for k in range(layout.n_state):
        part = layout.state_part(k)
        if part == "prefix":
            L.append(f"{ind}{W}{k}[i] = n_{k}")
        elif part == "acc":
            L.append(f"{ind}{W}{k}[i] = {f'S{k}[i] + d' if kind == 'accumulate' else '_Z'}")
        elif outplace:
            L.append(f"{ind}O{k}[i] = S{k}[i]")
    if outplace:
        L.append(f"{ind}xo[i] = xi")
    # the members with unit states come after the AccumGrad: a pure call that does not step copies them, as "copy"
    return L + (unit_copies(layout, "S", "O", indent) if outplace and layout.units else [])


def _copy_geo(src: str, dst: str, row: str, ind: str) -> list:
    """Copy geometry row ``row`` of ``{src}g`` into ``{dst}g`` (a pure step's new state keeps the leaf's view)."""
    return [f"{ind}for _k in range({src}g.shape[1]):", f"{ind}    {dst}g[{row}, _k] = {src}g[{row}, _k]"]


# --------------------------------------------------------------------------------------------------
# one array


def _alias_lines(written: list) -> list:
    """``return ALIASED`` when the gradient ``g`` shares memory with an array the kernel writes other than by being
    that array (an element loop reads g[i] before writing w[i] at the same i, so g is w is safe, but a shifted view
    would read elements the loop has already written). Written out rather than called: Adam's three inlined calls
    of a helper cost ~80 ms of its ~0.42 s compile (Numba's IR inlining copies the helper per call)."""
    L = ["    _gn = g.shape[0] * g.itemsize", "    _ga = data_address(g)"]
    for w in written:
        L += [f"    _wn = {w}.shape[0] * {w}.itemsize", f"    _wa = data_address({w})",
              "    if _gn and _wn and not (_ga == _wa and _gn == _wn) and _ga < _wa + _wn and _wa < _ga + _gn:",
              f"        return {ALIASED}"]
    return L


def _single(layout: ChainLayout, name: str, par: bool, outplace: bool, counters: bool = True,
            inline: bool = False) -> list:
    S = array_names(layout, "S")
    O = array_names(layout, "O")
    params = ["x", "g"] + S + ["hp", "C" if counters else "t"] + (["xo"] + O if outplace else [])
    G = "Sg[0, {}]"
    axis = bool(layout.axis_rules)
    units = layout.units
    if any(type(layout.rules[r]).matrix is not None for r in layout.axis_rules):
        par = False  # a matrix rule's array code: parallel=True would turn its NumPy reductions into parfors
    if inline:
        deco = '@njit(inline="always", **_NJ)'
    else:
        deco = "@njit(cache=True, parallel=_PAR, **_NJ)" if par else (
            "@njit(cache=True, **_NJ)" if axis else "@njit(cache=True, **_NJK)")
    rng = "prange" if par else "range"
    L = [deco, f"def {name}({', '.join(params)}):", "    n = x.shape[0]"]
    memo = {}  # the element steps kept by the first pass after the last axis member (axes.geo_reduction)
    if counters:  # before anything is read or written: a gradient overlapping what this call writes
        written = [a for a in ((["xo"] + O) if outplace else (["x"] + S)) if not a.endswith("g")]
        L += _alias_lines(written)
    L += ["    t = C[0] + 1", "    tp = C[1] + 1"] if counters else ["    tp = t"]
    L += load_lines(layout, "    ", "t", "tp")
    pre, suf = split(layout)

    def reduce(r, ind, on_skip):
        if r in layout.axis_rules:
            return axis_phase(layout, r, ind, G, lambda u: f"Su{u}.dtype")
        out = scalar_loads(layout, r, lambda u: f"Su{u}[0]", ind) + lane_reduction(layout, r, ind, G, memo)
        fins = [f"g{r}_{n}" for n in type(layout.rules[r]).finals] + [f"w{r}_{k}" for k in range(layout.n_scalar(r))]
        accs = [f"acc{r}_{c}" for c in range(len(reduce_ops(layout.rules[r])))]
        accs += [f"np.float64(Su{u}[0])" for u in layout.scalar_units(r)]
        out.append(f"{ind}{', '.join(fins)}, = {finish_call(layout, r, accs)}")
        if has(layout, r, "error"):
            out += [f"{ind}if g{r}_error != 0.0:", f"{ind}    return {ERROR_BASE + r}"]
        if has(layout, r, "skip"):
            out += [f"{ind}if g{r}_skip != 0.0:"] + on_skip(ind + "    ")
        out += finals_lines(layout, [r], ind, lambda q, m: f"g{q}_{type(layout.rules[q]).finals[m]}")
        return out

    def skip_all(ind):
        out = _loop(layout, "copy", rng, True, ind) if outplace else []
        if outplace and units:
            out += _copy_geo("S", "O", "0", ind)
        return out + ([f"{ind}C[3] += 1"] if counters else []) + [f"{ind}return 1"]

    # the axis members after an AccumGrad run on the completing calls only, on the cycle's mean
    axis_suf = [r for r in layout.axis_rules if layout.accum is not None and r > layout.accum]
    for r in sorted(pre + [r for r in layout.axis_rules if r not in axis_suf]):
        L += reduce(r, "    ", skip_all)

    def keep_geo(ind):  # a pure call that does not step keeps the view (its unit states: _loop copies them)
        return _copy_geo("S", "O", "0", ind) if outplace and units else []

    if layout.accum is not None:
        a = layout.accum
        L += [f"    if C[2] + 1 < h{a}_n:"] + _loop(layout, "accumulate", rng, outplace, "        ")
        L += keep_geo("        ")
        L += ["        C[1] += 1", "        C[2] += 1", "        return -1", "    sskip = False"]
        guard = False  # once a member may skip, the later reductions run only when it did not
        for r in sorted(suf + axis_suf):
            if guard:
                L += ["    if not sskip:"] + reduce(r, "        ", lambda ind: [f"{ind}sskip = True"])
            else:
                L += reduce(r, "    ", lambda ind: [f"{ind}sskip = True"])
            guard = guard or has(layout, r, "skip")
        if any(has(layout, r, "skip") for r in suf):
            L += ["    if sskip:"] + _loop(layout, "reset", rng, outplace, "        ") + keep_geo("        ")
            L += ["        C[1] += 1", "        C[2] = 0", "        C[3] += 1", "        return -2"]
    L += _loop(layout, "full", rng, outplace, "    ", G, memo=memo)
    W = "O" if outplace else "S"
    L += [f"    {W}u{u}[0] = w{r}_{k}" for r in layout.reducers for k, u in enumerate(layout.scalar_units(r))]
    if outplace and units:
        L += _copy_geo("S", "O", "0", "    ")
    if counters:
        L += ["    C[0] += 1", "    C[1] += 1", "    C[2] = 0"]
    return L + ["    return 0"]


# --------------------------------------------------------------------------------------------------
# many leaves


def _apply(layout, outplace: bool) -> list:
    A = array_names(layout, "A")
    B = array_names(layout, "B")
    lead = ["xaddr", "gaddr"] + (["xoaddr"] if outplace else []) + ["sizes", "offsets"] + A + (B if outplace else [])
    name = "apply_out" if outplace else "apply"
    L = ["@njit(cache=True, **_NJ)", f"def {name}({', '.join(lead + ['hp', 'C', 'act', 'F'])}):",
         "    for j in range(sizes.shape[0]):"]
    if outplace:
        L += ["        if act[j] == 2:", "            continue", "        if act[j] == 0:"]
        L += head(layout, "            ", views=False)
        # element loops, not slice assignment: Numba compiles a slice copy into seconds of array machinery
        if layout.n_state:
            L += ["            for i in range(o, o + n):"]
            L += [f"                B{k}[i] = A{k}[i]" for k in range(layout.n_state)]
        if layout.units:
            L += unit_views(layout, "A", "S", TG, "            ") + unit_views(layout, "B", "O", TG, "            ")
            L += unit_copies(layout, "S", "O", "            ")
            L += _copy_geo("A", "B", "j", "            ")
        L += ["            continue"]
    else:
        L += ["        if act[j] != 1:", "            continue"]
    L += head(layout, "        ", out=outplace) + load_lines(layout, "        ", "t", "tp")
    inline = inline_reducers(layout)
    L += finals_lines(layout, [r for r in layout.reducers if r not in inline], "        ", fin_src(layout))
    pre, suf = split(layout)
    for r in pre:
        if has(layout, r, "skip"):
            L += [f"        if f{r}_skip != 0.0:"]
            L += _loop(layout, "copy", "range", True, "            ") if outplace else []
            if outplace and layout.units:
                L += _copy_geo("A", "B", "j", "            ")
            L += ["            C[3, j] += 1", "            continue"]
    if layout.accum is not None:
        a = layout.accum
        # the view of a leaf not stepped (its unit states: _loop copies them)
        keep = _copy_geo("A", "B", "j", "            ") if outplace and layout.units else []
        L += [f"        if C[2, j] + 1 < h{a}_n:"] + _loop(layout, "accumulate", "range", outplace, "            ")
        L += keep + ["            C[1, j] += 1", "            C[2, j] += 1", "            continue"]
        sk = [r for r in suf if has(layout, r, "skip")]
        if sk:
            L += [f"        if {' or '.join(f'f{r}_skip != 0.0' for r in sk)}:"]
            L += _loop(layout, "reset", "range", outplace, "            ") + keep
            L += [f"            {c}" for c in ("C[1, j] += 1", "C[2, j] = 0", "C[3, j] += 1", "continue")]
    memo = {}
    L += in_leaf(layout, len(layout.rules), "        ", memo)
    L += _loop(layout, "full", "range", outplace, "        ", TG, memo=memo)
    W = "O" if outplace else "S"
    for r in layout.reducers:  # the new scalar states, after the finals in F (inline reductions have none)
        nf = len(type(layout.rules[r]).finals)
        L += [f"        {W}u{u}[0] = F[j, {layout.fin_cols[r] + nf + k}]" for k, u in enumerate(layout.scalar_units(r))]
    if outplace and layout.units:
        L += _copy_geo("A", "B", "j", "        ")
    L += ["        C[0, j] += 1", "        C[1, j] += 1", "        C[2, j] = 0"]
    return L + ["    return 0"]


def _fused(layout, outplace: bool) -> list:
    """``multi``/``multi_out``: the reductions, then the element pass, in one call. The element pass's code is
    written into it rather than called: a compiled call links the callee's code into the caller, and Numba then
    optimises the linked whole again (as long as the callee's own optimisation: 0.2-2 s a chain, cold). The
    reductions are called: compiled once, shared by ``multi`` and ``multi_out`` (written into both, their
    front end would compile twice). ``apply``/``apply_out`` compile only where a step calls them on their own
    (reductions across groups), and a chain without reductions calls them instead of this."""
    B = array_names(layout, "B")
    A = array_names(layout, "A")
    if outplace:
        params = ["xaddr", "gaddr", "xoaddr", "sizes", "offsets"] + A + B + ["hp", "C", "act", "F", "P"]
    else:
        params = ["xaddr", "gaddr", "sizes", "offsets"] + A + ["hp", "C", "act", "F", "P"]
    red = ", ".join(["xaddr", "gaddr", "sizes", "offsets"] + A + ["hp", "C", "act", "F", "P"])
    L = ["@njit(cache=True, **_NJ)", f"def {'multi_out' if outplace else 'multi'}({', '.join(params)}):"]
    if layout.reducers:
        L += [f"    status = reductions({red})", "    if status != 0:", "        return status"]
    app = _apply(layout, outplace)
    assert app[1].startswith("def ")
    return L + app[2:]


# --------------------------------------------------------------------------------------------------
# the module


def generate_source(rule, dtype) -> str:
    """The full source of the generated module for ``rule`` (a rule or chain) and compute dtype ``dtype``: the
    kernels with the rules' calls written out (:mod:`.inliner`)."""
    return finish_source(raw_source(rule, dtype))


def raw_source(rule, dtype) -> str:
    """The generated module before its calls are written out: every member's functions and the prelude's are
    ``inline="always"`` functions that the kernels call. :func:`finish_source` takes it on from there."""
    dtype = np.dtype(dtype)
    layout = ChainLayout(rule)
    out = [f"# generated by numbaopt.compiler.cpu v{GENERATOR_VERSION}; do not edit",
           f"# chain: {' -> '.join(type(r).__name__ for r in layout.rules) or '(identity)'}; dtype {dtype.name}",
           prelude.COMMON, f"_NJK = {_KERNEL_OPTIONS}", f"_PAR = {_PARALLEL_OPTIONS}",
           f"_R = np.{real_dtype(dtype).name}", f"_C = np.{dtype.name}", "_Z = _C(0)",
           prelude.COMPLEX if dtype.kind == "c" else prelude.REAL]
    out += rule_functions(layout, '@njit(inline="always", **_NJ)')
    body = []
    for name, par, outp in (("inplace", False, False), ("outplace", False, True), ("inplace_par", True, False),
                            ("outplace_par", True, True)):
        body += _single(layout, name, par, outp) + ["", ""]
    for r in layout.reducers:
        body += reduce_phase(layout, r) + ["", ""]
    body += reductions(layout) + ["", ""]
    body += _apply(layout, False) + ["", ""] + _apply(layout, True) + ["", ""]
    body += _fused(layout, False) + ["", ""] + _fused(layout, True) + ["", ""]
    if layout.accum is None:
        args = ", ".join(["x", "g"] + [f"S[{k}]" for k in range(layout.n_arrays)] + ["hp", "t"])
        body += _single(layout, "step_inline", False, False, counters=False, inline=True)
        body += ["", "", "@njit(cache=True, **_NJ)", "def step(x, g, S, hp, t):", f"    return step_inline({args})"]
    return "\n".join(out) + "\n\n\n" + "\n".join(body) + "\n"
