"""torch.optim's and optax's spellings of numbaopt keywords: what to write instead, for every rule class.

:data:`FOREIGN` is the one table. Each entry maps a keyword of torch or optax to a function
``hint(rule_class, value) -> str | None`` that says what to write for *that* class (``None`` where the
spelling means nothing for it; then the close matches of :func:`difflib.get_close_matches` speak).
Nothing is accepted silently: a foreign keyword is always an error, one that says exactly what to write.
"""
from __future__ import annotations

__all__ = ["FOREIGN", "unknown_keyword_message"]


def _names(cls) -> set:
    return set(cls._hypers) | set(cls._options)


def _betas(cls, value):
    names = [n for n in ("beta1", "beta2", "beta3") if n in cls._hypers]
    if not names:
        return None
    vals = list(value) if isinstance(value, (tuple, list)) else None
    if vals is not None and len(vals) == len(names):
        spelled = ", ".join(f"{n}={v!r}" for n, v in zip(names, vals))
    else:
        spelled = ", ".join(f"{n}=..." for n in names)
    return (f"torch's betas=({', '.join('b' + str(k + 1) for k in range(len(names)))}) is {spelled}: "
            f"write {cls.__name__}({spelled})")


def _renamed(target, lib):
    def hint(cls, value):
        if target not in _names(cls):
            return None
        return f"{lib}'s {{name}} is {target}: write {cls.__name__}({target}={value!r})"
    return hint


def _weight_decay(cls, value):
    c = cls.__name__
    text = (f"torch's weight_decay=wd adds wd*x to the gradient (L2, coupled with the adaptive scaling): "
            f"write chain(WeightDecay({value!r}), {c}(...))")
    if "beta2" in cls._hypers:
        text += (f"; for decoupled decay (torch's AdamW, optax's adamw: lr*(step + wd*x)) write "
                 f"AdamW(weight_decay={value!r})")
    return text


def _nesterov(cls, value):
    if cls.__name__ == "Momentum":
        return "torch's SGD(momentum=mu, nesterov=True) is Nesterov: write Nesterov(lr, momentum=mu)"
    if "beta2" in cls._hypers:
        return "optax's adam(nesterov=True) is NAdam: write NAdam(..., b2_factor=False) (optax's form)"
    return None


def _lr(cls, value):
    if "lr" in cls._hypers:
        return _renamed("lr", "optax")(cls, value)
    return (f"{cls.__name__} has no learning rate (torch's and optax's default 1.0 is {cls.__name__} as it "
            f"stands); to scale its step write chain({cls.__name__}(...), Descent({value!r}))")


def _eps_root(cls, value):
    if "eps_in_sqrt" in cls._options:
        return f"optax's eps_root puts eps under the square root: write {cls.__name__}(eps=..., eps_in_sqrt=True)"
    if cls.__name__ == "AdaBelief":
        return "AdaBelief's one eps is optax's eps and eps_root together: write AdaBelief(eps=...)"
    if "beta2" in cls._hypers:
        return (f"{cls.__name__} adds eps outside the square root only, which is optax's default eps_root=0.0; "
                f"drop eps_root")
    return None


def _amsgrad(cls, value):
    if "beta2" not in cls._hypers:
        return None
    return "torch's Adam(amsgrad=True) is AMSGrad: write AMSGrad(lr, beta1, beta2, eps, correction='torch', " \
           "initial_value=0.0)"


def _etas(cls, value):
    if "eta_minus" not in cls._hypers:
        return None
    v = list(value) if isinstance(value, (tuple, list)) and len(value) == 2 else ["...", "..."]
    return f"torch's etas=(minus, plus) is eta_minus, eta_plus: write Rprop(eta_minus={v[0]!r}, eta_plus={v[1]!r})"


def _step_sizes(cls, value):
    if "step_min" not in cls._hypers:
        return None
    v = list(value) if isinstance(value, (tuple, list)) and len(value) == 2 else ["...", "..."]
    return f"torch's step_sizes=(min, max) is step_min, step_max: write Rprop(step_min={v[0]!r}, step_max={v[1]!r})"


def _initial_accumulator(cls, value):
    for target in ("initial_accumulator", "initial_value"):
        if target in cls._hypers:
            return f"torch's and optax's initial_accumulator_value is {target}: write " \
                   f"{cls.__name__}({target}={value!r})"
    return None


