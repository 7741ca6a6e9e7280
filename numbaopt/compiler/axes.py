"""Generated-code pieces of axis reductions (rules with ``axes``, see :mod:`numbaopt.rules.base`).

A leaf of a chain with axis members is stepped through a loop over its geometry: the leaf is viewed as
``(P, A, Q, B, S)`` (the first axis member's ``geometry``), five nested loops give each element its flat index
``i`` and, per axis member ``r``, the index of its unit in each of its axes (``ri{r}``, ``ci{r}``, ``bi{r}``).
An axis member's *phase* is a dry pass (the chain up to it, nothing written) that sums its contributions per
unit into float64 totals, then ``finish`` per unit into the arrays of finals ``UF{r}_{axis}_{m}`` (float64)
and the new unit states ``NU{u}`` (written with the parameter, after every check). The state arrays of a
leaf are the element states, the unit states ``{prefix}u{u}`` and the geometry row ``{prefix}g`` (int64,
:meth:`.layout.ChainLayout.new_units`).
"""
from __future__ import annotations

import re

from ..rules.base import SCALAR, step_args
from .elements import LANES, accumulate, call_args, element_lines, finish_call, identity, opt_literal, pairwise
from .layout import GEO, ChainLayout, reduce_ops

__all__ = ["array_names", "geo_loop", "axis_phase", "unit_views", "unit_writes", "unit_copies", "geo_reduction",
           "memo_member", "memo_loop",
           "unit_indices", "geometry_loads", "unit_count", "geo_lines"]

_DIMS = ("P", "A", "Q", "B", "S", "act")


def _totals(size, op) -> str:
    """A new float64 array of ``size`` accumulators at ``op``'s identity (``np.zeros`` for sums: Numba lowers it
    directly, where ``np.full`` compiles an implementation of its own in every process)."""
    return f"np.zeros({size}, np.float64)" if identity(op) == "0.0" else f"np.full({size}, {identity(op)}, np.float64)"


def array_names(layout: ChainLayout, prefix: str) -> list:
    """The names of a leaf's state arrays in the kernels: element, unit, geometry."""
    out = [f"{prefix}{k}" for k in range(layout.n_state)]
    if layout.units:
        out += [f"{prefix}u{u}" for u in range(layout.n_unit)] + [f"{prefix}g"]
    return out


def geo_lines(layout, q: int, G: str) -> list:
    """``gP{q} = <G>[..]`` ... for axis member number q (G is a format string with ``{}`` for the column)."""
    return [f"g{d}{q} = {G.format(GEO * q + k)}" for k, d in enumerate(_DIMS)]


