"""Side-by-side speed of numbaopt's generated Adam against a hand-written Numba loop and NumPy.

Run with ``make bench-compare`` (``NUMBA_NUM_THREADS=1``). Everything runs in ONE process; the
variants of a case are timed in interleaved rounds (the order rotates every round) and the medians
of the rounds are compared, so slow drifts of a shared machine hit every variant alike. Prints one
line per case while it runs, then the results as a markdown table (what ``docs/performance.md``
quotes). ``--quick`` does fewer rounds. ``--timer wall`` (the default) uses ``time.perf_counter``;
``--timer cpu`` the process's CPU clock, which leaves out the time other processes hold the core on
a busy shared machine, but counts every thread of the process (and read up to 1.7x higher than the
wall clock for 16-element calls on a quiet VM here): prefer wall-clock runs on a quiet machine.

Variants (float32, lr 1e-3, betas 0.9/0.999, eps 1e-8):

* ``hand``: a plain hand-written fused ``@njit`` Adam loop (float32 hyperparameters and literals,
  ``error_model='numpy'``), called from Python with the hyperparameters as Python floats;
* ``kernel``: numbaopt's generated in-place kernel called directly (the serial one);
* ``update_``: ``numbaopt.update_(state, x, g)``, the public call (its Python overhead included);
* ``numpy``: Adam with in-place NumPy operations (``out=``, one scratch buffer);
* ``torch``: ``torch.optim.Adam`` (default implementation, ``torch.set_num_threads(1)``), when torch is
  installed;
* ``optax``: ``optax.adam`` + ``apply_updates`` in one ``jax.jit`` with the parameters and the state
  donated (updated in place; XLA on one thread), when jax and optax are installed;
* chain: ``chain(WeightDecay, ClipGrad, Adam)`` fused (one generated kernel, one pass) against the
  same three rules unfused (one pass per rule, the step of each materialised in a buffer).

With matplotlib it also writes ``docs/img/compare.png`` (``--plot PATH`` elsewhere, ``--no-plot`` not at
all): time per Adam step against the parameter count, log-log, one line per library.
"""
from __future__ import annotations

import gc
import importlib.util
import math
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
# one thread for XLA as well (read when jax is first imported, inside optax_variant)
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

import numbaopt as no  # noqa: E402
from numbaopt.compiler import kernels  # noqa: E402
from numbaopt.compiler.placement import PAGE, empty_staggered, page_offsets  # noqa: E402

F32 = np.float32
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
WD, DELTA = 5e-4, 1.0
WD32, DELTA32 = F32(WD), F32(DELTA)
SIZES = (16, 4096, 1 << 20, 1 << 24)