def _lr_decay(cls, value):
    if "lr" not in cls._hypers:
        return None
    return (f"torch's Adagrad lr_decay is a schedule of lr over the count c of steps taken: write "
            f"{cls.__name__}(lr=lambda c: LR / (1 + c * {value!r}))")


def _momentum(cls, value):
    if cls.__name__ != "Descent":
        return None
    return f"torch's SGD(momentum=mu) is Momentum: write Momentum(lr, momentum={value!r})"


def _implementation(cls, value):
    return "a torch implementation switch: numbaopt always runs one fused kernel per step; drop it"


def _maximize(cls, value):
    return "numbaopt minimises: pass the negated gradient to maximise"


def _dampening(cls, value):
    if cls.__name__ not in ("Momentum", "Nesterov", "Trace"):
        return None
    return f"{cls.__name__} is torch's dampening=0 (its default); other dampening values have no equivalent"


def _mu_dtype(cls, value):
    return "state arrays have the parameters' dtype; chain(MixedPrecision(np.float32), rule) keeps float32 " \
           "master copies and state"


def _initial_scale(cls, value):
    if cls.__name__ != "RMSProp":
        return None
    return "RMSProp starts q at 0 (optax's default initial_scale=0.0); other starts have no equivalent"


def _momentum_decay(cls, value):
    if cls.__name__ != "NAdam":
        return None
    return "torch's NAdam momentum_decay schedule (psi) has no equivalent; NAdam(b2_factor=False) is optax's form"


def _decoupled(cls, value):
    if "beta2" not in cls._hypers:
        return None
    return "torch's Adam(decoupled_weight_decay=True) is AdamW: write AdamW(weight_decay=...)"


def _clip_value_fn(cls, value):
    if "clip_exponent" not in cls._hypers:
        return None
    return (f"optax's clip_value_fn(count) is count**clip_exponent here (count = t - 1): write "
            f"{cls.__name__}(clip_exponent=0.25) for optax's default; other functions have no equivalent")


#: foreign keyword -> hint(rule class, value); ``{name}`` in a hint is the keyword as written
FOREIGN = {
    "betas": _betas,
    "b1": _renamed("beta1", "optax"), "b2": _renamed("beta2", "optax"), "b3": _renamed("beta3", "optax"),
    "learning_rate": _lr, "lr": _lr,
    "weight_decay": _weight_decay,
    "decoupled_weight_decay": _decoupled,
    "nesterov": _nesterov,
    "alpha": _renamed("rho", "torch"),
    "decay": _renamed("rho", "optax"),
    "centered": _renamed("centred", "torch and optax"),
    "eps_root": _eps_root,
    "amsgrad": _amsgrad,
    "etas": _etas, "step_sizes": _step_sizes,
    "min_step_size": _renamed("step_min", "optax"), "max_step_size": _renamed("step_max", "optax"),
    "initial_accumulator_value": _initial_accumulator,
    "lr_decay": _lr_decay,
    "momentum": _momentum,
    "foreach": _implementation, "fused": _implementation, "capturable": _implementation,
    "differentiable": _implementation,
    "maximize": _maximize,
    "dampening": _dampening,
    "mu_dtype": _mu_dtype, "accumulator_dtype": _mu_dtype,
    "clip_value_fn": _clip_value_fn,
    "initial_scale": _initial_scale,
    "momentum_decay": _momentum_decay,
    "every_k_schedule": _renamed("n", "optax"),
    "sync_period": _renamed("k", "optax"), "slow_step_size": _renamed("alpha", "optax"),
    "clip_norm": _renamed("max_norm", "optax"), "max_delta": _renamed("delta", "optax"),
}


def unknown_keyword_message(cls, kwargs: dict, unknown) -> str:
    """The error for keywords ``unknown`` given to rule class ``cls``: per keyword, what torch or optax
    meant by it and what to write here, else the close matches among the valid names."""
    valid = list(cls._hypers) + list(cls._options)
    lines = []
    for name in sorted(unknown):
        hint_of = FOREIGN.get(name)
        hint = hint_of(cls, kwargs[name]) if hint_of is not None else None
        if hint is None:
            import difflib  # only for a mistake: not at import
            close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
            hint = (f"did you mean {' or '.join(repr(c) for c in close)}? " if close else "") + \
                f"valid: {', '.join(valid) or '(none)'}"
        else:
            hint = f"{hint.replace('{name}', name)} (valid: {', '.join(valid) or '(none)'})"
        lines.append(f"{cls.__name__} has no keyword {name!r} (unknown hyperparameter); {hint}")
    return "\n".join(lines)