def geo_loop(layout: ChainLayout, body: list, indent: str, G: str, hoist=None, rng: str = "range") -> list:
    """``body`` (unindented lines) inside the loops over the first axis member's geometry, with ``i`` and every
    axis member's unit indices defined; ``G`` reads the geometry row (``"Sg[0, {}]"``). ``hoist(form)`` gives
    ``(before, each, after)`` lines for the forms ``"leaf"``, ``"matrix"`` (a batch of matrices), ``"general"``:
    ``each`` runs after ``body`` for every element, ``before``/``after`` around the innermost loop (sums whose unit
    does not change along it are kept in a local there, not in memory: no store-to-load chain per element).
    ``rng="prange"`` runs the outer loop (over the rows of every matrix) on threads: for a body whose elements are
    independent (the element pass), not with ``hoist``."""
    hoist = hoist or (lambda form: ([], [], []))
    # threaded, one flattened loop over (p, a) replaces the two serial ones; an "if True:" keeps the nesting depth
    # of what follows the same in both
    par = rng == "prange"
    leaf_body = body  # the whole-leaf form loops over the elements themselves (prange over i vectorizes)
    if par:
        body, views = _slab_views(body)
    L = []
    for q in range(len(layout.axis_rules)):
        L += [f"{indent}{line}" for line in geo_lines(layout, q, G)]
    i1, i2, i3 = indent + "    ", indent + "        ", indent + "            "
    # three forms of the loop, chosen per leaf: the common views (a whole leaf, a matrix or a batch of them) keep a
    # contiguous innermost loop and their row / matrix sums in locals
    pre, each, post = hoist("leaf")
    L += [f"{indent}if gP0 == 1 and gQ0 == 1 and gS0 == 1 and gB0 == 1:"]  # one unit of cols/batch (whole leaf)
    L += [f"{i1}{x}" for x in pre] + [f"{i1}for i in {rng}(gA0):"]
    L += _indexed(layout, {"rows": "i", "cols": "0", "batch": "0"}, leaf_body + each, i2) + [f"{i1}{x}" for x in post]
    pre, each, post = hoist("matrix")
    i4 = i3 + "    "
    L += [f"{indent}elif gQ0 == 1 and gS0 == 1:"]  # a batch of P matrices (one, usually): rows x cols each
    L += ([f"{i1}for _pa in prange(gP0 * gA0):", f"{i2}_p = _pa // gA0", f"{i2}_a = _pa - _p * gA0"]
          + views(i2, "gB0") + [f"{i2}if True:"] if par
          else [f"{i1}for _p in range(gP0):", f"{i2}for _a in range(gA0):"])
    L += [f"{i3}{x}" for x in pre]
    L += [f"{i3}for _b in range(gB0):", f"{i4}i = (_p * gA0 + _a) * gB0 + _b"]
    L += _indexed(layout, {"rows": "_p * gA0 + _a", "cols": "_p * gB0 + _b", "batch": "_p"}, body + each, i4)
    L += [f"{i3}{x}" for x in post]
    _, each, _ = hoist("general")
    ind = [indent + "    " * k for k in range(7)]
    L += [f"{indent}else:"]
    L += ([f"{ind[1]}for _pa in prange(gP0 * gA0):", f"{ind[2]}_p = _pa // gA0", f"{ind[2]}_a = _pa - _p * gA0"]
          + views(ind[2], "gQ0 * gB0 * gS0") + [f"{ind[2]}if True:"] if par
          else [f"{ind[1]}for _p in range(gP0):", f"{ind[2]}for _a in range(gA0):"])
    L += [f"{ind[3]}for _q in range(gQ0):", f"{ind[4]}for _b in range(gB0):",
          f"{ind[5]}_ib = (((_p * gA0 + _a) * gQ0 + _q) * gB0 + _b) * gS0",
          f"{ind[5]}_ir = ((_p * gA0 + _a) * gQ0 + _q) * gS0",
          f"{ind[5]}_ic = ((_p * gQ0 + _q) * gB0 + _b) * gS0",
          f"{ind[5]}_it = (_p * gQ0 + _q) * gS0",
          f"{ind[5]}for _s in range(gS0):", f"{ind[6]}i = _ib + _s"]
    return L + _indexed(layout, {"rows": "_ir + _s", "cols": "_ic + _s", "batch": "_it + _s"}, body + each, ind[6])


_ELEMENT_READ = re.compile(r"\b(x|g|xo|S\d+|O\d+)\[i\]")


def _slab_views(body: list) -> tuple:
    """The threaded loop's body reading and writing views of the slab of elements of one ``(p, a)`` (contiguous,
    ``_o`` onwards) instead of the whole arrays: the inner loop over a view vectorizes in a parfor, over the whole
    array it does not (a standalone experiment: 1024 x 1024 float32 Adam body 2.0 ms threaded, 0.28 ms on row
    views, 0.47 ms serial). Returns the new body and ``views(indent, slab) -> lines`` making them."""
    names = sorted({m.group(1) for line in body for m in _ELEMENT_READ.finditer(line)})
    new = [_ELEMENT_READ.sub(lambda m: f"_r_{m.group(1)}[i - _o]", line) for line in body]

    def views(indent, slab):
        return [f"{indent}_o = _pa * ({slab})"] + [f"{indent}_r_{n} = {n}[_o:_o + {slab}]" for n in names]
    return new, views


def _decompose(q: int, ind: str) -> tuple:
    """Lines splitting the flat index ``i`` by axis member q's view ``(P, A, Q, B, S)``, and its unit index
    expressions per axis."""
    L = [f"{ind}_s{q} = i % gS{q}", f"{ind}_t{q} = i // gS{q}", f"{ind}_b{q} = _t{q} % gB{q}",
         f"{ind}_t{q} = _t{q} // gB{q}", f"{ind}_q{q} = _t{q} % gQ{q}", f"{ind}_t{q} = _t{q} // gQ{q}",
         f"{ind}_a{q} = _t{q} % gA{q}", f"{ind}_p{q} = _t{q} // gA{q}"]
    src = {"rows": f"((_p{q} * gA{q} + _a{q}) * gQ{q} + _q{q}) * gS{q} + _s{q}",
           "cols": f"((_p{q} * gQ{q} + _q{q}) * gB{q} + _b{q}) * gS{q} + _s{q}",
           "batch": f"(_p{q} * gQ{q} + _q{q}) * gS{q} + _s{q}"}
    return L, src


