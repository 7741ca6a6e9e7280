"""Time to solution of the TFIM VQE of ``examples/vqe.py``: numbaopt against PennyLane, same optimiser on both sides.

    .venv/bin/python benchmarks/vqe_vs_pennylane.py --qubits 6 8 10 12 --target 1e-3 --budget 120 \\
        --repeat 3 --json vqe_vs_pennylane.json --plot vqe_vs_pennylane.png

The problem: ``H = -sum Z_i Z_(i+1) - sum X_i`` (open chain), the ansatz of ``examples/vqe.py`` (``--layers``
blocks of RY, RZ on every qubit and a CNOT ladder, then a last RY, RZ layer) from ``initial_angles(nq, layers)``.
PennyLane's side is the same circuit as a QNode; before any timing the energies and the gradients of both sides
at the initial angles must agree to 1e-12 (and the block-diagonal metric tensors, for the QNG row).
"Within the target" means ``E <= E_exact + target * |E_exact|`` (``target`` is relative, as in
``benchmarks/loops.py``).

Rows (each with the same optimiser and settings on both sides; a row whose numbaopt API is missing prints
"not available"):

* Adam(lr): ``numbaopt.minimize(energy_grad, x0, Adam(lr, beta1, beta2, eps))`` against
  ``qml.AdamOptimizer(lr, beta1, beta2, eps)``. PennyLane folds the bias corrections into the step size and adds
  ``eps`` to the *uncorrected* ``sqrt(v)``: ``x -= lr sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)``; numbaopt's
  Adam (Kingma & Ba, as torch and optax) adds it to the corrected one: ``x -= lr (m/(1-b1^t)) /
  (sqrt(v/(1-b2^t)) + eps)``. They are the same update when numbaopt's ``eps`` is ``eps / sqrt(1 - b2^t)``,
  which is :class:`numbaopt.quantum.PennyLaneAdam` (PennyLane's formula as a numbaopt rule, compiled in the loop);
  the iterates then coincide to rounding (checked: ``--check-steps`` steps of both, max |d theta| printed and
  asserted < 1e-8). With the same ``eps`` and no schedule they do not: at 6 qubits the first step already
  differs by 7e-3 in angles whose gradient is ~1e-7 (``step ~ g / (|g| + eps')``).
* QNG: ``numbaopt.quantum.minimize_qng(energy_grad, vqe.metric_tensor_block_diag, x0, lr, lam)`` against
  ``qml.QNGOptimizer(lr, approx="block-diag", lam)`` (Stokes et al., Quantum 4, 269 (2020)).
* QNG on the full metric (``qng-full``): ``minimize_qng(energy_grad, vqe.metric_tensor, x0, lam)`` with the
  learning rate decaying exponentially from ``--qngf-lr`` to ``--qngf-lr-end`` over ``--qngf-decay-steps`` (a
  numbaopt ``exponential`` schedule inside the compiled loop) against ``qml.QNGOptimizer(approx=None, lam)`` whose
  ``stepsize`` is set to the same schedule's value before every step. This is the configuration that reaches 1e-3
  at 12 qubits (docs/quantum.md). PennyLane's full metric is the costly part: its candidates are Hadamard tests
  (``qml.metric_tensor(approx=None)``, one spare wire) on ``lightning.qubit`` or ``default.qubit`` and
  ``qml.adjoint_metric_tensor`` on ``default.qubit``; one metric of each is timed at ``--probe-qubits`` qubits
  (at 12 qubits the slowest costs minutes) and the fastest kept. Where PennyLane's run stops at the budget, its
  time to the target is also *projected*: its median seconds per step times the steps numbaopt took, valid
  because both sides take the same iterates (checked for ``--check-steps-full`` steps and asserted < 1e-8).
* Rotosolve: ``numbaopt.quantum.rotosolve(vqe.energy, x0)`` against ``qml.RotosolveOptimizer()`` with one
  frequency per angle (Ostaszewski et al., Quantum 5, 391 (2021)); an iteration is a sweep over all angles.

PennyLane runs its best configuration: for each row and qubit count a short probe times ``lightning.qubit``
(adjoint gradients) and ``default.qubit`` (adjoint) and keeps the faster (``--pl-device`` forces one).
Timing: wall-clock, after a warm-up of every code path (numbaopt's compiled loops load from the cache, PennyLane
builds its tapes), median of ``--repeat`` interleaved runs, each stopped at the target or after ``--budget``
seconds. "Seconds" is the wall time until the run stopped: PennyLane's loop tests the energy returned by every
``step_and_cost`` (so it includes one update past the target); numbaopt stops on ``f_target`` when its driver
accepts one (a callback every 250 iterations keeps the budget), else in a callback every 25 iterations (then up
to 24 iterations past the target). "Iterations" is
the index of the first iterate within the target (sweeps for Rotosolve), "evaluations" the energy(+gradient)
evaluations up to it (the QNG row also computes one metric per evaluation, on both sides).
Error-vs-time traces: PennyLane records ``(t, E)`` at every step; numbaopt's compiled Adam/QNG loops keep the
loss history only, so their times are spread uniformly over the run's total (``t_k = T (k+1) / (K+1)``);
numbaopt's Rotosolve records ``(t, E)`` in a callback after every sweep.
The ratio is PennyLane's seconds over numbaopt's: "> r" where only numbaopt reached the target within the budget
(a lower bound), "< r" for the converse.
Threads: NUMBA_NUM_THREADS=1 and OMP_NUM_THREADS=1 (lightning's OpenMP) are set here, for both sides, before
numba or PennyLane is imported: single-core against single-core.
"""
from __future__ import annotations

