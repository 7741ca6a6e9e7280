"""The CPU emitter's reductions: the dry passes that sum a reduction's contributions before anything is
written, and the tree kernels' phases of a reduction (``partial_{r}``, ``combine_{r}``, ``finish_row_{r}``,
``put_finals_{r}``, ``finish_leaves_{r}``) and ``reductions`` (see :mod:`.cpu` for the kernels' arguments).

Reduction passes accumulate in float64, in :data:`.elements.LANES` partial sums combined in a fixed order.
"""
from __future__ import annotations

from .axes import array_names, axis_phase, geo_reduction, unit_views
from .elements import (LANES, accumulate, call_args, element_lines, finals_lines, finish_call, identity, load_lines,
                       pairwise, scalar_loads)
from .layout import ERROR_BASE, reduce_ops

__all__ = ["lane_reduction", "split", "has", "head", "TG", "fin_src", "inline_reducers", "in_leaf", "reduce_phase",
           "reductions"]


def lane_reduction(layout, r, indent, G="", memo=None) -> list:
    """A dry pass over ``g[i], x[i]`` (``i < n``): the chain up to member r (an AccumGrad before it gives
    the cycle's mean), rule r's contributions summed (or maxed) in float64 into ``acc{r}_{c}``."""
    if any(q < r for q in layout.axis_rules):  # its elements read their units' finals: the geometry loop
        return geo_reduction(layout, r, indent, G, memo)
    ops = reduce_ops(layout.rules[r])
    L = [f"{indent}acc{r}_{c}_{u} = {identity(op)}" for c, op in enumerate(ops) for u in range(LANES)]
    rargs = call_args(layout, r, "reduce", ["d", "xi"])

    def body(u, ind):
        out = [f"{ind}gi = g[i]", f"{ind}xi = x[i]"]
        out += element_lines(layout, r, "gi", "xi", lambda k: f"S{k}[i]", False, ind)
        out.append(f"{ind}{', '.join(f'c{c}' for c in range(len(ops)))}, = reduce_t_{r}({rargs})")
        out += [f"{ind}{accumulate(f'acc{r}_{c}_{u}', f'c{c}', op)}" for c, op in enumerate(ops)]
        return out

    bi = indent + "    "
    L.append(f"{indent}m{r} = n - n % {LANES}")
    L.append(f"{indent}for i0 in range(0, m{r}, {LANES}):")
    for u in range(LANES):
        L.append(f"{bi}i = i0 + {u}")
        L += body(u, bi)
    L.append(f"{indent}for i in range(m{r}, n):")
    L += body(0, bi)
    L += [f"{indent}acc{r}_{c} = {pairwise([f'acc{r}_{c}_{u}' for u in range(LANES)], op)}" for c, op in enumerate(ops)]
    return L


def split(layout):
    """The reductions before the chain's AccumGrad (all of them without one) and those after it."""
    a = layout.accum
    pre = [r for r in layout.reducers if a is None or r < a]
    suf = [r for r in layout.reducers if a is not None and r > a]
    return pre, suf


def has(layout, r, final) -> bool:
    """Whether member r's reduction has the final ``final`` (``"error"``, ``"skip"``)."""
    return final in type(layout.rules[r]).finals


def head(layout, ind, out=False, views=True) -> list:
    """Leaf ``j`` of a tree kernel: its size and offset, the views of its parameter, gradient (and new
    parameter when ``out``) and its state, and its step counts ``t``/``tp``."""
    L = [f"{ind}n = sizes[j]", f"{ind}o = offsets[j]"]
    if not views:
        return L
    L += [f"{ind}x = carray(as_pointer(xaddr[j], _C), (n,))", f"{ind}g = carray(as_pointer(gaddr[j], _C), (n,))"]
    if out:
        L.append(f"{ind}xo = carray(as_pointer(xoaddr[j], _C), (n,))")
    L += [f"{ind}S{k} = A{k}[o:o + n]" for k in range(layout.n_state)]
    if out:
        L += [f"{ind}O{k} = B{k}[o:o + n]" for k in range(layout.n_state)]
    if layout.units:
        L += unit_views(layout, "A", "S", TG, ind) + (unit_views(layout, "B", "O", TG, ind) if out else [])
    return L + [f"{ind}t = C[0, j] + 1", f"{ind}tp = C[1, j] + 1"]


#: the geometry row of leaf j in the tree kernels
TG = "Ag[j, {}]"


def fin_src(layout):
    """``(r, m) -> ...``: where leaf ``j`` of a tree kernel reads final ``m`` of reduction r (its row of ``F``)."""
    return lambda r, m: f"F[j, {layout.fin_cols[r] + m}]"


def _skipped_before(layout, r, ind) -> list:
    """Leave out a leaf that an earlier reduction of its part of the chain skipped."""
    pre, suf = split(layout)
    earlier = [q for q in (pre if r in pre else pre + suf) if q < r and has(layout, q, "skip")]
    out = []
    for q in earlier:
        col = layout.fin_cols[q] + type(layout.rules[q]).finals.index("skip")
        out += [f"{ind}if F[j, {col}] != 0.0:", f"{ind}    continue"]
    return out


