"""The public step API: ``setup``, ``update`` (pure), ``update_`` (in place), ``adjust``, ``adjust_``,
``jit_step``, for one array (a :class:`numbaopt.Leaf`), one device array and nested models (trees).

Both ``update`` and ``update_`` refuse bad input before anything is written: a failed call leaves the
parameters and the state exactly as they were. A ``None`` gradient skips the step (of a leaf, or of the
whole array).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, overload

import numpy as np

from .backends.cpu import bind_inplace, step_array
from .backends.cuda import DeviceGroup, DeviceLeaf, is_device_array, setup_leaf
from .backends.state import Leaf, adjusted_rule, as_rule, check_param_dtype, enter, in_use, leave, status_error
from .compiler import ChainLayout
from .compiler.layout import ALIASED
from .compiler.notice import register as register_public
from .compiler.placement import PAGE
from .rules.base import Rule
from .rules.chain import Chain
from .schedules import Schedule
from .tree.adjust import adjust_tree, adjust_tree_
from .tree.groups import TreeLeaf
from .tree.manage import update_tree, update_tree_
from .tree.params import ARRAY_SUBCLASSES, is_array_subclass, wrap_like
from .tree.paths import Path
from .tree.setup import setup_tree
from .tree.state import StateNode, StateTree
from .tree.torch_models import bump_written, setup_model, torch_form

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

__all__ = ["setup", "update", "update_", "adjust", "adjust_", "jit_step", "JitStep", "Model", "Grad", "State",
           "RuleLike", "RuleChooser", "HyperValue", "DeviceArrayLike"]

# The types of the public API. A model's structure is checked when it is stepped (every message names the
# path), not by the type checker: ``Model`` and ``Grad`` are ``Any``, and the step functions return the model
# with the type it came in with (a pure step rebuilds the same containers).

Model: TypeAlias = Any
"""A model: one NumPy array, one device array, or a nested model (dataclasses, dicts, lists, tuples,
namedtuples, registered containers, torch modules) whose leaves are parameters (float or complex arrays,
tensors, scalars) and anything else, carried through unchanged."""
Grad: TypeAlias = Any
"""The gradients of a model: the model's structure with gradient arrays at the trained leaves (``None``
skips a leaf); for one array, an array of its shape (or ``None``)."""
RuleLike: TypeAlias = Rule | Chain
"""A rule or a fused chain of rules (``numbaopt.Adam()``, ``numbaopt.chain(...)``)."""
RuleChooser: TypeAlias = Callable[[Path, Any], Rule | Chain | None]
"""A rule per leaf of a tree: ``fn(path, leaf) -> rule or None`` (``None``: the leaf is not trained)."""
State: TypeAlias = Leaf | StateTree | DeviceLeaf | DeviceGroup
"""An optimiser state, as :func:`setup` (or :func:`numbaopt.setup_device_group`, :func:`numbaopt.load`)
returns it and the step functions take it (``isinstance(s, numbaopt.State)`` works too)."""
HyperValue: TypeAlias = float | Schedule | Callable[[int], float]
"""A runtime hyperparameter's value (:func:`adjust`): a number, a schedule of the step count, or any function
of the count of steps taken (``docs/conventions.md``)."""

M = TypeVar("M")  # a model, given back with its type
A = TypeVar("A", bound="np.ndarray[Any, Any]")  # one array, given back with its dtype and shape
D = TypeVar("D")  # a device array
L = TypeVar("L", bound=Leaf)  # a Leaf or a DeviceLeaf, given back with its type


class DeviceArrayLike(Protocol):
    """What a device array has (Numba device arrays, CuPy arrays, torch tensors): ``setup`` of one gives a
    ``DeviceLeaf``; a torch tensor on the CPU has the attribute too (it raises there), and its state is a
    one-leaf ``StateTree``."""

    @property
    def __cuda_array_interface__(self) -> Any: ...


@overload
def setup(rule: RuleLike, model: NDArray[Any]) -> Leaf: ...
@overload
def setup(rule: RuleLike, model: DeviceArrayLike) -> DeviceLeaf | StateTree: ...
@overload
def setup(rule: RuleLike | RuleChooser, model: Model) -> StateTree: ...
def setup(rule: Any, model: Any) -> Any:  # the overloads above are the signature
    """Optimiser state for ``model``: one array (a :class:`numbaopt.Leaf`), one device array (a
    ``DeviceLeaf``) or a nested model (a state tree).

    For a tree, ``rule`` may also be a function ``fn(path, leaf) -> rule or None`` choosing per leaf.
    An ndarray subclass (a ``pennylane.numpy.tensor``, a ``np.memmap``; not ``np.matrix`` or a masked
    array) is one array too: a ``Leaf``, stepped like an ndarray (``docs/pennylane.md``).
    """
    if type(model) is not np.ndarray and isinstance(model, np.ndarray) and is_array_subclass(type(model)):
        model = model.view(np.ndarray)  # its data: dtype, shape and address are all a Leaf records
    if type(model) is np.ndarray:
        rule = as_rule(rule)
        layout = ChainLayout(rule)
        compute = check_param_dtype(model.dtype, "x", layout)
        master = model.astype(compute).reshape(-1) if compute != model.dtype else None
        anchor = (master if master is not None else model).ctypes.data % PAGE
        return Leaf(rule, model.shape, model.dtype, master=master, layout=layout, anchor=anchor)
    if is_device_array(model):
        return setup_leaf(rule, model)
    view = setup_model(model)  # a torch module: its named parameters (docs/torch.md)
    return setup_tree(rule, view, None if view is model else type(model).__name__)


@overload
def update(state: DeviceLeaf, model: D, grad: Any) -> tuple[DeviceLeaf, D]: ...
@overload
def update(state: DeviceGroup, model: Sequence[Any], grad: Sequence[Any]) -> tuple[DeviceGroup, list[Any]]: ...
@overload
def update(state: Leaf, model: A, grad: NDArray[Any] | complex | None) -> tuple[Leaf, A]: ...
@overload
def update(state: StateTree, model: M, grad: Grad) -> tuple[StateTree, M]: ...
def update(state: Any, model: Any, grad: Any) -> Any:
    """Pure step: returns ``(new_state, new_model)``; ``state``, ``model`` and ``grad`` are untouched.

    A new array of an ndarray subclass has the model's type, by the model's ``__array_wrap__`` (as NumPy's
    ``model - step`` would): a ``pennylane.numpy.tensor`` keeps its ``requires_grad``.

    A state is used by one thread at a time: a state another thread is stepping in place raises
    :class:`numbaopt.StateInUseError` (several pure steps of one state may run at once)."""
    t = type(state)
    if t is Leaf or t is DeviceLeaf or t is DeviceGroup:
        enter(state, "update", False)
        try:
            if t is Leaf:
                if type(model) is not np.ndarray and is_array_subclass(type(model)):
                    return _step_subclass(state, model, grad, False)
                return step_array(state, model, grad, False)
            if t is DeviceLeaf:
                return state.step(model, grad, False)
            return state.update(model, grad)
        finally:
            leave(state, False)
    if t is not StateTree and hasattr(t, "_numbaopt_step_"):  # a state of another layer (numbaopt.mpi)
        return state._numbaopt_step_(model, grad, False)
    if type(model) is not dict or grad is model:  # a torch form (a module, named parameters): through its view
        form = torch_form(model, grad)
        if form is not None:
            state, new = update_tree(state, form.view, form.grads)
            return state, form.result(new, False)
    return update_tree(state, model, grad)


@overload
def update_(state: DeviceLeaf, model: D, grad: Any) -> tuple[DeviceLeaf, D]: ...
@overload
def update_(state: DeviceGroup, model: Sequence[Any], grad: Sequence[Any]) -> tuple[DeviceGroup, list[Any]]: ...
@overload
def update_(state: Leaf, model: A, grad: NDArray[Any] | complex | None) -> tuple[Leaf, A]: ...
@overload
def update_(state: StateTree, model: M, grad: Grad) -> tuple[StateTree, M]: ...
def update_(state: Any, model: Any, grad: Any) -> Any:
    """In-place step: writes the parameter (when writeable) and the state; returns ``(state, model)``.

    A read-only array is not written: a new (read-only) array is returned, so always use the returned model.
    An ndarray subclass (a ``pennylane.numpy.tensor``) is written like an ndarray, on the same fast path.
    A gradient that overlaps the parameter or the state (other than by being the parameter) is copied first.
    A state another thread is using raises :class:`numbaopt.StateInUseError` and nothing is done.
    """
    if type(state) is Leaf:
        # fast path: a writeable contiguous 1-D array and a gradient of its dtype and shape. On a small
        # array each check here costs about a tenth of the whole step: keep them few and flat. An ndarray
        # subclass seen before (a pennylane tensor) takes it too: the bound kernel's compiled entry point
        # unboxes any ndarray, and a plain ndarray never reaches the set lookups.
        tm, tg = type(model), type(grad)
        if (tm is np.ndarray or tm in ARRAY_SUBCLASSES) and (tg is np.ndarray or tg in ARRAY_SUBCLASSES) \
                and state.master is None:
            dt = state.dtype
            shape = state.shape
            if model.dtype is dt and grad.dtype is dt and model.shape == shape and grad.shape == shape \
                    and len(shape) == 1 and not state.layout.scheduled and model.flags.carray \
                    and grad.flags.carray:
                call = state.fast
                if call is None:
                    call = state.fast = bind_inplace(state)
                if state.users:  # enter(state) inlined: no call between the test and the store
                    raise in_use("update_", state)
                state.users = -1
                try:
                    status = call(model, grad)
                finally:
                    state.users = 0
                if status:  # 0: stepped, the common case, one test
                    if status == ALIASED:  # g overlaps x or the state: nothing was done, step on a copy
                        return update_(state, model, grad.copy())
                    if status >= 2:
                        raise status_error(state.rule, status, "g")
                return state, model
        enter(state, "update_")
        try:
            if tm is not np.ndarray and is_array_subclass(tm):
                is_array_subclass(tg)  # a subclass gradient, seen once here, takes the fast path next time
                return _step_subclass(state, model, grad, True)
            is_array_subclass(tg)
            return step_array(state, model, grad, True)
        finally:
            leave(state)
    t = type(state)
    if t is DeviceLeaf or t is DeviceGroup:
        enter(state, "update_")
        try:
            out = state.step(model, grad, True) if t is DeviceLeaf else state.update_(model, grad)
        finally:
            leave(state)
        bump_written(model)  # torch tensors written through detach(): autograd is told
        return out
    if t is not StateTree and hasattr(t, "_numbaopt_step_"):  # a state of another layer (numbaopt.mpi)
        return state._numbaopt_step_(model, grad, True)
    if type(model) is not dict or grad is model:  # a torch form (a module, named parameters): through its view
        form = torch_form(model, grad)
        if form is not None:
            state, new = update_tree_(state, form.view, form.grads)
            return state, form.result(new, True)
    return update_tree_(state, model, grad)


def _step_subclass(state: Leaf, model: Any, grad: Any, inplace: bool) -> tuple[Leaf, Any]:
    """A :class:`Leaf`'s step on an ndarray subclass (a pennylane tensor, a memmap) that the fast path did
    not take (a pure step, a strided or read-only one, a schedule): stepped as its ndarray view; the
    caller's object when it was written in place (or not stepped), else the new values as its type
    (:func:`numbaopt.tree.params.wrap_like`: a tensor keeps ``requires_grad``)."""
    base = model.view(np.ndarray)
    state, new = step_array(state, base, grad, inplace)
    return state, (model if new is base else wrap_like(new, model))


@overload
def adjust(state: TreeLeaf | StateNode, **hyper: HyperValue) -> StateTree: ...
@overload
def adjust(state: L, **hyper: HyperValue) -> L: ...
@overload
def adjust(state: DeviceGroup, **hyper: HyperValue) -> DeviceGroup: ...
def adjust(state: Any, **hyper: Any) -> Any:
    """A new state with some hyperparameters changed; moments and step counts are kept.

    ``state`` may be a part of a state tree (``state["enc"]``, a leaf of it): the result is then the whole new
    tree with that part adjusted (docs/trees.md, "Parameter groups"). Unknown names are a ``ValueError`` listing
    the valid ones. Never recompiles a kernel.
    """
    t = type(state)
    if t is Leaf or t is DeviceLeaf or t is DeviceGroup:
        enter(state, "adjust", False)
        try:
            if t is DeviceGroup:
                return state.adjust(hyper, False)
            return state.with_rule(adjusted_rule(state.rule, hyper))
        finally:
            leave(state, False)
    if t is not StateTree and hasattr(t, "_numbaopt_adjust_"):  # numbaopt.mpi
        return state._numbaopt_adjust_(False, hyper)
    return adjust_tree(state, **hyper)


@overload
def adjust_(state: L, **hyper: HyperValue) -> L: ...
@overload
def adjust_(state: StateTree, **hyper: HyperValue) -> StateTree: ...
@overload
def adjust_(state: StateNode, **hyper: HyperValue) -> StateNode: ...
@overload
def adjust_(state: DeviceGroup, **hyper: HyperValue) -> DeviceGroup: ...
def adjust_(state: Any, **hyper: Any) -> Any:
    """Change hyperparameters in place; returns ``state`` (everything is checked before anything changes).

    ``state`` may be a part of a state tree (``state["enc"]``, Optimisers.jl's ``adjust!(tree.layers[3], 0.04)``,
    torch's ``param_groups[i]["lr"] = ...``) or one of its leaves: only its leaves' hyperparameters change
    (docs/trees.md, "Parameter groups")."""
    t = type(state)
    if t is Leaf or t is DeviceLeaf or t is DeviceGroup:
        enter(state, "adjust_")
        try:
            if t is DeviceGroup:
                return state.adjust(hyper, True)
            state.set_rule_(adjusted_rule(state.rule, hyper))  # hp rewritten in place: compiled callers see it
            return state
        finally:
            leave(state)
    if t is not StateTree and hasattr(t, "_numbaopt_adjust_"):  # numbaopt.mpi
        return state._numbaopt_adjust_(True, hyper)
    return adjust_tree_(state, **hyper)


class JitStep:
    """A rule's step for use inside a user's ``@njit`` code.

    ``step(x, g, state, hp, t)`` updates the 1-D contiguous arrays ``x`` and ``state`` in place for step
    number ``t`` (1, 2, ...) and returns a status (0 = stepped, 1 = skipped, 2 + k = rule k refused).
    ``hp`` is an array (float32 for float32 parameters, else float64) of hyperparameters
    (``hyper_index(name)`` says where each lives, so a loop can change them, e.g. from a schedule);
    ``state`` is a tuple of arrays created here on the host (for an axis reduction, its units are those of
    ``x``'s shape: pass ``x.reshape(-1)`` to the step).
    """

    step: Any  #: the compiled step (a Numba dispatcher)
    state: tuple[np.ndarray, ...]
    hp: np.ndarray
    rule: RuleLike
    layout: ChainLayout

    def __init__(self, rule: RuleLike, x: ArrayLike) -> None:
        rule = as_rule(rule)
        layout = ChainLayout(rule)
        if layout.accum is not None or layout.master is not None:
            raise TypeError(f"jit_step: {rule!r} has a stage (AccumGrad or MixedPrecision), which keeps "
                            "counters and copies on the host; pass a chain of elementwise and reduction rules")
        x = np.asarray(x)
        dtype = check_param_dtype(x.dtype)
        # x's shape: an axis reduction's units (rows, columns) come from it; the step takes x.reshape(-1)
        leaf = Leaf(rule, x.shape, dtype, layout=layout)
        self.rule = rule
        self.step = leaf.kernels().step
        self.state = tuple(leaf.arrays)
        self.hp = leaf.hp
        self.layout = layout

    def hyper_index(self, name: str, rule: int | None = None) -> int:
        """Index of hyperparameter ``name`` in ``hp`` (for a chain, of the first member having it, or of
        member ``rule``)."""
        for k, (r_i, n) in enumerate(self.layout.hyper_names):
            if n == name and (rule is None or rule == r_i):
                return k
        raise ValueError(f"no hyperparameter {name!r}; valid: {[n for _, n in self.layout.hyper_names]}")

    def __iter__(self) -> Iterator[Any]:
        return iter((self.step, self.state, self.hp))


def jit_step(rule: RuleLike, x: ArrayLike) -> JitStep:
    """``step, state, hp = jit_step(rule, x)``: see :class:`JitStep`."""
    return JitStep(rule, x)


# the compile notice (numbaopt.compiler.notice) charges compilation to the outermost of these on the stack;
# nothing wraps them: their code objects are looked up only when Numba starts compiling
register_public(setup, update, update_, adjust, adjust_, jit_step)
register_public(JitStep.__init__, name="jit_step")