import os

os.environ["NUMBA_NUM_THREADS"] = "1"  # before numba is imported: one core each side
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
import numbaopt as no  # noqa: E402
import vqe  # noqa: E402

import numbaopt.quantum as noq  # noqa: E402

J, H_FIELD = 1.0, 1.0
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
PL_CONFIGS = (("lightning.qubit", "adjoint"), ("default.qubit", "adjoint"))
#: the full metric's candidates: (device, how the metric is computed); the gradient is the device's adjoint one
PL_FULL_METRIC_CONFIGS = (("lightning.qubit", "hadamard"), ("default.qubit", "hadamard"),
                          ("default.qubit", "adjoint_metric_tensor"))
TRACE_POINTS = 400


@dataclass
class Problem:
    nq: int
    layers: int
    x0: np.ndarray
    exact: float
    target_energy: float

    @property
    def args(self):
        return (self.nq, self.layers, J, H_FIELD)

    def error(self, e):
        return (float(e) - self.exact) / abs(self.exact)


@dataclass
class Run:
    """One timed run: ``trace`` is [(seconds, relative error)], thinned to at most TRACE_POINTS."""
    iterations: int
    evaluations: int | None
    seconds: float
    final_error: float
    reached: bool
    trace: list = field(default_factory=list)


def thin(ts, errs):
    """At most TRACE_POINTS of the trace, log-spaced in the iteration count (as the plot's time axis is)."""
    n = len(ts)
    idx = range(n) if n <= TRACE_POINTS else np.unique(np.geomspace(1, n, TRACE_POINTS).astype(int) - 1)
    return [(float(ts[i]), float(errs[i])) for i in idx]


def make_problem(nq, layers, target, seed=0):
    exact = vqe.exact_ground_energy(nq, J, H_FIELD)
    return Problem(nq, layers, vqe.initial_angles(nq, layers, seed), exact, exact + target * abs(exact))


# -- PennyLane side --------------------------------------------------------------------------------
def tfim_qnode(p: Problem, device: str, diff_method: str | None, wires: int | None = None):
    """The ansatz of examples/vqe.py as a QNode (``vqe.pennylane_tfim``)."""
    return vqe.pennylane_tfim(p.nq, p.layers, device, diff_method, J, H_FIELD, wires=wires)


