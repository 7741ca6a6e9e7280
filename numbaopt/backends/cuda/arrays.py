"""Device arrays as the CUDA backend sees them: detection, facts, checks, flat views, fresh state.

Nothing here imports ``numba.cuda`` at import time; :func:`runtime` does, on the first use of the backend,
with a clear error when numba-cuda (``pip install numbaopt[cuda]``) or a GPU is missing.
"""
from __future__ import annotations

import sys

import numpy as np

from ...compiler.layout import GEO, real_dtype
from ..state import check_param_dtype

__all__ = ["INSTALL_HINT", "runtime", "unpickling_runtime", "cuda_available", "is_device_array", "kind", "info",
           "facts", "flat",
           "torch_ptr", "table_stale", "host_side_error", "host_grad_error", "empty_like", "device_state",
           "device_copies", "blocks", "Scratch", "decode", "run_reductions", "reduce_phase", "finish_phase",
           "check_tree_grad", "check_device_param",
           "check_device_grad"]

INSTALL_HINT = ("device arrays need the optional CUDA backend: pip install numbaopt[cuda] "
                "(numba-cuda with the CUDA 12 toolkit wheels)")

_rt = [None]  # numbaopt.backends.cuda.runtime, imported on first use


def runtime():
    """The CUDA runtime module (imports ``numba.cuda``), with a clear error when it cannot run here."""
    if _rt[0] is None:
        try:
            from numba import cuda
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        from . import runtime as rt
        if not rt.SIM and not cuda.is_available():
            raise RuntimeError("numbaopt: a device array was passed but CUDA reports no usable GPU or driver "
                               "(the CUDA backend, numbaopt[cuda], needs one; set NUMBA_ENABLE_CUDASIM=1 before "
                               "importing numba to use the simulator)")
        _rt[0] = rt
    return _rt[0]


def unpickling_runtime(what: str):
    """:func:`runtime` for unpickling a device state (``what``): its state goes back to a GPU, and a
    process without a usable one gets a ``RuntimeError`` saying so."""
    try:
        return runtime()
    except (ImportError, RuntimeError) as e:
        raise RuntimeError(f"unpickling a {what}: its state goes back to a GPU, and this process has none "
                           f"usable ({e})") from None


def cuda_available() -> bool:
    """Whether the CUDA backend can run here (numba-cuda installed and a GPU, or the simulator)."""
    try:
        runtime()
    except (ImportError, RuntimeError):
        return False
    return True


def is_device_array(obj) -> bool:
    """Whether ``obj`` is an array in GPU memory (never imports numba.cuda, torch or cupy)."""
    cls = type(obj)
    if cls is np.ndarray:
        return False
    if cls.__name__ == "FakeCUDAArray":
        return True
    if not hasattr(cls, "__cuda_array_interface__") and "__cuda_array_interface__" not in getattr(obj, "__dict__", ()):
        return False
    if cls.__module__.startswith("torch"):  # every torch.Tensor has the property; only CUDA ones work
        return bool(getattr(obj, "is_cuda", False))
    if cls.__module__.partition(".")[0] in ("jax", "jaxlib"):
        # every jax.Array has the property (CPU ones raise on access); none is a device array here:
        # JAX arrays are immutable, so the tree engine steps a host copy and puts the result back on
        # the input's device (numbaopt.tree.jax_models) instead of writing the buffer in place
        return False
    return True


def kind(obj) -> str:
    mod = type(obj).__module__
    if type(obj).__name__ == "FakeCUDAArray":
        return "simulator"
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("numba"):
        return "numba"
    return "other"


