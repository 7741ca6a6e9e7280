"""The package's layering: imports go one way, no cycle, no private name across modules, short files, and
``import numbaopt`` pulls in none of the optional extras."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "numbaopt")

#: the layers, lowest first: a module may import from its own layer and the ones before it
LAYERS = ["numbaopt.schedules", "numbaopt.rules", "numbaopt.compiler", "numbaopt.backends", "numbaopt.tree",
          "numbaopt.api", ("numbaopt.loops", "numbaopt.persist", "numbaopt.docs", "numbaopt.plateau",
                           "numbaopt.evaluation"),
          ("numbaopt.mpi", "numbaopt.quantum"), "numbaopt"]
MAX_LINES = 500


def _modules():
    out = {}
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[rel[:-9] if rel.endswith(".__init__") else rel] = path
    return out


def _layer(mod):
    for k, entry in enumerate(LAYERS):
        names = entry if isinstance(entry, tuple) else (entry,)
        if any(mod == n or (n != "numbaopt" and mod.startswith(n + ".")) for n in names):
            return k
    return len(LAYERS) - 1


def _imports(mods):
    """``{module: {(imported module, name or None), ...}}`` for imports of numbaopt modules (also in functions)."""
    edges = {}
    for m, path in mods.items():
        is_pkg = path.endswith("__init__.py")
        base = m.split(".") if is_pkg else m.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base[:len(base) - node.level + 1] + (node.module.split(".") if node.module else [])
                    target = ".".join(parts)
                else:
                    target = node.module or ""
                if not target.startswith("numbaopt"):
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    found.add((sub, None) if sub in mods else (target, a.name))
            elif isinstance(node, ast.Import):
                found |= {(a.name, None) for a in node.names if a.name.startswith("numbaopt")}
        edges[m] = found
    return edges


def test_imports_go_down_the_layers_without_cycles_or_private_names():
    mods = _modules()
    edges = _imports(mods)
    upward, private = [], []
    for m, targets in edges.items():
        for t, name in targets:
            if t not in mods:
                continue
            if t != m and _layer(t) > _layer(m) and not m.startswith(t + "."):
                upward.append(f"{m} -> {t}")
            if name and name.startswith("_") and not name.startswith("__") and t != m:
                private.append(f"{m} <- {t}.{name}")
    assert not upward, upward
    assert not private, private
    graph = {m: {t for t, _ in ts if t in mods and t != m} for m, ts in edges.items()}
    # a package's __init__ re-exporting its children is no cycle by itself
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state, cycles = {}, []

    def visit(u, stack):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                cycles.append(stack[stack.index(v):] + [v])
            elif not state.get(v):
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if not state.get(u):
            visit(u, [])
    assert not cycles, cycles


def test_files_are_short():
    long = [f"{m} ({sum(1 for _ in open(p))})" for m, p in _modules().items() if sum(1 for _ in open(p)) > MAX_LINES]
    assert not long, long


#: imports each module named on the command line in a process of its own, forked (two at a time) from one that has
#: imported only numpy and numba, which every numbaopt module imports first (a fresh interpreter each would spend
#: ~0.45 s of its ~0.5 s importing them again: ~50 s of CPU for the package); prints the failures' stderr tails
_IMPORT_EACH = """
import os, sys, tempfile
import numpy, numba
assert not any(m == "numbaopt" or m.startswith("numbaopt.") for m in sys.modules)
todo, running, bad = sys.argv[1:], {}, []
while todo or running:
    while todo and len(running) < 2:
        m = todo.pop()
        err = tempfile.TemporaryFile()
        pid = os.fork()
        if pid == 0:
            os.dup2(err.fileno(), 2)
            try:
                __import__(m)
            except BaseException:
                import traceback
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        running[pid] = (m, err)
    pid, status = os.wait()
    m, err = running.pop(pid)
    if status:
        err.seek(0)
        bad.append((m, err.read()[-300:].decode(errors="replace")))
    err.close()
print(sorted(bad))
"""


def test_every_module_imports_alone_and_the_package_needs_no_extras():
    """Each module imports in a process of its own first (no hidden order dependence among numbaopt's modules), and
    ``import numbaopt`` imports none of numba.cuda, torch, jax, mpi4py, pennylane, matplotlib, tqdm."""
    mods = sorted(m for m in _modules() if not m.startswith("numbaopt.backends.cuda.runtime"))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    each = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *mods], capture_output=True, text=True, env=env,
                          timeout=900)
    assert each.returncode == 0 and each.stdout.strip() == "[]", each.stdout[-3000:] + each.stderr[-3000:]
    code = ("import sys, numbaopt\n"
            "extras = ('numba.cuda', 'torch', 'jax', 'mpi4py', 'pennylane', 'matplotlib', 'tqdm')\n"
            "print(sorted(n for n in extras if n in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=True).stdout
    assert out.strip() == "[]", out


def test_import_numbaopt_loads_the_optional_parts_on_first_use():
    """``import numbaopt`` imports no compiled loops, persistence, MPI, quantum or docs code, and nothing
    (scipy included) beyond what numba imports itself; ``numbaopt.save``, ``numbaopt.mpi``, ``numbaopt.quantum``
    and the other lazy names then load on first access, as attributes and through ``from numbaopt import``."""
    code = ("import sys\n"
            "import numba\n"
            "before = set(sys.modules)\n"
            "import numbaopt as no\n"
            "lazy = ('numbaopt.mpi', 'numbaopt.quantum', 'numbaopt.persist', 'numbaopt.loops', 'numbaopt.docs',\n"
            "        'mpi4py', 'scipy', 'torch', 'jax', 'matplotlib', 'pennylane', 'tqdm', 'numba.cuda')\n"
            "new = set(sys.modules) - before\n"
            "print(sorted(m for m in new if any(m == n or m.startswith(n + '.') for n in lazy)))\n"
            "assert set(no.__all__) <= set(dir(no))\n"
            "assert not hasattr(no, 'no_such_name')\n"
            "assert no.save is sys.modules['numbaopt.persist'].save\n"
            "from numbaopt import CheckpointError, load_state_dict, minimize\n"
            "assert minimize is sys.modules['numbaopt.loops'].minimize and callable(load_state_dict)\n"
            "assert no.mpi is sys.modules['numbaopt.mpi'] and callable(no.mpi.minimize)\n"
            "assert no.quantum is sys.modules['numbaopt.quantum'] and callable(no.quantum.minimize_qng)\n"
            "assert all(hasattr(no, n) for n in no.__all__)\n"
            "print(sorted(n for n in ('mpi4py', 'torch', 'jax', 'matplotlib', 'pennylane') if n in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.splitlines()
    assert out == ["[]", "[]"], out