def check_agreement(p: Problem, circuit, metric_fn, full=False):
    """Energies and gradients (and block-diagonal or ``full`` metrics) of both sides at x0, to 1e-12."""
    import pennylane as qml
    from pennylane import numpy as pnp
    th = pnp.array(p.x0, requires_grad=True)
    g = np.empty_like(p.x0)
    e = vqe.energy_grad(p.x0, g, *p.args)
    de, dg = abs(float(circuit(th)) - e), float(np.max(np.abs(np.asarray(qml.grad(circuit)(th)) - g)))
    assert de <= 1e-12 and dg <= 1e-12, f"PennyLane and examples/vqe.py disagree: |dE| {de:.2e}, |dgrad| {dg:.2e}"
    out = {"energy": de, "gradient": dg}
    if metric_fn is not None:
        G = np.empty((p.x0.size, p.x0.size))
        (vqe.metric_tensor if full else vqe.metric_tensor_block_diag)(p.x0, G, p.nq, p.layers)
        dG = float(np.max(np.abs(np.asarray(metric_fn(th)) - G)))
        assert dG <= 1e-12, f"{'full' if full else 'block-diagonal'} metric tensors disagree: {dG:.2e}"
        out["metric"] = dG
    return out


def pl_optimizer(row, a):
    import pennylane as qml
    if row == "adam":
        return qml.AdamOptimizer(stepsize=a.adam_lr, beta1=BETA1, beta2=BETA2, eps=EPS)
    if row == "qng":
        return qml.QNGOptimizer(stepsize=a.qng_lr, approx="block-diag", lam=a.qng_lam)
    if row == "qng-full":  # pl_run sets the stepsize of every step from the schedule
        return qml.QNGOptimizer(stepsize=qngf_schedule(a)(1), approx=None, lam=a.qngf_lam)
    return qml.RotosolveOptimizer()


def qngf_schedule(a):
    """The full-metric QNG's learning rate: ``lr * (lr_end / lr) ** ((t - 1) / decay_steps)`` at step t."""
    return no.schedules.exponential(a.qngf_lr, a.qngf_lr_end / a.qngf_lr, every=a.qngf_decay_steps)


def pl_metric_fn(row, p, device, method="hadamard"):
    """QNG's metric: PennyLane computes it from tapes of its own (probabilities, Hadamard tests), which the
    adjoint method cannot differentiate, so it comes from a twin QNode with no gradient method (it is never
    differentiated); the gradient still comes from the adjoint QNode. The full metric (``qng-full``): Hadamard
    tests on one spare wire, or ``method="adjoint_metric_tensor"``. None for the other rows."""
    import pennylane as qml
    if row == "qng":
        return qml.metric_tensor(tfim_qnode(p, device, None), approx="block-diag")
    if row != "qng-full":
        return None
    if method == "adjoint_metric_tensor":
        return qml.adjoint_metric_tensor(tfim_qnode(p, device, None))
    return qml.metric_tensor(tfim_qnode(p, device, None, wires=p.nq + 1), approx=None, aux_wire=p.nq)


def pl_run(row, p: Problem, circuit, a, budget, max_steps, metric_fn=None):
    """PennyLane's loop: step until the energy is within the target or the budget is spent; (t, E) per step."""
    from pennylane import numpy as pnp
    opt = pl_optimizer(row, a)
    theta = pnp.array(p.x0, requires_grad=True)
    nevals = [0]
    if row == "rotosolve":
        def cost(theta):  # counts evaluations; Rotosolve reads the argument name "theta" from the signature
            nevals[0] += 1
            return circuit(theta)
        freqs = {"theta": {(i,): 1 for i in range(p.x0.size)}}
    kw = {} if metric_fn is None else {"metric_tensor_fn": metric_fn}
    lr = qngf_schedule(a) if row == "qng-full" else None
    ts, es = [], []
    t0 = time.perf_counter()
    for k in range(max_steps):
        if lr is not None:
            opt.stepsize = lr(k + 1)  # step k + 1 of the schedule, as numbaopt's loop
        if row == "rotosolve":  # the energy after the sweep is the last substep's minimum
            theta, _, subs = opt.step_and_cost(cost, theta, nums_frequency=freqs, full_output=True)
            e = float(subs[-1])
        else:  # e = E(x_k), the energy before the step
            theta, e = opt.step_and_cost(circuit, theta, **kw)
            e = float(e)
            nevals[0] = k + 1
        ts.append(time.perf_counter() - t0)
        es.append(e)
        if e <= p.target_energy or ts[-1] > budget:
            break
    reached = es[-1] <= p.target_energy
    it = len(es) if row == "rotosolve" else len(es) - 1
    return Run(it, nevals[0], ts[-1], p.error(es[-1]), reached, thin(ts, [p.error(e) for e in es])), theta


