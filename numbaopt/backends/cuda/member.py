"""One leaf of a :class:`numbaopt.DeviceGroup` as a tree's state shows it: :class:`DeviceMember`."""
from __future__ import annotations

from ..state import Leaf, enter, leave
from .leaf import leaf_from_host

__all__ = ["DeviceMember"]


class DeviceMember:
    """Leaf ``j`` of a :class:`numbaopt.DeviceGroup` as a tree's state shows it (``state['gpu'].w``): a view.

    A tree groups its device leaves by (rule, dtype) into one ``DeviceGroup`` each, stepped with one
    launch. This view reads the group live: ``rule``, ``t``, ``skipped``, ``shape``, ``dtype``,
    ``state`` (device views), ``to_host()``.
    """

    __slots__ = ("group", "j")

    def __init__(self, group, j):
        self.group, self.j = group, j

    rule = property(lambda self: self.group.rule)
    t = property(lambda self: int(self.group.ts[self.j]))
    skipped = property(lambda self: int(self.group.skips[self.j]))
    shape = property(lambda self: self.group.shapes[self.j])
    dtype = property(lambda self: self.group.dtype)
    state = property(lambda self: self.group.state(self.j), doc="state arrays by name (device views)")

    def to_host(self) -> Leaf:
        """This leaf's state as a host :class:`numbaopt.Leaf` (copied from the device)."""
        g, j = self.group, self.j
        hp = g.layout.hyper_vector(self.t + 1, None, g.dtype) if g.scheduled else g.hp.copy()
        return Leaf(g.rule, self.shape, g.dtype, arrays=g.host_arrays(j),
                    t=self.t, hp=hp, skipped=self.skipped)

    def __reduce__(self):  # pickled alone, a member is a DeviceLeaf of its own (its group does not come along)
        enter(self.group, "pickle", False)
        try:
            host = self.to_host()
        finally:
            leave(self.group, False)
        return (leaf_from_host, (host,))

    def __repr__(self):
        return (f"DeviceLeaf({self.rule!r}, t={self.t}, {self.dtype.name}{list(self.shape)}, "
                f"group of {len(self.group)})")
