"""Backends: the state of one array (:mod:`.state`) and the CPU (:mod:`.cpu`, :mod:`.abi`) and CUDA
(:mod:`.cuda`) execution of the generated kernels."""
__all__: list[str] = []  # the backends are reached through their subpackages and modules
