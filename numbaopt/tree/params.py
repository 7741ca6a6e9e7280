"""The writeability trait: which leaves of a model are parameters, and which may be written in place.

:func:`param_info` is a :func:`functools.singledispatch` function: ``param_info(x)`` returns a
:class:`ParamInfo` for a parameter leaf, or ``None`` for anything that is carried through unchanged
(integer/boolean arrays, strings, ``None``, functions, other objects). Built in:

* ``np.ndarray`` of a floating or complex dtype: written in place when ``x.flags.writeable``; a
  read-only array is immutable (the step returns a new, also read-only, array);
* Python ``float``/``complex`` and NumPy floating scalars: immutable scalars (a new scalar is returned);
* ``torch.Tensor`` on the CPU (only when torch is already imported by the user; torch is never
  imported here): written in place through the memory it shares with ``tensor.numpy()``;
* any other object with ``__array__`` (a JAX array, ...): immutable, the step returns a NumPy array;
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
from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np

from ..backends.cpu import new_readonly
from ..backends.cuda.arrays import facts as device_facts
from ..backends.cuda.arrays import is_device_array

__all__ = ["ParamInfo", "param_info", "same", "new_array", "new_readonly_array", "ND_WRITEABLE", "ND_READONLY"]


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
    leaf that a backend other than the CPU one must update.
    """

    dtype: np.dtype
    shape: tuple
    writeable: bool
    to_array: Callable = same
    from_array: Callable = new_array
    kind: str = "array"
    backend: str = "cpu"
    tieable: bool = field(default=True)


@functools.singledispatch
def param_info(x):
    """``ParamInfo`` for a parameter leaf, ``None`` for a leaf carried through unchanged.

    Extend it for your own array types with ``param_info.register(Type)``.
    """
    if is_device_array(x):  # stepped by the CUDA backend (numbaopt[cuda])
        shape, dtype = device_facts(x)
        return ParamInfo(dtype=dtype, shape=shape, writeable=True, kind=type(x).__name__, backend="cuda")
    if _is_torch_tensor(x):
        _register_torch(type(x))
        return param_info(x)
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


def _is_torch_tensor(x) -> bool:
    for t in type(x).__mro__:
        mod = t.__module__ or ""
        if t.__name__ == "Tensor" and (mod == "torch" or mod.startswith("torch.")):
            return True
    return False


def _torch_from_array(a, old):
    import sys
    return sys.modules["torch"].from_numpy(a)  # torch is imported: the leaf is a tensor


@param_info.register(np.ndarray)
def _(x):
    if x.dtype.kind not in "fc":
        return None
    if x.flags.writeable:
        return ParamInfo(dtype=x.dtype, shape=x.shape, writeable=True, kind="array")
    return ParamInfo(dtype=x.dtype, shape=x.shape, writeable=False, from_array=new_readonly_array,
                     kind="read-only array")


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


def _register_torch(cls):
    """Register torch tensors lazily (by type name), so torch is never imported by numbaopt."""
    if cls in _torch_done:
        return
    _torch_done.add(cls)

    def _torch(x):
        if x.device.type != "cpu":
            raise TypeError(f"a torch tensor on {x.device} is not updated by the CPU tree engine; "
                            "move it to the CPU or use the CUDA backend")
        a = x.detach().numpy()  # shares memory with the tensor (raises for bfloat16 etc.)
        if a.dtype.kind not in "fc":
            return None
        return ParamInfo(dtype=a.dtype, shape=a.shape, writeable=a.flags.writeable,
                         to_array=lambda t: t.detach().numpy(), from_array=_torch_from_array,
                         kind="torch.Tensor")

    param_info.register(cls)(_torch)


#: what ``param_info`` says of a (writeable / read-only) ndarray, less dtype and shape (checked by the caller):
#: the step pipeline classifies the common leaf without the trait's dispatch
ND_WRITEABLE = ParamInfo(dtype=None, shape=(), writeable=True, kind="array")
ND_READONLY = ParamInfo(dtype=None, shape=(), writeable=False, from_array=new_readonly_array, kind="read-only array")
