"""Axis reductions measured: Adafactor's state memory on ResNet-18's shapes against Adam's, and the step time of
the axis rules beside Adam on one matrix and on the whole ResNet-18 tree (float32, in place).

    .venv/bin/python benchmarks/axis_rules.py [--rounds 15] [--optax] [--torch]
    .venv/bin/python benchmarks/axis_rules.py --threads [--rounds 15]   # only: serial against threaded kernels
    .venv/bin/python benchmarks/axis_rules.py --faults [--rounds 15]    # only: page faults of the per-unit tables

Memory is counted from the states' arrays (exact). Times are medians of ``--rounds`` rounds; in each round
every case runs once, in turn, so that all cases see the same machine load; ratios are to Adam in the same
run. ``--optax`` also times optax's ``adafactor`` (jitted, CPU, float32) on the same tree.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import numbaopt as no


def resnet18_shapes() -> list:
    """ResNet-18's parameter shapes in torch's layout (convolution kernels OIHW): 11,689,512 values."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    for cin, cout in ((64, 64), (64, 128), (128, 256), (256, 512)):
        for b in range(2):
            c_in = cin if b == 0 else cout
            shapes += [(cout, c_in, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
            if b == 0 and cin != cout:
                shapes += [(cout, cin, 1, 1), (cout,), (cout,)]
    return shapes + [(1000, 512), (1000,)]


def state_bytes(state, keys) -> int:
    return sum(a.nbytes for k in keys for a in state[k].state.values())


RULES = {
    "Adam": lambda: no.Adam(1e-3),
    "Adafactor": lambda: no.Adafactor(lr=1e-3, min_dim_size_to_factor=32),
    "Adafactor(unfactored)": lambda: no.Adafactor(lr=1e-3, factored=False),
    "Adafactor(torch)": lambda: no.Adafactor(lr=1e-2, convention="torch"),
    "Centralize+Adam": lambda: no.chain(no.Centralize(), no.Adam(1e-3)),
    "AdaptiveGradClip+Adam": lambda: no.chain(no.AdaptiveGradClip(0.01), no.Adam(1e-3)),
}


#: beside Descent, serial: what one axis member costs on its own
SERIAL = {
    "Descent": lambda: no.Descent(1e-3),
    "ClipByBlockRMS+Descent": lambda: no.chain(no.ClipByBlockRMS(1.0), no.Descent(1e-3)),
    "Centralize+Descent": lambda: no.chain(no.Centralize(), no.Descent(1e-3)),
    "NovoGrad": lambda: no.NovoGrad(1e-3),
    "ScaleByFactoredRMS+Descent": lambda: no.chain(no.ScaleByFactoredRMS(min_dim_size_to_factor=2), no.Descent(1e-3)),
    "AdaptiveGradClip+Descent": lambda: no.chain(no.AdaptiveGradClip(0.01), no.Descent(1e-3)),
}


def timed(cases: dict, rounds: int) -> dict:
    for f in cases.values():  # compile (or load from the disk cache) outside the timing
        f()
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for k, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--optax", action="store_true")
    ap.add_argument("--torch", action="store_true", help="add torch.optim.Adafactor (CPU) beside Adafactor(torch)")
    ap.add_argument("--threads", action="store_true", help="only the table of serial against threaded kernels")
    ap.add_argument("--faults", action="store_true", help="only the minor page faults per step (getrusage)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    if args.threads:
        threads_table(rng, args.rounds)
        return
    if args.faults:
        faults_table(rng, args.rounds)
        return
    shapes = resnet18_shapes()
    model = {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in model.items()}
    n = sum(v.size for v in model.values())
    print(f"ResNet-18 shapes: {len(shapes)} arrays, {n:,} float32 parameters ({4 * n / 2**20:.1f} MiB)")
    print("\nstate memory")
    print("| rule | state values | MiB | of Adam's |\n|---|---|---|---|")
    adam_b = None
    for name in ("Adam", "Adafactor", "Adafactor(unfactored)"):
        st = no.setup(RULES[name](), model)
        b = state_bytes(st, model)
        adam_b = adam_b or b
        print(f"| {name} | {b // 4:,} | {b / 2**20:.2f} | {b / adam_b:.4f} |")

    print(f"\nstep time, in place, float32 (median of {args.rounds} rounds, cases interleaved)")
    mat = {"x": rng.standard_normal((1024, 1024)).astype(np.float32)}
    gmat = {"x": rng.standard_normal((1024, 1024)).astype(np.float32)}
    for label, m, g in (("one 1024x1024 matrix", mat, gmat), ("ResNet-18 tree", model, grads)):
        cases = {}
        for name, make in RULES.items():
            st, mm = no.setup(make(), m), {k: v.copy() for k, v in m.items()}

            def f(st=st, mm=mm, g=g):
                no.update_(st, mm, g)
            cases[name] = f
        if args.optax and label == "ResNet-18 tree":
            cases["optax.adafactor (jit)"] = _optax_case(m, g)
        if args.torch:
            cases["torch.optim.Adafactor (foreach)"] = _torch_case(m, g)
        med = timed(cases, args.rounds)
        print(f"\n{label}\n| rule | ms | / Adam |\n|---|---|---|")
        for k, v in med.items():
            print(f"| {k} | {1e3 * v:.2f} | {v / med['Adam']:.2f} |")
    serial_table(rng, args.rounds)


def threads_table(rng, rounds: int) -> None:
    """One large array (the threaded kernels run from 1M elements) stepped by the serial and the threaded kernel of
    each rule, interleaved: the element pass and ``finish`` run on threads, the per-unit sums stay serial."""
    import numba
    for shape in ((1024, 1024), (256, 256, 4, 4), (1 << 20,)):
        x = rng.standard_normal(shape).astype(np.float32)
        g = rng.standard_normal(shape).astype(np.float32)
        cases = {}
        for name, make in RULES.items():
            for label, th in (("serial", 1 << 40), ("threaded", 0)):
                st, xx = no.setup(make(), x), x.copy()

                def f(st=st, xx=xx, th=th, g=g):
                    old = no.set_parallel_threshold(th)
                    no.update_(st, xx, g)
                    no.set_parallel_threshold(old)
                cases[(name, label)] = f
        med = timed(cases, rounds)
        print(f"\none {shape} array, {numba.get_num_threads()} threads\n| rule | serial ms | threaded ms | speed-up |")
        print("|---|---|---|---|")
        for name in RULES:
            a, b = med[(name, "serial")], med[(name, "threaded")]
            print(f"| {name} | {1e3 * a:.2f} | {1e3 * b:.2f} | {a / b:.2f} |")


def faults_table(rng, rounds: int) -> None:
    """Minor page faults per in-place step (``getrusage``, Linux) and the median step time, serial kernels: the
    per-unit tables the kernels allocate per call fault their pages in again when they are as large as the leaf."""
    import resource
    shapes = resnet18_shapes()
    model = {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in model.items()}
    vec = {"x": rng.standard_normal(1 << 20).astype(np.float32)}
    gvec = {"x": rng.standard_normal(1 << 20).astype(np.float32)}
    old = no.set_parallel_threshold(1 << 40)
    try:
        print(f"\nminor page faults per step, serial kernels (median ms of {rounds})\n| rule | model | faults | ms |")
        print("|---|---|---|---|")
        for name in ("Adam", "Adafactor", "Adafactor(unfactored)", "Adafactor(torch)"):
            for label, m, g in (("1M vector", vec, gvec), ("ResNet-18 tree", model, grads)):
                st, mm = no.setup(RULES[name](), m), {k: v.copy() for k, v in m.items()}
                no.update_(st, mm, g)  # compiled, and the allocator warmed
                times, f0 = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    no.update_(st, mm, g)
                    times.append(time.perf_counter() - t0)
                faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / rounds
                print(f"| {name} | {label} | {faults:,.0f} | {1e3 * statistics.median(times):.2f} |")
    finally:
        no.set_parallel_threshold(old)


def serial_table(rng, rounds: int) -> None:
    old = no.set_parallel_threshold(1 << 40)
    try:
        for shape in ((1024, 1024), (128, 128, 8, 8)):
            x = rng.standard_normal(shape).astype(np.float32)
            g = rng.standard_normal(shape).astype(np.float32)
            cases = {}
            for name, make in SERIAL.items():
                st, xx = no.setup(make(), x), x.copy()
                cases[name] = (lambda st=st, xx=xx, g=g: no.update_(st, xx, g))
            med = timed(cases, rounds)
            print(f"\nserial, one {shape} array\n| rule | ms | / Descent |\n|---|---|---|")
            for k, v in med.items():
                print(f"| {k} | {1e3 * v:.2f} | {v / med['Descent']:.1f} |")
    finally:
        no.set_parallel_threshold(old)


def _optax_case(model, grads):
    import jax
    import optax
    tx = optax.adafactor(learning_rate=1e-3, min_dim_size_to_factor=32)
    p = jax.tree.map(jax.numpy.asarray, model)
    g = jax.tree.map(jax.numpy.asarray, grads)
    box = [p, tx.init(p)]

    @jax.jit
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    def f():
        box[0], box[1] = step(box[0], box[1], g)
        jax.block_until_ready(box[0])
    return f


def _torch_case(model, grads):
    import torch
    params = [torch.tensor(v.copy()) for v in model.values()]
    for p, g in zip(params, grads.values()):
        p.grad = torch.tensor(g)
    opt = torch.optim.Adafactor(params, lr=1e-2, foreach=True)

    def f():
        opt.step()
    return f


if __name__ == "__main__":
    main()
