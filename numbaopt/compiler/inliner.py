"""Inline the rules' functions into a generated module's kernels at the source level.

A generated module (CPU or CUDA) defines every member's ``step``/``reduce``/``prepare``/``finish`` and the
prelude's helpers (``sqrt``, ``abs2``, ...) as ``@njit(inline="always")`` functions (CUDA: device functions), and
its kernels call them. Numba inlines such a call by running the callee's untyped passes again and deep-copying
its IR, once per call site (``inline_closurecall``): 22% of a cold ``chain(ClipGlobalNorm, AdamW)`` step under the
profiler. This module writes the calls out instead, before Numba sees the module, so that a kernel is one
function of plain statements:

* ``T = f(a, b)`` becomes ``f``'s body with its locals renamed (``_k{n}_name``), its parameters bound to the
  arguments and each ``return v`` an assignment ``T = v`` ending its path (the statements after an ``if`` that
  returns on some path are written into both branches). A name or a constant argument is substituted; any other
  is written where the body reads it when the body reads it once and has no loop, not at all when the body does
  not read it, and otherwise copied into a local first (as is every parameter the body assigns);
* a call inside an expression to a function whose body is one ``return expr`` (``sqrt``, ``abs2``, ...) becomes
  that expression when each argument is a name or a constant or its parameter is used once;
* ``if``/``... if ... else ...`` tests that the substituted constants decide (a member's options, written into
  the call as literals) keep only the branch taken, as Numba's own dead-branch pruning would, the constants
  compared as Numba compares them (``p == _R(0.1)`` with ``p = 0.1`` is False where ``_R`` is float32).

The arithmetic and its order are the callee's, so the kernels compute the same bits (the arguments are pure
expressions: loads, casts and arithmetic). A call this cannot write out (a ``return`` inside a loop, a path without
one, keyword or starred arguments, a nested scope, a name that would collide with the kernel's, a statement that
shares its line with another) stays a call, and Numba inlines it as before. Measured in docs/performance.md
("Third round: the rules' calls written out").
"""
from __future__ import annotations

import ast
import hashlib
import math
import operator
import re

import numpy as np

__all__ = ["inline_module", "finish_source", "STAMP"]

#: how many times more statements than the callee's body an inlined copy may have (branches that each receive the
#: statements after them) before the call is left to Numba
_GROWTH = 8

_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge}
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}
_UNKNOWN = object()
_SCOPES = (ast.Lambda, ast.FunctionDef, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
           ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await, ast.Try, ast.With)


class _NotInlinable(Exception):
    """The call stays a call (Numba inlines it)."""


def _is_inline_decorator(d) -> bool:
    """``@njit(inline="always", ...)``, or a CUDA device function ``@cuda.jit(device=True, ...)``."""
    if not isinstance(d, ast.Call):
        return False
    want = {"njit": ("inline", "always"), "cuda.jit": ("device", True)}.get(ast.unparse(d.func))
    return want is not None and any(k.arg == want[0] and isinstance(k.value, ast.Constant)
                                    and k.value.value == want[1] for k in d.keywords)


def _stored(fn) -> set:
    """Names the function assigns (its locals besides its parameters)."""
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


class _Callee:
    """An inlinable function of the module: its parameters, locals, free (global) names and body."""

    def __init__(self, fn: ast.FunctionDef):
        a = fn.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
            raise _NotInlinable(fn.name)
        if any(isinstance(n, _SCOPES) for n in ast.walk(ast.Module(body=fn.body, type_ignores=[]))):
            raise _NotInlinable(fn.name)
        self.params = [p.arg for p in a.args]
        self.assigned = _stored(fn)
        self.free = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} - self.assigned - set(self.params)
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        self.body = body
        self.expr = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value else None
        self.size = _count(body)
        self.loops = any(isinstance(n, (ast.For, ast.While)) for s in body for n in ast.walk(s))
        self.uses = {p: sum(1 for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == p) for p in self.params}


def _const_value(node, real):
    """The value of ``node`` when constants decide it (else ``_UNKNOWN``, also where Python would raise, say
    ``"a" < 1.0``: Numba would refuse such code, and the call is left as it is); ``real``: the module's ``_R``."""
    try:
        return _evaluate(node, real)
    except (TypeError, ValueError, OverflowError):
        return _UNKNOWN


