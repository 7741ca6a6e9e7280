"""Trees: nested models (dataclasses, dicts, lists, tuples, registered containers) and their state.

Layers inside: :mod:`.paths` → :mod:`.containers` → :mod:`.structure` → :mod:`.params` (the writeability
trait) → :mod:`.groups` → :mod:`.state` (``StateTree``, owned here) → :mod:`.scopes` (which leaves a tree-scope
reduction spans) → :mod:`.setup` → :mod:`.collect` → :mod:`.passes` (reduction passes) → :mod:`.step` (the
transactional step) → :mod:`.fastpath` → :mod:`.manage` (update, freeze), :mod:`.adjust` and
:mod:`.destructure` (``trainables``).
"""
from .containers import not_trainable, register_container
from .destructure import destructure, trainables
from .groups import TreeLeaf
from .manage import freeze_, thaw_
from .params import ParamInfo, param_info
from .paths import Path, PathEntry
from .state import StateNode, StateTree

__all__ = ["Path", "PathEntry", "register_container", "not_trainable", "StateTree", "StateNode", "TreeLeaf",
           "ParamInfo", "param_info", "freeze_", "thaw_", "destructure", "trainables"]
