"""Per-array optimiser state: the rule, its step count, hyperparameters and per-element state arrays."""
from __future__ import annotations

import numpy as np

from . import codegen
from .chain import Chain
from .rule import Rule

__all__ = ["Leaf", "as_rule", "check_param_dtype"]

_SUPPORTED = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128))


def as_rule(rule):
    if isinstance(rule, (Rule, Chain)):
        return rule
    if hasattr(rule, "setup_leaf"):  # host-level wrappers (AccumGrad, MixedPrecision, ...)
        return rule
    if isinstance(rule, type) and issubclass(rule, Rule):
        raise TypeError(f"expected a rule instance, got the class {rule.__name__}; use {rule.__name__}()")
    raise TypeError(f"expected a rule (e.g. numbaopt.Adam()), got {rule!r}")


def check_param_dtype(dtype, where="x"):
    dtype = np.dtype(dtype)
    if dtype in _SUPPORTED:
        if not dtype.isnative:
            raise TypeError(f"{where}: byte-swapped dtype {dtype}; use a native-endian array")
        return dtype
    if dtype == np.float16:
        raise TypeError(f"{where}: float16 parameters are not computed directly (Numba has no float16 on the "
                        "CPU); wrap the rule in numbaopt.MixedPrecision(np.float32, rule), which keeps a "
                        "float32 master copy")
    if dtype.kind in "biu":
        raise TypeError(f"{where}: dtype {dtype} is not a parameter dtype; expected float32, float64, "
                        "complex64 or complex128")
    raise TypeError(f"{where}: unsupported dtype {dtype}; expected float32, float64, complex64 or complex128")


class Leaf:
    """Optimiser state of one parameter array.

    Attributes: ``rule``, ``t`` (steps taken), ``shape``, ``dtype``, ``arrays`` (the per-element state,
    flat, in kernel order) and ``hp`` (current hyperparameters, in the parameters' real precision). ``leaf.state`` maps state
    names to arrays shaped like the parameter (views).
    """

    __slots__ = ("rule", "layout", "arrays", "t", "hp", "shape", "dtype", "kern", "scheduled", "skipped",
                 "fast", "__weakref__")

    def __init__(self, rule, shape, dtype, arrays=None, t=0, hp=None, skipped=0):
        self.rule = rule
        members = rule.rules
        for r in members:
            if np.dtype(dtype).kind == "c" and not type(r).supports_complex:
                raise TypeError(f"{type(r).__name__} does not support complex parameters (dtype {np.dtype(dtype)})")
        self.layout = codegen.ChainLayout(members)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.t = int(t)
        self.skipped = int(skipped)
        from .schedules import Schedule
        self.scheduled = any(isinstance(r._values[n], Schedule) for r in members for n in r._hypers)
        self.hp = self.layout.hyper_vector(self.t + 1, self.dtype) if hp is None else hp
        size = int(np.prod(self.shape, dtype=np.int64))
        if arrays is None:
            arrays = []
            for (r_i, decl), dt in zip(self.layout.state_decls, self.layout.state_dtypes(self.dtype)):
                init = decl.init
                if isinstance(init, str):
                    init = members[r_i]._values[init]
                    from .schedules import Schedule
                    if isinstance(init, Schedule):
                        init = init(1)
                arrays.append(np.full(size, init, dtype=dt) if init != 0 else np.zeros(size, dtype=dt))
        self.arrays = tuple(arrays)
        self.kern = None
        self.fast = None

    def fast_call(self):
        """``call(x, g, t) -> status`` with the kernel and state bound (the small-array fast path)."""
        from .backends.cpu import bind_inplace
        self.fast = bind_inplace(self)
        return self.fast

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def kernels(self):
        k = self.kern
        if k is None:
            k = self.kern = codegen.kernels(self.rule.rules, self.dtype)
        return k

    @property
    def state(self) -> dict:
        """State arrays by name (``m``, ``v``, ...; ``name_k`` for rule k of a chain when names repeat)."""
        names = [d.name for _, d in self.layout.state_decls]
        out = {}
        for (r_i, d), a in zip(self.layout.state_decls, self.arrays):
            key = d.name if names.count(d.name) == 1 else f"{d.name}_{r_i}"
            out[key] = a.reshape(self.shape)
        return out

    def copy(self) -> "Leaf":
        new = Leaf.__new__(Leaf)
        for s in Leaf.__slots__[:-1]:
            setattr(new, s, getattr(self, s))
        new.arrays = tuple(a.copy() for a in self.arrays)
        new.hp = self.hp.copy()
        new.fast = None
        return new

    def with_rule(self, rule) -> "Leaf":
        """The same moments and step count under a rule with other hyperparameters (same options)."""
        new = self.copy()
        new.rule = rule
        new.layout = codegen.ChainLayout(rule.rules)
        from .schedules import Schedule
        new.scheduled = any(isinstance(r._values[n], Schedule) for r in rule.rules for n in r._hypers)
        new.hp = new.layout.hyper_vector(self.t + 1, self.dtype)
        return new

    def adjusted_rule(self, hyper: dict):
        """``self.rule`` with runtime hyperparameters changed; options cannot change (state layout)."""
        members = self.rule.rules
        hypers = sorted({n for r in members for n in r._hypers})
        for n in hyper:
            if n not in hypers:
                opts = {o for r in members for o in r._options}
                if n in opts:
                    raise ValueError(f"{n} is a compile-time option of {self.rule!r}; set up a new state to "
                                     "change it")
                raise ValueError(f"unknown hyperparameter {n!r}; valid: {hypers}")
        return self.rule.replace(**hyper)

    def __repr__(self):
        shape = "×".join(map(str, self.shape)) or "scalar"
        extra = f", skipped={self.skipped}" if self.skipped else ""
        return f"Leaf({self.rule!r}, t={self.t}, {self.dtype.name}[{shape}]{extra})"
