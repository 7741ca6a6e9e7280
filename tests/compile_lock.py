"""One compile of a kernel at a time across the processes of a test run.

Processes that meet the same uncompiled kernel at the same time (``make test``'s two pytest-xdist workers, the
simulator suite's process beside a worker, the ranks of an MPI test, which all compile the same kernels in
step) would each compile it: seconds of CPU apiece, cold. Under a lock per kernel (a file lock, keyed by numba's
cache index of the function and the signature) the first compiles and saves it to the disk cache, the others wait
and then load it from there (numba's own ``Dispatcher.compile`` runs unchanged under the lock: it looks in the
disk cache before compiling). Dispatchers without a disk cache are left alone. Used by tests/conftest.py and
tests/mpi/harness.py.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading


def install():
    """Wrap numba's ``Dispatcher.compile`` (once per process) in a file lock per kernel."""
    try:
        import fcntl

        from numba.core import dispatcher
        from numba.core.caching import NullCache
        from numba.core.compiler_lock import global_compiler_lock
    except ImportError:
        return
    original = dispatcher.Dispatcher.compile
    if getattr(original, "numbaopt_tests_locked", False):
        return
    here = threading.local()
    lock_dir = os.path.join(tempfile.gettempdir(), f"numbaopt-test-compile-locks-{os.getuid()}")

    def compile(self, sig):
        cache = getattr(self, "_cache", None)
        if getattr(here, "depth", 0) or cache is None or isinstance(cache, NullCache):
            return original(self, sig)  # nested, or nothing on disk to share
        where = getattr(getattr(cache, "_cache_file", None), "_index_path", None) or repr(self.py_func)
        # 4096 lock files at most: two kernels that share one wait for each other, nothing worse
        name = hashlib.sha1(f"{where}|{sig}".encode()).hexdigest()[:3] + ".lock"
        with global_compiler_lock:  # always this process's compiler lock first, then the file: no cycle
            here.depth = 1
            try:
                os.makedirs(lock_dir, exist_ok=True)
                fd = os.open(os.path.join(lock_dir, name), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    return original(self, sig)  # loads from the disk cache what another process just saved
                finally:
                    os.close(fd)
            finally:
                here.depth = 0

    compile.numbaopt_tests_locked = True
    dispatcher.Dispatcher.compile = compile

