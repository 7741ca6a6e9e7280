"""The state of one parameter array (:class:`Leaf`) and the checks every backend applies to parameters
and gradients (one place: the bare-array path, the tree pipeline and the CUDA backend call these)."""
from __future__ import annotations

import numbers

import numpy as np

from ..compiler import ChainLayout, kernels
from ..rules.base import Rule
from ..rules.chain import Chain

__all__ = ["Leaf", "as_rule", "check_param_dtype", "check_grad", "adjusted_rule", "raise_status",
           "status_error", "SUPPORTED", "StateInUseError", "in_use", "enter", "leave", "as_reader"]

#: the dtypes the kernels compute in
SUPPORTED = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128))


def as_rule(rule):
    """``rule`` if it is a rule or chain; a clear ``TypeError`` otherwise."""
    if isinstance(rule, (Rule, Chain)):
        return rule
    if isinstance(rule, type) and issubclass(rule, Rule):
        raise TypeError(f"expected a rule instance, got the class {rule.__name__}; use {rule.__name__}()")
    raise TypeError(f"expected a rule (e.g. numbaopt.Adam()), got {rule!r}")


def check_param_dtype(dtype, where="x", layout: ChainLayout | None = None) -> np.dtype:
    """The compute dtype for a parameter of ``dtype`` under ``layout`` (a ``TypeError`` naming ``where`` when
    no kernel can step it)."""
    dtype = np.dtype(dtype)
    master = layout.master if layout is not None else None
    if master is not None:
        if dtype.kind != "f" or not dtype.isnative:
            raise TypeError(f"{where}: MixedPrecision needs a real floating-point parameter, got {dtype}")
        return master
    if dtype in SUPPORTED:
        if not dtype.isnative:
            raise TypeError(f"{where}: byte-swapped dtype {dtype}; use a native-endian array")
        return dtype
    if dtype == np.float16:
        raise TypeError(f"{where}: float16 parameters are not computed directly (Numba has no float16 on the "
                        "CPU); put numbaopt.MixedPrecision(np.float32) first in the chain (a float32 master copy)")
    if dtype.kind in "biu":
        raise TypeError(f"{where}: dtype {dtype} is not a parameter dtype; expected float32, float64, "
                        "complex64 or complex128")
    raise TypeError(f"{where}: unsupported dtype {dtype}; expected float32, float64, complex64 or complex128")


def check_grad(g, dtype, shape, where, compute=None) -> np.ndarray:
    """The gradient ``g`` of a parameter of ``dtype`` and ``shape``, validated (before anything is written)
    and returned as an ndarray of the compute dtype (``compute``, default ``dtype``). Python and NumPy
    numbers are accepted for a 0-d parameter; another dtype of the same kind is cast."""
    dtype = np.dtype(dtype)
    if type(g) is not np.ndarray:
        if isinstance(g, numbers.Number) and not isinstance(g, bool) and tuple(shape) == ():
            g = np.asarray(g, dtype=dtype if isinstance(g, numbers.Integral) else None)
        elif isinstance(g, np.ndarray):  # a subclass: its data, as a plain array
            g = np.asarray(g)
        else:
            raise TypeError(f"{where}: expected a {dtype} numpy array of shape {tuple(shape)} (or None), got "
                            f"{type(g).__name__}")
    if g.shape != tuple(shape):
        raise ValueError(f"{where}: shape {g.shape}, expected {tuple(shape)}")
    target = dtype if compute is None else np.dtype(compute)
    if g.dtype != target:
        if g.dtype.kind != dtype.kind or g.dtype.kind not in "fc":
            raise TypeError(f"{where}: dtype {g.dtype}, expected {dtype} (the parameter's dtype or the same kind)")
        g = g.astype(target)
    return g


def adjusted_rule(rule, hyper: dict):
    """``rule`` with runtime hyperparameters changed (the one check of ``adjust``): an unknown name or a
    compile-time option is a ``ValueError`` and nothing changes."""
    members = rule.rules
    hypers = sorted({n for r in members for n in r._hypers})
    for n in hyper:
        if n not in hypers:
            if any(n in r._options for r in members):
                raise ValueError(f"{n} is a compile-time option of {rule!r}; set up a new state to change it")
            raise ValueError(f"unknown hyperparameter {n!r}; valid: {hypers}")
    return rule.replace(**hyper)


def status_error(rule, status: int, where: str = "") -> ValueError:
    """The error for a kernel's refusal (status ``ERROR_BASE + r``: reduction rule r refused)."""
    r = rule.rules[status - 2]
    msg = getattr(type(r), "error_message", "its reduction refused the step")
    return ValueError(f"{where + ': ' if where else ''}{type(r).__name__}: {msg}")


