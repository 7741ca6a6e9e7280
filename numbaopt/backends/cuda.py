"""CUDA backend: optimiser state on the GPU, updated by kernels generated from the same rule definitions.

Importing this module does not import ``numba.cuda`` (that costs ~0.3 s and needs the optional
``numba-cuda`` package); the first device array passed to :func:`numbaopt.setup` does.

* :func:`setup_leaf` (what ``numbaopt.setup(rule, device_array)`` calls) returns a :class:`DeviceLeaf`:
  the state arrays are Numba device arrays on the parameter's device; ``numbaopt.update_`` writes the
  parameter and the state in place (one launch, or three per reduction rule); ``numbaopt.update``
  returns new arrays (see ``docs/gpu.md`` for what comes back for each array kind).
* :func:`setup_device_group` returns a :class:`DeviceGroup`: many device arrays of one dtype under one rule,
  updated with ONE launch per step (state in flat device arenas, parameters and gradients through a
  table of device addresses).

Device arrays are Numba device arrays, any object with ``__cuda_array_interface__`` (CuPy arrays,
PyTorch CUDA tensors) and, under the simulator (``NUMBA_ENABLE_CUDASIM=1``), its ``FakeCUDAArray``.
A gradient on the other side of the bus from its parameter is a ``TypeError``: nothing is copied
silently. All launches go to the default stream.
"""
from __future__ import annotations

import numpy as np

from ..leaf import Leaf, as_rule, check_param_dtype

__all__ = ["DeviceLeaf", "DeviceGroup", "DeviceMember", "setup_device_group", "is_device_array", "cuda_available"]

INSTALL_HINT = ("device arrays need the optional CUDA backend: pip install numbaopt[cuda] "
                "(numba-cuda with the CUDA 12 toolkit wheels)")

_cc = None  # numbaopt.backends.cuda_codegen, imported on first use


def _codegen():
    """Import ``numba.cuda`` and the CUDA generator, with a clear error when they are missing."""
    global _cc
    if _cc is None:
        try:
            from numba import cuda  # noqa: F401
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        from . import cuda_codegen
        if not cuda_codegen.SIM and not cuda.is_available():
            raise RuntimeError("numbaopt: a device array was passed but CUDA reports no usable GPU or driver "
                               "(the CUDA backend, numbaopt[cuda], needs one; set NUMBA_ENABLE_CUDASIM=1 before "
                               "importing numba to use the simulator)")
        _cc = cuda_codegen
    return _cc


def cuda_available() -> bool:
    """Whether the CUDA backend can run here (numba-cuda installed and a GPU, or the simulator)."""
    try:
        _codegen()
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
    return True


def _kind(obj) -> str:
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


def _info(obj, where, write=True):
    """``(array to launch with, shape, dtype, address)`` of a device array, checking contiguity (and, for
    an array to be written, that it is not read-only)."""
    if type(obj).__name__ == "FakeCUDAArray":
        ary = obj._ary
        if not ary.flags.c_contiguous:
            raise ValueError(f"{where}: expected a C-contiguous device array")
        return obj, ary.shape, ary.dtype, ary.ctypes.data
    src = obj.detach() if _kind(obj) == "torch" else obj
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


def _torch_ptr(t):
    return t.data_ptr()


def _table_stale(objs, cached, table):
    """Whether ``objs`` differ from the cached objects (identity), or a torch tensor among them moved."""
    if cached is None or len(objs) != len(cached) or any(a is not b for a, b in zip(objs, cached)):
        return True
    return any(_kind(o) == "torch" and o.data_ptr() != table[i] for i, o in enumerate(objs))


def _flat(src, n):
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


def _host_side_error(where, obj, other):
    return TypeError(f"{where}: a host {type(obj).__name__} for a parameter on the GPU ({other}); "
                     "copy it to the device yourself (numbaopt never copies across the bus silently)")


def _empty_like(kind, obj, shape, dtype):
    """A new array of the same kind as ``obj`` (torch -> tensor, CuPy -> cupy array, else Numba)."""
    import sys
    from numba import cuda
    if kind == "torch":
        return sys.modules["torch"].empty_like(obj)
    if kind == "cupy":
        return sys.modules["cupy"].empty_like(obj)
    return cuda.device_array(shape, dtype=dtype)


