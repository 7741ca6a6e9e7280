"""The compile notice: a public call that compiled for more than a threshold says so, in one log record.

Numba broadcasts a ``numba:compile`` event around every real compilation (not around a load from its disk
cache). One listener, registered when this module is imported, times each thread's outermost compilations and
charges them to the outermost numbaopt public call on that thread's stack (the functions given to
:func:`register`, found by walking the frames when a compilation starts): a call that compiles nothing runs
none of this. Once a call has compiled something, a profile hook (``sys.setprofile``, this thread only,
suspended while Numba compiles) waits for that call's return, and then, when the total passed the threshold,
logs ONE record on the logger ``numbaopt.compile`` at WARNING (seen by default through Python's last-resort
handler; ``logging.getLogger("numbaopt.compile").setLevel(logging.ERROR)`` silences it). Nested public calls
are charged to the outermost one; a call marked ``quiet`` (``numbaopt.precompile``: the user chose to pay
there) logs at INFO. Compilations on a thread outside any numbaopt call (your own ``@njit`` functions) are not
reported; a call running on another thread is reported from that thread. When another profiler holds the
thread's profile hook, nothing is installed: the record is logged when the threshold is crossed, with the time
compiled so far.

The threshold: ``NUMBAOPT_COMPILE_NOTICE`` (seconds, default 1.0) when the module is imported, then
:func:`set_threshold`.
"""
from __future__ import annotations

import linecache
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from numba.core import event

from .cache import cache_dir

__all__ = ["logger", "register", "set_threshold", "threshold"]

#: the logger of the notice (``numbaopt.compile``)
logger = logging.getLogger("numbaopt.compile")

# id of a code object -> (the public name, quiet, the code object: kept alive, so its id is never reused). By id:
# a code object's hash and equality read its bytecode, which CPython rewrites in place as it specialises it
_publics: dict = {}


def _from_env() -> float:
    try:
        return max(float(os.environ.get("NUMBAOPT_COMPILE_NOTICE", "1.0")), 0.0)
    except ValueError:  # a malformed value: the default (the import must not fail over it)
        return 1.0


_limit = [_from_env()]
_HEADER = re.compile(r"(?:chain: |\()(.+?); dtype (\w+)")


def threshold() -> float:
    """Seconds of compilation from which a public call logs the compile notice."""
    return _limit[0]


def set_threshold(seconds: float) -> float:
    """Set the compile notice's threshold (seconds; 0 reports every call that compiled anything; ``inf``: never).
    Returns the old value."""
    s = float(seconds)
    if not s >= 0.0:
        raise ValueError(f"the compile notice threshold must be >= 0 seconds, got {seconds!r}")
    old, _limit[0] = _limit[0], s
    return old


def register(*functions: Callable[..., Any], name: str | None = None, quiet: bool = False) -> None:
    """Mark ``functions`` as public calls: compilation inside them is charged to the outermost one on the stack.
    Nothing wraps them (they run as they are): their code objects are looked up when a compilation starts."""
    for f in functions:
        code = getattr(f, "__code__", None)
        if code is None:
            raise TypeError(f"register: {f!r} is not a Python function")
        _publics[id(code)] = (name or f.__name__, quiet, code)


class _Thread(threading.local):
    depth = 0  # nesting of numba:compile events on this thread
    t0 = 0.0  # start of the outermost compilation being charged, or -1.0: not charged
    frame = 0  # id of the public call's frame being charged (0: none); alive while the call runs
    name = ""
    quiet = False
    total = 0.0
    what: list = []
    hooked = False  # our profile hook watches the charged call (taken off while Numba compiles)
    reported = False


_th = _Thread()


def _public_frame():
    """``(frame, (name, quiet))`` of the outermost registered call on this thread's stack, or ``(None, None)``."""
    f = sys._getframe(2)
    found, info = None, None
    get = _publics.get
    while f is not None:
        i = get(id(f.f_code))
        if i is not None:
            found, info = f, i
        f = f.f_back
    return found, info


