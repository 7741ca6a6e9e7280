"""The CUDA backend without a GPU: the simulator suite (``tests/cudasim``) in processes of its own, and the
promises that hold without numba-cuda at all (import cost, the install hint, device-array detection)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbaopt as no
from numbaopt.backends import cuda as nc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_numba_cuda() -> bool:
    import importlib.util
    return importlib.util.find_spec("numba_cuda") is not None


def _python(code, **env):
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, env=e, timeout=300)


#: the simulator suite's files, one process each (pytest-xdist runs them side by side)
SIM_FILES = sorted(f for f in os.listdir(os.path.join(ROOT, "tests", "cudasim"))
                   if f.startswith("test_") and f.endswith(".py"))


@pytest.mark.skipif(not _has_numba_cuda(), reason="numba-cuda (the simulator) is not installed")
@pytest.mark.parametrize("part", SIM_FILES)
def test_simulator_suite(part):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        os.path.join("tests", "cudasim", part)], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout.splitlines()[-1]


def test_importing_numbaopt_does_not_import_numba_cuda():
    r = _python("""
        import sys, numpy as np, numbaopt as no
        s = no.setup(no.Adam(), np.ones(3, np.float32))
        no.update_(s, np.ones(3, np.float32), np.ones(3, np.float32))
        assert not any(m == "numba.cuda" or m.startswith("numba.cuda.") for m in sys.modules), \\
            sorted(m for m in sys.modules if "cuda" in m)
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_device_array_without_numba_cuda_says_what_to_install():
    r = _python("""
        import sys
        sys.modules["numba.cuda"] = None  # as if numba-cuda were not installed
        import numpy as np, numbaopt as no

        class FakeGpuArray:
            __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (1, False), "version": 3}

        try:
            no.setup(no.Adam(), FakeGpuArray())
        except ImportError as e:
            print("hint:", e)
    """)
    assert "pip install numbaopt[cuda]" in r.stdout, r.stdout + r.stderr


def test_device_array_detection_needs_no_gpu_library():
    class CAI:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}

    assert nc.is_device_array(CAI())
    assert not nc.is_device_array(np.zeros(3))
    assert not nc.is_device_array([np.zeros(3)])
    assert {"DeviceLeaf", "DeviceGroup", "setup_device_group", "cuda_available"} <= set(no.__all__)