def info(obj, where, write=True):
    """``(array to launch with, shape, dtype, address)`` of a device array, checking contiguity (and, for
    an array to be written, that it is not read-only)."""
    if type(obj).__name__ == "FakeCUDAArray":
        ary = obj._ary
        if not ary.flags.c_contiguous:
            raise ValueError(f"{where}: expected a C-contiguous device array")
        return obj, ary.shape, ary.dtype, ary.ctypes.data
    src = obj.detach() if kind(obj) == "torch" else obj
    cai = src.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expect, acc = [], dtype.itemsize
        for s in reversed(shape):
            expect.append(acc)
            acc *= s
        if any(n > 1 and s != e for n, s, e in zip(shape, strides, reversed(expect))):
            raise ValueError(f"{where}: expected a C-contiguous device array (strides {strides})")
    if write and cai["data"][1]:
        raise ValueError(f"{where}: the device array is read-only")
    return src, shape, dtype, int(cai["data"][0] or 0)


def torch_ptr(t):
    return t.data_ptr()


def table_stale(objs, cached, table):
    """Whether ``objs`` differ from the cached objects (identity), or a torch tensor among them moved."""
    if cached is None or len(objs) != len(cached) or any(a is not b for a, b in zip(objs, cached)):
        return True
    return any(kind(o) == "torch" and o.data_ptr() != table[i] for i, o in enumerate(objs))


def flat(src, n):
    """A 1-D Numba device view of a contiguous device array (no copy)."""
    from numba import cuda
    if type(src).__name__ != "FakeCUDAArray" and not cuda.is_cuda_array(src):
        raise TypeError(f"not a CUDA array: {type(src).__name__}")
    if type(src).__name__ != "FakeCUDAArray" and not hasattr(src, "copy_to_host"):
        cai = src.__cuda_array_interface__
        # kernels run on the legacy default stream, ordered after work on it (CAI stream 1) and on
        # per-thread default streams (2); only another producer stream needs a host synchronisation
        src = cuda.from_cuda_array_interface(cai, owner=src, sync=cai.get("stream") not in (None, 1, 2))
    return src.reshape(n) if src.ndim != 1 else src


def host_side_error(where, obj, other):
    return TypeError(f"{where}: a host {type(obj).__name__} for a parameter on the GPU ({other}); "
                     "copy it to the device yourself (numbaopt never copies across the bus silently)")


def empty_like(kind, obj, shape, dtype):
    """A new array of the same kind as ``obj`` (torch -> tensor, CuPy -> cupy array, else Numba)."""
    from numba import cuda
    if kind == "torch":
        return sys.modules["torch"].empty_like(obj)
    if kind == "cupy":
        return sys.modules["cupy"].empty_like(obj)
    return cuda.device_array(shape, dtype=dtype)


def device_state(layout, dtype, size, shapes=()):
    """Fresh state arrays on the current device, filled with their initial values by a kernel; with scalar states
    (``layout.units``), then the unit arrays and the geometry table of leaves of ``shapes`` (small: uploaded)."""
    from numba import cuda
    rt = runtime()
    arrays = []
    for init, dt in zip(layout.initial_values(), layout.state_dtypes(dtype)):
        a = cuda.device_array(max(size, 0), dtype=dt)
        if size:
            rt.fill[blocks(size), rt.TPB](a, dt.type(init))
        arrays.append(a)
    return arrays + [cuda.to_device(a) for a in layout.new_units(list(shapes), dtype)]


def device_copies(arrays) -> list:
    """New device arrays holding device-to-device copies of ``arrays``."""
    from numba import cuda
    out = []
    for a in arrays:
        b = cuda.device_array(a.shape, dtype=a.dtype)
        b.copy_to_device(a)
        out.append(b)
    return out


_max_blocks = [None]