def _describe(dispatcher) -> str:
    """What a dispatcher compiled: ``Adam on float32`` for a generated kernel module (``the compiled loop of
    Adam on float32`` for a loop driver's), else the function's name."""
    py = getattr(dispatcher, "py_func", None)
    mod = sys.modules.get(getattr(py, "__module__", None) or "")
    path = getattr(mod, "source_path", None)
    if path:  # the generated modules' headers name their chain and dtype in their first lines
        for k in (1, 2, 3):
            line = linecache.getline(path, k)
            m = _HEADER.search(line)
            if m:
                loop = "the compiled loop of " if line.startswith("# drivers") else ""
                return f"{loop}{m.group(1)} on {m.group(2)}"
    return getattr(py, "__qualname__", None) or repr(dispatcher)


def _hook(frame, ev, arg):
    th = _th
    if ev == "return" and id(frame) == th.frame:
        sys.setprofile(None)
        th.hooked = False
        _finish(th)


def _finish(th) -> None:
    """The charged call returned: its record, if it compiled long enough; then forget it."""
    th.frame = 0
    if not th.reported and (th.total >= _limit[0] or th.quiet) and th.total > 0.0:
        _emit(th, False)


def _emit(th, so_far: bool) -> None:
    th.reported = True
    what = list(dict.fromkeys(th.what))
    kernels = [w for w in what if " on " in w]
    others = [w for w in what if " on " not in w]
    parts = kernels[:4] + ([f"{len(kernels) - 4} more chains"] if len(kernels) > 4 else [])
    parts += others[:3] + ([f"{len(others) - 3} more functions"] if len(others) > 3 else [])
    detail = "first use of " + ", ".join(parts) if parts else "first use"
    if kernels:
        detail += f"; kept in the kernel cache {os.path.dirname(cache_dir())} for later processes"
    if th.name in ("setup", "update", "update_", "adjust", "adjust_") and not th.quiet:
        detail += "; numbaopt.precompile(state, model) compiles ahead"
    verb = "has compiled" if so_far else "compiled"
    so = " so far" if so_far else ""
    logger.log(logging.INFO if th.quiet else logging.WARNING, "numbaopt: %s %s for %.1f s%s (%s)",
               th.name, verb, th.total, so, detail)


class _Listener(event.Listener):
    """Times each thread's outermost compilations and charges them to its outermost public call. A failure
    here must never fail a compilation: it is dropped (the notice is lost, nothing else)."""

    def on_start(self, ev):
        th = _th
        th.depth += 1
        if th.depth != 1:
            return
        try:
            self.started(th, ev)
        except Exception:
            th.t0 = -1.0

    def on_end(self, ev):
        th = _th
        th.depth -= 1
        if th.depth != 0 or th.t0 < 0.0:
            return
        try:
            self.ended(th)
        except Exception:
            pass

    @staticmethod
    def started(th, ev) -> None:
        f, info = _public_frame()
        if f is None:
            th.t0 = -1.0
            return
        fid = id(f)
        del f
        if fid != th.frame:  # a new call (a call that compiled nothing charged before, or the first one)
            th.frame, (th.name, th.quiet, _) = fid, info
            th.total, th.what, th.reported = 0.0, [], False
        if th.hooked:
            if sys.getprofile() is _hook:
                sys.setprofile(None)  # no hook while Numba compiles (it would slow the compiler down)
            else:  # someone else set the thread's profiler since: leave it
                th.hooked = False
        data = ev.data
        if isinstance(data, dict) and "dispatcher" in data:
            th.what.append(_describe(data["dispatcher"]))
        th.t0 = time.perf_counter()

    @staticmethod
    def ended(th) -> None:
        th.total += time.perf_counter() - th.t0
        current = sys.getprofile()
        if current is None or current is _hook:  # watch for the return of the charged call
            th.hooked = True
            sys.setprofile(_hook)
        elif not th.reported and th.total >= _limit[0]:  # another profiler: say it now, once
            th.hooked = False
            _emit(th, True)


_listener = _Listener()
event.register("numba:compile", _listener)