def pick_pl_config(row, p, a):
    """The faster of PL_CONFIGS for this row (one warm-up step, then the median of three timed ones)."""
    from pennylane import numpy as pnp
    if row == "qng-full":
        return pick_pl_full_metric(p, a)
    configs = [tuple(a.pl_device.split(":"))] if a.pl_device else PL_CONFIGS
    best = None
    for dev, diff in configs:
        circuit, metric_fn = tfim_qnode(p, dev, diff), pl_metric_fn(row, p, dev)
        kw = {} if metric_fn is None else {"metric_tensor_fn": metric_fn}
        if row == "rotosolve":  # a sweep is 3n evaluations: probe the evaluation
            th = pnp.array(p.x0, requires_grad=True)
            circuit(th)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                circuit(th)
                times.append(time.perf_counter() - t0)
        else:
            opt, th = pl_optimizer(row, a), pnp.array(p.x0, requires_grad=True)
            opt.step_and_cost(circuit, th, **kw)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                th, _ = opt.step_and_cost(circuit, th, **kw)
                times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        if best is None or t < best[0]:
            best = (t, f"{dev}:{diff}", circuit, metric_fn)
    return best[1:]


def pick_pl_full_metric(p, a):
    """The fastest of PL_FULL_METRIC_CONFIGS: one metric evaluation each (after a warm-up one) at
    ``min(nq, --probe-qubits)`` qubits, since the slowest costs minutes at 12 qubits; then that configuration
    at ``nq`` (gradients by the same device's adjoint method)."""
    from pennylane import numpy as pnp
    configs = [tuple(a.pl_device.split(":"))] if a.pl_device else PL_FULL_METRIC_CONFIGS
    small = make_problem(min(p.nq, a.probe_qubits), p.layers, a.target)
    th = pnp.array(small.x0, requires_grad=True)
    best = None
    for dev, method in configs:
        fn = pl_metric_fn("qng-full", small, dev, method)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn(th)
            times.append(time.perf_counter() - t0)
        print(f"#   full metric on PennyLane, {small.nq} qubits: {dev} {method} {times[-1]:.3f} s", flush=True)
        if best is None or times[-1] < best[0]:
            best = (times[-1], dev, method)
    _, dev, method = best
    return f"{dev}:adjoint, metric {method}", tfim_qnode(p, dev, "adjoint"), pl_metric_fn("qng-full", p, dev, method)


# -- numbaopt side ---------------------------------------------------------------------------------
def accepts(fn, name):
    return name in inspect.signature(fn).parameters


def available(row):
    """None when the row can run, else why not."""
    if row == "adam":
        return None
    name = {"qng": "minimize_qng", "qng-full": "minimize_qng", "rotosolve": "rotosolve"}[row]
    if noq is None or not hasattr(noq, name):
        return f"numbaopt.quantum.{name} not available"
    if row == "qng" and not hasattr(vqe, "metric_tensor_block_diag"):
        return "examples/vqe.py has no metric_tensor_block_diag"
    return None