#: the phases of a reduction, each its own kernel: the tree pipeline calls them one by one when a tree-scope
#: reduction spans several groups (and MPI across ranks). ``reductions`` holds their code as text instead (see
#: :func:`reductions`).
_PHASE = "@njit(cache=True, **_NJ)"


def _partial_lines(layout, r, ind) -> list:
    """The loop over the leaves of ``partial_{r}``: each stepped leaf's dry pass, its accumulators and
    scalar states into row ``j`` of ``P``."""
    ops = reduce_ops(layout.rules[r])
    nops, units = len(ops), layout.scalar_units(r)
    c0, flag = layout.acc_cols[r], layout.acc_cols[r] + nops
    bi = ind + "    "
    L = [f"{ind}for j in range(sizes.shape[0]):"]
    L += [f"{bi}P[j, {c0 + c}] = {identity(op)}" for c, op in enumerate(ops)] + [f"{bi}P[j, {flag}] = 0.0"]
    L += [f"{bi}if act[j] != 1:", f"{bi}    continue"] + _skipped_before(layout, r, bi)
    L += head(layout, bi) + load_lines(layout, bi, "t", "tp", upto=r + 1)
    if layout.accum is not None and r > layout.accum:  # only the leaves completing their cycle
        L += [f"{bi}if C[2, j] + 1 < h{layout.accum}_n:", f"{bi}    continue"]
    inline = inline_reducers(layout)
    L += finals_lines(layout, [q for q in layout.reducers if q < r and q not in inline], bi, fin_src(layout))
    memo = {}
    L += in_leaf(layout, r, bi, memo)  # the axis members (and inline reductions) before r: nothing written
    L += scalar_loads(layout, r, lambda u: f"Su{u}[0]", bi)
    # the last pass of this kernel: it reads the kept steps when an inline reduction kept them, and keeps none
    L += lane_reduction(layout, r, bi, TG, memo if memo.get("D") else None)
    L += [f"{bi}P[j, {c0 + c}] = acc{r}_{c}" for c in range(nops)] + [f"{bi}P[j, {flag}] = 1.0"]
    return L + [f"{bi}P[j, {flag + 1 + k}] = np.float64(Su{u}[0])" for k, u in enumerate(units)]  # the leaf's states


def _combine_lines(layout, r, tot, ind) -> list:
    """Fold the rows of ``P`` that contributed into the totals ``tot(c)`` (accumulators, then the scalar
    states of the tree: the first contributing leaf's; every leaf stepped keeps a copy)."""
    ops = reduce_ops(layout.rules[r])
    nops, units = len(ops), layout.scalar_units(r)
    c0, flag = layout.acc_cols[r], layout.acc_cols[r] + nops
    L = [f"{ind}for j in range(P.shape[0]):", f"{ind}    if P[j, {flag}] != 0.0:"]
    bi = ind + "        "
    for c, op in enumerate(ops):
        L.append(f"{bi}{tot(c)} = {tot(c)} + P[j, {c0 + c}]" if op == "sum"
                 else f"{bi}{tot(c)} = max({tot(c)}, P[j, {c0 + c}])")
    if units:
        seen = nops + len(units)
        L += [f"{bi}if {tot(seen)} == 0.0:", f"{bi}    {tot(seen)} = 1.0"]
        L += [f"{bi}    {tot(nops + k)} = P[j, {flag + 1 + k}]" for k in range(len(units))]
    return L


def _finish_row_lines(layout, r, tot, row, ind) -> list:
    """``row(m)`` = the finals (and new scalar states) of the tree-scope reduction r from its totals."""
    nops, nf = len(reduce_ops(layout.rules[r])), layout.row_len(r)
    states = [tot(nops + k) for k in range(len(layout.scalar_units(r)))]
    L = [f"{ind}{', '.join(f'v{m}' for m in range(nf))}, = "
         f"{finish_call(layout, r, [tot(c) for c in range(nops)] + states)}"]
    return L + [f"{ind}{row(m)} = v{m}" for m in range(nf)]


def _put_finals_lines(layout, r, row, ind) -> list:
    nops = len(reduce_ops(layout.rules[r]))
    flag, f0 = layout.acc_cols[r] + nops, layout.fin_cols[r]
    L = [f"{ind}for j in range(P.shape[0]):", f"{ind}    if P[j, {flag}] != 0.0:"]
    return L + [f"{ind}        F[j, {f0 + m}] = {row(m)}" for m in range(layout.row_len(r))]


def _finish_leaves_lines(layout, r, ind) -> list:
    ops = reduce_ops(layout.rules[r])
    nops, units = len(ops), layout.scalar_units(r)
    c0, flag, f0, nf = layout.acc_cols[r], layout.acc_cols[r] + nops, layout.fin_cols[r], layout.row_len(r)
    states = [f"P[j, {flag + 1 + k}]" for k in range(len(units))]
    L = [f"{ind}for j in range(P.shape[0]):", f"{ind}    if P[j, {flag}] != 0.0:",
         f"{ind}        {', '.join(f'v{m}' for m in range(nf))}, = "
         f"{finish_call(layout, r, [f'P[j, {c0 + c}]' for c in range(nops)] + states)}"]
    return L + [f"{ind}        F[j, {f0 + m}] = v{m}" for m in range(nf)]


