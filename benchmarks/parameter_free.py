"""The learning-rate-free rules measured: one in-place step of DAdaptAdamW and Prodigy beside Adam, on one float32
array (small and large) and on ResNet-18's shapes as a tree (one estimate over every leaf), medians of interleaved
rounds; ``--optax`` adds optax's jitted ``contrib.dadapt_adamw`` and ``contrib.prodigy`` on the tree.

    python benchmarks/parameter_free.py --rounds 15 [--optax]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numbaopt as no  # noqa: E402
from axis_rules import resnet18_shapes, timed  # noqa: E402

RULES = {
    "Adam": lambda: no.Adam(1e-3),
    "DAdaptAdamW": lambda: no.DAdaptAdamW(),
    "Prodigy": lambda: no.Prodigy(),
}


def _optax_case(model, grads, name):
    import jax
    import optax
    tx = getattr(optax.contrib, name)()
    params = jax.tree_util.tree_map(jax.numpy.asarray, model)
    g = jax.tree_util.tree_map(jax.numpy.asarray, grads)
    st = tx.init(params)

    @jax.jit
    def step(params, st, g):
        u, st = tx.update(g, st, params)
        return optax.apply_updates(params, u), st
    box = [params, st]
    step(*box, g)[0]["p0"].block_until_ready()

    def f():
        box[0], box[1] = step(box[0], box[1], g)
        box[0]["p0"].block_until_ready()
    return f


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--optax", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    shapes = resnet18_shapes()
    tree = {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    tgrads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in tree.items()}
    cases = [(f"one array of {n:,}", {"x": rng.standard_normal(n).astype(np.float32)},
              {"x": rng.standard_normal(n).astype(np.float32)}) for n in (4096, 1 << 20)]
    cases.append((f"ResNet-18 tree ({len(shapes)} leaves)", tree, tgrads))
    print(f"update_ step time, float32, in place (median of {args.rounds} interleaved rounds)")
    for label, m, g in cases:
        fs = {}
        for name, make in RULES.items():
            st, mm = no.setup(make(), m), {k: v.copy() for k, v in m.items()}
            fs[name] = (lambda st=st, mm=mm, g=g: no.update_(st, mm, g))
        if args.optax and label.startswith("ResNet"):
            for name in ("dadapt_adamw", "prodigy"):
                fs[f"optax contrib.{name} (jit)"] = _optax_case(m, g, name)
        med = timed(fs, args.rounds)
        print(f"\n{label}\n| rule | ms | / Adam |\n|---|---|---|")
        for k, v in med.items():
            print(f"| {k} | {1e3 * v:.3f} | {v / med['Adam']:.2f} |")


if __name__ == "__main__":
    main()
