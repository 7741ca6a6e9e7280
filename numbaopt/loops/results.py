"""What the loops return: :class:`OptimizeResult` (one problem) and :class:`BatchResult` (a batch)."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["OptimizeResult", "BatchResult"]


class OptimizeResult:
    """What :func:`minimize` returns.

    ``x`` (the final parameters), ``fun`` (the loss at ``x``), ``nit`` (iterations: gradient
    evaluations followed by a step), ``nfev`` (objective evaluations), ``converged`` (a tolerance, or
    ``f_target``, was met; ``success`` is an alias), ``status`` (a reason code: ``numbaopt.loops.GTOL``...)
    and ``message`` (the reason in words), ``history`` (the loss at every iterate: ``history[k]`` at
    ``x_k``, ``nit + 1`` values; with SPSA the first ``nit`` are the mean of the two perturbed
    evaluations), ``grad_norm``, ``t`` (steps the rule took), ``skipped`` (steps a rule skipped) and
    ``state`` (the rule's state arrays).
    """

    # the fields, for type checkers (a callback's snapshot has x, fun, nit, grad_norm, history and t)
    x: np.ndarray
    fun: float
    nit: int
    nfev: int
    converged: bool
    status: int
    message: str
    history: np.ndarray | None
    grad_norm: float
    t: int
    skipped: int
    state: Any

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    @property
    def success(self) -> bool:
        """Alias of ``converged`` (scipy's name)."""
        return self.converged

    def plot(self, ax=None, path=None, logy=True, label=None):
        """Plot ``history`` (the loss per iteration; one line per row of a batch) with matplotlib (an
        optional extra); with ``path``, save the figure there. Returns the axes.

        With ``path`` and no ``ax`` the figure is a ``matplotlib.figure.Figure`` outside pyplot, so the
        user's backend and open figures are left alone; without either, pyplot's current state is used
        as it is (no backend is chosen here). ``logy`` uses a log scale when every value is positive."""
        try:
            import matplotlib  # noqa: F401
        except ImportError as e:  # optional extra
            raise ImportError("OptimizeResult.plot needs matplotlib (pip install numbaopt[plot])") from e
        if self.history is None:
            raise ValueError("plot: no history to plot (the loop ran with history=False)")
        if ax is None and path is not None:
            from matplotlib.figure import Figure
            ax = Figure(figsize=(6, 4)).add_subplot()
        elif ax is None:
            import matplotlib.pyplot as plt
            _, ax = plt.subplots(figsize=(6, 4))
        h = np.atleast_2d(self.history)
        for i, row in enumerate(h):
            ax.plot(np.arange(row.shape[0]), row, label=label if i == 0 else None)
        if logy and np.all(h[np.isfinite(h)] > 0):
            ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss")
        if path is not None:
            ax.figure.savefig(path, dpi=120, bbox_inches="tight")
        return ax

    def __repr__(self):
        keys = ("message", "converged", "fun", "nit", "nfev", "grad_norm", "x")
        lines = []
        for k in keys:
            v = self.__dict__.get(k)
            if isinstance(v, np.ndarray) and v.size > 8:
                v = f"array(shape={v.shape}, dtype={v.dtype})"
            lines.append(f"{k:>10}: {v}")
        return "\n".join(lines)


class BatchResult(OptimizeResult):
    """What :func:`minimize_batch` returns: the fields of :class:`OptimizeResult`, one per row
    (``x`` is ``(B, n)``; ``fun``, ``nit``, ``nfev``, ``converged``, ``status``, ``grad_norm``, ``t`` are
    length-B arrays; ``message`` a list; ``history`` is ``(B, max(nit) + 1)``, NaN after a row stopped).
    """

    # per row: arrays where OptimizeResult has scalars (so not substitutable for it in a type checker's eyes)
    fun: np.ndarray  # type: ignore[assignment]
    nit: np.ndarray  # type: ignore[assignment]
    nfev: np.ndarray  # type: ignore[assignment]
    converged: np.ndarray  # type: ignore[assignment]
    status: np.ndarray  # type: ignore[assignment]
    message: list[str]  # type: ignore[assignment]
    grad_norm: np.ndarray  # type: ignore[assignment]
    t: np.ndarray  # type: ignore[assignment]
    skipped: np.ndarray  # type: ignore[assignment]

    def row(self, r: int) -> OptimizeResult:
        """Row ``r`` as an :class:`OptimizeResult`."""
        n = int(self.nit[r])
        return OptimizeResult(x=self.x[r], fun=float(self.fun[r]), nit=n, nfev=int(self.nfev[r]),
                              converged=bool(self.converged[r]), status=int(self.status[r]),
                              message=self.message[r],
                              history=None if self.history is None else self.history[r, :n + 1],
                              grad_norm=float(self.grad_norm[r]), t=int(self.t[r]),
                              skipped=int(self.skipped[r]), state=None)

    def __repr__(self):
        return (f"BatchResult(B={self.x.shape[0]}, converged={int(np.sum(self.converged))}/{self.x.shape[0]}, "
                f"fun min={np.min(self.fun):.6g}, nit max={int(np.max(self.nit))})")
