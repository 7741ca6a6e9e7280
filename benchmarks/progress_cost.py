"""What ``progress=True`` costs a compiled ``minimize``: a fixed cost per call and a cost per iteration.

    NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/progress_cost.py [--rounds 21] [--timer cpu|wall]

The problem: Adam on ``sum c_i x_i``, 16 float64 parameters (~0.15 µs per compiled iteration on a quiet
machine, so any overhead of the bar shows). Measured:

* the first ``progress=True`` call in a process, which pays for importing tqdm and for the first bar
  (tqdm creates a multiprocessing lock then): once, on the first call after the loop is compiled;
* the fixed cost of later calls: median(on) - median(off) of a short run (1,000 iterations), the bar
  off and on in alternating order (flipped every round);
* the cost per iteration: with the bar the compiled loop runs in chunks (64 iterations, growing x4 up to
  about 0.1 s each), and between chunks Python updates the bar (and the loss/gradient-norm postfix, at
  most every 0.1 s). The cost of one such update is timed directly (postfix forced every time: the worst
  case), and a long run (1,000,000 iterations) is timed on and off as a whole for the end-to-end
  difference, which on a shared machine is mostly noise.

The bar writes to ``os.devnull`` here (a file, like a log): drawing on a terminal costs what the terminal
takes, at most ~10 redraws per second. ``--timer cpu`` uses the process's CPU time (robust when other
processes share the cores; it counts tqdm's monitor thread too), ``--timer wall`` (default) the wall clock.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

import numbaopt as no  # noqa: E402


@njit(cache=True)
def linear(x, g, c):
    """sum c_i x_i: a gradient that never vanishes. On a loss with a minimum, a long Adam run converges
    until its moments decay into subnormal numbers, and every iteration then costs ~10x more (1.4 µs
    instead of ~0.15 µs here): that would measure the FPU, not the bar."""
    s = 0.0
    for i in range(x.shape[0]):
        g[i] = c[i]
        s += c[i] * x[i]
    return s


C = np.linspace(-1.0, 1.0, 16) + 0.01  # no zero component
X0 = np.zeros(16)


@contextlib.contextmanager
def quiet_stderr():
    saved = sys.stderr
    with open(os.devnull, "w") as f:
        sys.stderr = f
        try:
            yield
        finally:
            sys.stderr = saved


CLOCK = [time.perf_counter]


def once(n, progress):
    clock = CLOCK[0]
    t0 = clock()
    r = no.minimize(linear, X0, no.Adam(0.01), args=(C,), maxiter=n, gtol=None, progress=progress)
    dt = clock() - t0
    assert r.nit == n
    return dt


def medians(n, rounds):
    on, off = [], []
    for k in range(rounds):
        for progress in ((False, True) if k % 2 == 0 else (True, False)):
            (on if progress else off).append(once(n, progress))
    return statistics.median(off), statistics.median(on)


def bar_update_cost(reps=2000):
    """Seconds per update of the bar between two chunks, the postfix rewritten every time (worst case)."""
    from numbaopt.loops.minimize import Bar
    from numbaopt.loops.problem import Problem

    p = Problem(linear, X0, no.Adam(0.01), None, (C,), 10 * reps, None, None, None, "x0", False)
    p.F[0] = (0.5, 0.4, 0.3)
    bar = Bar(p)
    clock = CLOCK[0]
    ts = []
    try:
        for k in range(reps):
            p.I[0, 0] = 5 * (k + 1)
            bar.posted = -1e300  # force the postfix
            t0 = clock()
            bar.show()
            ts.append(clock() - t0)
    finally:
        bar.close()
    return statistics.median(ts)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 21
    timer = argv[argv.index("--timer") + 1] if "--timer" in argv else "wall"
    if timer not in ("cpu", "wall"):
        raise SystemExit(f"--timer cpu|wall, got {timer!r}")
    CLOCK[0] = time.process_time if timer == "cpu" else time.perf_counter
    short, long_ = 1_000, 1_000_000
    print(f"# progress=True cost, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: Adam on 16 float64 "
          f"parameters, {timer} clock, medians of {rounds} alternating rounds, bar written to os.devnull; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    once(10, False)  # compile (or load from the cache)
    with quiet_stderr():
        base = statistics.median(once(short, False) for _ in range(5))
        first = once(short, True) - base
        off_s, on_s = medians(short, rounds)
        upd = bar_update_cost()
        off_l, on_l = medians(long_, max(3, rounds // 3))
    fixed = on_s - off_s
    per_s = off_l / long_
    # updates in a long run: the chunks growing from 64 to ~0.1 s (x4 each), then ~10 per second
    grow = 0
    c = 64
    while c * per_s < 0.1 and c < long_:
        c *= 4
        grow += 1
    n_upd = grow + 1 + off_l / 0.1
    print(f"first progress=True call in a process: +{first * 1e3:.1f} ms (importing tqdm, the first bar)")
    print(f"fixed cost of a later call: {fixed * 1e3:.2f} ms (maxiter={short:,}: off {off_s * 1e3:.3f} ms, "
          f"on {on_s * 1e3:.3f} ms)")
    print(f"one bar update between chunks (postfix rewritten): {upd * 1e6:.1f} µs; about {n_upd:.0f} of them in "
          f"a {long_:,}-iteration run ({off_l:.2f} s off): {upd * n_upd / long_ * 1e9:.3f} ns per iteration "
          f"({upd * n_upd / off_l * 100:.3f}% of the run)")
    print(f"end to end, maxiter={long_:,}: off {off_l * 1e3:.1f} ms, on {on_l * 1e3:.1f} ms "
          f"({(on_l - off_l) / off_l * 100:+.1f}%, {(on_l - off_l - fixed) / long_ * 1e9:+.2f} ns per iteration; "
          f"off: {per_s * 1e9:.0f} ns per iteration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
