"""The VQE example: simulator against dense linear algebra, adjoint against parameter-shift gradients,
and a short Adam run on 6 qubits to within 1e-3 of the exact ground energy."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))  # Numba's cache re-imports the module by name
import vqe  # noqa: E402


def test_energy_matches_dense_hamiltonian_and_gradients_agree():
    nq, layers, J, h = 3, 2, 1.0, 0.7
    theta = vqe.initial_angles(nq, layers, seed=5, scale=1.0)
    psi = vqe._prepare(theta, nq, layers)
    assert abs(np.linalg.norm(psi) - 1) < 1e-12
    H = vqe.tfim_matrix(nq, J, h)
    e_dense = float(np.real(psi.conj() @ H @ psi))
    g = np.empty_like(theta)
    e = vqe.energy_grad(theta, g, nq, layers, J, h)
    assert abs(e - e_dense) < 1e-12 and abs(vqe.energy(theta, nq, layers, J, h) - e_dense) < 1e-12
    ps = vqe.parameter_shift_grad(theta, nq, layers, J, h)
    np.testing.assert_allclose(g, ps, atol=1e-12)
    assert np.max(np.abs(g)) > 1e-2  # a non-trivial point


def test_exact_ground_energy_known_value():
    # open TFIM chain, 2 sites, J = h = 1: lowest eigenvalue of -ZZ - X1 - X2 is -sqrt(5)
    assert abs(vqe.exact_ground_energy(2) + np.sqrt(5.0)) < 1e-12


def test_vqe_six_qubits_within_1e_3():
    res, exact, _ = vqe.run(nq=6, layers=4, lr=0.1, maxiter=300)
    rel = abs(res.fun - exact) / abs(exact)
    assert res.fun >= exact - 1e-9  # variational bound
    assert rel < 1e-3, (res.fun, exact, rel)
    assert res.history[0] - res.fun > 1.0  # it actually optimised
