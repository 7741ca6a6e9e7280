"""Numba intrinsics on raw addresses: a typed pointer (for ``numba.carray``) and 64/32-bit loads.

The multi-leaf kernels receive the data addresses of many arrays in one int64 array, so that one
compiled call updates every leaf without building a typed list per step; the CPU backend reads NumPy
array headers with the loads (:mod:`numbaopt.backends.abi`).
"""
from numba import types
from numba.core.cpu import CPUTargetOptions
from numba.core import errors
from numba.extending import intrinsic

__all__ = ["as_pointer", "load_i64", "load_i32", "data_address", "NO_NRT"]

#: options for compiled functions that allocate nothing (every array is the caller's, alive for the call):
#: without Numba's reference counting (NRT) an array argument, or an inlined helper taking an array, costs no
#: atomic increment and decrement. ``_nrt`` is Numba's own flag; a Numba without it keeps the default.
NO_NRT = {"_nrt": False} if hasattr(CPUTargetOptions, "_nrt") else {}


@intrinsic
def as_pointer(typingctx, addr, dtype):
    """``as_pointer(address: int64, np.float32) -> float32*`` inside ``@njit`` code."""
    if isinstance(dtype, types.NumberClass):
        elem = dtype.instance_type
    elif isinstance(dtype, types.DType):
        elem = dtype.dtype
    else:
        raise errors.TypingError(f"as_pointer: expected a NumPy scalar type, got {dtype}")
    if not isinstance(addr, types.Integer):
        raise errors.TypingError(f"as_pointer: address must be an integer, got {addr}")

    sig = types.CPointer(elem)(addr, dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(elem)))

    return sig, codegen


@intrinsic
def load_i64(typingctx, addr):
    """The int64 at address ``addr`` inside ``@njit`` code."""
    sig = types.int64(addr)

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int64)))
        return builder.load(ptr)

    return sig, codegen


@intrinsic
def load_i32(typingctx, addr):
    """The int32 at address ``addr`` inside ``@njit`` code."""
    sig = types.int32(addr)

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int32)))
        return builder.load(ptr)

    return sig, codegen


@intrinsic
def data_address(typingctx, arr):
    """The address of an array's first element, as an int64 (``arr.ctypes.data`` without building the
    ctypes object, whose code would bring float64 values into a float32 kernel)."""
    if not isinstance(arr, types.Array):
        raise errors.TypingError(f"data_address: expected an array, got {arr}")
    sig = types.int64(arr)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, context.get_value_type(types.int64))

    return sig, codegen
