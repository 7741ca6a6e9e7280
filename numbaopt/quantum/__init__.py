"""Quantum-circuit optimisers and PennyLane interop (docs/quantum.md, docs/pennylane.md).

:mod:`.qng` (quantum natural gradient over a user-supplied metric tensor; :mod:`.linalg`, its compiled solver),
:mod:`.rotosolve` (closed-form coordinate minimisation of objectives sinusoidal in each angle), :mod:`.qnspsa`
(QN-SPSA: SPSA estimates of the gradient and of the metric from fidelities) and :mod:`.pennylane` (PennyLane's
Adam convention, ``step_and_cost``, a QNode as a ``minimize`` objective; PennyLane is imported only when used).
"""
from .linalg import natural_gradient, workspace
from .pennylane import PennyLaneAdam, qnode_objective, step_and_cost
from .qng import minimize_qng
from .qnspsa import minimize_qnspsa, pennylane_directions
from .rotosolve import rotosolve

__all__ = ["minimize_qng", "natural_gradient", "workspace", "rotosolve", "minimize_qnspsa", "pennylane_directions",
           "PennyLaneAdam", "step_and_cost", "qnode_objective"]
