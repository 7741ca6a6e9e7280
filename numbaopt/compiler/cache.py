"""Generated modules on disk: written under the hash of their text, imported once per process.

Numba's ``cache=True`` needs functions defined in a real source file, so every generated module is written
to :func:`cache_dir` under a content-hashed name (atomically) and imported from there: an unchanged chain
loads its compiled kernels from Numba's disk cache in every later process, a changed definition is a new
file. :func:`kernels` is the CPU registry: one module per (chain, compute dtype) and process.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

import numpy as np

from . import cpu
from .inliner import STAMP as INLINER_STAMP, finish_source

__all__ = ["cache_dir", "import_generated", "kernels", "rule_key", "chain_key", "module_lock", "cached"]

#: serialises generating and importing modules (kernels are looked up without it)
module_lock = threading.RLock()
_modules: dict = {}


def cache_dir() -> str:
    """Where generated kernel modules (and Numba's cache of them) live.

    ``NUMBAOPT_CACHE_DIR`` overrides; default ``$XDG_CACHE_HOME/numbaopt`` (``~/.cache/numbaopt``).
    """
    d = os.environ.get("NUMBAOPT_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "numbaopt")
    return os.path.join(d, f"kernels-v{cpu.GENERATOR_VERSION}")


def _write_module(text: str, finish=None, stamp: bytes = b"") -> str:
    """The file of ``text`` (of ``finish(text)`` when given, run only when the file is new, so that a later
    process skips it; the name hashes ``text`` and ``stamp``, which changes with ``finish``'s code)."""
    digest = hashlib.sha256(text.encode() + stamp).hexdigest()[:20]
    d = cache_dir()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"nbo_{digest}.py")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(text if finish is None else finish(text))
        os.replace(tmp, path)  # atomic: another process sees the whole file or none
    return path


def import_generated(text: str, prefix: str = "", finish=None, stamp: bytes = b""):
    """Write generated source to the cache (content-hashed file name) and import it once per process.

    The module is named after the file (plus ``prefix``, for generators whose text could coincide);
    ``module.source_path`` is the file. ``finish``: a last transformation of the text, run only when the file
    does not exist yet; ``stamp``: bytes that change with ``finish``'s code (hashed into the name).
    """
    path = _write_module(text, finish, stamp)
    name = prefix + os.path.splitext(os.path.basename(path))[0]
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mod.source_path = path
    return mod


def rule_key(rule) -> tuple:
    """What decides a member's generated code: its class (module, name, source hash) and options."""
    cls = type(rule)
    return (cls.__module__, cls.__qualname__, cls.source_fingerprint(), tuple(sorted(rule.option_values().items())))


def chain_key(rule) -> tuple:
    """What decides a chain's generated code (its members' :func:`rule_key`): two rules of equal keys run the same
    kernels, whatever their hyperparameters."""
    return tuple(rule_key(r) for r in rule.rules)


def cached(key, make):
    """The module ``make()`` returns, once per ``key`` and process (thread-safe)."""
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with module_lock:
        mod = _modules.get(key)
        if mod is None:
            mod = _modules[key] = make()
    return mod


def kernels(rule, dtype):
    """The generated CPU module for ``rule`` (a rule or chain) and compute dtype ``dtype``."""
    dtype = np.dtype(dtype)
    key = ("cpu", chain_key(rule), dtype.str)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    return cached(key, lambda: import_generated(cpu.raw_source(rule, dtype), finish=finish_source,
                                                    stamp=INLINER_STAMP))