def raise_status(rule, status: int, where: str = "") -> None:
    """Raise the rule's error for a refused step (status >= 2); nothing for the other statuses."""
    if status >= 2:
        raise status_error(rule, status, where)


class StateInUseError(RuntimeError):
    """A state used by two calls at once: another thread is stepping it (or reading it while this call
    would write it). Nothing was done. A state belongs to one thread at a time: give each thread its own
    state, or serialise the calls with your own lock."""


def in_use(fname: str, state) -> StateInUseError:
    return StateInUseError(f"{fname}: this {type(state).__name__} is in use by another call (another thread is "
                           "stepping or reading it); nothing was done. Give each thread its own state, or "
                           "serialise the calls with a lock")


# The guard of a state (``state.users``: 0 idle, -1 one writer, k > 0 readers). Between reading ``users`` and
# storing it there is no call, no loop and no allocation, so CPython does not switch threads there: the
# test-and-set is atomic under the GIL at the cost of two attribute accesses, and states used by one thread
# each never contend (no lock is shared). The kernels release the GIL, so without it two threads would step
# one state's arrays at once.
def enter(state, fname: str, write: bool = True) -> None:
    """Mark ``state`` in use by this call (a writer: ``update_``, ``adjust_``; a reader: ``update``, ``save``),
    or raise :class:`StateInUseError`."""
    u = state.users
    if u < 0 or (write and u):
        raise in_use(fname, state)
    state.users = -1 if write else u + 1


def leave(state, write: bool = True) -> None:
    """End :func:`enter`."""
    state.users = 0 if write else state.users - 1


def as_reader(state, fname: str, read):
    """``read()`` while ``state`` is held as a reader (pickling, copying: a step of another thread raises
    :class:`StateInUseError` instead of leaving a half-written copy)."""
    enter(state, fname, False)
    try:
        return read()
    finally:
        leave(state, False)


