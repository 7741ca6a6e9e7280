"""Generated-code pieces shared by the CPU and CUDA emitters: the rules' functions and the fused element body.

Names in the generated code: ``h{r}_{name}`` is hyperparameter ``name`` of member ``r`` (cast to ``_R``),
``p{r}_{name}`` a per-step scalar of its ``prepare``, ``f{r}_{name}`` a final of its reduction, ``d`` the
running step of the element (the next member's gradient), ``n_{k}`` the new value of state array ``k``.
"""
from __future__ import annotations

import ast

from ..rules.base import function_source, step_args
from .layout import ChainLayout, reduce_ops

__all__ = ["LANES", "identity", "accumulate", "pairwise", "axis_finals",
           "renamed_source", "rule_functions", "element_lines", "load_lines", "finals_lines",
           "finish_call", "scalar_loads",
           "reduction_lines", "opt_literal", "call_args"]


#: independent partial accumulators per reduction: the element loop is unrolled this many times so that
#: the float64 sums are not one serial dependency chain (~2x faster on 1M float32 elements)
LANES = 4


def identity(op) -> str:
    """The starting value of a reduction's accumulator (``"sum"`` or ``"max"``)."""
    return "0.0" if op == "sum" else "-INF"


def accumulate(target: str, value: str, op) -> str:
    """``target += float64(value)`` (or its max): one contribution into a float64 accumulator."""
    return f"{target} += np.float64({value})" if op == "sum" else f"{target} = max({target}, np.float64({value}))"


def pairwise(terms: list, op) -> str:
    """The partial accumulators ``terms`` combined pairwise, in a fixed order (deterministic)."""
    a = list(terms)
    while len(a) > 1:
        a = [(f"({a[k]} + {a[k + 1]})" if op == "sum" else f"max({a[k]}, {a[k + 1]})") for k in range(0, len(a), 2)]
    return a[0]


class _FloatLiterals(ast.NodeTransformer):
    """Rewrite float literals to ``_R(literal)`` and leave integers (shapes, indices, ranges) alone: a matrix
    rule's array code computes in the parameters' precision."""

    def visit_Constant(self, node):
        if type(node.value) is float:
            return ast.Call(func=ast.Name("_R", ast.Load()), args=[node], keywords=[])
        return node


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


def renamed_source(func, new_name: str, literals) -> str:
    """The source of a rule's function under ``new_name``; ``literals`` rewrites numbers to ``_R(...)``
    (``"float"``: only float literals)."""
    fn = ast.parse(function_source(func)).body[0]
    fn.name = new_name
    if literals == "float":
        fn = _FloatLiterals().visit(fn)
    elif literals:
        fn = _Literals().visit(fn)
    ast.fix_missing_locations(fn)
    return ast.unparse(fn)


def _reduce_returns_scalar(f) -> bool:
    fn = ast.parse(function_source(f)).body[0]
    rets = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    return not any(isinstance(r.value, ast.Tuple) for r in rets)


def rule_functions(layout: ChainLayout, decorator: str) -> list:
    """Lines defining every member's ``step``/``reduce``/``prepare``/``finish`` as ``step_{r}``...
    (``reduce_t_{r}`` returns the contributions as a tuple), each under ``decorator``. ``finish`` works on
    the float64 totals of a reduction; everything else computes in the parameters' precision."""
    out = []
    for r_i, r in enumerate(layout.rules):
        cls = type(r)
        if cls.stage is not None:
            continue  # stages are implemented by the emitters themselves
        for fname, literals in (("step", True), ("reduce", True), ("prepare", True), ("finish", False),
                                ("matrix", "float")):
            f = getattr(cls, fname, None)
            if f is None or (fname == "prepare" and not cls.scalars):
                continue
            out += ["", decorator, renamed_source(f, f"{fname}_{r_i}", literals)]
            if fname == "reduce":
                a = ", ".join(step_args(f))  # explicit names: Numba cannot inline a call with *args
                out += ["", decorator, f"def reduce_t_{r_i}({a}):",
                        f"    return (reduce_{r_i}({a}),)" if _reduce_returns_scalar(f)
                        else f"    return reduce_{r_i}({a})"]
    return out


def opt_literal(v) -> str:
    return repr(v) if not (isinstance(v, float) and v == float("inf")) else "INF"


def call_args(layout: ChainLayout, r_i: int, fname: str, lead, state_vars=()) -> str:
    """Argument list for member ``r_i``'s ``fname`` with the kernel's local variable names."""
    rule = layout.rules[r_i]
    names = step_args(getattr(type(rule), fname))
    out = list(lead)
    rest = names[len(lead) + len(state_vars):] if fname == "step" else names[len(lead):]
    out += list(state_vars)
    own = {d.name: k for d, k in layout.state_slots[r_i] if k is not None}
    for n in rest:
        if fname == "reduce" and n in own:  # a contribution reads the rule's state at this element
            out.append(f"S{own[n]}[i]")
        elif fname == "reduce" and n in layout.scalar_names(r_i):  # and its scalar states (see scalar_loads)
            out.append(f"z{r_i}_{n}")
        elif n in rule._hypers:
            out.append(f"h{r_i}_{n}")
        elif n in rule._options:
            out.append(opt_literal(rule._values[n]))
        elif n in type(rule).scalars:
            out.append(f"p{r_i}_{n}")
        elif n in type(rule).finals and not type(rule).axes:
            out.append(f"f{r_i}_{n}")
        elif type(rule).axes and n in axis_finals(rule):
            f, a = axis_finals(rule)[n]  # this element's unit's value (see .axes)
            out.append(f"_R(UF{r_i}_{a}_{f}[{a[0]}i{r_i}])")
        else:  # pragma: no cover - prevented by the checks at class creation
            raise TypeError(n)
    return ", ".join(out)


