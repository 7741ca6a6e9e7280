"""CUDA pieces of axis reductions (rules with ``axes``; the CPU form is in :mod:`.axes`).

On the GPU an axis member's per-unit values live in device tables kept across the kernels of a step, one set
per *slot* ``s`` = (member r, axis a) of :attr:`.layout.ChainLayout.axis_slots`, over the units of every leaf of
the launch (leaf j's start at ``xoff[j, s]``):

* ``T{r}_{a}_{c}``: float64 totals of contribution c (reset to the op's identity by the finish kernel);
* ``UF{r}_{a}_{m}``: float64 finals, read by the later kernels at each element's unit;
* ``NU{u}``: the new values of unit state u (its dtype), copied into the state arrays by the element kernels,
  after every check (a refused step leaves the state as it was).

Kernels: ``axred_k{r}`` (one array) / ``maxred_k{r}`` (a group): the chain's dry pass up to member r, each thread
summing its contributions in float64 while its unit stays the same (a per-matrix or whole-leaf unit costs one
atomic per thread, a row one per change of row) and adding them to the totals with one atomic each time its unit
changes; ``axfin_k{r}_{a}``: one thread per unit, ``finish`` on its totals, its element count (from the leaf's
geometry row) and its unit states.

The atomics add in an order that varies from run to run, so the float64 totals differ from the CPU's in their last
bits (and the steps, rarely, by an ulp of the parameters' precision).
"""
from __future__ import annotations

from .axes import geo_lines, geometry_loads, unit_count, unit_indices
from .elements import accumulate, call_args, element_lines, finish_call, identity, load_lines
from .layout import GEO, ChainLayout, reduce_ops

__all__ = ["table_specs", "table_names", "block_loads", "index_lines", "axis_reduce_body", "axis_finish_kernels",
           "unit_commits"]


def table_specs(layout: ChainLayout) -> list:
    """``(name, slot, kind, extra)`` per table, in kernel-argument order; kind ``"T"`` (extra: its op), ``"UF"``
    or ``"NU"`` (extra: the unit state's index)."""
    out = []
    for s, (r, a) in enumerate(layout.axis_slots):
        out += [(f"T{r}_{a}_{c}", s, "T", op) for c, op in enumerate(reduce_ops(layout.rules[r]))]
        out += [(f"UF{r}_{a}_{m}", s, "UF", None) for m in range(len(type(layout.rules[r]).finals))]
        out += [(f"NU{u}", s, "NU", u) for u in layout.unit_slots[r].get(a, [])]
    return out


def table_names(layout: ChainLayout) -> list:
    """The tables' names, then ``xoff`` (leaves x slots: where each leaf's units start): the extra arguments of
    every kernel of a chain with axis members."""
    return [n for n, *_ in table_specs(layout)] + ["xoff"] if layout.axis_rules else []


def _slot(layout, r, a) -> int:
    return layout.axis_slots.index((r, a))


def block_loads(layout: ChainLayout, G: str, row: str, indent: str) -> list:
    """The geometry of every axis member (``gP{q}``...) from the geometry row ``G`` and the starts of the leaf's
    units in each table (``xo{s}``), for the rows ``row`` (``"0"`` for one array, ``"j"`` in a group)."""
    if not layout.axis_rules:
        return []
    return geometry_loads(layout, G, indent) + [f"{indent}xo{s} = xoff[{row}, {s}]"
                                                for s in range(len(layout.axis_slots))]


def index_lines(layout: ChainLayout, indent: str) -> list:
    """Element ``i``'s unit index in every table (``ri{r}``, ``ci{r}``, ``bi{r}``)."""
    if not layout.axis_rules:
        return []
    return unit_indices(layout, indent, offset=lambda r, a: f"xo{_slot(layout, r, a)}")


