"""The rule definition mechanism.

A rule is declared once, as a class:

* hyperparameters: ``lr = hyper(1e-3, low=0)`` -- runtime scalars with validated domains;
* compile-time options: ``centred = option(False)`` -- they select code paths and state;
* per-element state: ``m = state(0.0)``; ``v = state(0.0, real=True)`` for a second moment that stays
  real for complex parameters; ``when="centred"`` allocates it only when that option is set;
* optionally ``prepare(t, <hyper names>)`` -> a tuple of per-step scalars named by ``scalars``
  (bias corrections), computed once per kernel call, before the element loop, in the parameters' real
  precision (``t`` included: a float32 kernel sees ``t`` exactly up to 2**24 steps);
* optionally a reduction (``reduce``/``reduce_ops``/``finish``/``finals``) run over the whole array
  (or the whole tree, with ``scope = "tree"``) before the elementwise pass;
  a reduction may keep scalar state (``state(scalar=True)``, one number per array or for the tree) that
  ``reduce`` reads and ``finish`` renews (learning-rate-free rules: Prodigy, D-Adaptation);
* or an *axis reduction* (``axes``): the same contributions summed per unit of the leaf -- per row, per
  column, per batch of a two-axis view of it (``geometry``) -- with per-unit state (``state(axis="rows")``,
  O(rows + cols) memory) that ``finish`` updates; the step reads each element's unit's finals
  (``<final>_rows``, ``<final>_cols``, ``<final>_batch``), see :data:`AXES`;
* ONE scalar function ``step(g, x, <state>, <hyper/option/scalar names>) -> (d, <new state>)``.

Every kernel (in-place, out-of-place, threaded, multi-leaf, CUDA, the step callable from a user's
``@njit`` code) is generated from ``step`` by :mod:`numbaopt.compiler`. The step and helper bodies may
use the names of :mod:`numbaopt.rules.ops` (:data:`STEP_NAMESPACE`) and nothing else from their module.

A rule may instead be a *stage* (``stage = "accumulate"`` or ``"master"``, see :mod:`numbaopt.rules.stages`):
a chain member with hyperparameters and state like any rule, whose effect the compiler and the step
pipeline implement (gradient accumulation, a master copy) instead of a ``step``.
"""
from __future__ import annotations

import hashlib
import inspect
import math

import numpy as np

from ..schedules import Schedule, is_schedule, real_scalar, schedule_value
from .definition import AXES, SCALAR, check_definition, function_source, step_args
from .ops import STEP_NAMESPACE
from .spellings import unknown_keyword_message

__all__ = ["Rule", "hyper", "option", "state", "STEP_NAMESPACE", "UNIT", "AXES", "SCALAR", "is_scheduled",
           "function_source", "step_args", "default_geometry", "whole_leaf"]



def default_geometry(shape):
    """The view of a leaf that an axis reduction uses unless its rule says otherwise: the leading axis is A (the
    rows), the others B (``(0, 1, 1, ndim)``; a row of a matrix is a unit of ``rows``); ``None`` for a 0-d
    leaf (no units: ``finish`` sees ``count = 0``)."""
    return None if len(shape) == 0 else (0, 1, 1, len(shape))


def whole_leaf(shape):
    """The view that makes the whole leaf one unit of ``batch`` (``(0, ndim, ndim, ndim)``): per-leaf state
    (NovoGrad's per-layer second moment, schedule-free's weight sum)."""
    return (0, len(shape), len(shape), len(shape))

#: the domain of a decay rate: ``beta1 = hyper(0.9, **UNIT)`` is checked to lie in [0, 1)
UNIT = dict(low=0.0, high=1.0, high_open=True)


