"""Variational quantum eigensolver for the transverse-field Ising chain, optimised by a compiled loop.

    H = -J * sum_i Z_i Z_(i+1) - h * sum_i X_i          (open chain of n qubits)

The ansatz is a hardware-efficient circuit on |0...0>: ``layers`` blocks of (RY on every qubit, RZ on
every qubit, a CNOT ladder 0->1->...->n-1), then a last RY and RZ layer: ``2 * n * (layers + 1)`` angles.
A small ``@njit`` state-vector simulator computes the energy and its exact gradient by the adjoint
method (one forward pass, one backward pass); ``parameter_shift_grad`` gives the same gradient from
``2 * n_params`` energies, as a check. The angles are tuned with Adam through ``numbaopt.minimize``, so
the whole loop (simulation, gradient, Adam step, stopping test) runs compiled.

    python examples/vqe.py --qubits 6 --layers 6   # prints energy vs exact; vqe.png (log-scale error) with matplotlib
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
from numba import njit

import numbaopt as no

_NJ = dict(cache=True, error_model="numpy")


# ---------------------------------------------------------------------------------------------
# gates on a state vector (qubit q is bit q of the basis index)
# ---------------------------------------------------------------------------------------------
@njit(**_NJ)
def _ry(psi, q, theta):
    c, s = math.cos(0.5 * theta), math.sin(0.5 * theta)
    m = 1 << q
    for i in range(psi.shape[0]):
        if i & m == 0:
            a, b = psi[i], psi[i | m]
            psi[i] = c * a - s * b
            psi[i | m] = s * a + c * b


@njit(**_NJ)
def _rz(psi, q, theta):
    e0 = complex(math.cos(0.5 * theta), -math.sin(0.5 * theta))
    e1 = complex(e0.real, -e0.imag)
    m = 1 << q
    for i in range(psi.shape[0]):
        if i & m == 0:
            psi[i] *= e0
        else:
            psi[i] *= e1


@njit(**_NJ)
def _cnot(psi, c, t):
    mc, mt = 1 << c, 1 << t
    for i in range(psi.shape[0]):
        if i & mc != 0 and i & mt == 0:
            j = i | mt
            psi[i], psi[j] = psi[j], psi[i]


@njit(**_NJ)
def _apply_h(psi, out, nq, J, h):
    """out = H psi."""
    dim = psi.shape[0]
    for i in range(dim):
        zz = 0.0
        for q in range(nq - 1):
            zz += 1.0 if ((i >> q) & 1) == ((i >> (q + 1)) & 1) else -1.0
        acc = -J * zz * psi[i]
        for q in range(nq):
            acc -= h * psi[i ^ (1 << q)]
        out[i] = acc


@njit(**_NJ)
def _prepare(theta, nq, layers):
    psi = np.zeros(1 << nq, dtype=np.complex128)
    psi[0] = 1.0
    k = 0
    for layer in range(layers + 1):
        for q in range(nq):
            _ry(psi, q, theta[k])
            k += 1
        for q in range(nq):
            _rz(psi, q, theta[k])
            k += 1
        if layer < layers:
            for q in range(nq - 1):
                _cnot(psi, q, q + 1)
    return psi


@njit(**_NJ)
def energy(theta, nq, layers, J, h):
    """<psi(theta)| H |psi(theta)>."""
    psi = _prepare(theta, nq, layers)
    hpsi = np.empty_like(psi)
    _apply_h(psi, hpsi, nq, J, h)
    e = 0.0
    for i in range(psi.shape[0]):
        e += (psi[i].conjugate() * hpsi[i]).real
    return e


@njit(**_NJ)
def energy_grad(theta, grad, nq, layers, J, h):
    """The energy; writes dE/dtheta into ``grad`` by the adjoint method."""
    psi = _prepare(theta, nq, layers)
    lam = np.empty_like(psi)
    _apply_h(psi, lam, nq, J, h)
    e = 0.0
    for i in range(psi.shape[0]):
        e += (psi[i].conjugate() * lam[i]).real
    # walk the circuit backwards: psi is the state after gate k, lam = U_(>k)^dagger H psi_final;
    # dE/dtheta_k = 2 Re <lam| (-i G/2) |psi> for a rotation exp(-i theta G / 2)
    k = theta.shape[0]
    for layer in range(layers, -1, -1):
        if layer < layers:
            for q in range(nq - 2, -1, -1):
                _cnot(psi, q, q + 1)
                _cnot(lam, q, q + 1)
        for q in range(nq - 1, -1, -1):  # RZ: -i Z / 2 = diag(-i/2, i/2)
            k -= 1
            m = 1 << q
            s = 0.0
            for i in range(psi.shape[0]):
                v = (lam[i].conjugate() * psi[i]).imag  # Re(conj(l) * (-i/2 * z) * p) = z/2 * Im(conj(l) p)
                s += v if i & m == 0 else -v
            grad[k] = s
            _rz(psi, q, -theta[k])
            _rz(lam, q, -theta[k])
        for q in range(nq - 1, -1, -1):  # RY: -i Y / 2 = [[0, -1/2], [1/2, 0]]
            k -= 1
            m = 1 << q
            s = 0.0
            for i in range(psi.shape[0]):
                if i & m == 0:
                    j = i | m
                    s += (lam[i].conjugate() * (-psi[j]) + lam[j].conjugate() * psi[i]).real
            grad[k] = s
            _ry(psi, q, -theta[k])
            _ry(lam, q, -theta[k])
    return e


def parameter_shift_grad(theta, nq, layers, J=1.0, h=1.0):
    """dE/dtheta from ``(E(theta + pi/2) - E(theta - pi/2)) / 2`` per angle (the hardware rule)."""
    g = np.empty_like(theta)
    for k in range(theta.shape[0]):
        tp, tm = theta.copy(), theta.copy()
        tp[k] += 0.5 * np.pi
        tm[k] -= 0.5 * np.pi
        g[k] = 0.5 * (energy(tp, nq, layers, J, h) - energy(tm, nq, layers, J, h))
    return g


def tfim_matrix(nq, J=1.0, h=1.0):
    """The dense Hamiltonian (same bit order as the simulator), for the exact reference."""
    Z = np.diag([1.0, -1.0])
    X = np.array([[0.0, 1.0], [1.0, 0.0]])
    eye = np.eye(2)

    def op(single):  # single: {qubit: 2x2}; qubit q is bit q, i.e. the rightmost kron factor is qubit 0
        out = np.ones((1, 1))
        for q in range(nq - 1, -1, -1):
            out = np.kron(out, single.get(q, eye))
        return out

    H = np.zeros((1 << nq, 1 << nq))
    for q in range(nq - 1):
        H -= J * op({q: Z, q + 1: Z})
    for q in range(nq):
        H -= h * op({q: X})
    return H


def exact_ground_energy(nq, J=1.0, h=1.0) -> float:
    """The lowest eigenvalue of the dense Hamiltonian (``numpy.linalg.eigvalsh``)."""
    return float(np.linalg.eigvalsh(tfim_matrix(nq, J, h))[0])


def n_params(nq, layers) -> int:
    return 2 * nq * (layers + 1)


def initial_angles(nq, layers, seed=0, scale=0.1):
    """Small random angles (all zeros is a stationary point of the RZ angles)."""
    return np.random.default_rng(seed).normal(scale=scale, size=n_params(nq, layers))


def run(nq=6, layers=6, J=1.0, h=1.0, lr=0.05, maxiter=3000, target_rtol=None, seed=0, every=25, **kw):
    """Optimise the ansatz with Adam through ``numbaopt.minimize``.

    Without ``target_rtol`` the loop runs until the gradient norm is below ``gtol`` (default 1e-6) or
    ``maxiter``. With it, a callback checked every ``every`` iterations stops as soon as the energy is
    within ``target_rtol`` (relative) of the exact ground energy (for time-to-accuracy benchmarks).
    Extra keywords go to ``minimize``. Returns ``(result, exact, seconds)``.
    """
    exact = exact_ground_energy(nq, J, h)
    x0 = initial_angles(nq, layers, seed)
    opts = dict(maxiter=maxiter, gtol=1e-6)
    if target_rtol is not None:
        target = exact + target_rtol * abs(exact)
        opts.update(callback=lambda res: res.fun <= target, callback_every=every)
    opts.update(kw)
    t0 = time.perf_counter()
    res = no.minimize(energy_grad, x0, no.Adam(lr), args=(nq, layers, J, h), **opts)
    return res, exact, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qubits", type=int, default=6)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--field", type=float, default=1.0, help="transverse field h (J = 1)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--maxiter", type=int, default=5000)
    ap.add_argument("--plot", default="vqe.png", help="PNG path (written when matplotlib is installed)")
    ap.add_argument("--progress", action="store_true", help="show a progress bar (needs tqdm)")
    a = ap.parse_args(argv)
    res, exact, dt = run(a.qubits, a.layers, 1.0, a.field, a.lr, a.maxiter, progress=a.progress)
    rel = abs(res.fun - exact) / abs(exact)
    print(f"TFIM n={a.qubits} h={a.field}: {n_params(a.qubits, a.layers)} angles, Adam(lr={a.lr})")
    print(f"  energy {res.fun:.8f}   exact {exact:.8f}   relative error {rel:.2e}")
    print(f"  {res.nit} iterations in {dt:.3f} s ({res.message})")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("  (matplotlib not installed: no plot)")
    else:
        from matplotlib.figure import Figure  # no pyplot: nobody's backend is touched

        ax = Figure(figsize=(6, 4), layout="constrained").add_subplot()
        # E >= E_exact for every state (variational principle): the error is positive, a log scale shows it
        err = np.maximum(res.history - exact, 1e-16 * abs(exact))
        ax.semilogy(np.arange(err.size), err)
        ax.set_xlabel("iteration")
        ax.set_ylabel("energy - exact ground energy")
        ax.set_title(f"VQE, TFIM {a.qubits} qubits, {n_params(a.qubits, a.layers)} angles, Adam(lr={a.lr})",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.figure.savefig(a.plot, dpi=120)
        print(f"  convergence plot (log-scale error): {a.plot}")
    return res, exact


if __name__ == "__main__":
    main()