def no_run(row, p: Problem, a, budget, maxiter):
    """numbaopt's run, stopped at the target (``f_target`` or a callback) or after the budget (callback)."""
    deadline = [0.0]
    trace = []
    if row == "rotosolve":
        fn = noq.rotosolve
    elif row in ("qng", "qng-full"):
        fn = noq.minimize_qng
    else:
        fn = no.minimize
    has_target = accepts(fn, "f_target") or (row.startswith("qng") and accepts(no.minimize, "f_target"))

    def callback(res):
        if row == "rotosolve":
            trace.append((time.perf_counter() - t0, res.fun))
        return (not has_target and res.fun <= p.target_energy) or time.perf_counter() > deadline[0]

    every = 1 if row == "rotosolve" else (250 if has_target else 25)  # with f_target the callback only keeps time
    opts = dict(maxiter=maxiter, callback=callback, callback_every=every)
    if has_target:
        opts["f_target"] = p.target_energy
    if row == "rotosolve":
        opts["ftol"] = None
        t0 = time.perf_counter()
        deadline[0] = t0 + budget
        res = fn(vqe.energy, p.x0, args=p.args, **opts)
    elif row == "qng":
        extra = {"metric_args": (p.nq, p.layers)} if accepts(fn, "metric_args") else {}
        t0 = time.perf_counter()
        deadline[0] = t0 + budget
        res = fn(vqe.energy_grad, vqe.metric_tensor_block_diag, p.x0, lr=a.qng_lr, lam=a.qng_lam, args=p.args,
                 gtol=None, **extra, **opts)
    elif row == "qng-full":
        t0 = time.perf_counter()
        deadline[0] = t0 + budget
        res = fn(vqe.energy_grad, vqe.metric_tensor, p.x0, lr=a.qngf_lr, lam=a.qngf_lam, args=p.args,
                 metric_args=(p.nq, p.layers), gtol=None, schedule=qngf_schedule(a), **opts)
    else:
        rule = no.quantum.PennyLaneAdam(a.adam_lr, beta1=BETA1, beta2=BETA2, eps=EPS)
        t0 = time.perf_counter()
        deadline[0] = t0 + budget
        res = fn(vqe.energy_grad, p.x0, rule, args=p.args, gtol=None, **opts)
    seconds = time.perf_counter() - t0
    hist = np.asarray(res.history)
    hits = np.flatnonzero(hist <= p.target_energy)
    reached = hits.size > 0  # the budget's callback would have stopped the run first
    k = int(hits[0]) if hits.size else int(res.nit)
    if row == "rotosolve":  # one sweep per callback: nfev counts the evaluations up to the stop
        evals = getattr(res, "nfev", None)
        ts = ([0.0] + [t for t, _ in trace])[:hist.size]
        ts += [seconds] * (hist.size - len(ts))  # a stop on f_target skips that sweep's callback
        es = hist
    else:
        evals = k + 1
        ts = seconds * np.arange(1, hist.size + 1) / hist.size
        es = hist
    return Run(k, evals, seconds, p.error(res.fun), bool(reached), thin(ts, [p.error(e) for e in es])), res


def no_warm_up(row, p, a):
    """Run every code path once untimed: the compiled loops load from numba's cache (or compile, once)."""
    no_run(row, p, a, 60.0, 2)


def trajectory_check(row, p, a, circuit, metric_fn, steps):
    """max |theta_PennyLane - theta_numbaopt| after ``steps`` steps (sweeps) from x0, angles mod 2 pi."""
    _, th = pl_run(row, Problem(p.nq, p.layers, p.x0, p.exact, -np.inf), circuit, a, np.inf, steps, metric_fn)
    _, res = no_run(row, Problem(p.nq, p.layers, p.x0, p.exact, -np.inf), a, np.inf, steps)
    d = np.asarray(th) - np.asarray(res.x)
    return float(np.max(np.abs((d + np.pi) % (2 * np.pi) - np.pi)))


