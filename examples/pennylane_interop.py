"""numbaopt driving a PennyLane QNode: the examples/vqe.py ansatz (TFIM chain) trained three ways, checked
against PennyLane's own ``qml.AdamOptimizer`` with the same settings.

    H = -J * sum_i Z_i Z_(i+1) - h * sum_i X_i;   ansatz: `layers` blocks of (RY, RZ on every qubit, CNOT
    ladder), then a last RY, RZ layer (the angle order of examples/vqe.py, whose simulator cross-checks E)

1. reference: ``qml.AdamOptimizer(lr, beta1=0.9, beta2=0.999, eps=1e-8).step_and_cost`` in a loop;
2. your loop: ``g = qml.grad(circuit)(theta); state, theta = numbaopt.update_(state, theta, g)`` on the
   ``pennylane.numpy.tensor`` itself (stepped in place on the fast path, ``requires_grad`` intact), with
   ``numbaopt.quantum.pennylane.PennyLaneAdam``: PennyLane's formula, so the iterates coincide to rounding;
   then ``step_and_cost(state, theta, circuit)`` with ``numbaopt.Adam``, whose eps is added after the bias
   correction (Kingma and Ba, torch, optax): the iterates differ, by up to ``lr * eps_t / |g|`` per step;
3. ``numbaopt.minimize`` with ``qnode_objective(circuit)`` (``fun(x, grad_out) -> loss``): the same iterates.

It prints the largest difference of the iterates from PennyLane's, the time per step (the circuit and its
gradient dominate) and per optimiser update alone, and exits with status 1 if an agreement check fails.

    python examples/pennylane_interop.py --qubits 4 --layers 2 --steps 20 [--device default.qubit]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pennylane as qml
from pennylane import numpy as pnp

import numbaopt as no
from numbaopt.quantum.pennylane import PennyLaneAdam, qnode_objective, step_and_cost

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vqe  # noqa: E402  (the compiled simulator of the same circuit: an independent energy)

#: iterates of the same formula agree to rounding: a few ulps per step, amplified by the circuit
TOL_SAME_FORMULA = 1e-10


def pennylane_reference(circuit, theta0, steps, lr):
    """PennyLane's own optimiser: the iterates after every step, the losses before each, the seconds of
    each step and of each update alone."""
    opt = qml.AdamOptimizer(lr, beta1=0.9, beta2=0.999, eps=1e-8)
    theta = pnp.array(theta0, requires_grad=True)
    xs, losses, t_step, t_update = [], [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        # opt.step_and_cost(circuit, theta), in its two halves so that the update alone can be timed
        grad = qml.grad(circuit)
        g = grad(theta)
        losses.append(float(grad.forward))
        t1 = time.perf_counter()
        theta = opt.apply_grad((g,), (theta,))[0]
        t2 = time.perf_counter()
        t_step.append(t2 - t0)
        t_update.append(t2 - t1)
        xs.append(np.array(theta))
    return np.array(xs), np.array(losses), t_step, t_update


def numbaopt_loop(circuit, theta0, steps, rule, one_call=False):
    """Your own loop: qml.grad, then numbaopt.update_ on the tensor in place; or (``one_call``) both in
    ``step_and_cost(state, theta, circuit)``, as ``opt.step_and_cost(circuit, theta)``."""
    theta = pnp.array(theta0, requires_grad=True)
    state = no.setup(rule, theta)
    grad = qml.grad(circuit)
    xs, losses, t_step, t_update = [], [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        if one_call:
            state, theta, loss = step_and_cost(state, theta, circuit)
            losses.append(loss)
            t1 = t0 + np.nan  # the update is not timed apart
        else:
            g = grad(theta)
            losses.append(float(grad.forward))
            t1 = time.perf_counter()
            state, theta = no.update_(state, theta, g)  # the same tensor object, written in place
        t2 = time.perf_counter()
        t_step.append(t2 - t0)
        t_update.append(t2 - t1)
        xs.append(np.array(theta))
    assert type(theta) is pnp.tensor and theta.requires_grad
    return np.array(xs), np.array(losses), t_step, t_update


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qubits", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--device", default=None, help="a PennyLane device (default: lightning.qubit if installed)")
    a = ap.parse_args(argv)
    device = a.device
    if device is None:
        try:
            qml.device("lightning.qubit", wires=1)
            device = "lightning.qubit"
        except Exception:  # pennylane-lightning not installed
            device = "default.qubit"
    nq, layers, steps, lr = a.qubits, a.layers, a.steps, a.lr
    circuit = vqe.pennylane_tfim(nq, layers, device, diff_method="adjoint")  # the QNode: E(theta) = <psi|H|psi>
    theta0 = vqe.initial_angles(nq, layers)
    exact = vqe.exact_ground_energy(nq)
    e_pl, e_sim = float(circuit(pnp.array(theta0))), vqe.energy(theta0, nq, layers, 1.0, 1.0)
    print(f"TFIM {nq} qubits, {layers} layers: {theta0.size} angles on {device}, {steps} Adam steps (lr={lr}, "
          f"beta1 0.9, beta2 0.999, eps 1e-8)")
    print(f"  E(theta0): QNode {e_pl:.12f}, examples/vqe.py simulator {e_sim:.12f} (diff {abs(e_pl - e_sim):.1e})")

    ref_x, ref_f, ref_t, ref_u = pennylane_reference(circuit, theta0, steps, lr)
    pl_adam = PennyLaneAdam(lr, beta1=0.9, beta2=0.999, eps=1e-8)
    # (name, iterates, losses, seconds, seconds in the updates, expected to coincide with the reference)
    rows = [("qml.AdamOptimizer (reference)", ref_x, ref_f, ref_t, ref_u, True)]
    rows.append(("update_ loop, PennyLaneAdam", *numbaopt_loop(circuit, theta0, steps, pl_adam), True))
    rows.append(("step_and_cost, numbaopt.Adam (Kingma-Ba eps)",
                 *numbaopt_loop(circuit, theta0, steps, no.Adam(lr, beta1=0.9, beta2=0.999, eps=1e-8), True), False))

    fun = qnode_objective(circuit)
    xs, stamps = [], [time.perf_counter()]

    def record(r):  # called after every step: its x is the live iterate (copied)
        xs.append(np.array(r.x))
        stamps.append(time.perf_counter())

    res = no.minimize(fun, theta0, pl_adam, maxiter=steps, gtol=None, callback=record)
    # the callback saw x_1 .. x_steps; history holds the loss at x_0 .. x_steps, PennyLane's losses are those
    # before each step (x_0 .. x_(steps-1))
    rows.append(("minimize(qnode_objective), PennyLaneAdam", np.array(xs), res.history[:steps], np.diff(stamps),
                 [np.nan], True))

    ok = True
    print(f"  {'(medians over the steps)':46s} {'max |x - x_PL|':>15s} {'max |f - f_PL|':>15s} {'ms/step':>8s} "
          f"{'us/update':>10s}")
    for name, x, f, t, tu, same in rows:
        dx, df = np.abs(x - ref_x).max(), np.abs(f - ref_f).max()
        if same:
            ok &= bool(x.shape == ref_x.shape and dx <= TOL_SAME_FORMULA and df <= TOL_SAME_FORMULA)
        print(f"  {name:46s} {dx:15.2e} {df:15.2e} {np.median(t) * 1e3:8.2f} {np.median(tu) * 1e6:10.2f}")
    print(f"  energy after {steps} steps {res.fun:.8f} (exact ground energy {exact:.8f}); minimize: {res.message}")
    print("  iterates of PennyLaneAdam (update_ and minimize) " + ("coincide with qml.AdamOptimizer's"
                                                                    if ok else "DIFFER from qml.AdamOptimizer's"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
