"""``save``/``load`` of optimiser state: :mod:`.files` (the ``.npz`` file, written crash safe and read without
trusting it), :mod:`.temps` (the temporary files of writes, and removing a killed writer's), :mod:`.codec`
(the JSON header's encoding: no pickles, nothing a file names is imported), :mod:`.checks` (strict readers
of header values, the limits, the step counters' invariants), :mod:`.states` (trees and single arrays),
:mod:`.statedict` (the same content as a dict keyed by the model's paths: ``state_dict``/``load_state_dict``,
and ``load`` of such a dict).

``load`` refuses every damaged, crafted or inconsistent file with a :class:`CheckpointError` naming the
file and what is wrong, before allocating anything on the strength of its header; ``save`` leaves the old
file or the new one, complete, whenever it is killed, and never writes a file ``load`` would refuse.
"""
from .files import CheckpointError
from .statedict import load, load_state_dict, state_dict
from .states import DeviceUnavailable, save

__all__ = ["save", "load", "state_dict", "load_state_dict", "DeviceUnavailable", "CheckpointError"]
