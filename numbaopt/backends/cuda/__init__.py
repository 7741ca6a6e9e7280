"""CUDA backend: optimiser state on the GPU, updated by kernels generated from the same rule definitions.

Importing this package does not import ``numba.cuda`` (that costs ~0.3 s and needs the optional
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
silently. All launches go to the default stream. Axis reductions (Adafactor...) run through per-unit tables
(:mod:`numbaopt.compiler.cuda_axes`). Stages (AccumGrad, MixedPrecision) and matrix rules (Muon) do not run on the
GPU yet (a clear ``NotImplementedError`` / ``TypeError`` at setup).
"""
from .arrays import cuda_available, is_device_array
from .group import DeviceGroup, setup_device_group
from .leaf import DeviceLeaf, setup_leaf
from .member import DeviceMember

__all__ = ["DeviceLeaf", "DeviceGroup", "DeviceMember", "setup_device_group", "setup_leaf", "is_device_array",
           "cuda_available"]
