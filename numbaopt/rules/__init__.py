"""Rules: the definition mechanism (:mod:`.base`), the names a step may use (:mod:`.ops`), composition
(:mod:`.chain`), the stages (:mod:`.stages`) and the built-in rules by family.

A rule is one class with its hyperparameters, state and ONE scalar ``step`` (read :mod:`.basic` or
:mod:`.adaptive` to write your own; ``docs/custom_rules.md``).
"""
from .adaptive import (AdaBelief, AdaDelta, AdaGrad, AdaMax, Adam, AdamW, Adan, AMSGrad, NAdam, OAdam, RAdam,
                       RMSProp, Yogi)
from .base import Rule, hyper, option, state
from .basic import EMA, Descent, Momentum, Nesterov, Trace, WeightDecay
from .chain import Chain, chain, masked
from .averaging import ParamAverage, ScheduleFree, ScheduleFreeAdamW, ScheduleFreeSGD
from .matrix import Muon, muon
from .factored import AdaptiveGradClip, Adafactor, Centralize, NovoGrad, ScaleByFactoredRMS, ScaleByParamBlockRMS
from .clipping import (ClipByBlockRMS, ClipGlobalNorm, ClipGrad, ClipNorm, KeepParamsNonNegative, NonFiniteGuard,
                       NormalizeByUpdateNorm, SkipNonFinite, ZeroNaNs)
from .layerwise import LAMB, LARS, LAMBDirection, TrustRatio
from .lookahead import Lookahead, LookaheadSync
from .parameter_free import DAdaptAdamW, Prodigy
from .recent import ADOPT, AdEMAMix
from .sign_based import Lion, Rprop, SignDecay, Signum
from .stages import AccumGrad, MixedPrecision

__all__ = [
    "Rule", "hyper", "option", "state", "Chain", "chain", "masked",
    "Descent", "Momentum", "Nesterov", "RMSProp", "Adam",
    "AdamW", "AdaGrad", "WeightDecay", "ClipGrad", "Rprop", "RAdam", "AdaMax", "OAdam", "AdaDelta", "AMSGrad",
    "NAdam", "AdaBelief", "Lion", "SignDecay", "ClipNorm", "ClipGlobalNorm", "ClipByBlockRMS", "Yogi", "Adan",
    "Signum", "Trace", "TrustRatio", "LAMBDirection", "LAMB", "LARS", "LookaheadSync", "Lookahead", "NonFiniteGuard",
    "SkipNonFinite",
    "EMA", "ADOPT", "AdEMAMix", "NormalizeByUpdateNorm", "ZeroNaNs", "KeepParamsNonNegative", "Centralize",
    "AdaptiveGradClip", "ScaleByFactoredRMS", "ScaleByParamBlockRMS", "Adafactor", "NovoGrad", "ScheduleFree",
    "ScheduleFreeSGD", "ScheduleFreeAdamW", "ParamAverage", "Muon", "muon", "DAdaptAdamW", "Prodigy", "AccumGrad",
    "MixedPrecision"
]

#: the built-in rules and rule constructors, in catalogue order (docs/rules.md follows it)
BUILTIN = __all__[7:]
