"""The writeability trait: which leaves of a model are parameters, and which may be written in place.

:func:`param_info` is a :func:`functools.singledispatch` function: ``param_info(x)`` returns a
:class:`ParamInfo` for a parameter leaf, or ``None`` for anything that is carried through unchanged
(integer/boolean arrays, strings, ``None``, functions, other objects). Built in:

* ``np.ndarray`` of a floating or complex dtype: written in place when ``x.flags.writeable``; a
  read-only array is immutable (the step returns a new, also read-only, array); an ndarray subclass
  (``pennylane.numpy.tensor``, ``np.memmap``; not ``np.matrix`` or masked arrays: :func:`is_array_subclass`)
  the same, through its ndarray view, a new value taking the old one's type (:func:`wrap_like`);
* Python ``float``/``complex`` and NumPy floating scalars: immutable scalars (a new scalar is returned);
* ``torch.Tensor`` on the CPU (only when torch is already imported by the user; torch is never
  imported here): written in place through the memory it shares with ``tensor.detach().numpy()``, then
  its autograd version counter is bumped (``after_write``), so a graph built before the step refuses to
  backpropagate, as after ``torch.optim``; a CUDA tensor is a device array (below); a tensor on any other
  device (``meta``, ``mps``, ...) is a ``TypeError`` (see ``docs/torch.md``);
* ``jax.Array`` (only when jax is already imported by the user): immutable, the step returns a new
  ``jax.Array`` of its dtype on its device or sharding (:mod:`numbaopt.tree.jax_models`);
* any other object with ``__array__``: immutable, the step returns a NumPy array;
* device arrays (``__cuda_array_interface__``, Numba device arrays, the CUDA simulator's arrays):
  ``backend="cuda"``, stepped by :mod:`numbaopt.backends.cuda` (``pip install numbaopt[cuda]``).

Register your own array type::

    @numbaopt.param_info.register(MyArray)
    def _(x):
        return numbaopt.ParamInfo(dtype=x.dtype, shape=x.shape, writeable=True,
                                  to_array=lambda x: x.as_numpy_view())
"""
from __future__ import annotations

import functools
import numbers
import sys
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends.cpu import new_readonly
from ..backends.cuda.arrays import facts as device_facts
from ..backends.cuda.arrays import is_device_array
from .jax_models import is_jax_array, jax_facts, jax_from_host, jax_to_host

__all__ = ["ParamInfo", "param_info", "same", "new_array", "new_readonly_array", "ND_WRITEABLE", "ND_READONLY",
           "is_torch_tensor", "is_torch_module", "bump_version", "ARRAY_SUBCLASSES", "is_array_subclass",
           "ndarray_view", "wrap_like"]


def same(x):
    """``to_array`` of a leaf that is an array already."""
    return x


def new_array(a, old):
    """``from_array`` of a leaf replaced by a plain new array."""
    return a


def new_readonly_array(a, old):
    """``from_array`` of a read-only array: the new value is read-only too."""
    return new_readonly(a)


@dataclass(frozen=True)
class ParamInfo:
    """What the tree engine needs to know about one parameter leaf.

    ``dtype``/``shape``: of the parameter. ``writeable``: whether ``to_array(x)`` is a writeable NumPy
    view sharing memory with ``x`` (then the leaf is updated in place and keeps its identity); otherwise
    the leaf is immutable and ``from_array(new_values, x)`` builds the new leaf. ``kind`` names the
    leaf type in messages and printing. ``backend`` is ``"cpu"`` for host memory; another value marks a
    leaf that a backend other than the CPU one must update. ``after_write(x)``, when given, is called
    once for every leaf ``update_`` wrote in place, after the whole step committed (a torch tensor bumps
    its autograd version counter there); leaves without it cost nothing. ``trainable=False`` marks a
    parameter that ``setup`` does not train, wherever it is (a torch ``Parameter`` whose ``requires_grad``
    is False), like a :func:`numbaopt.not_trainable` field.
    """

    dtype: np.dtype
    shape: tuple
    writeable: bool
    to_array: Callable = same
    from_array: Callable = new_array
    kind: str = "array"
    backend: str = "cpu"
    tieable: bool = field(default=True)
    after_write: Callable | None = None
    trainable: bool = True


