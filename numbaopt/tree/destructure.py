"""The trainable parameters of a model: ``trainables(model)`` lists them with their paths, ``destructure(model)``
puts them in one flat vector and gives the way back."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .params import param_info
from .paths import Path
from .structure import flatten, rebuild
from .torch_models import setup_model

__all__ = ["destructure", "trainables"]

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

M = TypeVar("M")  # the model, rebuilt with its type


def trainables(model) -> list[tuple[Path, object]]:
    """``[(path, parameter), ...]``: the arrays (tensors, scalars) :func:`numbaopt.setup` trains in ``model``, in
    the model's order, a tied array once (Optimisers.jl's ``trainables(model; path=true)``). Leaves that are no
    parameters, ``not_trainable`` fields, keys a container excludes and frozen torch Parameters are left out; a
    torch module is seen as ``setup`` sees it (its named parameters).

    >>> import numpy as np, numbaopt as no
    >>> model = {"enc": {"w": np.ones((2, 2)), "b": np.zeros(2)}, "steps": 3}
    >>> [(str(p), x.shape) for p, x in no.trainables(model)]
    [("['enc']['w']", (2, 2)), ("['enc']['b']", (2,))]
    """
    out, seen = [], set()

    def on_leaf(path, x, trainable):
        info = param_info(x)
        if info is None or not trainable or not info.trainable:
            return False
        if info.tieable:
            if id(x) in seen:
                return True
            seen.add(id(x))
        out.append((path, x))
        return True

    flatten(setup_model(model), on_leaf)
    return out


def destructure(model: M) -> tuple[np.ndarray, Callable[[ArrayLike], M]]:
    """``flat, restructure = destructure(model)``: all trainable parameters in one flat vector.

    A tied array appears once. ``flat``'s dtype is the common dtype of the parameters (e.g. float64
    for float32 and float64 leaves); ``restructure(flat)`` returns a new model of the same structure
    with the original dtypes and shapes (a wrong length is a ``ValueError``).
    """
    recs = []

    def on_leaf(path, x, trainable):
        info = param_info(x)
        if info is None or not trainable:
            return False
        recs.append((path, x, info))
        return True

    root = flatten(model, on_leaf)
    units: list = []
    by_id: dict = {}
    positions: dict = {}

    def number(n):
        if n.spec is None:
            return [n.pos] if n.trained else []
        return [p for c in n.children for p in number(c)]

    trained = number(root)
    for p, (_path, x, info) in zip(trained, recs):
        u = by_id.get(id(x)) if info.tieable else None
        if u is None:
            u = len(units)
            units.append((x, info))
            if info.tieable:
                by_id[id(x)] = u
        positions.setdefault(u, []).append(p)
    dtypes = [np.dtype(info.dtype) for _, info in units]
    dt = np.result_type(*dtypes) if dtypes else np.dtype(np.float64)
    sizes = [int(np.prod(info.shape, dtype=np.int64)) for _, info in units]
    total = int(sum(sizes))
    flat = np.empty(total, dtype=dt)
    o = 0
    for (x, info), n in zip(units, sizes):
        flat[o:o + n] = np.asarray(info.to_array(x)).reshape(-1)
        o += n

    def restructure(v):
        v = np.asarray(v)
        if v.ndim != 1 or v.shape[0] != total:
            raise ValueError(f"restructure: expected a flat vector of length {total}, got shape {v.shape}")
        new, o = {}, 0
        for u, ((x, info), n) in enumerate(zip(units, sizes)):
            seg = v[o:o + n]
            o += n
            if info.dtype.kind != "c" and seg.dtype.kind == "c":
                seg = seg.real
            a = np.array(seg, dtype=info.dtype, copy=True).reshape(info.shape)
            val = a if (type(x) is np.ndarray and info.writeable) else info.from_array(a, x)
            for p in positions[u]:
                new[p] = val
        return rebuild(root, model, new, False)

    return flat, restructure