def _indexed(layout, first: dict | None, body: list, ind: str, offset=None) -> list:
    """``body`` after the unit indices of every axis member: the first member's from ``first`` (its loop's
    names), the others' (all, when ``first`` is None) from ``i`` and their own geometry. ``offset(r, a)``, when
    given, names what to add to member r's unit index of axis a (where its leaf's units start in a table)."""
    L = []
    for q, r in enumerate(layout.axis_rules):
        axes = type(layout.rules[r]).axes
        if q == 0 and first is not None:
            src = first
        else:  # another member's view of the same element: its indices from i
            lines, src = _decompose(q, ind)
            L += lines
        for a in axes:
            plus = f" + {offset(r, a)}" if offset is not None else ""
            idx = "i" if a == "elements" else f"({src[a]}) * gact{q}"
            L.append(f"{ind}{a[0]}i{r} = {idx}{plus}")
    return L + [f"{ind}{line}" for line in body]


def unit_indices(layout: ChainLayout, ind: str, offset=None) -> list:
    """Every axis member's unit indices of element ``i`` (``ri{r}``...), each from the flat index and the member's
    geometry ``gP{q}``... (see :func:`geometry_loads`); ``offset`` as for :func:`_indexed`."""
    return _indexed(layout, None, [], ind, offset)


def geometry_loads(layout: ChainLayout, G: str, indent: str) -> list:
    """``gP{q} = ...`` for every axis member, read from the geometry row ``G`` (a format string)."""
    return [f"{indent}{line}" for q in range(len(layout.axis_rules)) for line in geo_lines(layout, q, G)]


def _units(q: int, axis: str) -> str:
    """The number of units of ``axis`` of axis member number q (1 when its geometry leaves the leaf out)."""
    n = {"rows": f"gP{q} * gA{q} * gQ{q} * gS{q}", "cols": f"gP{q} * gQ{q} * gB{q} * gS{q}",
         "batch": f"gP{q} * gQ{q} * gS{q}"}[axis]
    return f"(({n}) if gact{q} != 0 else 1)"


def unit_count(q: int, axis: str) -> str:
    """The number of elements in one unit of ``axis`` (0 when the geometry leaves the leaf out)."""
    n = {"rows": f"gB{q}", "cols": f"gA{q}", "batch": f"gA{q} * gB{q}"}[axis]
    return f"np.float64(({n}) * gact{q})"


