"""One run on a CUDA GPU: every rule against the CPU result, then Adam timings and bandwidth.

    python benchmarks/gpu_check.py                 # on a machine with an NVIDIA GPU and numbaopt[cuda]
    python benchmarks/gpu_check.py --sim           # the same code path under Numba's CUDA simulator, tiny sizes
    python benchmarks/gpu_check.py --ptx 9.0       # no GPU needed: compile every generated kernel to PTX
                                                   # (needs NVVM, e.g. the nvidia-cuda-nvcc wheel) and count f64 ops

What it does (GPU or --sim):

1. every rule of the catalog (and the composites: LAMB, LARS, Lookahead, SkipNonFinite, fused chains) for a
   few steps on the device, against the CPU path on the same data (float32; complex64 for a few), and the
   device's in-place against its out-of-place result (bitwise);
2. Adam ``update_`` on float32 arrays of 1M, 16M and 256M elements and on 1000 leaves of 1000 elements
   (one launch per step, :class:`numbaopt.DeviceGroup`), median seconds per step over batches, and the
   achieved bandwidth (28 bytes per element: read x, g, m, v; write x, m, v) next to a device-to-device
   copy of the same number of bytes per element measured in the same run;
3. where PyTorch with CUDA is importable: ``torch.optim.Adam(fused=True)`` on the same sizes, and
   numbaopt stepping torch tensors directly (through ``__cuda_array_interface__``).

It prints a table and writes JSON (``--json``, default ``gpu_check.json``). Exit status 1 when a rule check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ADAM_BYTES = 28  # float32: read x, g, m, v and write x, m, v


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sim", action="store_true", help="Numba's CUDA simulator with tiny sizes (no GPU)")
    p.add_argument("--sizes", default=None, help="comma-separated array sizes (default 1M,16M,256M)")
    p.add_argument("--leaves", default=None, help="LEAVESxSIZE for the many-leaves case (default 1000x1000)")
    p.add_argument("--repeat", type=int, default=None, help="timed batches per case (median reported)")
    p.add_argument("--no-rules", action="store_true", help="skip the rule-by-rule check")
    p.add_argument("--max-rules", type=int, default=None, help="check only the first N rules (a quick run)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    p.add_argument("--json", default="gpu_check.json", help="where to write the results")
    p.add_argument("--ptx", metavar="CC", default=None,
                   help="compile every generated kernel to PTX for compute capability CC (e.g. 9.0); no GPU")
    return p.parse_args(argv)


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def catalog():
    """Every rule of numbaopt at its defaults, option variants, and the composites (chains); not the matrix
    rules (Muon), which the GPU backend refuses for now."""
    import numbaopt as no
    from numbaopt import rules as R
    out = []
    for name in R.__all__:
        obj = getattr(R, name)
        if isinstance(obj, type) and issubclass(obj, no.Rule) and obj is not no.Rule and obj.stage is None \
                and obj.matrix is None:
            out.append(obj())
    out += [no.RMSProp(centred=True), no.AdamW(weight_decay=0.1, couple=False), no.ClipNorm(1.0, p=float("inf")),
            no.ClipNorm(1.0, p=1.0), no.LAMB(weight_decay=0.1), no.LARS(0.5, weight_decay=0.1),
            no.Lookahead(no.Adam(), k=2), no.SkipNonFinite(no.Adam()),
            no.chain(no.WeightDecay(1e-2), no.ClipGrad(1.0), no.AdamW(weight_decay=0.1)),
            no.chain(no.ClipGlobalNorm(1.0), no.Adam()),
            no.Adafactor(min_dim_size_to_factor=8), no.Adafactor(convention="torch", min_dim_size_to_factor=8),
            no.chain(no.Centralize(), no.ClipNorm(1.0), no.Adam())]
    return out


def _shape(rule, n):
    """A matrix for a rule with an axis member (its rows and columns factored), else a vector."""
    return (n // 64, 64) if any(type(m).axes for m in rule.rules) and n >= 128 else (n,)


def _name(rule) -> str:
    return repr(rule) if len(repr(rule)) < 70 else repr(rule)[:67] + "..."


def check_rules(n, steps, complex_rules=4, max_rules=None):
    """Device against CPU (and in-place against out-of-place on the device) for every rule."""
    import numpy as np
    from numba import cuda
    import numbaopt as no
    results = []
    rng = np.random.default_rng(0)
    cases = [(r, np.float32) for r in catalog()[:max_rules]]
    cplx = [r for r in catalog() if all(type(m).supports_complex for m in r.rules)][:complex_rules]
    cases += [(r, np.complex64) for r in cplx]
    for rule, dtype in cases:
        shape = _shape(rule, n)

        def draw(dtype=dtype, shape=shape):
            a = rng.standard_normal(shape)
            if np.dtype(dtype).kind == "c":
                a = a + 1j * rng.standard_normal(shape)
            return a.astype(dtype)
        x0, grads = draw(), [draw() for _ in range(steps)]
        rec = {"rule": _name(rule), "dtype": np.dtype(dtype).name, "n": n, "steps": steps}
        try:
            t0 = time.perf_counter()
            sc, xc = no.setup(rule, x0.copy()), x0.copy()
            xd, xe = cuda.to_device(x0.copy()), cuda.to_device(x0.copy())
            sd, se = no.setup(rule, xd), no.setup(rule, xe)
            for g in grads:
                sc, xc = no.update_(sc, xc, g)
                gd = cuda.to_device(g)
                sd, xd = no.update_(sd, xd, gd)
                se, xe = no.update(se, xe, gd)
            cuda.synchronize()
            a, b = xd.copy_to_host(), xe.copy_to_host()
            tol = 1e-4
            close = np.isclose(a, xc, rtol=tol, atol=tol * 1e-2)
            rec.update(max_abs_diff_vs_cpu=float(np.max(np.abs(a - xc))), frac_close=float(close.mean()),
                       inplace_equals_outplace=a.tobytes() == b.tobytes(), t=sd.t,
                       seconds=round(time.perf_counter() - t0, 3))
            # FMA contraction on the GPU changes the last bits; sign-based rules may flip a near-zero element
            rec["ok"] = bool(rec["frac_close"] >= 0.999 and rec["inplace_equals_outplace"] and sd.t == sc.t)
        except Exception as e:  # report and go on: one broken rule must not hide the rest of the table
            rec.update(ok=False, error=f"{type(e).__name__}: {e}")
        results.append(rec)
    return results


def _timeit(fn, sync, repeat, target_s, max_steps):
    """Median seconds per call: batches of calls between synchronisations."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    steps = int(min(max(target_s / one, 1), max_steps))
    per = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        sync()
        per.append((time.perf_counter() - t0) / steps)
    return statistics.median(per), steps