def axis_reduce_body(layout: ChainLayout, r: int, loop, indent: str) -> list:
    """Member r's dry pass into its totals: ``loop(body)`` wraps the body in the kernel's element loop (``i``
    set, ``gi``/``xi`` loaded); a member whose geometry leaves the leaf out contributes nothing."""
    cls = type(layout.rules[r])
    ops = reduce_ops(layout.rules[r])
    q = layout.axis_rules.index(r)
    if not ops:  # a member without contributions renews its unit states from nothing but them
        return []
    init = []
    for a in cls.axes:
        init.append(f"cu_{a} = -1")
        init += [f"cs_{a}_{c} = {identity(op)}" for c, op in enumerate(ops)]
    body = index_lines(layout, "")
    body += element_lines(layout, r, "gi", "xi", lambda k: f"S{k}[i]", False, "")
    body.append(f"{', '.join(f'c{c}' for c in range(len(ops)))}, = "
                f"reduce_t_{r}({call_args(layout, r, 'reduce', ['d', 'xi'])})")
    flush = []
    for a in cls.axes:
        k = f"{a[0]}i{r}"
        body += [f"if {k} != cu_{a}:", f"    if cu_{a} >= 0:"]
        body += [f"        {_atomic(f'T{r}_{a}_{c}', f'cu_{a}', f'cs_{a}_{c}', op)}" for c, op in enumerate(ops)]
        body += [f"    cu_{a} = {k}"] + [f"    cs_{a}_{c} = np.float64(c{c})" for c in range(len(ops))]
        body += ["else:"] + [f"    {accumulate(f'cs_{a}_{c}', f'c{c}', op)}" for c, op in enumerate(ops)]
        flush += [f"if cu_{a} >= 0:"] + [f"    {_atomic(f'T{r}_{a}_{c}', f'cu_{a}', f'cs_{a}_{c}', op)}"
                                         for c, op in enumerate(ops)]
    inner = [f"{indent}    {x}" for x in init] + loop(body, indent + "    ") + [f"{indent}    {x}" for x in flush]
    return [f"{indent}if gact{q} != 0:"] + inner


def _atomic(table, index, value, op) -> str:
    return f"cuda.atomic.{'add' if op == 'sum' else 'max'}({table}, {index}, {value})"


def axis_finish_kernels(layout: ChainLayout, deco: str) -> list:
    """``axfin_k{r}_{a}(hp, t, G, *U, leafof, xoff, ntot, *tables of the slot)``: one thread per unit of the
    launch (``leafof`` gives its leaf, ``G`` the leaves' geometry rows, ``U`` the slot's unit-state arrays)."""
    L = []
    specs = table_specs(layout)
    base = GEO * len(layout.axis_rules)
    for s, (r, a) in enumerate(layout.axis_slots):
        q = layout.axis_rules.index(r)
        ops = reduce_ops(layout.rules[r])
        nf = len(type(layout.rules[r]).finals)
        us = layout.unit_slots[r].get(a, [])
        mine = [n for n, slot, *_ in specs if slot == s]
        params = ["hp", "t", "G"] + [f"U{u}" for u in us] + ["leafof", "xoff", "ntot"] + mine
        L += [deco, f"def axfin_k{r}_{a}({', '.join(params)}):", "    k = cuda.grid(1)", "    if k < ntot:",
              "        j = leafof[k]", "        _u = k - xoff[j, %d]" % s]
        L += [f"        {x}" for x in geo_lines(layout, q, "G[j, {}]")] + load_lines(layout, "        ", "t")
        accs = [f"T{r}_{a}_{c}[k]" for c in range(len(ops))] + [unit_count(q, a)]
        accs += [f"np.float64(U{u}[G[j, {base + 2 * u}] + _u])" for u in us]
        outs = [f"_v{m}" for m in range(nf)] + [f"_w{k}" for k in range(len(us))]
        L.append(f"        {', '.join(outs)}, = {finish_call(layout, r, accs)}")
        L += [f"        UF{r}_{a}_{m}[k] = _v{m}" for m in range(nf)]
        L += [f"        NU{u}[k] = _w{k}" for k, u in enumerate(us)]
        L += [f"        T{r}_{a}_{c}[k] = {identity(op)}" for c, op in enumerate(ops)] + [""]
    return L


def unit_commits(layout: ChainLayout, W: str, group: bool, indent: str) -> list:
    """Copy the new unit states ``NU{u}`` into ``{W}u{u}``: one array (a grid-stride loop over its units) or, in
    a group, leaf j's units by the blocks of its elements (its last block takes the units beyond its elements,
    those of an empty leaf)."""
    base = GEO * len(layout.axis_rules)
    L = []
    for s, (r, a) in enumerate(layout.axis_slots):
        for u in layout.unit_slots[r].get(a, []):
            if not group:
                L += [f"{indent}k = cuda.grid(1)", f"{indent}while k < {W}u{u}.shape[0]:",
                      f"{indent}    {W}u{u}[k] = NU{u}[k]", f"{indent}    k += cuda.gridsize(1)"]
                continue
            nu, ou = f"Ag[j, {base + 2 * u + 1}]", f"Ag[j, {base + 2 * u}]"
            L += [f"{indent}k = start + tid", f"{indent}lim = {nu} if start + CHUNK >= n else min(start + CHUNK, {nu})",
                  f"{indent}while k < lim:", f"{indent}    {W}u{u}[{ou} + k] = NU{u}[xo{s} + k]",
                  f"{indent}    k += TPB"]
    return L