# -- the table ---------------------------------------------------------------------------------------
def bench_row(row, p, a):
    why = available(row)
    if why is not None:
        return {"row": row, "qubits": p.nq, "available": False, "why": why}
    config, circuit, metric_fn = pick_pl_config(row, p, a)
    agree = check_agreement(p, circuit, metric_fn, full=row == "qng-full")
    steps = {"rotosolve": 1, "qng-full": a.check_steps_full}.get(row, a.check_steps)
    dtheta = trajectory_check(row, p, a, circuit, metric_fn, steps)
    if row in ("adam", "qng-full"):
        assert dtheta < 1e-8, f"{row} iterates differ by {dtheta:.2e} after {steps} steps"
    no_warm_up(row, p, a)
    runs = {"numbaopt": [], "pennylane": []}
    for _ in range(a.repeat):  # interleaved: the machine's drift hits both sides alike
        runs["numbaopt"].append(no_run(row, p, a, a.budget, a.maxiter)[0])
        runs["pennylane"].append(pl_run(row, p, circuit, a, a.budget, a.maxiter, metric_fn)[0])
    out = {"row": row, "qubits": p.nq, "layers": p.layers, "available": True, "pennylane_config": config,
           "agreement_at_x0": agree, "max_dtheta_after_check": dtheta, "check_steps": steps}
    for side, rs in runs.items():
        med = statistics.median(r.seconds for r in rs)
        first = asdict(rs[0])
        first["seconds"] = med
        first["seconds_all"] = [r.seconds for r in rs]
        first["reached"] = all(r.reached for r in rs)
        out[side] = first
    out["ratio"] = out["pennylane"]["seconds"] / out["numbaopt"]["seconds"]
    if row in ("adam", "qng-full") and out["numbaopt"]["reached"] and not out["pennylane"]["reached"]:
        # the same iterates (asserted above): PennyLane would reach the target after numbaopt's steps
        per_step = statistics.median(r.seconds / (r.iterations + 1) for r in runs["pennylane"])
        out["pennylane"]["seconds_per_step"] = per_step
        out["pennylane"]["projected_seconds"] = per_step * (out["numbaopt"]["iterations"] + 1)
        out["projected_ratio"] = out["pennylane"]["projected_seconds"] / out["numbaopt"]["seconds"]
    # a side stopped by the budget took at least its seconds: the ratio is then a bound, or nothing
    out["ratio_is"] = {(True, True): "exact", (True, False): "lower bound", (False, True): "upper bound",
                       (False, False): "none"}[(out["numbaopt"]["reached"], out["pennylane"]["reached"])]
    return out


ROW_LABEL = {"adam": "Adam(lr={adam_lr})", "qng": "QNG(lr={qng_lr}, lam={qng_lam}, block-diag)",
             "qng-full": "QNG(lr={qngf_lr}->{qngf_lr_end} over {qngf_decay_steps}, lam={qngf_lam}, full)",
             "rotosolve": "Rotosolve (sweeps)"}


