"""The compiler: from a chain's scalar definitions to generated, cached kernel modules.

:mod:`.layout` (where hyperparameters, state and reductions sit), :mod:`.elements` (the fused element
body, shared by both emitters), :mod:`.prelude` (compiled ``ops``), :mod:`.cpu` and :mod:`.cuda` (the
emitters), :mod:`.cache` (content-hashed modules on disk), :mod:`.intrinsics` (raw-address helpers).
"""
from .cache import cache_dir, chain_key, kernels
from .layout import ChainLayout, real_dtype

__all__ = ["ChainLayout", "real_dtype", "kernels", "chain_key", "cache_dir"]