# no cache=True: Numba ties a cached function to the module name it was compiled under, and asv
# imports this file under another name than a direct import does
@njit(error_model="numpy", nogil=True)
def adam_hand(x, g, m, v, lr, beta1, beta2, eps, t):
    """The reference: what one would write by hand (same operation order as the published formula)."""
    f = np.float32
    lr, b1, b2, eps = f(lr), f(beta1), f(beta2), f(eps)
    # 1 - b**t as numbaopt's one_minus_pow computes it, so that the results can be compared bitwise
    bc1 = -math.expm1(f(t) * math.log(b1))
    bc2 = -math.expm1(f(t) * math.log(b2))
    c1 = f(1) - b1
    c2 = f(1) - b2
    for i in range(x.shape[0]):
        gi = g[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        x[i] = x[i] - lr * (mi / bc1) / (math.sqrt(vi / bc2) + eps)


def numpy_adam(x, g, m, v, tmp, t):
    """In-place NumPy Adam: no allocation per step (``out=`` everywhere, one scratch array)."""
    b1, b2 = F32(B1), F32(B2)
    bc1, bc2 = F32(1) - b1 ** F32(t), F32(1) - b2 ** F32(t)
    m *= b1
    np.multiply(g, F32(1) - b1, out=tmp)
    m += tmp
    v *= b2
    np.multiply(g, g, out=tmp)
    tmp *= F32(1) - b2
    v += tmp
    np.divide(v, bc2, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += F32(EPS)
    np.divide(m, tmp, out=tmp)
    tmp *= F32(LR) / bc1
    x -= tmp


def _map_pass(step):
    """One pass applying a stateless one-hyperparameter rule's generated ``step``: ``out = step(g, x)``."""
    @njit(error_model="numpy", nogil=True)
    def run(x, g, out, h):
        for i in range(x.shape[0]):
            out[i] = step(g[i], x[i], h)
    return run


def have(*modules) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def torch_variant(x0, g):
    """``torch.optim.Adam`` on a copy of ``x0`` with the fixed gradient ``g``: (loop, parameters as NumPy)."""
    import torch

    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    p.grad = torch.from_numpy(g.copy())
    opt = torch.optim.Adam([p], lr=LR, betas=(B1, B2), eps=EPS)

    def loop(number, step=opt.step):
        for _ in range(number):
            step()

    return loop, lambda: p.detach().numpy()


def optax_variant(x0, g):
    """``optax.adam`` under ``jax.jit``, parameters and state donated: (loop, parameters as NumPy)."""
    import jax
    import jax.numpy as jnp
    import optax

    opt = optax.adam(LR, b1=B1, b2=B2, eps=EPS)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    step = jax.jit(step, donate_argnums=(0, 1))
    box = [jnp.asarray(x0)]
    box.append(opt.init(box[0]))
    gj = jnp.asarray(g)

    def loop(number):
        p, s = box
        for _ in range(number):
            p, s = step(p, s, gj)
        jax.block_until_ready(p)
        box[:] = [p, s]

    return loop, lambda: np.asarray(box[0])


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32)


CLOCK = [time.perf_counter]


def interleaved(variants: dict, number: int, rounds: int) -> dict:
    """Median seconds per call of each ``loop(number)`` over ``rounds`` rotating rounds."""
    names = list(variants)
    samples = {k: [] for k in names}
    clock = CLOCK[0]
    gc.disable()
    try:
        for r in range(rounds):
            s = r % len(names)
            for k in names[s:] + names[:s]:
                t0 = clock()
                variants[k](number)
                samples[k].append((clock() - t0) / number)
    finally:
        gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


def calibrate(variants: dict, budget: float) -> int:
    """Calls per timed batch so that the slowest variant's batch takes about ``budget`` seconds."""
    for loop in variants.values():
        loop(2)  # compile / warm caches
    if budget <= 0:
        return 1
    worst = 0.0
    for loop in variants.values():
        k = 1
        while True:  # time enough calls for the clock to resolve them
            t0 = time.perf_counter()
            loop(k)
            dt = time.perf_counter() - t0
            if dt > 1e-3 or k >= 10000:
                break
            k *= 10
        worst = max(worst, dt / k)
    return max(1, int(budget / worst))


def placed(x0, count):
    """A copy of ``x0`` and ``count`` zero arrays, laid out as numbaopt lays out a state: apart within a 4 KiB
    page from each other and from the parameter (``numbaopt.compiler.placement``), so that the hand-written
    variant and the generated kernel compare code, not where NumPy happened to put the arrays (4K aliasing
    alone moved a 1M-element Adam step by up to 2.5x here)."""
    x = x0.copy()
    out = [x]
    for off in page_offsets(count, x.ctypes.data % PAGE):
        a = empty_staggered(x0.size, x0.dtype, off)
        a[:] = 0
        out.append(a)
    return out


def adam_case(n: int, rounds: int):
    x0, g = data(n)
    # one array set per variant: they advance independently (identical work per call)
    xh, mh, vh = placed(x0, 2)
    xk = x0.copy()
    sk = no.setup(no.Adam(lr=LR, beta1=B1, beta2=B2, eps=EPS), xk)
    kern = sk.kernels().inplace
    S0, S1 = sk.arrays
    hp, C = sk.hp, sk.counters
    xu = x0.copy()
    su = no.setup(no.Adam(lr=LR, beta1=B1, beta2=B2, eps=EPS), xu)
    xn, mn, vn, tmp = x0.copy(), np.zeros(n, F32), np.zeros(n, F32), np.empty(n, F32)
    th, _tk, tn = [0], [0], [0]

    def hand(number, f=adam_hand, x=xh, g=g, m=mh, v=vh):
        t = th[0]
        for _ in range(number):
            t += 1
            f(x, g, m, v, LR, B1, B2, EPS, t)
        th[0] = t

    def kernel(number, f=kern, x=xk, g=g, a=S0, b=S1, hp=hp, C=C):
        for _ in range(number):  # the kernel advances its step counters C itself
            f(x, g, a, b, hp, C)

    def update(number, f=no.update_, s=su, x=xu, g=g):
        for _ in range(number):
            f(s, x, g)

    def numpy(number, x=xn, g=g, m=mn, v=vn, tmp=tmp):
        t = tn[0]
        for _ in range(number):
            t += 1
            numpy_adam(x, g, m, v, tmp, t)
        tn[0] = t

    variants = {"hand": hand, "kernel": kernel, "update_": update, "numpy": numpy}
    others = {k: f for k, f, mods in (("torch", torch_variant, ("torch",)),
                                      ("optax", optax_variant, ("jax", "optax"))) if have(*mods)}  # where installed
    variants.update({k: f(x0, g)[0] for k, f in others.items()})
    number = calibrate(variants, 0.02 if n < (1 << 22) else 0.0)
    res = interleaved(variants, number, rounds)
    # the other libraries compute Adam too: 3 steps on 64 elements agree with numbaopt's to float32 rounding
    # (their operation order differs, so not bitwise)
    xc = x0[:64].copy()
    sc = no.setup(no.Adam(lr=LR, beta1=B1, beta2=B2, eps=EPS), xc)
    for _ in range(3):
        no.update_(sc, xc, g[:64])
    for k, f in others.items():
        loop, params = f(x0[:64], g[:64])
        loop(3)
        res[f"{k}_close"] = bool(np.allclose(params(), xc, rtol=1e-5, atol=1e-6))
    # honesty check: the generated kernel and the hand-written loop do the same arithmetic
    xa, ma, va = x0[:64].copy(), np.zeros(min(n, 64), F32), np.zeros(min(n, 64), F32)
    xb = x0[:64].copy()
    sb = no.setup(no.Adam(lr=LR, beta1=B1, beta2=B2, eps=EPS), xb)
    for t in range(1, 4):
        adam_hand(xa, g[:64], ma, va, LR, B1, B2, EPS, t)
        no.update_(sb, xb, g[:64])
    res["same_numbers"] = bool(np.array_equal(xa, xb) and np.array_equal(ma, sb.arrays[0]))
    return res


def chain_case(n: int, rounds: int):
    x0, g = data(n, 1)
    rules = (no.WeightDecay(WD), no.ClipGrad(DELTA), no.Adam(lr=LR))
    xf = x0.copy()
    sf = no.setup(no.chain(*rules), xf)
    xu = x0.copy()
    su = no.setup(rules[2], xu)
    wd_pass = _map_pass(kernels(rules[0], F32).step_0)
    clip_pass = _map_pass(kernels(rules[1], F32).step_0)
    d = np.empty(n, F32)

    def fused(number, f=no.update_, s=sf, x=xf, g=g):
        for _ in range(number):
            f(s, x, g)

    def unfused(number, f=no.update_, s=su, x=xu, g=g, d=d, wd=WD32, delta=DELTA32):
        for _ in range(number):
            wd_pass(x, g, d, wd)
            clip_pass(x, d, d, delta)
            f(s, x, d)

    variants = {"fused": fused, "unfused": unfused}
    number = calibrate(variants, 0.02 if n < (1 << 22) else 0.0)
    res = interleaved(variants, number, rounds)
    # the two compute the same numbers (checked on a few steps of a small slice)
    xa, xb = x0[:64].copy(), x0[:64].copy()
    sa, sb = no.setup(no.chain(*rules), xa), no.setup(rules[2], xb)
    db = np.empty(64, F32)
    for _ in range(3):
        no.update_(sa, xa, g[:64])
        wd_pass(xb, g[:64], db, F32(WD))
        clip_pass(xb, db, db, F32(DELTA))
        no.update_(sb, xb, db)
    res["same_numbers"] = bool(np.array_equal(xa, xb))
    return res


def fmt(sec: float) -> str:
    us = sec * 1e6
    if us < 10:
        return f"{us:.2f} µs"
    if us < 10000:
        return f"{us:.0f} µs"
    return f"{us / 1000:.1f} ms"


def size_name(n: int) -> str:
    return {16: "16", 4096: "4096", 1 << 20: "1M", 1 << 24: "16M"}.get(n, str(n))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    timer = argv[argv.index("--timer") + 1] if "--timer" in argv else "wall"
    if timer not in ("cpu", "wall"):
        raise SystemExit(f"--timer cpu|wall, got {timer!r}")
    CLOCK[0] = time.process_time if timer == "cpu" else time.perf_counter
    print(f"# numbaopt bench-compare: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"numba {numba.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
          f"NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}, {os.cpu_count()} CPUs, "
          f"parallel threshold {no.parallel_threshold()}; {timer} clock; medians of interleaved rounds")
    rows = []
    for n in SIZES:
        rounds = (7 if quick else 21) if n <= 4096 else (5 if quick else 11) if n < (1 << 24) else (3 if quick else 5)
        r = adam_case(n, rounds)
        rows.append((n, r))
        print(f"Adam {size_name(n):>5}: hand {fmt(r['hand'])}, kernel {fmt(r['kernel'])}, update_ "
              f"{fmt(r['update_'])} (update_/hand {r['update_'] / r['hand']:.3f}, kernel/hand "
              f"{r['kernel'] / r['hand']:.3f}), numpy {fmt(r['numpy'])}"
              + "".join(f", {k} {fmt(r[k])} (close: {r[k + '_close']})" for k in OTHERS if k in r)
              + f"; same numbers: {r['same_numbers']}", flush=True)
    chains = []
    for n in (1 << 20, 1 << 24):
        rounds = (5 if quick else 11) if n < (1 << 24) else (3 if quick else 5)
        r = chain_case(n, rounds)
        chains.append((n, r))
        print(f"chain {size_name(n):>5}: fused {fmt(r['fused'])}, unfused {fmt(r['unfused'])} "
              f"(unfused/fused {r['unfused'] / r['fused']:.2f}); same numbers: {r['same_numbers']}", flush=True)

    print()
    print("| Adam, float32, 1 thread | hand-written @njit | numbaopt kernel | numbaopt `update_` | "
          "`update_` / hand | kernel / hand | NumPy in-place | NumPy / `update_` |")
    print("|---|---|---|---|---|---|---|---|")
    for n, r in rows:
        print(f"| {size_name(n)} elements | {fmt(r['hand'])} | {fmt(r['kernel'])} | {fmt(r['update_'])} | "
              f"{r['update_'] / r['hand']:.3f} | {r['kernel'] / r['hand']:.3f} | {fmt(r['numpy'])} | "
              f"{r['numpy'] / r['update_']:.1f} |")
    present = [k for k in OTHERS if k in rows[0][1]]
    if present:
        print()
        print("| Adam, float32, 1 thread | numbaopt `update_` | NumPy in-place | "
              + " | ".join(OTHERS[k] for k in present) + " |")
        print("|---|---|---|" + "---|" * len(present))
        for n, r in rows:
            print(f"| {size_name(n)} elements | {fmt(r['update_'])} | {fmt(r['numpy'])} | "
                  + " | ".join(f"{fmt(r[k])} ({r[k] / r['update_']:.1f}x)" for k in present) + " |")
    r16 = rows[0][1]
    print()
    print(f"Python overhead of `update_` at 16 elements: {fmt(r16['update_'] - r16['kernel'])} over the "
          f"generated kernel's own call, {fmt(r16['update_'] - r16['hand'])} over the hand-written call.")
    print()
    print("| chain(WeightDecay, ClipGrad, Adam), float32 | fused (one kernel) | unfused (3 passes) | unfused / fused |")
    print("|---|---|---|---|")
    for n, r in chains:
        ratio = r["unfused"] / r["fused"]
        print(f"| {size_name(n)} elements | {fmt(r['fused'])} | {fmt(r['unfused'])} | {ratio:.2f} |")
    ok = all(r["same_numbers"] for _, r in rows + chains)
    close = all(r[k + "_close"] for _, r in rows for k in OTHERS if k in r)
    print()
    print("Generated and reference variants computed identical numbers." if ok else
          "WARNING: a generated variant and its reference computed different numbers.")
    if not close:
        print("WARNING: torch or optax computed different parameters than numbaopt's Adam.")
    if "--no-plot" not in argv:
        path = argv[argv.index("--plot") + 1] if "--plot" in argv else os.path.join(ROOT, "docs", "img",
                                                                                    "compare.png")
        print(plot(rows, path, timer))
    return 0 if ok and close else 1


OTHERS = {"torch": "torch.optim.Adam", "optax": "optax.adam (jit, donated)"}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)


def plot(rows, path, timer):
    """Time per Adam step against the parameter count, log-log, one line per library (matplotlib's
    ``Figure``, no pyplot). Returns what to print."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "No plot: matplotlib is not installed (pip install 'numbaopt[plot]')."
    ns = np.array([n for n, _ in rows], dtype=float)
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    lines = [("update_", "numbaopt (update_)", "o-", 2.2), ("hand", "hand-written @njit loop", "k:", 1.0),
             ("numpy", "NumPy (in place)", "s-", 1.4)] + \
        [(k, OTHERS[k], m, 1.4) for k, m in (("torch", "^-"), ("optax", "d-")) if k in rows[0][1]]
    for key, label, style, lw in lines:
        ax.plot(ns, [r[key] for _, r in rows], style, lw=lw, ms=4, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters (float32 elements)")
    ax.set_ylabel(f"time per Adam step (s, {timer} clock)")
    ax.set_title(f"One Adam step, 1 thread, {os.cpu_count()}-CPU machine, {time.strftime('%Y-%m-%d')} "
                 "(make bench-compare)", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    return f"Plot: {os.path.abspath(path)}"


if __name__ == "__main__":
    sys.exit(main())