def markdown(results, a):
    lines = [f"| qubits | row | side | iterations | evaluations | seconds to {a.target:g} | final error | reached "
             f"| PennyLane / numbaopt |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        label = ROW_LABEL[r["row"]].format(**vars(a))
        if not r["available"]:
            lines.append(f"| {r['qubits']} | {label} | - | not available ({r['why']}) | | | | | |")
            continue
        for side in ("numbaopt", "pennylane"):
            s = r[side]
            name = "numbaopt" if side == "numbaopt" else f"PennyLane {r['pennylane_config']}"
            prefix = {"exact": "", "lower bound": "> ", "upper bound": "< ", "none": "(neither) "}[r["ratio_is"]]
            ratio = f"{prefix}{r['ratio']:.1f}x" if side == "pennylane" else ""
            if side == "pennylane" and "projected_seconds" in s:
                ratio += (f"; projected {s['projected_seconds']:.0f} s ({s['seconds_per_step']:.1f} s/step x "
                          f"{r['numbaopt']['iterations'] + 1} steps), {r['projected_ratio']:.0f}x")
            ev = "-" if s["evaluations"] is None else s["evaluations"]
            lines.append(f"| {r['qubits']} | {label} | {name} | {s['iterations']} | {ev} | {s['seconds']:.3f} | "
                         f"{s['final_error']:.2e} | {'yes' if s['reached'] else 'no'} | {ratio} |")
    return "\n".join(lines)


def plot(results, a, path):
    from matplotlib.figure import Figure  # the object API: no pyplot, nobody's backend is touched
    qubits = sorted({r["qubits"] for r in results})
    fig = Figure(figsize=(4.2 * len(qubits), 3.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(qubits), squeeze=False)[0])
    colours = {"adam": "C0", "qng": "C1", "rotosolve": "C2", "qng-full": "C3"}
    for ax, nq in zip(axes, qubits):
        for r in results:
            if r["qubits"] != nq or not r["available"]:
                continue
            for side, style in (("numbaopt", "-"), ("pennylane", "--")):
                tr = np.array(r[side]["trace"]).reshape(-1, 2)
                tr = tr[tr[:, 0] > 0]  # x0's point (t = 0) has no place on a log axis
                if tr.size:
                    label = f"{r['row']} {'numbaopt' if side == 'numbaopt' else 'PennyLane'}"
                    ax.loglog(tr[:, 0], np.maximum(tr[:, 1], 1e-16), style,
                              color=colours[r["row"]], label=label)
        ax.axhline(a.target, color="k", lw=0.6, alpha=0.5)
        ax.set_title(f"TFIM {nq} qubits, {vqe.n_params(nq, a.layers)} angles", fontsize=10)
        ax.set_xlabel("wall time (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("(E - E_exact) / |E_exact|")
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qubits", type=int, nargs="+", default=[6, 8, 10, 12])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0, help="the start: vqe.initial_angles(nq, layers, seed) (0: the "
                    "shipped angles)")
    ap.add_argument("--target", type=float, default=1e-3, help="relative error to reach")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per run before it counts as not reached")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--maxiter", type=int, default=100_000,
                    help="iterations (sweeps) at most, both sides; numbaopt allocates its history (and Adam's eps "
                         "table) for maxiter: 1e5 costs it about 1 ms per run, 1e6 about 60 ms")
    ap.add_argument("--rows", nargs="+", default=["adam", "qng", "rotosolve"],
                    choices=["adam", "qng", "qng-full", "rotosolve"])
    ap.add_argument("--adam-lr", type=float, default=0.05)
    ap.add_argument("--qng-lr", type=float, default=0.05)
    ap.add_argument("--qng-lam", type=float, default=0.01)
    ap.add_argument("--qngf-lr", type=float, default=0.15)
    ap.add_argument("--qngf-lr-end", type=float, default=0.05)
    ap.add_argument("--qngf-decay-steps", type=int, default=2500)
    ap.add_argument("--qngf-lam", type=float, default=0.01)
    ap.add_argument("--check-steps", type=int, default=10, help="steps of both sides compared before timing")
    ap.add_argument("--check-steps-full", type=int, default=2, help="the same for the qng-full row (costly on "
                    "PennyLane's side)")
    ap.add_argument("--probe-qubits", type=int, default=6, help="qubits at which the full metric's PennyLane "
                    "candidates are timed")
    ap.add_argument("--pl-device", default=None,
                    help="force device:diff_method, e.g. lightning.qubit:adjoint (for qng-full: device:metric, "
                         "e.g. lightning.qubit:hadamard)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    import numba
    import pennylane as qml
    meta = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__, "pennylane": qml.__version__,
            "NUMBA_NUM_THREADS": os.environ["NUMBA_NUM_THREADS"], "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"],
            "f_target": accepts(no.minimize, "f_target"), "args": vars(a)}
    print(f"# VQE time to solution, numbaopt vs PennyLane: {meta['machine']}, python {meta['python']}, numba "
          f"{meta['numba']}, PennyLane {meta['pennylane']}; NUMBA_NUM_THREADS=1, OMP_NUM_THREADS=1; "
          f"target {a.target:g} relative, budget {a.budget:g} s, median of {a.repeat}")
    print(f"# numbaopt.minimize stops on {'f_target' if meta['f_target'] else 'a callback every 25 iterations'}")
    results = []
    for nq in a.qubits:
        p = make_problem(nq, a.layers, a.target, a.seed)
        for row in a.rows:
            r = bench_row(row, p, a)
            results.append(r)
            if r["available"]:
                print(f"# {nq} qubits, {row}: PennyLane {r['pennylane_config']}; |dE|, |dgrad| at x0 "
                      f"{r['agreement_at_x0']['energy']:.1e}, {r['agreement_at_x0']['gradient']:.1e}; max |dtheta| "
                      f"after {r['check_steps']} steps {r['max_dtheta_after_check']:.1e}", flush=True)
            else:
                print(f"# {nq} qubits, {row}: not available ({r['why']})", flush=True)
    print()
    print(markdown(results, a))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    if a.plot:
        plot(results, a, a.plot)
    return results


if __name__ == "__main__":
    main()
