"""numbaopt: gradient-based optimisers written once as scalar rules, compiled and fused with Numba.

>>> import numpy as np, numbaopt as no
>>> x = np.ones(4, dtype=np.float32)
>>> state = no.setup(no.Adam(lr=0.1), x)
>>> state, x = no.update_(state, x, np.ones(4, dtype=np.float32))
"""
from .rule import Rule, hyper, option, state
from .chain import Chain, chain
from .rules import *  # noqa: F401,F403
from .rules import __all__ as _rules_all
from .leaf import Leaf
from .api import setup, update, update_, adjust, adjust_, jit_step, JitStep
from .backends.cpu import set_parallel_threshold, parallel_threshold

# Each feature module defines __all__; its public names are re-exported here (one line per module).
from .tree import *  # [trees]
from .wrappers import *  # [catalog]
from .schedules import *  # [catalog]
from .loops import *  # [loops]
from .backends.cuda import *  # [cuda]

__version__ = "0.1.0"
import types as _types

__all__ = sorted(n for n, v in globals().items()
                 if not n.startswith("_") and not isinstance(v, _types.ModuleType))