def _device_state(layout, rules, dtype, size):
    """Fresh state arrays on the current device, filled with their initial values by a kernel."""
    from numba import cuda
    cc = _codegen()
    arrays = []
    for (r_i, decl), dt in zip(layout.state_decls, layout.state_dtypes(dtype)):
        init = decl.init
        if isinstance(init, str):
            init = rules[r_i]._values[init]
            from ..schedules import Schedule
            if isinstance(init, Schedule):
                init = init(1)
        a = cuda.device_array(max(size, 0), dtype=dt)
        if size:
            cc.fill[_blocks(size), cc.TPB](a, dt.type(init))
        arrays.append(a)
    return arrays


def _device_copies(arrays) -> list:
    """New device arrays holding device-to-device copies of ``arrays``."""
    from numba import cuda
    out = []
    for a in arrays:
        b = cuda.device_array(a.shape, dtype=a.dtype)
        b.copy_to_device(a)
        out.append(b)
    return out


_max_blocks = [None]


def _blocks(n: int) -> int:
    """Blocks for a grid-stride launch over n elements (capped: each thread loops)."""
    cc = _codegen()
    cap = _max_blocks[0]
    if cap is None:
        if cc.SIM:
            cap = 2
        else:
            from numba import cuda
            cap = 32 * cuda.get_current_device().MULTIPROCESSOR_COUNT
        _max_blocks[0] = cap
    return max(1, min(cap, -(-n // cc.TPB)))


def _identity_acc(plan, rows):
    acc = np.zeros((rows, plan.acc_cols), dtype=np.float64)
    for r, ops in plan.ops.items():
        for j, op in enumerate(ops):
            if op != "sum":
                acc[:, plan.abase[r] + j] = -np.inf
    return acc


class _Scratch:
    """Device-side buffers of one state: hyperparameters, reduction accumulators, finals, status."""

    __slots__ = ("hp_dev", "hp_seen", "acc", "fin", "st", "rows")

    def __init__(self, plan, rows, hp):
        from numba import cuda
        self.hp_dev = cuda.to_device(hp)
        self.hp_seen = hp.copy()
        self.rows = rows
        if plan.acc_cols and plan.ops:
            self.acc = cuda.to_device(_identity_acc(plan, rows))
            self.fin = cuda.device_array((rows, plan.fin_cols), dtype=np.float64)
            self.st = cuda.to_device(np.array([_codegen().NO_STATUS], dtype=np.int64))
        else:
            self.acc = self.fin = self.st = None

    def sync_hp(self, hp):
        """Upload the hyperparameters only when they changed (adjust, schedules)."""
        if not np.array_equal(hp, self.hp_seen):
            self.hp_dev.copy_to_device(hp)
            self.hp_seen = hp.copy()


def _decode(key):
    """``(status, row)`` from the status key written by the finish kernels."""
    if key == _codegen().NO_STATUS:
        return 0, None
    r, row, kind = key >> 40, (key >> 1) & ((1 << 39) - 1), key & 1
    return (1 if kind else 2 + r), row


def _reductions(mod, layout, sc, args, rows_of, launch):
    """Reduce, then finish, for every reducer in chain order."""
    cc = _codegen()
    for r in layout.reducers:
        launch(getattr(mod, f"reduce_k{r}" if rows_of is None else f"mreduce_k{r}"))(
            *args, sc.fin, sc.st, sc.acc)
        rows = 1 if (rows_of is None or mod.plan.tree[r]) else rows_of
        getattr(mod, f"finish_k{r}")[max(1, -(-rows // cc.TPB)), cc.TPB](sc.acc, sc.hp_dev, sc.fin, sc.st, rows)


class DeviceLeaf(Leaf):
    """Optimiser state of one device array: like :class:`numbaopt.Leaf`, with the state arrays on the GPU.

    ``arrays``/``state`` are Numba device arrays; ``hp`` stays on the host (uploaded when it changes).
    :meth:`to_host`/:meth:`from_host` move the state across the bus (pickling does it for you).
    """

    __slots__ = ("scratch", "_xcache")

    def __init__(self, rule, shape, dtype, arrays=None, t=0, hp=None, skipped=0):
        size = int(np.prod(shape, dtype=np.int64))
        layout_rules = rule.rules
        from .. import codegen
        if arrays is None:
            arrays = _device_state(codegen.ChainLayout(layout_rules), layout_rules, dtype, size)
        Leaf.__init__(self, rule, shape, dtype, arrays=arrays, t=t, hp=hp, skipped=skipped)
        self.scratch = _Scratch(self.kernels().plan, 1, self.hp)
        self._xcache = None

    def kernels(self):
        """The generated CUDA module of this state's chain and dtype."""
        k = self.kern
        if k is None:
            k = self.kern = _codegen().kernels(self.rule.rules, self.dtype)
        return k

    def fast_call(self):  # the CPU fast path does not apply to device arrays
        raise TypeError("DeviceLeaf has no CPU fast path")

    @property
    def state(self) -> dict:
        """State arrays by name, as Numba device arrays shaped like the parameter (views)."""
        names = [d.name for _, d in self.layout.state_decls]
        out = {}
        for (r_i, d), a in zip(self.layout.state_decls, self.arrays):
            out[d.name if names.count(d.name) == 1 else f"{d.name}_{r_i}"] = a.reshape(self.shape)
        return out

    def copy(self) -> "DeviceLeaf":
        """An independent copy (device-to-device copies of the state)."""
        return DeviceLeaf(self.rule, self.shape, self.dtype, arrays=_device_copies(self.arrays), t=self.t,
                          hp=self.hp.copy(), skipped=self.skipped)

    def to_host(self) -> Leaf:
        """A host :class:`numbaopt.Leaf` with the same state (copied to host memory)."""
        return Leaf(self.rule, self.shape, self.dtype, arrays=[a.copy_to_host() for a in self.arrays],
                    t=self.t, hp=self.hp.copy(), skipped=self.skipped)

    @classmethod
    def from_host(cls, leaf: Leaf) -> "DeviceLeaf":
        """The device state of a host :class:`numbaopt.Leaf` (copied to the current device)."""
        from numba import cuda
        _codegen()
        return cls(leaf.rule, leaf.shape, leaf.dtype, arrays=[cuda.to_device(np.ascontiguousarray(a))
                                                              for a in leaf.arrays],
                   t=leaf.t, hp=leaf.hp.copy(), skipped=leaf.skipped)

    def __reduce__(self):
        return (_leaf_from_host, (self.to_host(),))

    def __repr__(self):
        return "Device" + Leaf.__repr__(self)

    # -- hooks called by numbaopt.update / update_ / adjust / adjust_ -----------------------------
    def _numbaopt_adjust(self, hyper, inplace):
        fresh_rule = self.adjusted_rule(hyper)
        target = self if inplace else self.copy()
        from .. import codegen
        from ..schedules import Schedule
        target.rule = fresh_rule
        target.layout = codegen.ChainLayout(fresh_rule.rules)
        target.scheduled = any(isinstance(r._values[n], Schedule) for r in fresh_rule.rules for n in r._hypers)
        target.hp[:] = target.layout.hyper_vector(target.t + 1, target.dtype)
        return target

    def _numbaopt_adjust_(self, **hyper):  # the tree engine's hook for the states it does not group
        self._numbaopt_adjust(hyper, True)

    def _numbaopt_copy(self):
        return self.copy()

    def _check(self, x, g):
        if not is_device_array(x):
            if isinstance(x, np.ndarray):
                raise TypeError(f"x: a host numpy array, but this state lives on the GPU; pass the device "
                                f"array it was set up for")
            raise TypeError(f"x: expected a device array, got {type(x).__name__}")
        cache = self._xcache
        if cache is not None and cache[0] is x and (cache[2] is None or _torch_ptr(x) == cache[2]):
            x1 = cache[1]
        else:
            xs, shape, dtype, addr = _info(x, "x")
            if dtype != self.dtype:
                raise TypeError(f"x: dtype {dtype}, but the state was set up for {self.dtype}")
            if tuple(shape) != self.shape:
                raise ValueError(f"x: shape {tuple(shape)}, but the state was set up for shape {self.shape}")
            x1 = _flat(xs, self.size)
            # a torch tensor can swap its storage under the same object (p.data = ...): recheck its address
            self._xcache = (x, x1, addr if _kind(x) == "torch" else None)
        if not is_device_array(g):
            if isinstance(g, np.ndarray) or hasattr(g, "__array__"):
                raise _host_side_error("g", g, type(x).__name__)
            raise TypeError(f"g: expected a device array for the GPU parameter, got {type(g).__name__}")
        gs, gshape, gdtype, _ = _info(g, "g", write=False)
        if tuple(gshape) != self.shape:
            raise ValueError(f"g: shape {tuple(gshape)}, expected {self.shape}")
        if gdtype != self.dtype:
            raise TypeError(f"g: dtype {gdtype}, expected {self.dtype} (on the GPU gradients are not cast: "
                            "that would need a hidden copy)")
        return x1, _flat(gs, self.size)

    def _run(self, x1, g1, outputs=None):
        cc = _codegen()
        mod = self.kernels()
        sc = self.scratch
        if self.scheduled:
            self.layout.fill_hyper(self.hp, self.t + 1)
        sc.sync_hp(self.hp)
        nb = _blocks(self.size)
        args = [x1, g1, *self.arrays, sc.hp_dev, self.t + 1]
        if self.layout.reducers:
            _reductions(mod, self.layout, sc, args, None, lambda k: k[nb, cc.TPB])
            args += [sc.fin, sc.st]
        if outputs is None:
            mod.inplace[nb, cc.TPB](*args)
        else:
            mod.outplace[nb, cc.TPB](*args, *outputs)
        if mod.plan.status:
            return _decode(int(sc.st.copy_to_host()[0]))[0]
        return 0

    def _numbaopt_update(self, model, grad, inplace):
        from ..backends.cpu import raise_status
        x1, g1 = self._check(model, grad)
        if inplace:
            status = self._run(x1, g1)
            if status == 0:
                self.t += 1
            else:
                raise_status(self, status)
                self.skipped += 1
            return self, model
        from numba import cuda
        # the new state reads this state's arrays (shared, never written) and owns the kernel's outputs
        new = DeviceLeaf(self.rule, self.shape, self.dtype, arrays=self.arrays, t=self.t, hp=self.hp.copy(),
                         skipped=self.skipped)
        xo_obj = _empty_like(_kind(model), model, self.shape, self.dtype)
        xo = _flat(_info(xo_obj, "x")[0], self.size)
        outs = [cuda.device_array(a.shape, dtype=a.dtype) for a in self.arrays]
        status = new._run(x1, g1, outputs=[xo] + outs)
        if status == 0:
            new.arrays = tuple(outs)
            new.t += 1
            return new, xo_obj
        for o, a in zip(outs, self.arrays):  # a refused step: the new state is a copy of this one
            o.copy_to_device(a)
        new.arrays = tuple(outs)
        xo.copy_to_device(x1)
        raise_status(new, status)
        new.skipped += 1
        return new, xo_obj


def _leaf_from_host(leaf):
    return DeviceLeaf.from_host(leaf)


def setup_leaf(rule, x) -> DeviceLeaf:
    """Optimiser state for one device array (``numbaopt.setup`` calls this for device arrays)."""
    rule = as_rule(rule)
    if hasattr(rule, "setup_leaf"):
        raise TypeError(f"{type(rule).__name__} is a host-level wrapper and does not support device arrays yet")
    _codegen()
    _, shape, dtype, _ = _info(x, "x")
    check_param_dtype(dtype)
    return DeviceLeaf(rule, shape, dtype)


# -- device leaves in trees (called by numbaopt.params / numbaopt.engine) ------------------------------
def _same(x):
    return x


def _new(a, old):
    return a


def param_info_device(x):
    """The tree engine's :class:`numbaopt.ParamInfo` for a device array (no numba.cuda import)."""
    from ..params import ParamInfo
    if type(x).__name__ == "FakeCUDAArray":
        shape, dtype = x._ary.shape, x._ary.dtype
    else:
        cai = (x.detach() if _kind(x) == "torch" else x).__cuda_array_interface__
        shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
    return ParamInfo(dtype=np.dtype(dtype), shape=tuple(shape), writeable=True, to_array=_same,
                     from_array=_new, kind=type(x).__name__, backend="cuda", tieable=True)


def tree_group(rule, xs, wheres):
    """The state of a tree's device leaves under one rule and dtype: one :class:`DeviceGroup` (one launch
    per step for all of them). ``wheres`` name the leaves' paths for errors."""
    rule = as_rule(rule)
    if hasattr(rule, "setup_leaf"):
        raise TypeError(f"{wheres[0]}: {type(rule).__name__} is a host-level wrapper and does not support "
                        "device arrays")
    try:
        _codegen()
    except (ImportError, RuntimeError) as e:  # in a tree, as every bad leaf: a TypeError naming the path
        raise TypeError(f"{wheres[0]}: {e}") from None
    for x, where in zip(xs, wheres):
        try:
            _, _, dtype, _ = _info(x, where)
            check_param_dtype(dtype, where)
        except (TypeError, ValueError) as e:
            raise type(e)(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
    try:
        return DeviceGroup(rule, xs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{wheres[0]}: {e}") from None


def tree_grad(g, dtype, shape, where, tied=False):
    """Check the gradient of a device leaf of a tree (``where`` names its path); returns it unchanged."""
    if not is_device_array(g):
        if isinstance(g, np.ndarray) or hasattr(g, "__array__"):
            raise _host_side_error(where, g, "a device leaf")
        raise TypeError(f"{where}: expected a device array (or None), got {type(g).__name__}")
    if tied:
        raise NotImplementedError(f"{where}: a device array that appears twice in the model (tied); the "
                                  "CUDA backend does not sum tied gradients yet")
    _, gshape, gdtype, _ = _info(g, where, write=False)
    if tuple(gshape) != tuple(shape):
        raise ValueError(f"{where}: shape {tuple(gshape)}, expected {tuple(shape)}")
    if gdtype != dtype:
        raise TypeError(f"{where}: dtype {gdtype}, expected {dtype} (gradients are not cast on the GPU)")
    return g


def host_grad_error(g, where):
    """The error for a device gradient given for a host leaf of a tree."""
    return TypeError(f"{where}: a device array ({type(g).__name__}) for a host parameter; copy it to the "
                     "host yourself (numbaopt never copies across the bus silently)")


class DeviceGroup:
    """Optimiser state of many device arrays of one dtype under one rule, stepped with ONE launch.

    The state of every leaf lives in flat device arenas (leaf ``i`` at ``offsets[i]``); parameters and
    gradients are reached through tables of device addresses, uploaded only when an address changes.
    A chunk table (built once) maps each block to one leaf and a range of its elements. Rules with a
    reduction add one reduce and one finish launch each (per leaf, or over the whole group for
    ``scope = "tree"`` rules such as global-norm clipping). ``update`` (pure) copies the parameters and
    arenas on the device, then steps the copies.

    Each leaf has its own step count (``ts``; ``t`` is the largest): called directly, every leaf steps
    every time; in a tree, leaves with a ``None`` gradient or frozen are left out of the launch (their
    blocks are not in its chunk table) and keep their step count. Leaves at different step counts are
    stepped with one launch per distinct count (the kernels take one ``t``).
    """

    def __init__(self, rule, params, *, _arenas=None, t=0, hp=None, skipped=0, _shapes=None, _dtype=None):
        from .. import codegen
        from numba import cuda
        cc = _codegen()
        rule = as_rule(rule)
        if hasattr(rule, "setup_leaf"):
            raise TypeError(f"{type(rule).__name__} is a host-level wrapper and does not support device arrays")
        if params is None:  # rebuilt from host state (load): shapes and dtype given
            shapes, dtype = [tuple(sh) for sh in _shapes], np.dtype(_dtype)
        else:
            params = list(params)
            shapes, dtype = [], None
            for i, p in enumerate(params):
                if not is_device_array(p):
                    raise TypeError(f"params[{i}]: expected a device array, got {type(p).__name__}")
                _, shape, dt, _ = _info(p, f"params[{i}]")
                check_param_dtype(dt, f"params[{i}]")
                if dtype is None:
                    dtype = dt
                elif dt != dtype:
                    raise TypeError(f"params[{i}]: dtype {dt}; a group has one dtype ({dtype}): make one group "
                                    "per dtype")
                shapes.append(tuple(shape))
        if not shapes:
            raise ValueError("setup_device_group: needs at least one device array")
        self.rule, self.dtype, self.shapes = rule, np.dtype(dtype), shapes
        for r in rule.rules:
            if self.dtype.kind == "c" and not type(r).supports_complex:
                raise TypeError(f"{type(r).__name__} does not support complex parameters (dtype {self.dtype})")
        self.layout = codegen.ChainLayout(rule.rules)
        from ..schedules import Schedule
        self.scheduled = any(isinstance(r._values[n], Schedule) for r in rule.rules for n in r._hypers)
        n = len(shapes)
        self.ts = np.zeros(n, dtype=np.int64) + np.asarray(t, dtype=np.int64)
        self.skips = np.zeros(n, dtype=np.int64) + np.asarray(skipped, dtype=np.int64)
        self.hp = self.layout.hyper_vector(self.t + 1, self.dtype) if hp is None else hp
        self.sizes = np.array([int(np.prod(s, dtype=np.int64)) for s in shapes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.total = int(self.sizes.sum())
        self.mod = cc.kernels(rule.rules, self.dtype)
        self.arenas = tuple(_device_state(self.layout, rule.rules, self.dtype, self.total)
                            if _arenas is None else _arenas)
        self._sizes_dev = cuda.to_device(self.sizes)
        self._offsets_dev = cuda.to_device(self.offsets)
        self._chunks = {}  # chunk tables by the leaves they cover (shared by copies: never written)
        self.scratch = _Scratch(self.mod.plan, n, self.hp)
        self._new_tables()

    def _new_tables(self):
        from numba import cuda
        n = len(self.shapes)
        self._xaddr = np.zeros(n, dtype=np.int64)
        self._gaddr = np.zeros(n, dtype=np.int64)
        self._xaddr_dev = cuda.to_device(self._xaddr)
        self._gaddr_dev = cuda.to_device(self._gaddr)
        self._params = None  # the parameter objects whose addresses are in the table
        self._grads = None  # the gradient objects whose addresses are in the table

    t = property(lambda self: int(self.ts.max()), doc="steps taken (the largest per-leaf count, ``ts``)")
    skipped = property(lambda self: int(self.skips.max()), doc="steps refused by the rule (e.g. SkipNonFinite)")

    def __len__(self):
        return len(self.shapes)

    def __repr__(self):
        return f"DeviceGroup({self.rule!r}, t={self.t}, {len(self)} leaves, {self.dtype.name}[{self.total}])"

    def state(self, i: int) -> dict:
        """State arrays of leaf ``i`` by name (device views into the arenas, shaped like the leaf)."""
        o, n = int(self.offsets[i]), int(self.sizes[i])
        names = [d.name for _, d in self.layout.state_decls]
        out = {}
        for (r_i, d), a in zip(self.layout.state_decls, self.arenas):
            out[d.name if names.count(d.name) == 1 else f"{d.name}_{r_i}"] = a[o:o + n].reshape(self.shapes[i])
        return out

    def _chunk_table(self, leaves):
        """``(bleaf, bstart, nblocks)`` on the device for the blocks of ``leaves`` (built once per set)."""
        key = leaves.tobytes()
        tab = self._chunks.get(key)
        if tab is None:
            from numba import cuda
            chunk = _codegen().CHUNK
            bleaf, bstart = [], []
            for j in leaves:
                for st in range(0, max(int(self.sizes[j]), 1), chunk):
                    bleaf.append(int(j))
                    bstart.append(st)
            tab = self._chunks[key] = (cuda.to_device(np.array(bleaf, dtype=np.int64)),
                                       cuda.to_device(np.array(bstart, dtype=np.int64)), len(bleaf))
        return tab

    def _table(self, objs, what, table, dev, leaves=None):
        """Check ``objs`` (those of ``leaves``; all when None) against the group's leaves and upload
        their addresses when they changed (a leaf not stepped gets address 0)."""
        if len(objs) != len(self.shapes):
            raise ValueError(f"{what}: {len(objs)} arrays for a group of {len(self.shapes)}")
        addr = np.zeros(len(objs), dtype=np.int64)
        for i in (range(len(objs)) if leaves is None else leaves):
            o = objs[i]
            if not is_device_array(o):
                if what == "grads" and (isinstance(o, np.ndarray) or hasattr(o, "__array__")):
                    raise _host_side_error(f"grads[{i}]", o, "device parameters")
                raise TypeError(f"{what}[{i}]: expected a device array, got {type(o).__name__}")
            _, shape, dt, a = _info(o, f"{what}[{i}]", write=what != "grads")
            if tuple(shape) != self.shapes[i]:
                raise ValueError(f"{what}[{i}]: shape {tuple(shape)}, expected {self.shapes[i]}")
            if dt != self.dtype:
                raise TypeError(f"{what}[{i}]: dtype {dt}, expected {self.dtype}")
            addr[i] = a
        if not np.array_equal(addr, table):
            table[:] = addr
            dev.copy_to_device(table)

    def _step(self, params, grads, active=None):
        """Step the leaves ``active`` (all when None) in place; raises what the rule refuses."""
        from ..backends.cpu import raise_status
        cc = _codegen()
        params, grads = list(params), list(grads)
        n = len(self.shapes)
        every = active is None or len(active) == n
        leaves = np.arange(n, dtype=np.int64) if active is None else np.asarray(active, dtype=np.int64)
        if every:
            # the same objects as last step (persistent buffers): nothing to check or upload; the
            # references held here keep their addresses from being reused by other arrays
            if _table_stale(params, self._params, self._xaddr):
                self._params = None
                self._table(params, "params", self._xaddr, self._xaddr_dev)
                self._params = params
            if _table_stale(grads, self._grads, self._gaddr):
                self._grads = None
                self._table(grads, "grads", self._gaddr, self._gaddr_dev)
                self._grads = grads
        else:  # a subset (a tree with None gradients or frozen leaves): tables made for this step
            self._params = self._grads = None
            self._table(params, "params", self._xaddr, self._xaddr_dev, leaves)
            self._table(grads, "grads", self._gaddr, self._gaddr_dev, leaves)
        tvals = self.ts[leaves]
        if tvals.min() == tvals.max():  # the usual case: one launch
            steps = [np.sort(leaves)]
        else:
            steps = [np.sort(leaves[tvals == t]) for t in np.unique(tvals)]
        if len(steps) > 1 and any(self.mod.plan.tree.values()):
            raise NotImplementedError(f"{self.rule!r}: a reduction over the whole group needs its leaves at one "
                                      f"step count; they are at {sorted(set(tvals.tolist()))}")
        sc = self.scratch
        for sub in steps:
            t = int(self.ts[sub[0]])
            if self.scheduled:
                self.layout.fill_hyper(self.hp, t + 1)
            sc.sync_hp(self.hp)
            bleaf, bstart, nb = self._chunk_table(sub)
            args = [self._xaddr_dev, self._gaddr_dev, self._sizes_dev, self._offsets_dev, bleaf, bstart,
                    *self.arenas, sc.hp_dev, t + 1]
            if self.layout.reducers:
                _reductions(self.mod, self.layout, sc, args, n, lambda k: k[nb, cc.TPB])
                args += [sc.fin, sc.st]
            self.mod.multi[nb, cc.TPB](*args)
            status, row = _decode(int(sc.st.copy_to_host()[0])) if self.mod.plan.status else (0, None)
            if status == 0:
                self.ts[sub] += 1
                continue
            raise_status(self, status, "" if row is None else f"leaf {row}")
            self.skips[sub] += 1

    def update_(self, params, grads):
        """One step on every leaf in place; returns ``(self, params)``."""
        self._step(params, grads)
        return self, params

    def copy(self) -> "DeviceGroup":
        """An independent copy (device-to-device copies of the arenas)."""
        g = DeviceGroup.__new__(DeviceGroup)
        g.__dict__.update(self.__dict__)
        g.arenas = tuple(_device_copies(self.arenas))
        g.ts, g.skips, g.hp = self.ts.copy(), self.skips.copy(), self.hp.copy()
        g.scratch = _Scratch(self.mod.plan, len(self.shapes), g.hp)
        g._new_tables()
        return g

    def copy_params(self, params, leaves=None):
        """New device arrays (of each parameter's kind) holding copies of ``params`` (those of ``leaves``)."""
        outs = list(params)
        for i in (range(len(outs)) if leaves is None else leaves):
            p = outs[i]
            if not is_device_array(p):
                raise TypeError(f"params[{i}]: expected a device array, got {type(p).__name__}")
            src, shape, dt, _ = _info(p, f"params[{i}]", write=False)
            o = _empty_like(_kind(p), p, shape, dt)
            size = int(np.prod(shape, dtype=np.int64))
            _flat(_info(o, "out")[0], size).copy_to_device(_flat(src, size))
            outs[i] = o
        return outs

    def update(self, params, grads):
        """Pure step: returns ``(new_group, new_params)``; the inputs are untouched."""
        new = self.copy()
        outs = self.copy_params(params)
        new._step(outs, grads)
        new._params = new._grads = None  # the caller's arrays now: do not keep their addresses
        return new, outs

    def _numbaopt_update(self, model, grad, inplace):
        return self.update_(model, grad) if inplace else self.update(model, grad)

    def _numbaopt_adjust(self, hyper, inplace):
        probe = Leaf.__new__(Leaf)  # the same name checks as for one array
        probe.rule = self.rule
        fresh = Leaf.adjusted_rule(probe, hyper)
        target = self if inplace else self.copy()
        from .. import codegen
        from ..schedules import Schedule
        target.rule = fresh
        target.layout = codegen.ChainLayout(fresh.rules)
        target.scheduled = any(isinstance(r._values[n], Schedule) for r in fresh.rules for n in r._hypers)
        target.hp[:] = target.layout.hyper_vector(target.t + 1, self.dtype)
        return target

    def to_host(self) -> list:
        """One host :class:`numbaopt.Leaf` per leaf (state copied to host memory)."""
        host = [a.copy_to_host() for a in self.arenas]
        out = []
        for i, shape in enumerate(self.shapes):
            o, n = int(self.offsets[i]), int(self.sizes[i])
            t = int(self.ts[i])
            hp = self.hp.copy()
            if self.scheduled:
                self.layout.fill_hyper(hp, t + 1)
            out.append(Leaf(self.rule, shape, self.dtype, arrays=[h[o:o + n].copy() for h in host],
                            t=t, hp=hp, skipped=int(self.skips[i])))
        return out

    @classmethod
    def from_host(cls, leaves, params=None) -> "DeviceGroup":
        """A group with the state of host leaves (as from :meth:`to_host`), for the device arrays ``params``
        (checked against the leaves' shapes and dtype) or, without them, for the leaves' shapes."""
        from numba import cuda
        leaves = list(leaves)
        if not leaves:
            raise ValueError("from_host: no leaves")
        first = leaves[0]
        for i, lf in enumerate(leaves):
            if lf.rule != first.rule or lf.dtype != first.dtype:
                raise ValueError(f"leaves[{i}]: a group needs one rule and one dtype")
        k = len(first.arrays)
        arenas = tuple(cuda.to_device(np.concatenate([np.ascontiguousarray(lf.arrays[a]).reshape(-1)
                                                      for lf in leaves])) for a in range(k))
        ts = np.array([lf.t for lf in leaves], dtype=np.int64)
        hp = first.layout.hyper_vector(int(ts.max()) + 1, first.dtype)
        g = cls(first.rule, params, _arenas=arenas, t=ts, hp=hp,
                skipped=np.array([lf.skipped for lf in leaves], dtype=np.int64),
                _shapes=[lf.shape for lf in leaves], _dtype=first.dtype)
        if g.shapes != [tuple(lf.shape) for lf in leaves]:
            raise ValueError(f"from_host: parameter shapes {g.shapes}, the leaves' {[lf.shape for lf in leaves]}")
        return g


class DeviceMember:
    """Leaf ``j`` of a :class:`DeviceGroup` as a tree's state shows it (``state['gpu'].w``): a view.

    A tree groups its device leaves by (rule, dtype) into one ``DeviceGroup`` each, stepped with one
    launch. This view reads the group live: ``rule``, ``t``, ``skipped``, ``shape``, ``dtype``,
    ``state`` (device views), ``to_host()``.
    """

    __slots__ = ("group", "j")

    def __init__(self, group, j):
        self.group, self.j = group, j

    rule = property(lambda self: self.group.rule)
    t = property(lambda self: int(self.group.ts[self.j]))
    skipped = property(lambda self: int(self.group.skips[self.j]))
    shape = property(lambda self: self.group.shapes[self.j])
    dtype = property(lambda self: self.group.dtype)
    state = property(lambda self: self.group.state(self.j), doc="state arrays by name (device views)")

    def to_host(self) -> Leaf:
        """This leaf's state as a host :class:`numbaopt.Leaf` (copied from the device)."""
        g, j = self.group, self.j
        o, n = int(g.offsets[j]), int(g.sizes[j])
        hp = g.hp.copy()
        if g.scheduled:
            g.layout.fill_hyper(hp, self.t + 1)
        return Leaf(g.rule, self.shape, g.dtype, arrays=[a[o:o + n].copy_to_host() for a in g.arenas],
                    t=self.t, hp=hp, skipped=self.skipped)

    def __repr__(self):
        return (f"DeviceLeaf({self.rule!r}, t={self.t}, {self.dtype.name}{list(self.shape)}, "
                f"group of {len(self.group)})")


def setup_device_group(rule, params) -> DeviceGroup:
    """One :class:`DeviceGroup` for a list of device arrays (one dtype): one launch per step."""
    return DeviceGroup(rule, params)
