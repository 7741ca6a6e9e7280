"""PyTorch models as numbaopt models: an ``nn.Module``, its ``named_parameters()``, its ``parameters()``.

torch is never imported here: these forms are recognised by type name (:func:`numbaopt.tree.params.is_torch_module`)
and only once the user has imported torch. The tree engine steps a module through its *view*, the plain dict
``dict(module.named_parameters())``: parameters by their dotted torch names (a tied parameter once, under
its first name, as ``torch.optim`` sees it). So the state is navigated and messages name leaves as torch
spells them: ``state['fc.weight']``, ``grads['fc.weight']: shape (3,), expected (4, 3)``. Buffers (BatchNorm's
running statistics) are not parameters and are never trained; a ``Parameter`` whose ``requires_grad`` is
False at setup is not trained either (the writeability trait's ``trainable``). Parameters are written in
place (the module keeps its ``Parameter`` objects) and their autograd version counters are bumped after the
step. The pure ``update`` returns a deep copy of the module holding the new parameters. See ``docs/torch.md``.
"""
from __future__ import annotations

import copy
import sys
import types
from collections.abc import Mapping

from .containers import container_spec
from .params import bump_version, is_torch_module, is_torch_tensor

__all__ = ["TorchForm", "torch_form", "setup_model", "bump_written"]

_GEN = types.GeneratorType


def _is_pairs(seq, none_ok: bool = False) -> bool:
    """Whether a list/tuple is ``(name, tensor)`` pairs, as ``named_parameters()`` yields them (gradients:
    ``(name, None)`` too, but not only those)."""
    return bool(seq) and all(type(p) is tuple and len(p) == 2 and type(p[0]) is str and
                             (is_torch_tensor(p[1]) or (none_ok and p[1] is None)) for p in seq) and \
        any(p[1] is not None for p in seq)


def _frozen(p) -> bool:
    return is_torch_tensor(p) and not p.requires_grad and isinstance(p, sys.modules["torch"].nn.Parameter)


def setup_model(model):
    """The tree ``setup`` sees for ``model``: a module's or a named-parameters form's view (a dict by name),
    a ``parameters()`` generator's list; any other model as it is."""
    form = torch_form(model, None)
    return model if form is None else form.view


class TorchForm:
    """A torch model form met by a step: ``view`` (what the tree engine steps), ``grads`` (the gradients in
    the view's structure) and :meth:`result`, the model the caller gets back."""

    __slots__ = ("kind", "model", "view", "grads")

    def __init__(self, kind, model, view, grads):
        self.kind, self.model, self.view, self.grads = kind, model, view, grads

    def result(self, new_view, inplace: bool):
        """The returned model: the module itself (in place) or a deep copy holding the new parameters (pure);
        for named-parameters forms the same form (a list of pairs stays one), for a generator what it gave."""
        kind = self.kind
        if kind == "module":
            if inplace:
                return self.model  # every parameter was written in place: the module holds them
            memo = {id(p): q for (p, q) in zip(self.view.values(), new_view.values()) if q is not p}
            memo[id(memo)] = list(self.view.values())  # deepcopy's keep-alive convention: ids stay unique
            return copy.deepcopy(self.model, memo)
        if kind == "pairs":
            return self.model if inplace else type(self.model)(zip(new_view.keys(), new_view.values()))
        return new_view  # a generator was read once: its view is the model now


def torch_form(model, grads):
    """``None`` for a model that is not a torch form (stepped as it is), else its :class:`TorchForm`.

    Forms: an ``nn.Module``; a list/tuple of ``(name, tensor)`` pairs or a generator of them
    (``named_parameters()``); a generator of tensors (``parameters()``: its list). With any model holding
    torch tensors (a tensor, a list/tuple/dict of them, the forms above), ``grads`` may be the model itself:
    each tensor's ``.grad`` (a ``None`` one skips that parameter).
    """
    if "torch" not in sys.modules:  # no torch object can exist
        return None
    t = type(model)
    if t is _GEN:
        items = list(model)
        if _is_pairs(items):
            kind, view = "gen", dict(items)
        else:
            kind, view = "gen", items
            return TorchForm(kind, model, view, _grads_of(view) if grads is model else _listed(grads))
    elif (t is list or t is tuple) and model and type(model[0]) is tuple and _is_pairs(model):
        kind, view = "pairs", dict(model)
    elif is_torch_module(model):
        kind, view = "module", dict(model.named_parameters())
    else:
        if grads is model and grads is not None:
            g = _grads_of(model)
            if g is not model:
                return TorchForm("plain", model, model, g)
        return None
    g = _grads_of(view) if grads is model else _by_name(view, grads)
    return TorchForm(kind, model, view, g)


def _listed(grads):
    return list(grads) if type(grads) is _GEN else grads


def _by_name(view, grads):
    """Gradients of a view (a dict by name): a dict by name, a list in the order of ``parameters()``, the
    pairs of ``named_parameters()``, or a module (its parameters' ``.grad``)."""
    if grads is None:
        return None
    if is_torch_module(grads):
        grads = {n: p.grad for n, p in grads.named_parameters()}
    elif type(grads) is _GEN:
        grads = list(grads)
    if isinstance(grads, (list, tuple)):
        if _is_pairs(grads, True):
            grads = dict(grads)
        else:
            if len(grads) != len(view):
                raise ValueError(f"grads: {len(grads)} gradients for the model's {len(view)} parameters (a list of "
                                 "gradients follows the order of model.parameters())")
            return dict(zip(view, grads))
    if isinstance(grads, Mapping):
        g = dict(grads)
        for n, p in view.items():  # a frozen parameter's gradient may be left out
            if n not in g and _frozen(p):
                g[n] = None
        return g
    raise TypeError(f"grads: expected the gradients by parameter name (a dict like dict(model.named_parameters())), "
                    f"a list in the order of model.parameters(), or the module itself (each parameter's .grad); "
                    f"got {type(grads).__name__}")


def _grads_of(model):
    """``model`` with each torch tensor replaced by its ``.grad`` (dicts, lists and tuples followed); ``model``
    itself when it holds no tensor (a NumPy model passed as its own gradient keeps that meaning)."""
    found = [False]

    def walk(x, path):
        if is_torch_tensor(x):
            found[0] = True
            return x.grad
        t = type(x)
        if t is dict:
            return {k: walk(v, f"{path}[{k!r}]") for k, v in x.items()}
        if t is list or t is tuple:
            return t(walk(v, f"{path}[{i}]") for i, v in enumerate(x))
        if _holds_tensor(x):
            raise TypeError(f"grads{path}: the model as its own gradient (each tensor's .grad) is followed through "
                            f"dicts, lists and tuples, not a {type(x).__name__}; pass the gradients explicitly")
        return None

    g = walk(model, "")
    return g if found[0] else model


def _holds_tensor(x) -> bool:
    """Whether a container of another kind (a dataclass, a registered one) holds a torch tensor."""
    spec = container_spec(x)
    if spec is None:
        return is_torch_tensor(x)
    return any(_holds_tensor(v) for _, v in spec.children(x))


def bump_written(model) -> None:
    """After ``update_`` of a bare device array or a device group: bump the torch tensors among them."""
    for x in (model if type(model) in (list, tuple) else (model,)):
        if is_torch_tensor(x):
            bump_version(x)
