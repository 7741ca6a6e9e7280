"""The state of one device array: :class:`DeviceLeaf`, stepped by the generated CUDA kernels."""
from __future__ import annotations

import numpy as np

from ..alias import shares
from ..state import Leaf, as_reader, as_rule, check_param_dtype, raise_status
from .arrays import (Scratch, blocks, check_device_grad, decode, device_copies, device_state, empty_like, flat, info,
                     is_device_array, kind, run_reductions, runtime, torch_ptr,
                     unpickling_runtime)

__all__ = ["DeviceLeaf", "setup_leaf", "check_device_rule", "leaf_from_host"]


def check_device_rule(rule, where="x"):
    """The CUDA backend runs plain chains: stages (AccumGrad, MixedPrecision) stay on the host for now."""
    for r in rule.rules:
        if type(r).stage is not None:
            raise NotImplementedError(f"{where}: {r!r} does not run on the GPU yet (the CUDA backend runs chains "
                                      "of elementwise and reduction rules)")


class DeviceLeaf(Leaf):
    """Optimiser state of one device array: like :class:`numbaopt.Leaf`, with the state arrays on the GPU.

    ``arrays``/``state`` are Numba device arrays; ``hp`` and the counters stay on the host (``hp`` is
    uploaded when it changes). :meth:`to_host`/:meth:`from_host` move the state across the bus (pickling
    does it for you).
    """

    display_name = "DeviceLeaf"
    __slots__ = ("scratch", "xcache", "spans")

    def __init__(self, rule, shape, dtype, arrays=None, t=0, hp=None, skipped=0, counters=None):
        from ...compiler import ChainLayout
        layout = ChainLayout(rule)
        layout.refuse_axes("a GPU parameter", scalar=False, axes=False)
        size = int(np.prod(shape, dtype=np.int64))
        if arrays is None:
            arrays = device_state(layout, dtype, size, [tuple(shape)])
        Leaf.__init__(self, rule, shape, dtype, arrays=arrays, t=t, hp=hp, skipped=skipped, counters=counters,
                      layout=layout)
        self.scratch = self.new_scratch(self.hp)
        self.xcache = None
        self.spans = None  # byte spans of the state arrays on the device (what a gradient must not overlap)

    def new_scratch(self, hp) -> Scratch:
        """Device buffers for stepping this state (the axis members' tables sized for its shape)."""
        lay = self.layout
        geo = lay.new_units([self.shape], self.dtype)[-1] if lay.axis_rules else None
        return Scratch(self.kernels().plan, 1, hp, (lay, geo, self.dtype))

    def kernels(self):
        """The generated CUDA module of this state's chain and dtype."""
        k = self.kern
        if k is None:
            k = self.kern = runtime().kernels(self.rule, self.dtype)
        return k

    def copy(self) -> DeviceLeaf:
        """An independent copy (device-to-device copies of the state)."""
        return DeviceLeaf(self.rule, self.shape, self.dtype, arrays=device_copies(self.arrays),
                          hp=self.hp.copy(), counters=self.counters.copy())

    def to_host(self) -> Leaf:
        """A host :class:`numbaopt.Leaf` with the same state (copied to host memory)."""
        return Leaf(self.rule, self.shape, self.dtype, arrays=[a.copy_to_host() for a in self.arrays],
                    hp=self.hp.copy(), counters=self.counters.copy())

    @classmethod
    def from_host(cls, leaf: Leaf) -> DeviceLeaf:
        """The device state of a host :class:`numbaopt.Leaf` (copied to the current device)."""
        from numba import cuda
        runtime()
        return cls(leaf.rule, leaf.shape, leaf.dtype,
                   arrays=[cuda.to_device(np.ascontiguousarray(a)) for a in leaf.arrays],
                   hp=leaf.hp.copy(), counters=leaf.counters.copy())

    # Pickling copies the state to host memory (under the in-use guard: never half-written); unpickling puts
    # it on the current device, and needs one (a RuntimeError naming what is missing otherwise).
    # copy.copy/deepcopy stay on the device (Leaf.__copy__: device-to-device copies).
    def __reduce__(self):
        return (leaf_from_host, (as_reader(self, "pickle", self.to_host),))

    def _check(self, x, g):
        if not is_device_array(x):
            if isinstance(x, np.ndarray):
                raise TypeError("x: a host numpy array, but this state lives on the GPU; pass the device "
                                "array it was set up for")
            raise TypeError(f"x: expected a device array, got {type(x).__name__}")
        cache = self.xcache
        if cache is not None and cache[0] is x and (cache[2] is None or torch_ptr(x) == cache[2]):
            x1, xaddr = cache[1], cache[3]
        else:
            xs, shape, dtype, addr = info(x, "x")
            if dtype != self.dtype:
                raise TypeError(f"x: dtype {dtype}, but the state was set up for {self.dtype}")
            if tuple(shape) != self.shape:
                raise ValueError(f"x: shape {tuple(shape)}, but the state was set up for shape {self.shape}")
            x1 = flat(xs, self.size)
            # a torch tensor can swap its storage under the same object (p.data = ...): recheck its address
            self.xcache = (x, x1, addr if kind(x) == "torch" else None, addr)
            xaddr = addr
        gs, gaddr = check_device_grad(g, self.dtype, self.shape, "g", type(x).__name__)
        g1 = flat(gs, self.size)
        nbytes = self.size * self.dtype.itemsize
        spans = self.spans
        if spans is None:
            spans = self.spans = [(a, a + s.size * s.dtype.itemsize) for s, a in
                                  ((s, info(s, "state", write=False)[3]) for s in self.arrays)]
        if shares(gaddr, gaddr + nbytes, spans + [(xaddr, xaddr + nbytes)]):
            g1 = device_copies([g1])[0]  # a gradient overlapping what the kernel writes: step on a copy
        return x1, g1

    def _run(self, x1, g1, hp, outputs=None):
        rt = runtime()
        mod = self.kernels()
        sc = self.scratch
        sc.sync_hp(hp)
        nb = blocks(self.size)
        args = [x1, g1, *self.arrays, sc.hp_dev, self.t + 1]
        if mod.plan.phases:
            run_reductions(mod, self.layout, sc, args, None, lambda k: k[nb, rt.TPB], self.arrays)
            args += [sc.fin, sc.st, *sc.tables]
        if outputs is None:
            mod.inplace[nb, rt.TPB](*args)
        else:
            mod.outplace[nb, rt.TPB](*args, *outputs)
        if mod.plan.status:
            return decode(int(sc.st.copy_to_host()[0]))[0]
        return 0

    def step(self, model, grad, inplace: bool):
        """One step on the device array ``model`` (``numbaopt.update``/``update_`` call this); a ``None``
        gradient skips it. A refusal raises before the kernels write anything."""
        if grad is None:
            if not is_device_array(model):
                self._check(model, model)
            return (self, model) if inplace else (self.copy(), model)
        x1, g1 = self._check(model, grad)
        hp = self.step_hp()  # schedules checked before anything runs
        if inplace:
            status = self._run(x1, g1, hp)
            raise_status(self.rule, status)
            self.hp[:] = hp
            self.count_status(status)
            return self, model
        from numba import cuda
        # the new state reads this state's arrays (shared, never written) and owns the kernel's outputs
        new = self.derive(self.arrays, self.counters.copy())
        new.scratch = new.new_scratch(new.hp)
        xo_obj = empty_like(kind(model), model, self.shape, self.dtype)
        xo = flat(info(xo_obj, "x")[0], self.size)
        outs = [cuda.device_array(a.shape, dtype=a.dtype) for a in self.arrays]
        if self.layout.units:  # the geometry row is not written by the kernels: the new state keeps this one's
            outs[-1].copy_to_device(self.arrays[-1])
        status = new._run(x1, g1, hp, outputs=[xo] + outs)
        raise_status(self.rule, status)
        if status == 1:  # skipped: the new state is a copy of this one
            for o, a in zip(outs, self.arrays):
                o.copy_to_device(a)
            xo.copy_to_device(x1)
        new.arrays = tuple(outs)
        new.hp[:] = hp
        new.count_status(status)
        return new, xo_obj


def leaf_from_host(leaf):
    """Unpickling a ``DeviceLeaf`` (or a tree's device leaf): its host state back on the current device."""
    unpickling_runtime("DeviceLeaf")
    return DeviceLeaf.from_host(leaf)


def setup_leaf(rule, x) -> DeviceLeaf:
    """Optimiser state for one device array (``numbaopt.setup`` calls this for device arrays)."""
    rule = as_rule(rule)
    check_device_rule(rule)
    runtime()
    _, shape, dtype, _ = info(x, "x")
    check_param_dtype(dtype)
    return DeviceLeaf(rule, shape, dtype)
