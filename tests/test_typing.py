"""The typed public API: ``py.typed`` is shipped, every package's ``__all__`` is explicit and complete, and
mypy (``--strict --no-implicit-reexport``) accepts a user's annotated script (``tests/typing_user.py``, which
also runs here, so the types it asserts are the ones returned) and reports the mistakes of a second one.

The package itself is checked with ``.venv/bin/mypy numbaopt --ignore-missing-imports`` (not a test: the
engine's internals are dynamically typed; see docs/architecture.md, "Typing").
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types

import pytest

import numbaopt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER = os.path.join(ROOT, "tests", "typing_user.py")
# public names a package binds but deliberately leaves out of ``__all__``
NOT_EXPORTED = {"numbaopt.rules": {"BUILTIN"}}  # the catalogue's order, read by numbaopt.docs

# one error per marked line (``# E: <code>``); mypy must report each of them, and nothing else
MISTAKES = '''
from __future__ import annotations
import numpy as np
import numbaopt as no
from numbaopt.api import Leaf  # E: attr-defined

x = np.zeros(3)
g = np.ones(3)
state = no.setup(no.Adam(), x)
no.update(g, state, x)  # E: call-overload
no.update_(state, x, "g")  # E: call-overload
tree_state: no.Leaf = no.setup(no.Adam(), {"w": x})  # E: assignment
no.setup("adam", x)  # E: call-overload
no.adjust(state, lr="big")  # E: call-overload
res = no.minimize(lambda x, g: 0.0, x, no.Adam())
res.solution  # E: attr-defined
no.freeze_(state)  # E: type-var
no.cosine(1e-3, steps="many")  # E: arg-type
'''


def _mypy():
    exe = shutil.which("mypy", path=os.path.dirname(sys.executable))
    if exe is None:
        try:
            import mypy  # noqa: F401
        except ImportError:
            pytest.skip("mypy is not installed (pip install numbaopt[typing])")
        return [sys.executable, "-m", "mypy"]
    return [exe]


def _run_mypy(*files):
    # --follow-imports=silent: numbaopt is checked as an installed typed package would be (its own
    # errors are not the user's); the cache lives outside the checkout and makes later runs fast
    cmd = _mypy() + ["--strict", "--allow-untyped-calls", "--no-implicit-reexport", "--follow-imports=silent",
                     "--show-error-codes", "--no-error-summary", "--python-version",
                     f"{sys.version_info[0]}.{sys.version_info[1]}",
                     "--cache-dir", os.path.join(tempfile.gettempdir(), "numbaopt-mypy-cache"), *files]
    env = dict(os.environ, MYPYPATH=ROOT)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 2: mypy itself failed
    return r.stdout


def test_py_typed_is_shipped():
    assert os.path.isfile(os.path.join(ROOT, "numbaopt", "py.typed"))
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*numbaopt\s*=\s*\["py\.typed"\]', text)


def test_all_is_explicit_and_complete():
    names = ["numbaopt"] + [m.name for m in pkgutil.walk_packages(numbaopt.__path__, "numbaopt.") if m.ispkg]
    assert "numbaopt.tree" in names and "numbaopt.backends.cuda" in names
    for name in names:
        mod = importlib.import_module(name)
        exported = getattr(mod, "__all__", None)
        assert isinstance(exported, list), f"{name} has no __all__ list"
        assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
        missing = [n for n in exported if not hasattr(mod, n)]
        assert not missing, f"{name}.__all__ lists names it does not bind: {missing}"
        public = {n for n, v in vars(mod).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
        unlisted = public - set(exported) - NOT_EXPORTED.get(name, set())
        assert not unlisted, f"{name} binds public names outside __all__: {sorted(unlisted)}"


def test_state_alias_works_at_run_time():
    import numpy as np
    assert isinstance(numbaopt.setup(numbaopt.Adam(), np.ones(2)), numbaopt.State)
    assert isinstance(numbaopt.setup(numbaopt.Adam(), {"w": np.ones(2)}), numbaopt.State)


def test_user_script_runs():
    """What typing_user.py asserts about its types holds at run time (isinstance next to assert_type)."""
    r = subprocess.run([sys.executable, USER], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "typing_user: ok" in r.stdout


@pytest.mark.slow  # mypy: ~3 s with a warm cache, ~25 s cold on a small machine
def test_mypy_accepts_the_user_script_and_reports_mistakes(tmp_path):
    bad = tmp_path / "mistakes.py"
    bad.write_text(textwrap.dedent(MISTAKES))
    out = _run_mypy(USER, str(bad))
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert not [e for e in errors if "typing_user.py" in e], out
    got = {}
    for e in errors:
        m = re.match(r".*mistakes\.py:(\d+): error: .*\[([\w-]+)\]$", e)
        assert m, e
        got.setdefault(int(m.group(1)), set()).add(m.group(2))
    want = {i: {c} for i, line in enumerate(bad.read_text().splitlines(), 1)
            for c in re.findall(r"# E: ([\w-]+)", line)}
    assert len(want) == 9
    assert got == want, out