@functools.singledispatch
def param_info(x: Any) -> ParamInfo | None:
    """``ParamInfo`` for a parameter leaf, ``None`` for a leaf carried through unchanged.

    Extend it for your own array types with ``param_info.register(Type)``.
    """
    if is_torch_tensor(x):
        _register_torch(type(x))
        return param_info(x)
    if is_device_array(x):  # stepped by the CUDA backend (numbaopt[cuda])
        return _device_info(x)
    if is_torch_module(x):  # a module is a model (numbaopt.setup(rule, module)), not a leaf of one
        raise TypeError(f"a torch.nn.Module ({type(x).__name__}) inside a model container; pass the module "
                        "itself as the model, or dict(module.named_parameters()) here")
    if is_jax_array(x):  # registered on first sight, like torch (jax is never imported here)
        param_info.register(type(x))(_jax_info)
        return _jax_info(x)
    if hasattr(x, "__array__") and not isinstance(x, (str, bytes)):
        try:
            a = np.asarray(x)
        except Exception:
            return None
        if a.dtype.kind not in "fc":
            return None
        return ParamInfo(dtype=a.dtype, shape=a.shape, writeable=False, to_array=np.asarray,
                         from_array=new_array, kind=type(x).__name__, tieable=True)
    return None


def _device_info(x):
    shape, dtype = device_facts(x)
    after = bump_version if is_torch_tensor(x) else None  # written through detach(): autograd must hear of it
    return ParamInfo(dtype=dtype, shape=shape, writeable=True, kind=type(x).__name__, backend="cuda",
                     after_write=after)


_torch_kinds: dict = {}  # type -> "tensor" / "module" / None, by the names in its MRO (torch is never imported)


def _torch_kind(cls):
    got = _torch_kinds.get(cls, False)
    if got is False:
        got = None
        for t in cls.__mro__:
            mod = t.__module__ or ""
            if t.__name__ == "Tensor" and (mod == "torch" or mod.startswith("torch.")):
                got = "tensor"
                break
            if t.__name__ == "Module" and mod == "torch.nn.modules.module":
                got = "module"
                break
        _torch_kinds[cls] = got
    return got


def is_torch_tensor(x) -> bool:
    """Whether ``x`` is a ``torch.Tensor`` (a ``Parameter`` too), without importing torch."""
    return _torch_kind(type(x)) == "tensor"


def is_torch_module(x) -> bool:
    """Whether ``x`` is a ``torch.nn.Module``, without importing torch."""
    return _torch_kind(type(x)) == "module"


def bump_version(t) -> None:
    """Tell autograd that tensor ``t`` was written in place behind its back (its version counter moves):
    a graph that saved ``t`` before then raises on ``backward``, as after a ``torch.optim`` step."""
    sys.modules["torch"].autograd.graph.increment_version(t)  # t is a tensor: torch is imported


def _torch_from_array(a, old):
    """A new tensor of the old one's kind: a ``Parameter`` stays a ``Parameter``; ``requires_grad`` is kept."""
    t = sys.modules["torch"].from_numpy(a)  # torch is imported: the leaf is a tensor
    if _is_parameter(old):
        return type(old)(t, requires_grad=old.requires_grad)
    return t.requires_grad_(old.requires_grad)


def _is_parameter(x) -> bool:
    return any(c.__name__ == "Parameter" and c.__module__ == "torch.nn.parameter" for c in type(x).__mro__)



def _jax_info(x):
    """A ``jax.Array`` is immutable: read on the host, rebuilt on its device; never tied (JAX arrays are
    values: one array object at two places of a pytree is two parameters, as in optax)."""
    facts = jax_facts(x)
    if facts is None:
        return None
    return ParamInfo(dtype=facts[0], shape=facts[1], writeable=False, to_array=jax_to_host,
                     from_array=jax_from_host, kind="jax.Array", tieable=False)


@param_info.register(np.ndarray)
def _(x):
    if x.dtype.kind not in "fc":
        return None
    if type(x) is not np.ndarray and is_array_subclass(type(x)):  # stepped through its ndarray view
        kind = type(x).__name__
        if x.flags.writeable:
            return ParamInfo(dtype=x.dtype, shape=x.shape, writeable=True, to_array=ndarray_view,
                             from_array=wrap_like, kind=kind)
        return ParamInfo(dtype=x.dtype, shape=x.shape, writeable=False, to_array=ndarray_view,
                         from_array=wrap_like, kind=f"read-only {kind}")
    if x.flags.writeable:
        return ParamInfo(dtype=x.dtype, shape=x.shape, writeable=True, kind="array")
    return ParamInfo(dtype=x.dtype, shape=x.shape, writeable=False, from_array=new_readonly_array,
                     kind="read-only array")


#: the ndarray subclasses stepped like an ndarray, found so far: ``update_``'s fast path tests membership
ARRAY_SUBCLASSES: set = set()
_subclass_verdicts: dict = {}  # type -> bool, decided once per type