def axis_phase(layout: ChainLayout, r: int, indent: str, G: str, dtype_of) -> list:
    """Axis member r's dry pass and ``finish``: the per-unit finals ``UF{r}_{axis}_{m}`` and new unit states
    ``NU{u}``. ``dtype_of(u)`` names the dtype of unit state u (its array's, e.g. ``"Su0.dtype"``). Serial in every
    kernel: the dry pass for its sums' fixed order, ``finish`` because a leaf has few units beside its elements
    (a loop on threads costs a threaded kernel ~0.2 s of compiling each, and gains nothing measurable)."""
    rule = layout.rules[r]
    cls = type(rule)
    q = layout.axis_rules.index(r)
    ops = reduce_ops(rule)
    L = [f"{indent}{line}" for line in geo_lines(layout, q, G)]
    if cls.matrix is not None:
        return L + _matrix_phase(layout, r, q, indent, G)
    for a in cls.axes:
        L += [f"{indent}T{r}_{a}_{c} = {_totals(_units(q, a), op)}" for c, op in enumerate(ops)]
    if ops:  # the dry pass (a rule without contributions renews its unit states from nothing but them)
        body = ["gi = g[i]", "xi = x[i]"]
        body += element_lines(layout, r, "gi", "xi", lambda k: f"S{k}[i]", False, "")
        body.append(_contributions(layout, r))

        def hoist(form):
            # the first member's sums whose unit is constant along the innermost loop go through locals
            local = {"leaf": ("cols", "batch"), "matrix": ("rows", "batch")}.get(form, ()) if q == 0 else ()
            before, each, after = [], [], []
            for a in cls.axes:
                for c, op in enumerate(ops):
                    t, h = f"T{r}_{a}_{c}[{a[0]}i{r}]", f"_h{a[0]}{c}"
                    if a in local:
                        before.append(f"{h} = {identity(op)}")
                        each.append(accumulate(h, f"c{c}", op))
                        # the unit of this row (of matrix _p) / this matrix / the leaf
                        unit = {"rows": "_p * gA0 + _a", "batch": "_p" if form == "matrix" else "0", "cols": "0"}
                        u = f"T{r}_{a}_{c}[{unit[a]}]"
                        after.append(f"{u} += {h}" if op == "sum" else f"{u} = max({u}, {h})")
                    else:
                        each.append(accumulate(t, f"c{c}", op))
            return before, each, after
        L += [f"{indent}if gact{q} != 0:"] + geo_loop(layout, body, indent + "    ", G, hoist)
    nf = len(cls.finals)
    for a in cls.axes:
        us = layout.unit_slots[r].get(a, [])
        # in the compute precision: the step reads them as _R, so rounding here is the same rounding
        L += [f"{indent}UF{r}_{a}_{m} = np.empty({_units(q, a)}, _R)" for m in range(nf)]
        L += [f"{indent}NU{u} = np.empty({_units(q, a)}, {dtype_of(u)})" for u in us]
        accs = [f"T{r}_{a}_{c}[_u]" for c in range(len(ops))] + [unit_count(q, a)]
        accs += [f"np.float64(Su{u}[_u])" for u in us]
        outs = [f"_v{m}" for m in range(nf)] + [f"_w{k}" for k in range(len(us))]
        L += [f"{indent}for _u in range({_units(q, a)}):",
              f"{indent}    {', '.join(outs)}, = {finish_call(layout, r, accs)}"]
        L += [f"{indent}    UF{r}_{a}_{m}[_u] = _v{m}" for m in range(nf)]
        L += [f"{indent}    NU{u}[_u] = _w{k}" for k, u in enumerate(us)]
    return L


def _matrix_phase(layout, r, q, indent, G) -> list:
    """A matrix rule's phase: its contributions into a matrix ``E{r}`` (A x B), then ``matrix`` on it gives the
    per-element finals ``UF{r}_elements_0`` (nothing of the leaf written)."""
    rule = layout.rules[r]
    body = ["gi = g[i]", "xi = x[i]"] + element_lines(layout, r, "gi", "xi", lambda k: f"S{k}[i]", False, "")
    body += [_contributions(layout, r), f"E{r}[i] = c0"]
    args = [f"h{r}_{n}" if n in rule._hypers else opt_literal(rule._values[n])
            for n in step_args(type(rule).matrix)[1:]]
    call = f"matrix_{r}({', '.join([f'E{r}.reshape((gA{q}, gB{q}))'] + args)})"
    return ([f"{indent}E{r} = np.empty(gA{q} * gB{q}, _C)"] + geo_loop(layout, body, indent, G) +
            [f"{indent}UF{r}_elements_0 = np.ascontiguousarray({call}).reshape(-1)"])


def _contributions(layout, r) -> str:
    """``c0, c1, ... = reduce_t_{r}(d, xi, ...)``: member r's contributions for this element."""
    n = len(reduce_ops(layout.rules[r]))
    return f"{', '.join(f'c{c}' for c in range(n))}, = reduce_t_{r}({call_args(layout, r, 'reduce', ['d', 'xi'])})"


def memo_member(layout: ChainLayout):
    """The chain's last axis member when the passes after it may start from the step through it, kept per element
    in ``D`` (see :func:`geo_reduction`), or None: it needs no AccumGrad and no member up to it keeping element
    state (whose new value only the writing pass computes)."""
    if not layout.axis_rules or layout.accum is not None:
        return None
    last = layout.axis_rules[-1]
    if any(k is not None for r in range(last + 1) for _, k in layout.state_slots[r]):
        return None
    return last


