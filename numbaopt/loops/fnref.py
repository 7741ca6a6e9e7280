"""First-class function plumbing: the user's ``@njit`` objective handed to a cached driver by address."""
from __future__ import annotations

import numba
from numba import types
from numba.core import cgutils
from numba.core import types as nt
from numba.experimental.function_type import FunctionModel, _get_jit_address, _get_wrapper_address
from numba.extending import NativeValue, register_model, typeof_impl, unbox

__all__ = ["FnRef", "fnref_type", "register_fnref", "fn_type", "compiled_entry"]

_entries: dict = {}  # compiled entry points of the drivers, by (driver, signature)


class FnRef:
    """An njit function's compiled addresses, handed to a driver as a first-class function.

    Passing the dispatcher itself would make Numba look both addresses up on every call of the driver
    (about 0.1 ms: two compile-result lookups); this object carries them, so a chunk costs microseconds.
    Calls go through ``jit_addr`` (Numba's own calling convention), so exceptions raised in the user's
    function propagate as usual. ``fn`` keeps the dispatcher (and its code) alive.
    """

    __slots__ = ("c_addr", "jit_addr", "fn", "ty")

    def __init__(self, fn, ty):
        sig = ty.signature
        self.fn, self.ty = fn, ty
        self.c_addr = _get_wrapper_address(fn, sig)
        self.jit_addr = _get_jit_address(fn, sig)


def fnref_type(fty):
    register_fnref()
    return _registered[0](fty.signature)


_registered: list = []  # the registered Numba type (once per process)


def register_fnref():
    """Register the Numba type of :class:`FnRef` (once): a FunctionType whose unboxing reads the two
    addresses from the object instead of looking them up."""
    if _registered:
        return

    class FnRefType(nt.FunctionType):
        pass

    FnRefType.__module__ = __name__
    FnRefType.__qualname__ = FnRefType.__name__ = "FnRefTypeImpl"
    globals()["FnRefTypeImpl"] = FnRefType  # picklable by reference for Numba's cache index
    register_model(FnRefType)(FunctionModel)

    @typeof_impl.register(FnRef)
    def _typeof_fnref(val, c):
        return FnRefType(val.ty.signature)

    @unbox(FnRefType)
    def _unbox_fnref(typ, obj, c):
        sfunc = cgutils.create_struct_proxy(typ)(c.context, c.builder)
        for field in ("c_addr", "jit_addr"):
            a = c.pyapi.object_getattr_string(obj, field)
            setattr(sfunc, field, c.pyapi.long_as_voidptr(a))
            c.pyapi.decref(a)
        sfunc.py_addr = c.builder.ptrtoint(obj, c.context.get_value_type(nt.voidptr))
        return NativeValue(sfunc._getvalue())

    _registered.append(FnRefType)


def fn_type(f, argtypes, what):
    """``FunctionType`` of the njit function ``f`` for these argument types (compiling it if needed)."""
    argtypes = tuple(argtypes)
    try:
        f.compile(argtypes)
    except Exception as e:  # a typing error in the user's function, reported with what was expected
        raise TypeError(f"{what} could not be compiled for arguments {argtypes}: {e}") from e
    rt = f.overloads[argtypes].signature.return_type
    return types.FunctionType(rt(*argtypes)), rt


def compiled_entry(drv, p):
    arr = numba.typeof(p.X[0])
    atys = tuple(numba.typeof(a) for a in p.args)
    if p.mode == "fg":
        fty, rt = fn_type(p.fun, (arr, arr) + atys, "fun(x, grad_out, *args)")
        jty, jac = types.none, None
    else:
        fty, rt = fn_type(p.fun, (arr,) + atys, "fun(x, *args)")
        if p.mode == "jac":
            jty, jrt = fn_type(p.jac, (arr, arr) + atys, "jac(x, grad_out, *args)")
            if jrt != types.none:  # typically the gradient returned instead of written: named if grad_out is not
                p.jac_returned.append(f"{jrt}")
            jac = FnRef(p.jac, jty)
            jty = fnref_type(jty)
        else:
            jty, jac = types.none, None
    if not isinstance(rt, (types.Float, types.Integer)) or isinstance(rt, types.Boolean):
        hint = ("; write the gradient into grad_out and return only the loss" if isinstance(rt, types.BaseTuple)
                and p.mode == "fg" else "")
        raise TypeError(f"fun must return a real scalar loss, but returns {rt}{hint}")
    fun = FnRef(p.fun, fty)
    fty = fnref_type(fty)
    sig = (fty, jty, numba.typeof(p.args)) + tuple(numba.typeof(a) for a in p._arrays()) + \
        (types.int64,) + tuple(numba.typeof(a) for a in p._tail())
    key = (id(drv), sig)
    entry = _entries.get(key)
    if entry is None:
        drv.compile(sig)
        entry = _entries[key] = drv.overloads[sig].entry_point
    return entry, fun, jac