def _evaluate(node, real):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id == "INF":
        return math.inf
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_R" and len(node.args) == 1 \
            and not node.keywords:
        v = _const_value(node.args[0], real)
        return _UNKNOWN if v is _UNKNOWN or type(v) not in (int, float, bool) else float(real(v))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        v = _const_value(node.operand, real)
        return _UNKNOWN if v is _UNKNOWN else _UNARY[type(node.op)](v)
    if isinstance(node, ast.Compare):
        return _compare(node, real)
    if isinstance(node, ast.BoolOp):  # as a truth value
        t = _test(node, real)
        return t.value if isinstance(t, ast.Constant) else _UNKNOWN
    return _UNKNOWN


def _compare(node, real):
    left = _const_value(node.left, real)
    for op, right_node in zip(node.ops, node.comparators):
        right = _const_value(right_node, real)
        if left is _UNKNOWN or right is _UNKNOWN or type(op) not in _CMP:
            return _UNKNOWN
        if not _CMP[type(op)](left, right):
            return False
        left = right
    return True


def _clone(node, mapping: dict):
    """A copy of ``node`` with the callee's names replaced: ``mapping[name]`` is a new name (``str``) or an
    expression (copied in). Faster than ``copy.deepcopy`` followed by a transformer."""
    if isinstance(node, ast.Name):
        new = mapping.get(node.id)
        if new is None or isinstance(new, str):
            return ast.Name(new or node.id, node.ctx)
        return _clone(new, {})
    if not node._fields:
        return node  # Load, Store, operators: shared, as ast.parse shares them
    new = node.__class__.__new__(node.__class__)
    for f in node._fields:
        v = getattr(node, f, None)
        if isinstance(v, ast.AST):
            v = _clone(v, mapping)
        elif isinstance(v, list):
            v = [_clone(x, mapping) if isinstance(x, ast.AST) else x for x in v]
        setattr(new, f, v)
    return new


def _test(node, real):
    """A truth test with the ``and``/``or`` operands that constants decide dropped (the operands are pure):
    a constant, or the simplified test."""
    if not isinstance(node, ast.BoolOp):
        return node
    decide = isinstance(node.op, ast.Or)  # the truth value that decides
    kept = []
    for v in node.values:
        v = _test(v, real)
        c = _const_value(v, real)
        if c is _UNKNOWN:
            kept.append(v)
        elif bool(c) == decide:
            return ast.Constant(decide)
    if not kept:
        return ast.Constant(not decide)
    return kept[0] if len(kept) == 1 else ast.BoolOp(node.op, kept)


class _Fold(ast.NodeTransformer):
    """Keep only the branch a constant test takes (``if`` statements and conditional expressions)."""

    def __init__(self, real):
        self.real = real

    def visit_IfExp(self, node):
        self.generic_visit(node)
        node.test = _test(node.test, self.real)
        c = _const_value(node.test, self.real)
        if c is _UNKNOWN:
            return node
        return node.body if c else node.orelse

    def visit_If(self, node):
        self.generic_visit(node)
        node.test = _test(node.test, self.real)
        c = _const_value(node.test, self.real)
        if c is _UNKNOWN:
            node.body = node.body or [ast.Pass()]
            return node
        return (node.body if c else node.orelse) or None


def _count(stmts) -> int:
    """Statements, nested ones included."""
    return sum(1 + _count(getattr(s, "body", [])) + _count(getattr(s, "orelse", [])) for s in stmts)


def _reads(stmts) -> dict:
    """How many times each name is read."""
    out: dict = {}
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                out[n.id] = out.get(n.id, 0) + 1
    return out


def _has_return(stmts) -> bool:
    return any(isinstance(n, ast.Return) for s in stmts for n in ast.walk(s))


