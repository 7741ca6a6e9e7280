"""Where a test run's compile time goes: a pytest plugin that counts numba's compile events, and their summary.

Every pytest process that loads the plugin (``-p suite_compiles``; through ``PYTEST_ADDOPTS`` it reaches the
xdist workers and the simulator suite's processes too) listens to numba's ``numba:compile`` events and, at exit,
writes its totals per compiled function to ``$NUMBAOPT_SUITE_COMPILES/<pid>.json``: the outermost compiles (what
a test waited for) and, apart, the compiles nested in them (a kernel's callees). Generated kernels are named
``gen:<kernel>`` (``gen:multi``, ``gen:inplace``, ...), others ``<top-level module>:<function>``; the outermost
compiles are also summed per test (the test running when they started, its fixtures' set-up included). A load from
the disk cache sends no event, so a warm cache counts nothing. Processes that are not pytest's (the MPI ranks,
scripts the tests start) are not counted.

Run (docs/performance.md, "The test suite")::

    rm -rf /tmp/suite_compiles
    PYTHONPATH=benchmarks PYTEST_ADDOPTS="-p suite_compiles" NUMBAOPT_SUITE_COMPILES=/tmp/suite_compiles \\
        NUMBAOPT_CACHE_DIR="$(mktemp -d)" .venv/bin/python -m pytest -q -n 2 --dist worksteal tests
    .venv/bin/python benchmarks/suite_compiles.py /tmp/suite_compiles
"""
from __future__ import annotations

import argparse
import atexit
import collections
import glob
import json
import os
import time

OUT = os.environ.get("NUMBAOPT_SUITE_COMPILES")


def _name(dispatcher) -> str:
    f = dispatcher.py_func
    mod = f.__module__ or ""
    return f"{'gen' if 'nbo_' in mod else mod.split('.')[0]}:{f.__qualname__}"


def install(out: str) -> None:
    """Count this process's compiles; write them to ``out/<pid>.json`` at exit."""
    from numba.core import event

    totals: dict = collections.defaultdict(lambda: [0, 0.0])  # name -> [count, seconds]
    tests: dict = collections.defaultdict(lambda: [0, 0.0])  # test id -> [count, seconds] (outermost)
    stack: list = []

    class Listener(event.Listener):
        def on_start(self, ev):
            stack.append(time.perf_counter())

        def on_end(self, ev):
            took = time.perf_counter() - stack.pop()
            rows = [totals[_name(ev.data["dispatcher"]) + ("@nested" if stack else "")]]
            if not stack:  # an outermost compile: what the running test waited for
                rows.append(tests[_CURRENT[0]])
            for t in rows:
                t[0] += 1
                t[1] += took

    event.register("numba:compile", Listener())

    def write():
        if totals:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
                json.dump({"functions": totals, "tests": tests}, f)

    atexit.register(write)


#: the id of the test running in this process (outside any test: "(collection)")
_CURRENT = ["(collection)"]


def pytest_runtest_logstart(nodeid, location):
    """pytest hook: a test's set-up begins; its compiles are counted under its id."""
    _CURRENT[0] = nodeid


if OUT and __name__ != "__main__":  # loaded as a pytest plugin
    install(OUT)


def summary(folder: str, top: int = 25) -> str:
    """The tables of the processes' totals in ``folder``: outermost compiles, nested ones, then per test."""
    outer: dict = collections.defaultdict(lambda: [0, 0.0])
    nested: dict = collections.defaultdict(lambda: [0, 0.0])
    tests: dict = collections.defaultdict(lambda: [0, 0.0])
    files = glob.glob(os.path.join(folder, "*.json"))
    for path in files:
        with open(path) as f:
            got = json.load(f)
        for name, (count, seconds) in got["functions"].items():
            t = nested[name[:-7]] if name.endswith("@nested") else outer[name]
            t[0] += count
            t[1] += seconds
        for name, (count, seconds) in got["tests"].items():
            tests[name][0] += count
            tests[name][1] += seconds
    lines = [f"{len(files)} processes; outermost compiles: {sum(c for c, _ in outer.values())}, "
             f"{sum(s for _, s in outer.values()):.0f} s", "", "| compiled | count | seconds | each |",
             "|---|---:|---:|---:|"]
    for title, table in (("", outer), ("nested: ", nested)):
        for name, (count, seconds) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
            lines.append(f"| {title}`{name}` | {count} | {seconds:.1f} | {seconds / count:.2f} |")
    lines += ["", "| test | compiles | seconds |", "|---|---:|---:|"]
    for name, (count, seconds) in sorted(tests.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"| `{name}` | {count} | {seconds:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", help="the NUMBAOPT_SUITE_COMPILES folder of a test run")
    ap.add_argument("--top", type=int, default=25, help="rows per table")
    args = ap.parse_args()
    print(summary(args.folder, args.top))


if __name__ == "__main__":
    main()
