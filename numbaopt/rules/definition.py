"""Checks of a rule's definition, run when its class is created (not at first compile): the functions the
generator copies, their arguments and the names their bodies use, and the extra rules of an axis reduction."""
from __future__ import annotations

import ast
import dis
import inspect
import textwrap
import types

from .ops import STEP_NAMESPACE

__all__ = ["function_source", "step_args", "check_definition", "units_per_axis", "scalar_states", "AXES", "ELEMENTS",
           "SCALAR"]

#: the units of an axis reduction, for a leaf viewed (by its rule's ``geometry``) as ``(P, A, Q, B, S)``, the
#: leaf's axes cut into five consecutive groups: ``rows`` are the ``(p, a, q, s)`` (a sum over the B axes),
#: ``cols`` the ``(p, q, b, s)`` (a sum over the A axes), ``batch`` the ``(p, q, s)`` (a sum over both)
AXES = ("rows", "cols", "batch")
#: the axis of a matrix rule (``matrix``): every element its own unit; the finals come from ``matrix``
ELEMENTS = "elements"
#: the "axis" of a reduction's scalar state (``state(scalar=True)``): one unit per array (or per tree)
SCALAR = "scalar"


def function_source(f) -> str:
    """Dedented source of a (static) method, without decorators."""
    f = getattr(f, "__func__", f)
    src = textwrap.dedent(inspect.getsource(f))
    tree = ast.parse(src)
    fn = tree.body[0]
    fn.decorator_list = []
    return ast.unparse(fn)


def step_args(f) -> list:
    f = getattr(f, "__func__", f)
    code = getattr(f, "__code__", None)
    if (type(f) is types.FunctionType and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
            and not hasattr(f, "__wrapped__") and not hasattr(f, "__signature__")):
        return list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])  # what signature() says, sooner
    return list(inspect.signature(f).parameters)