def is_array_subclass(cls) -> bool:
    """Whether ``cls`` is an ndarray subclass that numbaopt steps as its ndarray data, exactly like an
    ndarray (a :class:`numbaopt.Leaf` for one array, a leaf written in place in a tree): a
    ``pennylane.numpy.tensor``, a ``np.memmap``, most others. Two are not: ``np.matrix`` (always 2-D, its
    ``reshape(-1)`` is a ``(1, n)`` matrix, so it cannot be viewed as the flat vector the kernels step) and
    masked arrays (a step on the data would ignore the mask); they keep the general tree path, as before.
    A True verdict adds ``cls`` to :data:`ARRAY_SUBCLASSES`."""
    got = _subclass_verdicts.get(cls)
    if got is None:
        got = isinstance(cls, type) and issubclass(cls, np.ndarray) and cls is not np.ndarray \
            and not issubclass(cls, (np.matrix, np.ma.MaskedArray))
        _subclass_verdicts[cls] = got
        if got:
            ARRAY_SUBCLASSES.add(cls)
    return got


def ndarray_view(x) -> np.ndarray:
    """``to_array`` of an ndarray subclass: its data as a plain ndarray (a view, nothing copied)."""
    return x.view(np.ndarray)


def wrap_like(a: np.ndarray, old):
    """The new values ``a`` of the ndarray subclass ``old`` as ``old``'s type: by ``old.__array_wrap__(a)``,
    which is how NumPy itself turns the result of a ufunc on ``old`` (``old - step``) into its type. A
    ``pennylane.numpy.tensor`` stays a tensor with its ``requires_grad`` (without it ``qml.grad`` finds no
    trainable argument); a ``np.memmap`` gives a plain ndarray, as NumPy does (the new values are not in its
    file). The result of a read-only ``old`` is read-only too."""
    if not old.flags.writeable:
        a = new_readonly(a)
    out = old.__array_wrap__(a)
    if not old.flags.writeable and isinstance(out, np.ndarray) and out.flags.writeable:
        out.flags.writeable = False
    return out


def _scalar_info(x, dtype):
    return ParamInfo(dtype=np.dtype(dtype), shape=(), writeable=False, to_array=np.asarray,
                     from_array=lambda a, old: type(old)(a[()].item() if type(old) in (float, complex)
                                                         else a[()]),
                     kind=type(x).__name__, tieable=False)


@param_info.register(float)
def _(x):
    return _scalar_info(x, np.float64)


@param_info.register(complex)
def _(x):
    return _scalar_info(x, np.complex128)


@param_info.register(np.floating)
def _(x):
    return _scalar_info(x, x.dtype)


@param_info.register(np.complexfloating)
def _(x):
    return _scalar_info(x, x.dtype)


@param_info.register(numbers.Integral)
def _(x):
    return None


@param_info.register(str)
@param_info.register(bytes)
@param_info.register(type(None))
def _(x):
    return None


_torch_done = set()


def _torch_numpy(t):
    return t.detach().numpy()


def _register_torch(cls):
    """Register torch tensors lazily (by type name), so torch is never imported by numbaopt."""
    if cls in _torch_done:
        return
    _torch_done.add(cls)

    def _torch(x):
        # the device first: nothing else is read from a tensor that is not on the CPU (a CUDA tensor that
        # requires grad raises on .numpy() and on __cuda_array_interface__)
        dev = x.device.type
        if dev == "cuda":  # the CUDA backend steps it through x.detach() (docs/gpu.md)
            return _device_info(x)
        if dev != "cpu":
            raise TypeError(f"a torch tensor on the {dev!r} device, which numbaopt cannot read or write; "
                            "numbaopt steps CPU tensors (tensor.cpu()) and, with numbaopt[cuda], CUDA tensors")
        try:
            a = x.detach().numpy()  # shares memory with the tensor
        except (TypeError, RuntimeError) as e:  # bfloat16, sparse, a conjugate or negative view
            raise TypeError(f"a torch tensor that NumPy cannot view ({e}); numbaopt steps dense float16/32/64 "
                            "and complex64/128 tensors") from None
        if a.dtype.kind not in "fc":
            return None  # an integer or boolean tensor: carried through, like an integer array
        # a Parameter that does not require grad is frozen (torch's idiom); a plain tensor is the user's data,
        # trained whatever its requires_grad says
        trainable = not (_is_parameter(x) and not x.requires_grad)
        return ParamInfo(dtype=a.dtype, shape=a.shape, writeable=a.flags.writeable,
                         to_array=_torch_numpy, from_array=_torch_from_array, kind="torch.Tensor",
                         after_write=bump_version, trainable=trainable)

    param_info.register(cls)(_torch)


#: what ``param_info`` says of a (writeable / read-only) ndarray, less dtype and shape (checked by the caller):
#: the step pipeline classifies the common leaf without the trait's dispatch
ND_WRITEABLE = ParamInfo(dtype=None, shape=(), writeable=True, kind="array")
ND_READONLY = ParamInfo(dtype=None, shape=(), writeable=False, from_array=new_readonly_array, kind="read-only array")
