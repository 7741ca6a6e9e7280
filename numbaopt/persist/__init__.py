"""``save``/``load`` of optimiser state: :mod:`.files` (the atomic ``.npz`` file), :mod:`.codec` (the JSON
header's encoding, no pickles), :mod:`.states` (trees and single arrays)."""
from .files import CheckpointError
from .states import DeviceUnavailable, load, save

__all__ = ["save", "load", "DeviceUnavailable", "CheckpointError"]