class hyper:
    """A runtime scalar hyperparameter with a default and a validated domain.

    ``low``/``high`` bound it; ``low_open``/``high_open`` make the bound strict. Values are finite:
    ``allow_inf=True`` admits ``inf`` where it means "no bound" (``ClipGrad(delta=inf)``). The value is
    passed to the kernels at run time, so changing it never recompiles.
    """

    __slots__ = ("default", "low", "high", "low_open", "high_open", "allow_inf", "doc", "name")

    def __init__(self, default, low=None, high=None, low_open=False, high_open=False, allow_inf=False, doc=""):
        self.default = default
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        self.allow_inf = allow_inf
        self.doc = doc
        self.name = None

    def __get__(self, obj, cls=None):
        # on an instance, the attribute is the value: Adam(lr=0.1).lr == 0.1
        return self if obj is None else obj.__dict__["_values"][self.name]

    def domain(self) -> str:
        """The admitted values, e.g. ``[0.0, inf)`` (finite), ``[0.0, inf]`` (``inf`` admitted)."""
        lo = "-inf" if self.low is None else repr(self.low)
        hi = "inf" if self.high is None else repr(self.high)
        left = "(" if (self.low is None or self.low_open) else "["
        right = ")" if (self.high is None or self.high_open) else "]"
        if self.allow_inf:
            left = "[" if self.low is None else left
            right = "]" if self.high is None else right
        return f"{left}{lo}, {hi}{right}"

    def check(self, owner: str, value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise TypeError(f"{owner}: hyperparameter {self.name} must be a real number, got {value!r}")
        try:
            v = float(value)
        except OverflowError:  # an int beyond float64 (10**400): out of every domain, not a crash
            raise ValueError(f"{owner}: hyperparameter {self.name} (an integer of {len(str(value))} digits) is too "
                             f"large for a float64; "
                             f"expected a number in {self.domain()}") from None
        if math.isnan(v):
            raise ValueError(f"{owner}: hyperparameter {self.name} is NaN; expected a number in {self.domain()}")
        if math.isinf(v) and not self.allow_inf:
            raise ValueError(f"{owner}: hyperparameter {self.name}={value!r} is not finite; expected a finite "
                             f"number in {self.domain()}")
        ok = True
        if self.low is not None:
            ok &= v > self.low if self.low_open else v >= self.low
        if self.high is not None:
            ok &= v < self.high if self.high_open else v <= self.high
        if not ok:
            raise ValueError(f"{owner}: hyperparameter {self.name}={value!r} is outside {self.domain()}")
        return v


class option:
    """A compile-time option (e.g. ``centred``): selects code and state; a new value compiles a new kernel."""

    __slots__ = ("default", "choices", "doc", "name")

    def __init__(self, default, choices=(False, True), doc=""):
        self.default, self.choices, self.doc = default, tuple(choices), doc
        self.name = None

    def __get__(self, obj, cls=None):
        # on an instance, the attribute is the value: Adam(lr=0.1).lr == 0.1
        return self if obj is None else obj.__dict__["_values"][self.name]

    def check(self, owner: str, value):
        for c in self.choices:
            if value == c and type(value) in (type(c), int, float) and not (
                    isinstance(c, bool) != isinstance(value, bool)):
                return c
        raise ValueError(f"{owner}: option {self.name}={value!r}; expected one of {self.choices}")


class state:
    """Per-element state of a rule, with its initial value.

    ``init`` is a number or the name of a hyperparameter (e.g. Rprop's per-element step starts at lr).
    ``real=True`` keeps the array real for complex parameters (second moments of ``|g|^2``).
    ``when`` names a boolean option that must be set for the state to exist.
    ``axis`` (one of :data:`AXES`) makes it per-unit state of an axis reduction instead: one value per row
    (column, batch) of the leaf, which ``finish`` reads and renews, not the step.
    ``scalar=True`` makes it the state of a reduction (``reduce``/``finish``): one real number per array, or one
    for the whole tree with ``scope = "tree"`` (Prodigy's distance estimate), that ``reduce`` may read and
    ``finish`` reads and renews (its ``axis`` is :data:`SCALAR`).
    """

    __slots__ = ("init", "real", "when", "axis", "name")

    def __init__(self, init=0.0, real=False, when=None, axis=None, scalar=False):
        if axis is not None and axis not in AXES:
            raise ValueError(f"state(axis={axis!r}); expected one of {AXES}")
        if scalar and (axis is not None or when is not None):
            raise ValueError("state(scalar=True) is the state of a reduction: it takes no axis and no when")
        self.init, self.real, self.when, self.axis = init, real or scalar, when, SCALAR if scalar else axis
        self.name = None


class _RuleMeta(type):
    def __repr__(cls):
        return f"<rule {cls.__name__}>"


class Rule(metaclass=_RuleMeta):
    """Base class of every update rule (built in or user defined).

    Subclasses declare ``hyper``/``option``/``state`` attributes and a static ``step``; see the module
    docstring and ``docs/custom_rules.md``. Instances are immutable: use :meth:`replace` (or
    :func:`numbaopt.adjust` on a state) for new hyperparameters.
    """

    #: names of the per-step scalars returned by ``prepare`` (in order)
    scalars: tuple = ()
    #: reductions: ``reduce(g, x, <hyper/option names>) -> contribution(s)``; ops "sum" or "max"
    reduce_ops: tuple = ()
    #: names of the scalars ``finish`` returns; ``scope`` "leaf" (per array) or "tree" (global)
    finals: tuple = ()
    scope: str = "leaf"
    #: whether complex parameters are supported (rules using sign/ordering of g are real-only)
    supports_complex: bool = True
    #: in a correspondence table: how torch.optim / optax spell the same rule
    torch: str = ""
    optax: str = ""
    #: None for an elementwise rule; "accumulate" or "master" for the stages of numbaopt.rules.stages
    stage = None
    #: whether the rule must be the last member of a chain (its state tracks the step it makes: Prodigy's x0 - x)
    last_member: bool = False
    #: a tree-scope reduction's span name (``ClipGlobalNorm(1.0, span="enc")``): the reduction spans the leaves
    #: holding it with the same name (None: every leaf holding it; see docs/trees.md, "Parameter groups")
    span: str | None = None
    #: an axis reduction's units (some of AXES): ``reduce``'s contributions are summed per unit of each,
    #: ``finish(<totals>, count, <this axis's unit states>, <hyper/option names>)`` runs per unit and returns
    #: the finals then the new unit states; the step reads ``<final>_<axis>`` at its element's unit
    axes: tuple = ()
    #: ``geometry(shape, <option names>) -> (c0, c1, c2, c3) | None``: the leaf's axes cut into the groups
    #: ``P = shape[:c0], A = shape[c0:c1], Q = shape[c1:c2], B = shape[c2:c3], S = shape[c3:]`` (plain
    #: Python, run once per leaf at setup); None leaves the leaf out: one unit per axis, ``count = 0``
    geometry = staticmethod(default_geometry)
    #: ``evaluate(x, <state names>, <hyper/option names>) -> x_eval`` (NumPy, on whole arrays): the parameters
    #: to evaluate the model at when they differ from the trained ones (schedule-free, averaging); see
    #: :func:`numbaopt.eval_params`. None: the trained parameters are the evaluation parameters
    evaluate = None
    #: a matrix rule (``axes = ("elements",)``): ``matrix(U, <hyper/option names>) -> O`` on the leaf's
    #: contributions as a matrix (the geometry's A x B), compiled into the kernels (it may call ``np.dot``); the
    #: step reads ``O`` at its element as ``<final>_elements`` (Muon's Newton-Schulz orthogonalisation)
    matrix = None

    _hypers: dict = {}
    _options: dict = {}
    _states: dict = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        hypers, options, states = dict(getattr(cls, "_hypers", {})), dict(getattr(cls, "_options", {})), \
            dict(getattr(cls, "_states", {}))
        for name, val in list(vars(cls).items()):
            if isinstance(val, hyper):
                val.name = name
                hypers[name] = val
            elif isinstance(val, option):
                val.name = name
                options[name] = val
            elif isinstance(val, state):
                val.name = name
                states[name] = val
        cls._hypers, cls._options, cls._states = hypers, options, states
        if "step" in vars(cls):
            check_definition(cls)
        cls.__signature__ = _constructor_signature(cls)

    def __init__(self, *args, span=None, **kwargs):
        names = list(self._hypers) + list(self._options)
        positional = list(self._hypers)  # options are keyword-only: adding one never shifts call sites
        if len(args) > len(positional):
            raise TypeError(f"{type(self).__name__} takes at most {len(positional)} positional arguments "
                            f"({', '.join(positional)}); options are keyword-only")
        for n, a in zip(positional, args):
            if n in kwargs:
                raise TypeError(f"{type(self).__name__}: {n} given twice")
            kwargs[n] = a
        unknown = set(kwargs) - set(names)
        if unknown:
            raise ValueError(unknown_keyword_message(type(self), kwargs, unknown))
        owner = type(self).__name__
        values = {}
        for n, h in self._hypers.items():
            v = kwargs.get(n, h.default)
            if is_schedule(v):
                _scheduled_value(owner, h, v, 1)  # its first value checked now; every value is checked on use
                values[n] = v
            else:
                values[n] = h.check(owner, v)
        for n, o in self._options.items():
            values[n] = o.check(owner, kwargs.get(n, o.default))
        object.__setattr__(self, "_values", values)
        if span is not None:
            object.__setattr__(self, "span", _checked_span(type(self), span))
        self.validate()

    def validate(self):
        """Hook for cross-hyperparameter checks (raise ValueError)."""

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace({name}=...) or numbaopt.adjust")

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __reduce__(self):
        return (_rebuild, (type(self), dict(self._values), self.span))

    def replace(self, **kw) -> "Rule":
        """A copy with some hyperparameters/options changed (unknown names are a ValueError)."""
        vals = dict(self._values)
        unknown = set(kw) - set(vals)
        if unknown:
            raise ValueError(unknown_keyword_message(type(self), kw, unknown))
        vals.update(kw)
        return type(self)(**vals) if self.span is None else type(self)(**vals, span=self.span)

    # -- introspection used by the generator and the engine -------------------------------------
    @property
    def rules(self) -> tuple:
        """The primitive rules of this rule (itself; a chain lists its members)."""
        return (self,)

    def active_states(self) -> tuple:
        """The state declarations present for this instance's options, in order."""
        return tuple(s for s in self._states.values() if s.when is None or self._values[s.when])

    def value_at(self, name: str, t: int) -> float:
        """Hyperparameter ``name`` for step ``t`` (counted from 1). A schedule is evaluated
        (:func:`numbaopt.schedules.schedule_value`: a numbaopt Schedule at ``t``, any other function at the
        count ``t - 1``) and its value checked: a value that is not one real number in the domain, or a
        function that raises, is a ``TypeError``/``ValueError`` naming the rule, the hyperparameter and the step."""
        v = self._values[name]
        if type(v) is float:  # every constant is stored as a float: the unscheduled path stops here
            return v
        t = int(t)
        if type(v).__call__ is Schedule.__call__:  # a numbaopt Schedule: served from a table of its values
            tables = self.__dict__.get("_tables")
            if tables is None:  # a cache, not part of the rule's value (not compared, copied or pickled)
                object.__setattr__(self, "_tables", tables := {})
            tab = tables.get(name)
            if tab is None or not 0 <= t - tab[0] < len(tab[1]):
                tab = tables[name] = _schedule_block(v, t)
            if tab[1]:
                return _scheduled_value(type(self).__name__, self._hypers[name], v, t, tab[1][t - tab[0]])
        return _scheduled_value(type(self).__name__, self._hypers[name], v, t)

    def hyper_values(self) -> dict:
        return {n: self._values[n] for n in self._hypers}

    def option_values(self) -> dict:
        return {n: self._values[n] for n in self._options}

    def __eq__(self, other):
        return type(self) is type(other) and self._values == other._values and self.span == other.span

    def __hash__(self):
        return hash((type(self), tuple(sorted((k, repr(v)) for k, v in self._values.items())), self.span))

    def __repr__(self):
        parts = []
        for n, v in self._values.items():
            parts.append(f"{n}={v!r}")
        if self.span is not None:
            parts.append(f"span={self.span!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    @classmethod
    def source_fingerprint(cls) -> str:
        """A hash of every function that generated code copies from this rule."""
        fp = cls.__dict__.get("_source_fp")
        if fp is not None:  # memoised per class: inspect.getsource costs ~1 ms per function
            return fp
        h = hashlib.sha256(cls.__qualname__.encode())
        for fname in ("step", "prepare", "reduce", "finish", "geometry", "matrix"):
            f = cls.__dict__.get(fname)
            if f is None:
                for base in cls.__mro__[1:]:
                    if fname in base.__dict__:
                        f = base.__dict__[fname]
                        break
            if f is not None and not (fname == "prepare" and f is Rule.__dict__.get("prepare")):
                h.update(function_source(f).encode())
        cls._source_fp = fp = h.hexdigest()[:16]
        return fp


def is_scheduled(rule) -> bool:
    """Whether any hyperparameter of ``rule`` (a rule or a chain) is driven by a schedule or a function."""
    return any(is_schedule(r._values[n]) for r in rule.rules for n in r._hypers)


#: steps of a numbaopt Schedule evaluated at once (``values`` over an array) and then served one per step: one
#: scalar evaluation through NumPy costs ~30 us, a step served from the table well under 1 us
_TABLE_STEPS = 256


def _schedule_block(s: Schedule, t: int) -> tuple:
    """``(t, [s(t), ..., s(t + _TABLE_STEPS - 1)])``, the values ``s(t)`` gives (``__call__`` evaluates
    ``values`` too); ``(t, [])`` when ``values`` raises or misbehaves over the block, so that the step that
    meets the fault raises it with the usual message, and no earlier step does."""
    try:
        with np.errstate(all="ignore"):  # a value beyond the domain is refused at its own step
            vals = np.asarray(s.values(np.arange(t, t + _TABLE_STEPS, dtype=np.int64)), dtype=np.float64)
    except Exception:
        return t, []
    return t, (vals.tolist() if vals.shape == (_TABLE_STEPS,) else [])


def _scheduled_value(owner: str, h: hyper, s, t: int, raw=None) -> float:
    """``s`` (a Schedule or a function) evaluated for step ``t`` (or its value ``raw`` already computed) and
    checked against ``h``'s domain."""
    try:
        if raw is None:
            raw = schedule_value(s, t)
    except Exception as e:  # the user's code: say which hyperparameter it was computing (chained below)
        raise ValueError(f"{owner}: hyperparameter {h.name}: {_where(s, t)} raised {type(e).__name__}: {e}") from e
    try:
        return h.check(owner, real_scalar(raw))
    except TypeError as e:
        msg = str(e)
        if not msg.startswith(owner):  # real_scalar's "returned ...": name the rule and hyperparameter
            msg = f"{owner}: hyperparameter {h.name}: {msg}"
        raise TypeError(f"{msg} ({_where(s, t)})") from None
    except ValueError as e:
        raise ValueError(f"{e} ({_where(s, t)})") from None


def _where(s, t: int) -> str:
    # built only for an error: a schedule's repr costs more than evaluating it
    if isinstance(s, Schedule):
        return f"the schedule {s!r} at step {t}"
    return f"the function {getattr(s, '__qualname__', None) or repr(s)} at step {t}, called with count {t - 1}"


def _constructor_signature(cls) -> inspect.Signature:
    """What ``inspect.signature(cls)``, ``help`` and IDEs show: the hyperparameters with their defaults, in
    declaration order (positional or keyword), then the options (keyword-only), as ``Rule.__init__`` takes
    them; a class with a constructor of its own (``AccumGrad(n, rule)``) shows that constructor's."""
    for base in cls.__mro__:
        init = base.__dict__.get("__init__")
        if init is not None:
            break
    if base is not Rule:
        params = list(inspect.signature(init).parameters.values())[1:]
        generic = {p.kind for p in params} <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
        if not generic:
            return inspect.Signature(params)
    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_OR_KEYWORD, default=h.default) for n, h in cls._hypers.items()]
    params += [P(n, P.KEYWORD_ONLY, default=o.default) for n, o in cls._options.items()]
    if cls.scope == "tree":
        params.append(P("span", P.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


def _rebuild(cls, values, span=None):
    return cls(**values) if span is None else cls(**values, span=span)


def _checked_span(cls, span) -> str:
    """A span name, checked: a non-empty string, on a tree-scope reduction."""
    if cls.scope != "tree":
        raise TypeError(f"{cls.__name__}: span={span!r} names the leaves a tree-scope reduction spans together; "
                        f"{cls.__name__} is not one (it acts on each array alone)")
    if not isinstance(span, str) or not span:
        raise TypeError(f"{cls.__name__}: span must be a non-empty string (a name), got {span!r}")
    return span