def blocks(n: int) -> int:
    """Blocks for a grid-stride launch over n elements (capped: each thread loops)."""
    rt = runtime()
    cap = _max_blocks[0]
    if cap is None:
        if rt.SIM:
            cap = 2
        else:
            from numba import cuda
            cap = 32 * cuda.get_current_device().MULTIPROCESSOR_COUNT
        _max_blocks[0] = cap
    return max(1, min(cap, -(-n // rt.TPB)))


def identity_acc(plan, rows):
    acc = np.zeros((rows, plan.acc_cols), dtype=np.float64)
    for r, ops in plan.ops.items():
        for j, op in enumerate(ops):
            if op != "sum":
                acc[:, plan.abase[r] + j] = -np.inf
    return acc


class Scratch:
    """Device-side buffers of one state: hyperparameters, reduction accumulators, finals, status and, for axis
    members, their per-unit tables (:mod:`numbaopt.compiler.cuda_axes`; ``units = (layout, geometry rows of the
    leaves, dtype)``)."""

    __slots__ = ("hp_dev", "hp_seen", "acc", "fin", "st", "rows", "tables", "slot_tables", "leafof", "xoff", "ntot")

    def __init__(self, plan, rows, hp, units=None):
        from numba import cuda
        self.hp_dev = cuda.to_device(hp)
        self.hp_seen = hp.copy()
        self.rows = rows
        if plan.phases:
            self.acc = cuda.to_device(identity_acc(plan, rows))
            self.fin = cuda.device_array((rows, plan.fin_cols), dtype=np.float64)
            self.st = cuda.to_device(np.array([runtime().NO_STATUS], dtype=np.int64))
        else:
            self.acc = self.fin = self.st = None
        self.tables, self.slot_tables = [], []
        if plan.xnames:
            self._axis_tables(plan, *units)

    def _axis_tables(self, plan, layout, geo, dtype):
        """The tables of every slot over the units of every leaf (geometry rows ``geo``), the leaf of each unit
        (``leafof``) and where each leaf's units start (``xoff``)."""
        from numba import cuda
        slots = layout.axis_slots
        counts = np.array([[layout.units_of(row[GEO * layout.axis_rules.index(r):][:GEO], a) for r, a in slots]
                           for row in np.asarray(geo)], dtype=np.int64).reshape(len(geo), len(slots))
        xoff = np.zeros_like(counts)
        xoff[1:] = np.cumsum(counts, axis=0)[:-1]
        self.ntot = counts.sum(axis=0)
        self.leafof = [cuda.to_device(np.repeat(np.arange(len(geo), dtype=np.int64), counts[:, s]))
                       for s in range(len(slots))]
        self.xoff = cuda.to_device(xoff)
        self.slot_tables = [[] for _ in slots]
        for _, s, kind_, extra in plan.specs:
            size = max(int(self.ntot[s]), 1)
            if kind_ == "T":
                t = cuda.to_device(np.full(size, 0.0 if extra == "sum" else -np.inf))
            else:
                d = layout.unit_decls[extra][1] if kind_ == "NU" else None
                dt = np.float64 if d is None else (real_dtype(dtype) if d.real else np.dtype(dtype))
                t = cuda.device_array(size, dtype=dt)
            self.slot_tables[s].append(t)
        self.tables = [t for ts in self.slot_tables for t in ts] + [self.xoff]

    def sync_hp(self, hp):
        """Upload the hyperparameters only when they changed (adjust, schedules)."""
        if not np.array_equal(hp, self.hp_seen):
            self.hp_dev.copy_to_device(hp)
            self.hp_seen = hp.copy()


def decode(key):
    """``(status, row)`` from the status key written by the finish kernels."""
    if key == runtime().NO_STATUS:
        return 0, None
    r, row, skip = key >> 40, (key >> 1) & ((1 << 39) - 1), key & 1
    return (1 if skip else 2 + r), row


def run_reductions(mod, layout, sc, args, rows_of, launch, arrays, first=0):
    """Reduce, then finish, for every reducer and axis member in chain order. ``arrays`` are the state arrays
    (their unit arrays: the scalar states, one value per leaf, and the axis members' unit states; the geometry
    table), ``first`` the first stepped leaf (whose copy a tree-scope finish reads)."""
    for r in mod.plan.phases:
        reduce_phase(mod, layout, sc, args, rows_of, launch, arrays, r)
        finish_phase(mod, layout, sc, args, rows_of, arrays, first, r)


def reduce_phase(mod, layout, sc, args, rows_of, launch, arrays, r):
    """The dry pass of member ``r`` (an axis member's: with its finish over the units): its totals in ``sc.acc``."""
    rt = runtime()
    if r in layout.axis_rules:
        launch(getattr(mod, f"axred_k{r}" if rows_of is None else f"maxred_k{r}"))(*args, sc.fin, sc.st, *sc.tables)
        units = layout.unit_arrays(arrays)
        for s, (q, a) in enumerate(layout.axis_slots):
            if q == r:
                n = int(sc.ntot[s])
                mine = [units[u] for u in layout.unit_slots[r].get(a, [])]
                getattr(mod, f"axfin_k{r}_{a}")[max(1, -(-n // rt.TPB)), rt.TPB](
                    sc.hp_dev, args[-1], arrays[-1], *mine, sc.leafof[s], sc.xoff, n, *sc.slot_tables[s])
        return
    launch(getattr(mod, f"reduce_k{r}" if rows_of is None else f"mreduce_k{r}"))(*args, sc.fin, sc.st, sc.acc,
                                                                                    *sc.tables)


def finish_phase(mod, layout, sc, args, rows_of, arrays, first, r):
    """The finish of reducer ``r`` over its totals in ``sc.acc`` (nothing for an axis member: its finish ran with
    its dry pass)."""
    if r in layout.axis_rules:
        return
    rt = runtime()
    rows = 1 if (rows_of is None or mod.plan.tree[r]) else rows_of
    mine = [layout.unit_arrays(arrays)[u] for u in layout.scalar_units(r)]
    getattr(mod, f"finish_k{r}")[max(1, -(-rows // rt.TPB)), rt.TPB](sc.acc, sc.hp_dev, sc.fin, sc.st, rows,
                                                                      first, *mine)


# -- device leaves in trees (called by numbaopt.params / numbaopt.engine) ------------------------------
def facts(x) -> tuple:
    """``(shape, dtype)`` of a device array, read without numba.cuda (the writeability trait uses it)."""
    if type(x).__name__ == "FakeCUDAArray":
        return tuple(x._ary.shape), np.dtype(x._ary.dtype)
    cai = (x.detach() if kind(x) == "torch" else x).__cuda_array_interface__
    return tuple(cai["shape"]), np.dtype(cai["typestr"])


def check_device_param(x, where, write=True):
    """Check a device parameter before anything is written (contiguous, writeable, a supported dtype)."""
    _, _, dtype, _ = info(x, where, write=write)
    check_param_dtype(dtype, where)


def check_device_grad(g, dtype, shape, where, param="a device parameter"):
    """The one check of a gradient for a device parameter (``where`` names it): a device array of the
    parameter's shape and dtype (not cast: that would need a hidden copy). Returns ``(array to launch
    with, device address)``."""
    if not is_device_array(g):
        if isinstance(g, np.ndarray) or hasattr(g, "__array__"):
            raise host_side_error(where, g, param)
        raise TypeError(f"{where}: expected a device array for the GPU parameter (or None), got {type(g).__name__}")
    src, gshape, gdtype, addr = info(g, where, write=False)
    if tuple(gshape) != tuple(shape):
        raise ValueError(f"{where}: shape {tuple(gshape)}, expected {tuple(shape)}")
    if gdtype != dtype:
        raise TypeError(f"{where}: dtype {gdtype}, expected {dtype} (on the GPU gradients are not cast: that "
                        "would need a hidden copy)")
    return src, addr


def check_tree_grad(g, dtype, shape, where, tied=False):
    """Check the gradient of a device leaf of a tree (``where`` names its path); returns it unchanged."""
    if tied:
        raise NotImplementedError(f"{where}: a device array that appears twice in the model (tied); the "
                                  "CUDA backend does not sum tied gradients yet")
    check_device_grad(g, dtype, shape, where, "a device leaf")
    return g


def host_grad_error(g, where):
    """The error for a device gradient given for a host leaf of a tree."""
    return TypeError(f"{where}: a device array ({type(g).__name__}) for a host parameter; copy it to the "
                     "host yourself (numbaopt never copies across the bus silently)")