def _assign(target, value) -> list:
    """``target = value``; a tuple into a tuple of names as one assignment each when no later element reads
    an earlier target (so that Numba builds no tuple)."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts) \
            and all(isinstance(t, ast.Name) for t in target.elts):
        names = [t.id for t in target.elts]
        later_reads = [{n.id for n in ast.walk(v) if isinstance(n, ast.Name)} for v in value.elts]
        if all(not (set(names[:k + 1]) & later_reads[m]) for k in range(len(names))
               for m in range(k + 1, len(names))):
            return [ast.Assign([ast.Name(n, ast.Store())], v) for n, v in zip(names, value.elts)]
    return [ast.Assign([target], value)]


def _single_exit(stmts, target) -> list:
    """The statements with every ``return v`` turned into ``target = v`` ending its path."""
    out = []
    for k, s in enumerate(stmts):
        rest = stmts[k + 1:]
        if isinstance(s, ast.Return):
            if s.value is None:
                raise _NotInlinable("a bare return")
            return out + _assign(target, s.value)
        if isinstance(s, ast.If) and _has_return([s]):
            body = _single_exit(s.body + rest, target)
            orelse = _single_exit(s.orelse + rest, target)
            return out + [ast.If(s.test, body or [ast.Pass()], orelse)]
        if _has_return([s]):
            raise _NotInlinable("a return inside a loop")
        out.append(s)
    raise _NotInlinable("a path without a return")


class _Inliner:
    """Writes out the calls in one kernel; ``taken``: the kernel's local names (no free name of a callee, a
    global of the module, may be one of them)."""

    def __init__(self, callees: dict, real, taken: set, counter: list):
        self.callees, self.real, self.taken, self.counter = callees, real, taken, counter

    def callee(self, call):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            return None
        c = self.callees.get(call.func.id)
        if c is None or call.keywords or any(isinstance(a, ast.Starred) for a in call.args) \
                or len(call.args) != len(c.params) or c.free & self.taken:
            return None
        return c

    def statements(self, stmts) -> list:
        out = []
        for s in stmts:
            out += self.statement(s)
        return out

    def statement(self, s) -> list:
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            return self.assignment(s)
        expressions = _Expressions(self)
        for field, value in ast.iter_fields(s):
            if field in ("body", "orelse", "finalbody"):
                setattr(s, field, self.statements(value) or ([ast.Pass()] if field == "body" else []))
            elif isinstance(value, ast.AST):
                setattr(s, field, expressions.visit(value))
        return [s]

    def assignment(self, s) -> list:
        """``T = value``: a call at the top of the value written out as statements, the calls inside it as
        expressions, and a tuple into a tuple split."""
        c = self.callee(s.value)
        if c is not None:
            try:
                return self.statements(self.write_out(c, s.value.args, s.targets[0]))
            except _NotInlinable:
                s.value.args = [_Expressions(self).visit(a) for a in s.value.args]
                return [s]
        s.value = _Expressions(self).visit(s.value)
        split = _assign(s.targets[0], s.value)
        if len(split) > 1 or split[0].targets[0] is not s.targets[0] or self.callee(s.value) is not None:
            return self.statements(split)
        return [s]

    def write_out(self, c: _Callee, args, target) -> list:
        """``target = c(*args)`` as statements. An argument that is neither a name nor a constant goes into a
        local first, unless the body (its option tests decided) reads that parameter once and has no loop: then
        it is written where it is read, and when the body does not read it at all, nowhere."""
        self.counter[0] += 1
        prefix = f"_k{self.counter[0]}_"
        mapping = {name: prefix + name for name in c.assigned}
        held = []  # (parameter, its local, the argument)
        for p, a in zip(c.params, args):
            if p not in c.assigned and isinstance(a, (ast.Constant, ast.Name)):
                mapping[p] = a
            else:
                mapping[p] = prefix + p
                held.append((p, prefix + p, a))
        body = _fold_statements([_clone(s, mapping) for s in c.body], self.real)
        reads = _reads(body)
        lead, moved = [], {}
        for p, name, a in held:
            n = 2 if p in c.assigned else reads.get(name, 0)
            if n == 0:
                continue  # not read: the argument's expression (pure) is not written at all
            if n == 1 and not c.loops:
                moved[name] = a
            else:
                lead.append(ast.Assign([ast.Name(name, ast.Store())], a))
        if moved:
            body = [_clone(s, moved) for s in body]
        out = lead + _single_exit(body, target)
        if _count(out) > _GROWTH * c.size:
            raise _NotInlinable("grows too much")
        return out


class _Expressions(ast.NodeTransformer):
    """Calls inside expressions to one-expression functions, written out (innermost first)."""

    def __init__(self, inliner: _Inliner):
        self.inliner = inliner

    def visit_Call(self, node):
        self.generic_visit(node)
        c = self.inliner.callee(node)
        if c is None or c.expr is None:
            return node
        mapping = {}
        for p, a in zip(c.params, node.args):
            if not (isinstance(a, (ast.Constant, ast.Name)) or c.uses[p] <= 1):
                return node
            mapping[p] = a
        expr = _clone(c.expr, mapping)
        return self.visit(_Fold(self.inliner.real).visit(expr))


def _fold_statements(stmts, real) -> list:
    """``stmts`` with the constant tests decided (a decided ``if`` is replaced by its branch, already folded)."""
    out = []
    for s in stmts:
        r = _Fold(real).visit(s)
        out += [] if r is None else r if isinstance(r, list) else [r]
    return out


def _targets(s) -> list:
    """The names a simple statement or a ``for`` header assigns (the generated kernels assign names only)."""
    targets = s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, (ast.AugAssign, ast.For)) \
        else []
    return [n.id for t in targets for n in ([t] if isinstance(t, ast.Name) else getattr(t, "elts", []))
            if isinstance(n, ast.Name)]


def _scan(stmts, calls, lines, found, stored, header):
    """The simple statements of a kernel whose text calls a callee (``calls``: a regular expression) into
    ``found``, the names the kernel assigns into ``stored``; compound statements are entered, their headers
    left as they are. A statement that shares a line with another (``if c: y = f(x)``, ``a = f(x); b = 1``;
    ``header``: the line of the enclosing statement's header) is left as it is: the rewrite replaces lines."""
    last = header
    for k, s in enumerate(stmts):
        stored.update(_targets(s))
        if isinstance(s, (ast.If, ast.For, ast.While)):
            _scan(s.body, calls, lines, found, stored, s.lineno)
            _scan(s.orelse, calls, lines, found, stored, s.lineno)
        elif s.lineno != last and (k + 1 == len(stmts) or stmts[k + 1].lineno != s.end_lineno) \
                and calls.search("\n".join(lines[s.lineno - 1:s.end_lineno])):
            found.append(s)
        last = s.end_lineno


def inline_module(text: str, real_dtype) -> str:
    """The generated module ``text`` with the calls of its kernels (every function not ``inline="always"``,
    and ``step_inline``) to the module's ``inline="always"`` functions written out where possible (module
    docstring). ``real_dtype``: the module's ``_R``, to decide tests such as ``p == _R(2.0)``. Only the
    statements that change are rewritten; the rest of the text is kept as it is."""
    tree = ast.parse(text)
    real = np.dtype(real_dtype).type
    callees, kernels = {}, []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        if any(_is_inline_decorator(d) for d in node.decorator_list) and node.name != "step_inline":
            try:
                callees[node.name] = _Callee(node)
            except _NotInlinable:
                pass
        else:
            kernels.append(node)
    counter, edits = [0], []
    lines = text.split("\n")
    calls = re.compile(r"\b(?:" + "|".join(sorted(callees)) + r")\(")
    for fn in kernels:
        found, stored = [], {a.arg for a in fn.args.args}
        _scan(fn.body, calls, lines, found, stored, fn.lineno)
        inliner = _Inliner(callees, real, stored, counter)
        edits += [(s.lineno, s.end_lineno, s.col_offset, inliner.statement(s)) for s in found]
    for lo, hi, col, new in sorted(edits, key=lambda e: e[0], reverse=True):
        written = "\n".join(ast.unparse(ast.fix_missing_locations(st)) for st in new)
        lines[lo - 1:hi] = [" " * col + ln for ln in written.split("\n")]
    return "\n".join(lines)


def _stamp() -> bytes:
    with open(__file__, "rb") as fh:
        return hashlib.sha256(fh.read()).digest()


#: a hash of this module's source: the generated modules' file names include it, so a changed inliner
#: writes new files instead of reusing the ones an earlier version wrote
STAMP = _stamp()


#: the line of a generated module (CPU or CUDA) naming its real scalar type
_REAL_TYPE = re.compile(r"^_R = np\.(\w+)$", re.M)


def finish_source(text: str) -> str:
    """A generated module's text with its kernels' calls written out (:func:`inline_module` in the module's
    own ``_R``)."""
    return inline_module(text, _REAL_TYPE.search(text).group(1))