def reduce_phase(layout, r) -> list:
    """The phases of reduction r as kernels of their own: ``partial_{r}``, ``combine_{r}``, ``finish_row_{r}``,
    ``put_finals_{r}``, ``finish_leaves_{r}``."""
    A = array_names(layout, "A")
    args = ", ".join(["xaddr", "gaddr", "sizes", "offsets"] + A + ["hp", "C", "act", "F", "P"])
    tot, row = (lambda c: f"tot[{c}]"), (lambda m: f"row[{m}]")
    L = [_PHASE, f"def partial_{r}({args}):"] + _partial_lines(layout, r, "    ")
    L += ["    return 0", "", "", _PHASE, f"def combine_{r}(P, tot):"] + _combine_lines(layout, r, tot, "    ")
    L += ["    return 0", "", "", _PHASE, f"def finish_row_{r}(tot, hp, row):"]
    L += _finish_row_lines(layout, r, tot, row, "    ")
    L += ["    return 0", "", "", _PHASE, f"def put_finals_{r}(row, P, F):"] + _put_finals_lines(layout, r, row, "    ")
    L += ["    return 0", "", "", _PHASE, f"def finish_leaves_{r}(P, hp, F):"] + _finish_leaves_lines(layout, r, "    ")
    return L + ["    return 0"]


def inline_reducers(layout) -> list:
    """The reductions that ``apply`` does itself, per leaf, after the axis members' phases (as the one-array
    kernels do): leaf-scope ones after an axis member that cannot refuse or skip a step. Done in ``reductions``,
    their dry passes would compute the axis members' phases again."""
    if not layout.axis_rules:
        return []
    first = min(layout.axis_rules)
    return [r for r in layout.reducers if r > first and type(layout.rules[r]).scope == "leaf"
            and not (has(layout, r, "error") or has(layout, r, "skip") or layout.n_scalar(r))]


def in_leaf(layout, upto: int, ind: str, memo=None) -> list:
    """Per leaf, in chain order, the members before ``upto`` that the tree kernels compute where they are needed:
    the axis members' phases and the inline reductions (dry pass, ``finish``, finals ``f{q}_...``)."""
    inline = inline_reducers(layout)
    L = []
    for q in sorted(layout.axis_rules + inline):
        if q >= upto:
            break
        if q in inline:
            accs = [f"acc{q}_{c}" for c in range(len(reduce_ops(layout.rules[q])))]
            names = [f"g{q}_{n}" for n in type(layout.rules[q]).finals]
            L += geo_reduction(layout, q, ind, TG, memo)
            L.append(f"{ind}{', '.join(names)}, = {finish_call(layout, q, accs)}")
            L += finals_lines(layout, [q], ind, lambda r, m: f"g{r}_{type(layout.rules[r]).finals[m]}")
        else:
            L += axis_phase(layout, q, ind, TG, lambda u: f"Su{u}.dtype")
    return L


def reductions(layout) -> list:
    """``reductions``: every reduction of the chain over one group, the phases' code written in (totals and
    finals in local variables). Calling inlined phases made Numba inline them at its IR level and allocate the
    totals: 1.3 s of inlining and 0.5 s of ``np.zeros``/``np.empty`` cold for ``chain(ClipGlobalNorm, AdamW)``."""
    A = array_names(layout, "A")
    args = ", ".join(["xaddr", "gaddr", "sizes", "offsets"] + A + ["hp", "C", "act", "F", "P"])
    L = ["@njit(cache=True, **_NJ)", f"def reductions({args}):"]
    inline = inline_reducers(layout)
    for r in layout.reducers:
        if r in inline:
            continue
        ops = reduce_ops(layout.rules[r])
        L += _partial_lines(layout, r, "    ")
        if type(layout.rules[r]).scope == "tree":
            tot, row = (lambda c, r=r: f"tot{r}_{c}"), (lambda m, r=r: f"row{r}_{m}")
            # the starting totals as layout.totals defines them for the pipeline's combine_r (identities, zeros)
            L += [f"    {tot(c)} = {'-INF' if v == float('-inf') else repr(float(v))}"
                  for c, v in enumerate(layout.totals(r))]
            L += _combine_lines(layout, r, tot, "    ") + _finish_row_lines(layout, r, tot, row, "    ")
            L += _put_finals_lines(layout, r, row, "    ")
        else:
            L += _finish_leaves_lines(layout, r, "    ")
        if has(layout, r, "error"):
            col = layout.fin_cols[r] + type(layout.rules[r]).finals.index("error")
            flag = layout.acc_cols[r] + len(ops)
            L += ["    for j in range(sizes.shape[0]):", f"        if P[j, {flag}] != 0.0 and F[j, {col}] != 0.0:",
                  f"            return {ERROR_BASE + r}"]
    return L + ["    return 0"]