class Leaf:
    """Optimiser state of one parameter array.

    ``rule``; ``t`` (steps taken), ``skipped`` (steps a rule skipped), ``count`` (gradients accumulated by an
    AccumGrad in the current cycle); ``shape``; ``dtype`` (the compute dtype) and ``param_dtype`` (the
    parameter's, different under MixedPrecision); ``arrays`` (the per-element state, flat, in kernel order)
    and ``state`` (the same by name, shaped like the parameter); ``master`` (the MixedPrecision master copy,
    flat, or None); ``hp`` (current hyperparameters, in the compute dtype's real precision); ``counters``
    (the int64 counter array the kernels advance, see ``numbaopt.compiler.layout.COUNTERS``).
    """

    #: the name ``repr`` shows (a tree's leaf views are Leaf too)
    display_name = "Leaf"

    __slots__ = ("rule", "layout", "arrays", "counters", "hp", "shape", "dtype", "param_dtype", "master", "kern",
                 "fast", "users", "__weakref__")

    def __init__(self, rule, shape, dtype, arrays=None, t=0, hp=None, skipped=0, counters=None, master=None,
                 layout=None, anchor=0):
        self.rule = rule
        self.layout = layout = ChainLayout(rule) if layout is None else layout
        self.shape = tuple(int(n) for n in shape)
        self.param_dtype = np.dtype(dtype)
        self.dtype = layout.compute_dtype(self.param_dtype)
        if self.dtype.kind == "c":
            for r in rule.rules:
                if not type(r).supports_complex:
                    raise TypeError(f"{type(r).__name__} does not support complex parameters (dtype {self.dtype})")
        self.counters = np.array([t, t, 0, skipped], dtype=np.int64) if counters is None else counters
        self.hp = layout.hyper_vector(self.t + 1, int(self.counters[1]) + 1, self.dtype) if hp is None else hp
        # ``anchor``: the parameter's page offset, which the state arrays are placed apart from
        if arrays is None:  # the per-element states, then (axis reductions) the unit states and the geometry row
            arrays = layout.new_state(self.size, self.dtype, anchor) + layout.new_units([self.shape], self.dtype)
        self.arrays = tuple(arrays)
        if master is None and self.param_dtype != self.dtype:
            raise ValueError(f"a {self.param_dtype} parameter computed in {self.dtype} needs its master copy")
        self.master = master if self.param_dtype != self.dtype else None
        self.kern = None
        self.fast = None
        self.users = 0  # see enter()

    # read-only: the kernels keep the counters consistent with each other (a checkpoint is refused otherwise)
    t = property(lambda self: int(self.counters[0]), doc="steps taken")
    skipped = property(lambda self: int(self.counters[3]), doc="steps a rule asked to skip (SkipNonFinite)")
    count = property(lambda self: int(self.counters[2]), doc="gradients accumulated in the current AccumGrad cycle")

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def scheduled(self) -> bool:
        """Whether a hyperparameter is driven by a schedule (``hp`` is refilled every step)."""
        return self.layout.scheduled

    def kernels(self):
        """The generated CPU module of this state's chain and compute dtype."""
        k = self.kern
        if k is None:
            k = self.kern = kernels(self.rule, self.dtype)
        return k

    @property
    def state(self) -> dict:
        """State arrays by name (``m``, ``v``, ...; ``name_k`` for member k of a chain when names repeat), shaped
        like the parameter; an axis reduction's unit states (``v_row``) shaped like the parameter without the
        axes summed over."""
        lay = self.layout
        out = {n: a.reshape(self.shape) for n, a in zip(lay.state_names(), self.arrays)}
        units = lay.unit_arrays(self.arrays)
        out.update({n: a.reshape(s) for n, a, s in zip(lay.unit_names(), units, lay.unit_shapes(self.shape))})
        return out

    def step_hp(self) -> np.ndarray:
        """The hyperparameters for the next step (schedules evaluated and checked; ``hp`` when none)."""
        if not self.layout.scheduled:
            return self.hp
        return self.layout.hyper_vector(self.t + 1, int(self.counters[1]) + 1, self.dtype)

    def copy(self) -> Leaf:
        """An independent copy (state arrays, counters, hyperparameters and master copied)."""
        return self.derive(arrays=[a.copy() for a in self.arrays], counters=self.counters.copy(),
                           master=None if self.master is None else self.master.copy())

    def derive(self, arrays, counters, master=None) -> Leaf:
        """A new state of this type with the given arrays, counters and master (nothing else copied but
        ``hp``)."""
        new = object.__new__(type(self))
        for cls in type(self).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot != "__weakref__" and hasattr(self, slot):
                    setattr(new, slot, getattr(self, slot))
        new.arrays, new.counters, new.master, new.fast, new.users = tuple(arrays), counters, master, None, 0
        new.hp = self.hp.copy()
        return new

    def with_rule(self, rule) -> Leaf:
        """The same state under a rule with other hyperparameters (same options): a new state."""
        new = self.copy()
        new.set_rule_(rule)
        return new

    def set_rule_(self, rule) -> None:
        """Switch to ``rule`` (same options) in place: ``hp`` is rewritten in place, so compiled callers
        holding it see the new values. Validates everything before changing anything."""
        layout = ChainLayout(rule)
        hp = layout.hyper_vector(self.t + 1, int(self.counters[1]) + 1, self.dtype)
        self.rule, self.layout = rule, layout
        self.hp[:] = hp

    def count_status(self, status: int) -> None:
        """Advance the counters after a single-array step that kept them on the host (status 0: stepped,
        1: skipped)."""
        self.counters[3 if status == 1 else 0] += 1
        if status == 0:
            self.counters[1] += 1

    # Pickling and copying. The pickled form is the state's data alone (rule, shape, dtype, arrays, counters,
    # hyperparameters, master copy): the compiled module (``kern``) and the bound fast call (``fast``) are
    # process-local and made again on first use, from numbaopt's disk cache (no recompile).
    def __getstate__(self) -> dict:
        # copies, taken under the guard (never a half-written state): pickle writes the arrays after this returns
        return as_reader(self, "pickle", lambda: {
            "rule": self.rule, "shape": self.shape, "dtype": self.param_dtype.str,
            "arrays": [np.array(a) for a in self.arrays], "counters": self.counters.copy(),
            "hp": self.hp.copy(), "master": None if self.master is None else self.master.copy()})

    def __setstate__(self, d: dict) -> None:
        # the dtype by name: NumPy's own descriptor object, which the fast path compares by identity
        master = None if d["master"] is None else np.array(d["master"])
        anchor = 0 if master is None else master.ctypes.data
        Leaf.__init__(self, d["rule"], d["shape"], np.dtype(d["dtype"]), counters=np.array(d["counters"]),
                      hp=np.array(d["hp"]), master=master, anchor=anchor)
        for a, v in zip(self.arrays, d["arrays"], strict=True):  # fresh arrays, placed as setup places them
            a[...] = v.reshape(-1)

    def __copy__(self) -> Leaf:
        """``copy.copy`` and ``copy.deepcopy``: an independent copy, as :meth:`copy` (never shared arrays)."""
        return as_reader(self, "copy", self.copy)

    def __deepcopy__(self, memo) -> Leaf:
        return self.__copy__()

    def __repr__(self):
        shape = "×".join(map(str, self.shape)) or "scalar"
        extra = f", skipped={self.skipped}" if self.skipped else ""
        if self.layout.accum is not None:
            extra += f", count={self.count}"
        dt = self.dtype.name if self.master is None else f"{self.param_dtype.name} (master {self.dtype.name})"
        return f"{self.display_name}({self.rule!r}, t={self.t}, {dt}[{shape}]{extra})"