def time_cases(sizes, leaves, leaf_size, repeat, target_s, max_steps, use_torch):
    import numpy as np
    from numba import cuda
    import numbaopt as no
    from numbaopt.backends.cuda import runtime as cc
    rows = []
    sync = cuda.synchronize

    def dev_full(n, v):
        a = cuda.device_array(n, dtype=np.float32)
        cc.fill[max(1, min(4096, -(-n // cc.TPB))), cc.TPB](a, np.float32(v))
        return a

    torch = None
    if use_torch:
        try:
            import torch as _torch
            if _torch.cuda.is_available():
                torch = _torch
        except Exception:
            torch = None

    def row(case, n, nleaves, sec, steps, bytes_per_elem, impl):
        total = n * nleaves
        return {"case": case, "impl": impl, "n": n, "leaves": nleaves, "elements": total, "median_s": sec,
                "steps_per_batch": steps, "bytes": total * bytes_per_elem,
                "GBps": total * bytes_per_elem / sec / 1e9}

    def measure(case, n, nleaves, impl, make, sync_fn=None, max_s=None, bpe=None):
        """Time ``make()``'s step function; a failure (out of memory, a missing feature) is recorded in
        its row and the run goes on, so one short GPU session always gives the whole table."""
        try:
            fn = make()
            sec, steps = _timeit(fn, sync_fn or sync, repeat, target_s, max_s or max_steps)
            rows.append(row(case, n, nleaves, sec, steps, bpe or ADAM_BYTES, impl))
        except Exception as e:
            rows.append({"case": case, "impl": impl, "n": n, "leaves": nleaves, "elements": n * nleaves,
                         "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"  {case} {impl} n={n} leaves={nleaves}: {rows[-1]['error']}", flush=True)
        finally:
            held.clear()
            if torch is not None:
                torch.cuda.empty_cache()

    held = []  # the buffers of the case being measured (released after it)

    def copy_case(total):
        def make():
            # a device-to-device copy moving the same 28 bytes per element as Adam (reads + writes)
            src = dev_full(total * ADAM_BYTES // 8, 1.0)
            dst = cuda.device_array(total * ADAM_BYTES // 8, dtype=np.float32)
            held.extend([src, dst])
            return lambda: dst.copy_to_device(src)
        return make

    def adam_case(n):
        def make():
            x, g = dev_full(n, 0.5), dev_full(n, 0.01)
            s = no.setup(no.Adam(1e-3), x)
            held.extend([x, g, s])
            return lambda: no.update_(s, x, g)
        return make

    def axis_case(n, rule):
        def make():  # a float32 matrix of n elements, 1024 (or fewer) columns: rows and columns factored
            cols = min(1024, n)
            x = dev_full(n - n % cols, 0.5).reshape((n // cols, cols))
            g = dev_full(x.size, 0.01).reshape(x.shape)
            s = no.setup(rule, x)
            held.extend([x, g, s])
            return lambda: no.update_(s, x, g)
        return make

    def torch_case(n, count, numbaopt_on_torch=False):
        def make():
            ps = [torch.full((n,), 0.5, device="cuda") for _ in range(count)]
            gs = [torch.full_like(p, 0.01) for p in ps]
            held.extend(ps + gs)
            if numbaopt_on_torch:
                st = no.setup(no.Adam(1e-3), ps[0])
                return lambda: no.update_(st, ps[0], gs[0])
            for p, g in zip(ps, gs):
                p.grad = g
            return torch.optim.Adam(ps, lr=1e-3, fused=True).step
        return make

    def group_case(n, count, mode):
        def make():
            xs = [dev_full(n, 0.5) for _ in range(count)]
            gs = [dev_full(n, 0.01) for _ in range(count)]
            held.extend(xs + gs)
            if mode == "group":
                grp = no.setup_device_group(no.Adam(1e-3), xs)
                return lambda: no.update_(grp, xs, gs)
            if mode == "tree":  # a nested model: the tree engine groups its device leaves (one launch)
                model = {"layers": [{"w": x} for x in xs]}
                grads = {"layers": [{"w": g} for g in gs]}
                state = no.setup(no.Adam(1e-3), model)
                return lambda: no.update_(state, model, grads)
            states = [no.setup(no.Adam(1e-3), x) for x in xs]

            def loop():
                for s, x, g in zip(states, xs, gs):
                    no.update_(s, x, g)
            return loop
        return make

    tsync = torch.cuda.synchronize if torch is not None else None
    for n in sizes:
        measure("copy", n, 1, "cuMemcpyDtoD", copy_case(n))
        measure("adam", n, 1, "numbaopt", adam_case(n))
        # Adafactor's passes read g three times (its pass, two leaf reductions) and x twice, write x: 24 bytes
        measure("adafactor", n, 1, "numbaopt", axis_case(n, no.Adafactor(min_dim_size_to_factor=2)), bpe=24)
        measure("adafactor(torch)", n, 1, "numbaopt", axis_case(n, no.Adafactor(convention="torch")), bpe=24)
        if torch is not None:
            measure("adam", n, 1, "torch fused", torch_case(n, 1), tsync)
            measure("adam", n, 1, "numbaopt on torch tensors", torch_case(n, 1, True), tsync)
    if leaves:
        n = leaf_size
        measure("copy", n, leaves, "cuMemcpyDtoD (one buffer)", copy_case(n * leaves))
        measure("adam", n, leaves, "numbaopt group (1 launch)", group_case(n, leaves, "group"))
        measure("adam", n, leaves, "numbaopt tree of dicts (1 launch)", group_case(n, leaves, "tree"))
        measure("adam", n, leaves, "numbaopt per-leaf launches", group_case(n, leaves, "per-leaf"),
                max_s=max(1, max_steps // 10))
        if torch is not None:
            measure("adam", n, leaves, "torch fused", torch_case(n, leaves), tsync)
    # bandwidth relative to the copy of the same size, measured in this run
    copies = {(r["n"], r["leaves"]): r["GBps"] for r in rows if r["case"] == "copy" and "GBps" in r}
    for r in rows:
        c = copies.get((r["n"], r["leaves"]))
        r["pct_of_copy"] = 100.0 * r["GBps"] / c if c and "GBps" in r else None
    return rows


def ptx_check(cc_str):
    """Compile every generated kernel for every catalog rule to PTX (no GPU; needs NVVM)."""
    import re
    import numpy as np
    from numba import cuda
    import numba.cuda.dispatcher as D
    from numba import typeof
    from numba.cuda import types as T
    from numbaopt.compiler import ChainLayout
    from numbaopt.backends.cuda import runtime as cg
    major, minor = (int(v) for v in cc_str.split("."))

    class _Dev:  # device functions ask the current device for its compute capability; there is none
        compute_capability = (major, minor)
    D.get_current_device = lambda: _Dev()

    out = []
    for rule in catalog():
        for dt in (np.float32, np.complex64):
            if np.dtype(dt).kind == "c" and not all(type(m).supports_complex for m in rule.rules):
                continue
            mod = cg.kernels(rule, dt)
            sigs = {name: tuple(T.int64 if isinstance(a, int) else typeof(a) for a in args)
                    for name, args in _stand_ins(ChainLayout(rule), mod.plan, dt).items()}
            for name, sig in sigs.items():
                rec = {"rule": _name(rule), "dtype": np.dtype(dt).name, "kernel": name}
                try:
                    ptx, _ = cuda.compile_ptx(getattr(mod, name).py_func, tuple(sig), cc=(major, minor))
                    rec.update(ok=True, f64_ops=len(re.findall(r"\.f64\b", ptx)), ptx_lines=ptx.count("\n"))
                except Exception as e:
                    rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[:500]}")
                out.append(rec)
                print(("ok  " if rec["ok"] else "FAIL"), rec["dtype"], name, rec["rule"],
                      f"f64 ops {rec.get('f64_ops')}" if rec["ok"] else rec["error"], flush=True)
    return out


def _stand_ins(lay, plan, dt):
    """Per kernel, host arrays shaped and typed as the backend passes device arrays (Numba types both alike), for
    a leaf of shape (4, 6): what the PTX check compiles each kernel for."""
    import numpy as np
    from numbaopt.compiler import real_dtype
    shape, n = (4, 6), 24
    x = np.zeros(n, dt)
    S = list(lay.new_state(n, dt)) + list(lay.new_units([shape], dt))
    hp, ints = lay.hyper_vector(1, None, dt), np.zeros(1, np.int64)
    fin, st = np.zeros((1, plan.fin_cols)), np.zeros(1, np.int64)
    red = [fin, st] if plan.phases else []
    tables, slot_tables = [], {}
    for _, s, kind_, extra in plan.specs:
        d = lay.unit_decls[extra][1] if kind_ == "NU" else None
        t = np.zeros(n, np.float64 if d is None else (real_dtype(dt) if d.real else dt))
        tables.append(t)
        slot_tables.setdefault(s, []).append(t)
    X = tables + ([np.zeros((1, len(lay.axis_slots)), np.int64)] if lay.axis_rules else [])
    head = [ints] * 6
    sigs = {"inplace": [x, x] + S + [hp, 1] + red + X, "outplace": [x, x] + S + [hp, 1] + red + X + [x] + S,
            "multi": head + S + [hp, 1] + red + X}
    units = lay.unit_arrays(S)
    for r in plan.phases:
        if r in lay.axis_rules:
            sigs[f"axred_k{r}"] = [x, x] + S + [hp, 1] + red + X
            sigs[f"maxred_k{r}"] = head + S + [hp, 1] + red + X
            for s, (q, a) in enumerate(lay.axis_slots):
                if q == r:
                    mine = [units[u] for u in lay.unit_slots[r].get(a, [])]
                    sigs[f"axfin_k{r}_{a}"] = [hp, 1, S[-1]] + mine + [ints, X[-1], 1] + slot_tables[s]
            continue
        acc = np.zeros((1, plan.acc_cols))
        sigs[f"reduce_k{r}"] = [x, x] + S + [hp, 1] + red + [acc] + X
        sigs[f"mreduce_k{r}"] = head + S + [hp, 1] + red + [acc] + X
        sigs[f"finish_k{r}"] = [acc, hp, fin, st, 1, 1] + [units[u] for u in lay.scalar_units(r)]
    return sigs


def _table(rows):
    lines = [f"{'case':6} {'impl':28} {'elements':>12} {'leaves':>6} {'median':>11} {'GB/s':>8} {'% copy':>7}"]
    for r in rows:
        head = f"{r['case']:6} {r['impl'][:28]:28} {r['elements']:12d} {r['leaves']:6d} "
        if "error" in r:
            lines.append(head + "failed: " + r["error"][:80])
            continue
        pct = f"{r['pct_of_copy']:6.1f}%" if r["pct_of_copy"] is not None else "     -"
        lines.append(head + f"{r['median_s'] * 1e6:9.1f}us {r['GBps']:8.1f} {pct}")
    return "\n".join(lines)


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.sim and "numba" not in sys.modules:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # must precede the first import of numba
    report = {"argv": list(sys.argv[1:] if argv is None else argv), "python": platform.python_version(),
              "host": platform.node()}
    if args.ptx:
        report["ptx"] = ptx_check(args.ptx)
        report["ptx_failed"] = [r for r in report["ptx"] if not r["ok"]]
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"{len(report['ptx'])} kernels compiled, {len(report['ptx_failed'])} failed; wrote {args.json}")
        return report

    import warnings
    import numba
    from numba import cuda
    from numbaopt.backends.cuda import runtime as cc
    for mod in ("numba.core.errors", "numba.cuda.core.errors"):  # small grids in the rule check are deliberate
        try:
            warnings.simplefilter("ignore", __import__(mod, fromlist=["x"]).NumbaPerformanceWarning)
        except (ImportError, AttributeError):
            pass
    sim = cc.SIM
    if args.sim and not sim:
        raise SystemExit("--sim: numba was imported before NUMBA_ENABLE_CUDASIM=1 could be set")
    report["simulator"] = sim
    report["numba"] = numba.__version__
    try:
        import importlib.metadata as md
        report["numba_cuda"] = md.version("numba-cuda")
    except Exception:
        report["numba_cuda"] = None
    if not sim:
        dev = cuda.get_current_device()
        report["device"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        report["compute_capability"] = list(dev.compute_capability)
        report["multiprocessors"] = dev.MULTIPROCESSOR_COUNT
    else:
        report["device"] = "CUDA simulator"
    sizes = [_size(s) for s in (args.sizes or ("64,200" if sim else "1M,16M,256M")).split(",")]
    lv, ls = (args.leaves or ("3x40" if sim else "1000x1000")).lower().split("x")
    repeat = args.repeat or (1 if sim else 7)
    print(f"device: {report['device']}; numba {report['numba']}, numba-cuda {report['numba_cuda']}", flush=True)

    if not args.no_rules:
        t0 = time.perf_counter()
        res = check_rules(37 if sim else 4099, 2 if sim else 5, complex_rules=2 if sim else 6,
                          max_rules=args.max_rules)
        report["rules"] = res
        report["rules_checked"] = len(res)
        report["rules_failed"] = [r["rule"] + " " + r["dtype"] for r in res if not r["ok"]]
        print(f"rules: {len(res)} checked, {len(report['rules_failed'])} failed "
              f"({time.perf_counter() - t0:.1f} s, compile included)", flush=True)
        for r in res:
            if not r["ok"]:
                print("  FAIL", r)
        with open(args.json, "w") as fh:  # kept even if the timings below crash the process
            json.dump(report, fh, indent=1)
    rows = time_cases(sizes, int(lv), _size(ls), repeat, 0.0 if sim else 0.2, 1 if sim else 2000,
                      not args.no_torch and not sim)
    report["timings"] = rows
    big = [r for r in rows if r["case"] == "adam" and r["impl"] == "numbaopt" and r["elements"] >= 16 << 20]
    report["target_85pct_of_copy_16M_plus"] = (all((r.get("pct_of_copy") or 0) >= 85 for r in big)
                                               if big else None)
    print(_table(rows))
    with open(args.json, "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    rep = main()
    sys.exit(1 if rep.get("rules_failed") or rep.get("ptx_failed") else 0)
