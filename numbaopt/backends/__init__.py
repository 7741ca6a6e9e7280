"""Execution backends: ``cpu`` (Numba njit kernels) and ``cuda`` (Numba CUDA kernels, optional)."""