def axis_finals(rule) -> dict:
    """``{"<final>_<axis>": (index of the final, axis)}`` for an axis reduction (the names its step takes)."""
    cls = type(rule)
    return {f"{f}_{a}": (m, a) for m, f in enumerate(cls.finals) for a in cls.axes}


def element_lines(layout: ChainLayout, upto: int, gvar: str, xvar: str, sread, writes: bool, indent: str,
                  zero: str = "_Z", real_zero: str = "_R(0)", start: int = 0) -> list:
    """Lines computing the fused chain's step for one element, for members ``start..upto-1`` (``gvar``: the
    step entering member ``start``; the gradient when ``start`` is 0).

    ``sread(k)`` reads state array ``k`` at this element. Leaves the step in ``d`` and, when ``writes``,
    the new state of array k in ``n_{k}``. An AccumGrad member among them turns ``d`` into the mean of the
    cycle, ``(acc + d) / n``, and resets its sum (the cycle completes here).
    """
    lines = [f"{indent}d = {gvar}"]
    for r_i in range(start, upto):
        rule = layout.rules[r_i]
        stage = type(rule).stage
        if stage == "master":
            continue
        if stage == "accumulate":
            k = layout.state_slots[r_i][0][1]
            lines.append(f"{indent}d = ({sread(k)} + d) / h{r_i}_n")
            if writes:
                lines.append(f"{indent}n_{k} = {zero}")
            continue
        svars, outs = [], []
        for decl, k in layout.state_slots[r_i]:
            if k is None:
                svars.append(real_zero if decl.real else zero)
                outs.append("_")
            else:
                svars.append(sread(k))
                outs.append(f"n_{k}")
        args = call_args(layout, r_i, "step", ["d", xvar], svars)
        lines.append(f"{indent}{', '.join(['d'] + outs)} = step_{r_i}({args})" if outs
                     else f"{indent}d = step_{r_i}({args})")
    return lines


def load_lines(layout: ChainLayout, indent: str, tvar: str, tpvar: str | None = None, hpvar: str = "hp",
               upto: int | None = None) -> list:
    """Load the hyperparameters (cast to the compute precision) and compute the per-step scalars of members
    ``0..upto-1`` (all by default); members before an AccumGrad count their steps in ``tpvar``."""
    lines = []
    for r_i, rule in enumerate(layout.rules[:upto]):
        for n, k in layout.hyper_slots[r_i].items():
            lines.append(f"{indent}h{r_i}_{n} = _R({hpvar}[{k}])")
        cls = type(rule)
        if cls.scalars:
            args = [f"h{r_i}_{n}" if n in rule._hypers else opt_literal(rule._values[n])
                    for n in step_args(cls.prepare)[1:]]
            names = [f"q{r_i}_{n}" for n in cls.scalars]
            t = tpvar if (tpvar is not None and layout.in_prefix(r_i)) else tvar
            lines.append(f"{indent}{', '.join(names)}, = prepare_{r_i}(_R({t}), {', '.join(args)})")
            lines += [f"{indent}p{r_i}_{n} = _R(q{r_i}_{n})" for n in cls.scalars]
    return lines


def scalar_loads(layout: ChainLayout, r_i: int, src, indent: str) -> list:
    """``z{r}_{name} = _R(<src(u)>)``: member r's scalar states for its ``reduce``, read from unit array u."""
    names = layout.scalar_names(r_i)
    return [f"{indent}z{r_i}_{n} = _R({src(u)})" for n, u in zip(names, layout.scalar_units(r_i))]


def finals_lines(layout: ChainLayout, rs, indent: str, src) -> list:
    """``f{r}_{name} = _R(<src(r, m)>)`` for the finals of the reduction rules ``rs``."""
    return [f"{indent}f{r}_{n} = _R({src(r, m)})" for r in rs for m, n in enumerate(type(layout.rules[r]).finals)]


def finish_call(layout: ChainLayout, r_i: int, accs, hpvar: str = "hp") -> str:
    """``finish_{r}(<accumulators>, <hyperparameters/options>)`` (run in float64)."""
    rule = layout.rules[r_i]
    args = list(accs)
    for n in step_args(type(rule).finish)[len(args):]:  # after the totals (and an axis finish's count, states)
        if n in type(rule).scalars:  # an axis finish: a per-step scalar, computed before the passes
            args.append(f"np.float64(p{r_i}_{n})")
        else:
            args.append(f"{hpvar}[{layout.hyper_slots[r_i][n]}]" if n in rule._hypers else opt_literal(rule._values[n]))
    return f"finish_{r_i}({', '.join(args)})"


def reduction_lines(layout: ChainLayout, r_i: int, loop_lines, indent: str) -> list:
    """A dry pass for reduction rule r_i over the elements produced by ``loop_lines`` (``loop_lines(body)``
    wraps a body in the element loop): the chain up to r_i without writing anything, rule r_i's
    contributions accumulated in float64 into ``acc{r}_{j}`` (its ``finish`` runs elsewhere: :func:`finish_call`).
    The CUDA emitter's form (grid-stride loops); the CPU emitter unrolls its own."""
    ops = reduce_ops(layout.rules[r_i])
    lines = [f"{indent}acc{r_i}_{j} = {identity(op)}" for j, op in enumerate(ops)]
    body = element_lines(layout, r_i, "gi", "xi", lambda k: f"S{k}[i]", False, "")
    rargs = call_args(layout, r_i, "reduce", ["d", "xi"])
    body.append(f"{', '.join(f'c{j}' for j in range(len(ops)))}, = reduce_t_{r_i}({rargs})")
    for j, op in enumerate(ops):
        body.append(accumulate(f"acc{r_i}_{j}", f"c{j}", op))
    return lines + loop_lines(body)
