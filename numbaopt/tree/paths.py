"""Paths in a model: ``['enc'].layers[0].w``, the address every message names."""
from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Path", "PathEntry", "where"]


class PathEntry(NamedTuple):
    """One step of a path: ``kind`` is ``"attr"`` (``.name``), ``"key"`` (``['k']``) or ``"index"`` (``[0]``)."""

    kind: str
    key: Any

    def __str__(self):
        if self.kind == "attr":
            return f".{self.key}"
        return f"[{self.key!r}]"


class Path(tuple):
    """A tuple of :class:`PathEntry` from the root to a leaf; ``str(path)`` is e.g. ``['enc'].layers[0].w``."""

    def __str__(self):
        return "".join(map(str, self))

    def __repr__(self):
        return f"Path({str(self) or '<root>'})"

    @property
    def keys(self) -> tuple:
        """The bare keys (``('enc', 'layers', 0, 'w')``)."""
        return tuple(e.key for e in self)


def where(prefix: str, path) -> str:
    return prefix + "".join(map(str, path))
