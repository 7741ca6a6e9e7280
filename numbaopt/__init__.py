"""numbaopt: gradient-based optimisers written once as scalar rules, compiled and fused with Numba.

>>> import numpy as np, numbaopt as no
>>> x = np.ones(4, dtype=np.float32)
>>> state = no.setup(no.Adam(lr=0.1), x)
>>> state, x = no.update_(state, x, np.ones(4, dtype=np.float32))

The package in layers (each imports only from those before it): :mod:`.schedules`, :mod:`.rules` (the
definition mechanism, chains, stages, the built-in rules), :mod:`.compiler` (kernel generation and cache),
:mod:`.backends` (one array's state, CPU and CUDA execution), :mod:`.tree` (nested models and their state,
the transactional step), :mod:`.api`, then :mod:`.loops`, :mod:`.persist` and :mod:`.docs`.
``import numbaopt`` leaves :mod:`.loops`, :mod:`.persist`, :mod:`.mpi` and :mod:`.quantum` to the first use of
one of their names (``numbaopt.save``, ``numbaopt.mpi``, ...).
"""
import typing as _typing

from . import schedules
from .ahead import precompile
from .api import (Grad, HyperValue, JitStep, Model, RuleChooser, RuleLike, State, adjust, adjust_, jit_step, setup,
                  update, update_)
from .backends.cpu import parallel_threshold, set_parallel_threshold
from .backends.cuda import DeviceGroup, DeviceLeaf, DeviceMember, cuda_available, is_device_array, setup_device_group
from .backends.state import Leaf, StateInUseError
from .evaluation import eval_params
from .plateau import ReduceOnPlateau
from .rules import (ADOPT, EMA, AccumGrad, AdaBelief, AdaDelta, AdaGrad, AdaMax, Adam, AdamW, Adan, AdEMAMix, AMSGrad,
                    Chain, ClipByBlockRMS, ClipGlobalNorm, ClipGrad, ClipNorm, Descent, KeepParamsNonNegative, LAMB,
                    Centralize, AdaptiveGradClip, ScaleByFactoredRMS, ScaleByParamBlockRMS, Adafactor, NovoGrad,
                    ScheduleFree, ScheduleFreeSGD, ScheduleFreeAdamW, ParamAverage, Muon, muon, DAdaptAdamW, Prodigy,
                    LAMBDirection, LARS, Lion, Lookahead, LookaheadSync, MixedPrecision, Momentum, NAdam, Nesterov,
                    NonFiniteGuard, NormalizeByUpdateNorm, OAdam, RAdam, RMSProp, Rprop, Rule, SignDecay, Signum,
                    SkipNonFinite, Trace, TrustRatio, WeightDecay, Yogi, ZeroNaNs, chain, hyper, masked, option, state)
from .schedules import (Schedule, ademamix_alpha, ademamix_beta3, constant, cosine, exponential, join, linear,
                        linear_one_cycle, one_cycle, piecewise_constant, polynomial, sgdr, sgdr_cycles, step_decay,
                        inverse_sqrt,
                        warmup_constant, warmup_cosine, warmup_exponential)
from .tree import (ParamInfo, Path, PathEntry, StateNode, StateTree, TreeLeaf, destructure, freeze_, not_trainable,
                   param_info, register_container, thaw_, trainables)

if _typing.TYPE_CHECKING:  # loaded on first use (``__getattr__`` below); imported here for type checkers
    from . import mpi, quantum
    from .loops import SPSA, BatchResult, OptimizeResult, minimize, minimize_batch
    from .persist import CheckpointError, DeviceUnavailable, load, load_state_dict, save, state_dict

#: the public names loaded on first use, and the module each comes from (a name that is a module's own is that
#: submodule): ``import numbaopt`` imports no compiled loops, persistence, MPI or quantum code
_LAZY = {
    **dict.fromkeys(("minimize", "minimize_batch", "SPSA", "OptimizeResult", "BatchResult"), "loops"),
    **dict.fromkeys(("save", "load", "state_dict", "load_state_dict", "CheckpointError", "DeviceUnavailable"),
                    "persist"),
    "mpi": "mpi",
    "quantum": "quantum",
}

__version__ = "0.1.0"

__all__ = [
    # the step API
    "setup", "update", "update_", "adjust", "adjust_", "jit_step", "JitStep", "Leaf", "StateInUseError",
    "parallel_threshold", "set_parallel_threshold", "precompile",
    # the types of the API (for annotations; docs/architecture.md, "Typing")
    "State", "Model", "Grad", "RuleLike", "RuleChooser", "HyperValue",
    # defining and composing rules
    "Rule", "hyper", "option", "state", "Chain", "chain", "masked",
    # the catalogue
    "Descent", "Momentum", "Nesterov", "RMSProp", "Adam", "AdamW", "AdaGrad", "WeightDecay", "ClipGrad", "Rprop",
    "RAdam", "AdaMax", "OAdam", "AdaDelta", "AMSGrad", "NAdam", "AdaBelief", "Lion", "SignDecay", "ClipNorm",
    "ClipGlobalNorm", "ClipByBlockRMS", "Yogi", "Adan", "Signum", "Trace", "TrustRatio", "LAMBDirection", "LAMB",
    "LARS", "LookaheadSync", "Lookahead", "NonFiniteGuard", "SkipNonFinite", "EMA", "ADOPT", "AdEMAMix",
    "NormalizeByUpdateNorm", "ZeroNaNs", "KeepParamsNonNegative", "Centralize", "AdaptiveGradClip",
    "ScaleByFactoredRMS", "ScaleByParamBlockRMS", "Adafactor", "NovoGrad", "ScheduleFree", "ScheduleFreeSGD",
    "ScheduleFreeAdamW", "ParamAverage", "Muon", "muon", "DAdaptAdamW", "Prodigy", "eval_params", "AccumGrad",
    "MixedPrecision",
    # schedules
    "schedules", "Schedule", "constant", "linear", "exponential", "piecewise_constant", "step_decay", "cosine",
    "warmup_cosine", "one_cycle", "join", "polynomial", "warmup_constant", "warmup_exponential", "linear_one_cycle",
    "sgdr", "sgdr_cycles", "inverse_sqrt", "ademamix_alpha", "ademamix_beta3", "ReduceOnPlateau",
    # trees
    "Path", "PathEntry", "register_container", "not_trainable", "StateTree", "StateNode", "TreeLeaf", "ParamInfo",
    "param_info", "freeze_", "thaw_", "destructure", "trainables",
    # persistence
    "save", "load", "state_dict", "load_state_dict", "DeviceUnavailable", "CheckpointError",
    # compiled loops
    "minimize", "minimize_batch", "SPSA", "OptimizeResult", "BatchResult",
    # beyond one machine (optional: numbaopt[mpi]; docs/mpi.md)
    "mpi",
    # quantum circuits: QNG, Rotosolve, QN-SPSA, PennyLane interop (docs/quantum.md)
    "quantum",
    # the GPU (optional: numbaopt[cuda])
    "DeviceLeaf", "DeviceGroup", "DeviceMember", "setup_device_group", "is_device_array", "cuda_available",
]


if not _typing.TYPE_CHECKING:  # type checkers see the imports above instead, and still flag unknown names
    def __getattr__(name: str):
        """The names of ``_LAZY``, imported on first access (then bound here: later accesses cost nothing)."""
        sub = _LAZY.get(name)
        if sub is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib
        module = importlib.import_module(f"{__name__}.{sub}")
        value = module if sub == name else getattr(module, name)
        globals()[name] = value
        return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