def memo_loop(layout: ChainLayout, upto: int, body, indent: str, rng: str = "range", writes: bool = False) -> list:
    """A flat loop over the elements whose step through the last axis member is ``D[i]`` (:func:`memo_member`): the
    members after it up to ``upto``, then ``body`` (lines). No geometry: nothing after that member reads a unit."""
    m = memo_member(layout)
    inner = ["xi = x[i]"] + element_lines(layout, upto, "D[i]", "xi", lambda k: f"S{k}[i]", writes, "", start=m + 1)
    return [f"{indent}for i in {rng}(n):"] + [f"{indent}    {line}" for line in inner + body]


def geo_reduction(layout: ChainLayout, r: int, indent: str, G: str, memo: dict | None = None) -> list:
    """A leaf-scope reduction's dry pass (``acc{r}_{c}``) over the geometry loop: for a reduction after an axis
    member, whose elements read their units' finals. Sums go to :data:`LANES` partial sums by element index (four
    independent chains instead of one), combined pairwise in a fixed order: serial and deterministic.

    ``memo`` (a dict per kernel body, or None): for a reduction after the chain's last axis member
    (:func:`memo_member`), the first such pass of the body keeps each element's step through that member in
    ``D`` and later ones (and the element pass) start from it in a flat loop: the members up to it are computed
    once and written out once, not in three loop forms per pass (the same arithmetic in the same element order:
    the same bits)."""
    ops = reduce_ops(layout.rules[r])
    L = [f"{indent}_ln{r}_{c} = {_totals(LANES, op)}" for c, op in enumerate(ops)]
    acc = [_contributions(layout, r)] + [accumulate(f"_ln{r}_{c}[i & {LANES - 1}]", f"c{c}", op)
                                         for c, op in enumerate(ops)]
    m = memo_member(layout) if memo is not None else None
    if m is not None and r > m and memo.get("D"):
        L += memo_loop(layout, r, acc, indent)
    else:
        sread = lambda k: f"S{k}[i]"  # noqa: E731
        body = ["gi = g[i]", "xi = x[i]"]
        if m is not None and r > m:  # the first pass after the last axis member keeps the step through it
            L.append(f"{indent}D = np.empty(n, _C)")
            body += element_lines(layout, m + 1, "gi", "xi", sread, False, "") + ["D[i] = d"]
            body += element_lines(layout, r, "d", "xi", sread, False, "", start=m + 1)[1:]
            memo["D"] = True
        else:
            body += element_lines(layout, r, "gi", "xi", sread, False, "")
        L += geo_loop(layout, body + acc, indent, G)
    for c, op in enumerate(ops):
        L.append(f"{indent}acc{r}_{c} = {pairwise([f'_ln{r}_{c}[{u}]' for u in range(LANES)], op)}")
    return L


def unit_views(layout: ChainLayout, arena: str, out: str, G: str, indent: str) -> list:
    """Leaf j's unit states in the tree kernels: ``{out}u{u} = {arena}u{u}[offset:offset + size]``."""
    base = GEO * len(layout.axis_rules)
    out_lines = []
    for u in range(layout.n_unit):
        off, size = G.format(base + 2 * u), G.format(base + 2 * u + 1)
        out_lines.append(f"{indent}{out}u{u} = {arena}u{u}[{off}:{off} + {size}]")
    return out_lines


def unit_writes(layout: ChainLayout, W: str, indent: str) -> list:
    """Write the new unit states ``NU{u}`` into ``{W}u{u}`` (after the element pass; the scalar states of
    reductions are written by the kernels from their finish). Serial, as :func:`axis_phase`'s ``finish``."""
    L = []
    for u, (_, d) in enumerate(layout.unit_decls):
        if d.axis == SCALAR:
            continue
        L += [f"{indent}for _u in range(NU{u}.shape[0]):", f"{indent}    {W}u{u}[_u] = NU{u}[_u]"]
    return L


def unit_copies(layout: ChainLayout, src: str, dst: str, indent: str) -> list:
    """Copy the unit states ``{src}u{u}`` into ``{dst}u{u}`` (a pure step that changes nothing)."""
    L = []
    for u in range(layout.n_unit):
        L += [f"{indent}for _u in range({src}u{u}.shape[0]):", f"{indent}    {dst}u{u}[_u] = {src}u{u}[_u]"]
    return L