def _free_names(f, allowed: frozenset = STEP_NAMESPACE) -> set:
    """The names ``f``'s body reads but neither binds nor takes as arguments (globals, builtins, an enclosing
    function's variables), less ``allowed``. Read from the bytecode, not the source: this runs for every rule
    class, the built-in ones at ``import numbaopt``, and parsing their source took most of that import."""
    f = inspect.unwrap(getattr(f, "__func__", f))  # the function whose source the generator copies
    code = getattr(f, "__code__", None)
    if code is None:  # not a Python function: read its source
        fn = ast.parse(function_source(f)).body[0]
        args = {a.arg for a in fn.args.args}
        assigned, used = set(), set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Name):
                (assigned if isinstance(node.ctx, ast.Store) else used).add(node.id)
        return used - assigned - args - allowed
    free = set(code.co_freevars) - allowed
    codes = [code]
    while codes:
        c = codes.pop()
        codes += [k for k in c.co_consts if isinstance(k, types.CodeType)]  # comprehensions, lambdas
        if not set(c.co_names) - allowed:  # co_names: every global read, and attribute names
            continue
        free |= {i.argval for i in dis.get_instructions(c) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")} - allowed
    return free


def check_definition(cls):
    """Fail at class creation (not at first compile) when a definition is malformed."""
    axes = tuple(cls.axes)
    scalars = scalar_states(cls)
    if scalars:
        _check_scalar_states(cls, scalars)
    if axes:
        _check_axes(cls, axes)
        fin = {f"{f}_{a}" for f in cls.finals for a in axes}
    else:
        fin = set(cls.finals)
    known = set(cls._hypers) | set(cls._options) | set(cls.scalars) | fin
    for fname in ("step", "reduce"):
        args = _static_args(cls, fname)
        if args is None:
            continue
        f = cls.__dict__[fname]
        if fname == "step":
            if args[:2] != ["g", "x"]:
                raise TypeError(f"{cls.__name__}.step must start with (g, x, ...), got {args}")
            st = [n for n, d in cls._states.items() if d.axis is None]
            if args[2:2 + len(st)] != st:
                raise TypeError(f"{cls.__name__}.step: after (g, x) come the states {st} in order; got {args}")
            rest = args[2 + len(st):]
        else:
            if args[:2] != ["g", "x"]:
                raise TypeError(f"{cls.__name__}.reduce must start with (g, x, ...), got {args}")
            rest = args[2:]
            # a contribution may read the rule's states at its element (before this step) and its scalar states
            rest = [a for a in rest if not (a in cls._states and cls._states[a].axis in (None, SCALAR))]
        bad = [a for a in rest if a not in known]
        if bad:
            raise TypeError(f"{cls.__name__}.{fname}: unknown argument(s) {bad}; "
                            f"expected names among {sorted(known)}")
        free = _free_names(f)
        if free:
            raise TypeError(f"{cls.__name__}.{fname} uses {sorted(free)}, which generated code cannot see; "
                            f"a step may use its arguments and {sorted(STEP_NAMESPACE)}")
    args = _static_args(cls, "evaluate")
    if args is not None:
        ok = set(cls._states) | set(cls._hypers) | set(cls._options)
        if not args or args[0] != "x" or any(a not in ok for a in args[1:]):
            raise TypeError(f"{cls.__name__}.evaluate takes (x, <state, hyperparameter or option names>), got {args}")
    if cls.__dict__.get("reduce") is not None and not cls.reduce_ops:
        raise TypeError(f"{cls.__name__} defines reduce but no reduce_ops")
    hyper_like = set(cls._hypers) | set(cls._options)
    for fname, lead in (("prepare", 1), ("finish", None)):
        args = _static_args(cls, fname)
        if args is None:
            continue
        f = cls.__dict__[fname]
        if fname == "prepare":
            if not args or args[0] != "t":
                raise TypeError(f"{cls.__name__}.prepare must start with t, got {args}")
            if not cls.scalars:
                raise TypeError(f"{cls.__name__} defines prepare but does not name its results in `scalars`")
        n_lead = lead if lead is not None else (len(cls.reduce_ops) if not callable(cls.reduce_ops) else 0)
        if fname == "finish" and scalars:  # the totals, then the scalar states
            if args[n_lead:n_lead + len(scalars)] != scalars:
                raise TypeError(f"{cls.__name__}.finish takes (<{n_lead} totals>, <the scalar states {scalars}>, "
                                f"<hyperparameters>), got {args}")
            n_lead += len(scalars)
        if fname == "finish" and axes:  # the totals, then count, then this axis's unit states
            n_lead += 1 + units_per_axis(cls)
            if args[len(cls.reduce_ops):len(cls.reduce_ops) + 1] != ["count"]:
                raise TypeError(f"{cls.__name__}.finish of an axis reduction takes (<{len(cls.reduce_ops)} totals>, "
                                f"count, <{units_per_axis(cls)} unit states>, <hyperparameters>), got {args}")
        ok = hyper_like | (set(cls.scalars) if fname == "finish" and axes else set())  # axis: per-step scalars too
        bad = [a for a in args[n_lead:] if a not in ok and not (lead is None and callable(cls.reduce_ops))]
        if bad:
            raise TypeError(f"{cls.__name__}.{fname}: unknown argument(s) {bad}; expected hyperparameter or "
                            f"option names among {sorted(hyper_like)}")
        free = _free_names(f)
        if free:
            raise TypeError(f"{cls.__name__}.{fname} uses {sorted(free)}, which generated code cannot see")


def scalar_states(cls) -> list:
    """The names of ``cls``'s scalar states (``state(scalar=True)``), in declaration order."""
    return [n for n, d in cls._states.items() if d.axis == SCALAR]


def _check_scalar_states(cls, names):
    """A reduction's scalar states: on a rule with ``reduce`` (a tuple of ops) and ``finish``, not an axis one."""
    name = cls.__name__
    if tuple(cls.axes):
        raise TypeError(f"{name}: scalar state(s) {names} belong to a reduction over the array or tree; an axis "
                        "reduction keeps per-unit state (state(axis=...))")
    if getattr(cls, "reduce", None) is None or getattr(cls, "finish", None) is None or callable(cls.reduce_ops):
        raise TypeError(f"{name}: scalar state(s) {names} need a reduction: reduce, a tuple of reduce_ops and "
                        "finish (which returns the finals, then the new scalar states)")


def _static_args(cls, fname: str):
    """The argument names of ``cls``'s own ``fname`` (None when the class does not define it); a ``TypeError``
    unless it is a ``@staticmethod``."""
    f = cls.__dict__.get(fname)
    if f is None:
        return None
    if not isinstance(f, staticmethod):
        raise TypeError(f"{cls.__name__}.{fname} must be a @staticmethod")
    return step_args(f)


def units_per_axis(cls) -> int:
    """The number of unit states each axis of ``cls`` has (the same for every axis: one ``finish`` serves all)."""
    per = [sum(1 for d in cls._states.values() if d.axis == a) for a in cls.axes]
    return per[0] if per else 0


def _check_axes(cls, axes):
    """The extra rules of an axis reduction (checked at class creation)."""
    name = cls.__name__
    if getattr(cls, "matrix", None) is not None:
        _check_matrix(cls, axes)
        return
    if len(set(axes)) != len(axes) or not set(axes) <= set(AXES):
        raise TypeError(f"{name}.axes={axes!r}; expected distinct names among {AXES}")
    if getattr(cls, "finish", None) is None or (getattr(cls, "reduce", None) is None) != (not cls.reduce_ops):
        raise TypeError(f"{name}: an axis reduction needs finish, and reduce with reduce_ops (or neither: per-unit "
                        "state that finish renews without a pass over the elements)")
    if callable(cls.reduce_ops) or any(op not in ("sum", "max") for op in cls.reduce_ops):
        raise TypeError(f"{name}.reduce_ops={cls.reduce_ops!r}; an axis reduction takes a tuple of 'sum'/'max'")
    if cls.scope != "leaf":
        raise TypeError(f"{name}: an axis reduction is per unit of a leaf; scope must be 'leaf'")
    if {"error", "skip"} & set(cls.finals):
        raise TypeError(f"{name}: an axis reduction cannot refuse or skip a step (finals 'error'/'skip')")
    stray = [n for n, d in cls._states.items() if d.axis is not None and d.axis not in axes]
    if stray:
        raise TypeError(f"{name}: unit state(s) {stray} on an axis not in axes={axes!r}")
    per = [sum(1 for d in cls._states.values() if d.axis == a) for a in axes]
    if len(set(per)) > 1:
        raise TypeError(f"{name}: every axis needs the same number of unit states (one finish serves all); "
                        f"got {dict(zip(axes, per))}")
    if any(d.when is not None for d in cls._states.values() if d.axis is not None):
        raise TypeError(f"{name}: unit states cannot be optional (when=...)")


def _check_matrix(cls, axes):
    """A matrix rule: ``axes = ("elements",)``, one ``"keep"`` contribution per element (``reduce``), one final
    per element computed by ``matrix(U, <hyper/option names>)`` from the contributions as a matrix."""
    name = cls.__name__
    if axes != (ELEMENTS,) or tuple(cls.reduce_ops) != ("keep",) or len(cls.finals) != 1:
        raise TypeError(f"{name}: a matrix rule has axes = ('elements',), reduce_ops = ('keep',) and one final")
    if getattr(cls, "reduce", None) is None or getattr(cls, "finish", None) is not None:
        raise TypeError(f"{name}: a matrix rule has reduce (its contribution per element) and no finish")
    if any(d.axis is not None for d in cls._states.values()):
        raise TypeError(f"{name}: a matrix rule has no unit states")
    args = _static_args(cls, "matrix")
    if args is not None:
        f = cls.__dict__["matrix"]
        ok = set(cls._hypers) | set(cls._options)
        if not args or any(a not in ok for a in args[1:]):
            raise TypeError(f"{name}.matrix takes (U, <hyperparameter or option names>), got {args}")
        free = _free_names(f, STEP_NAMESPACE | {"range", "len"})  # array code loops
        if free:
            raise TypeError(f"{name}.matrix uses {sorted(free)}, which generated code cannot see")
