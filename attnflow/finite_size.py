"""The finite-size law: how the gap between a theory and its finite network shrinks with size.

A theory (an ODE in the limit of an infinite size ``N``: dimension, vocabulary, context) and
a simulation at finite ``N`` produce the same named observables. Two host-side helpers
(NumPy in, NumPy out, like `attnflow.fit_power_law`):

- `trajectory_gap`: the distance between a theory `Trajectory` and a batch of simulated
  ones (one per seed), per batch element: the Euclidean norm of the difference over the named
  observables at each save time of the simulation, reduced over time by its root mean square
  (``reduce="rms"``) or its maximum (``reduce="max"``);
- `fit_finite_size`: the law ``gap = A N^p`` fitted to the gaps of several sizes and seeds,
  with a confidence interval for the exponent ``p`` (`FiniteSizeFit`).

Online SGD in dimension ``D`` fluctuates around its order-parameter ODE by ``O(D^{-1/2})``,
so ``p = -1/2`` there; elsewhere the exponent is whatever the data say.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from jaxtyping import ArrayLike, Real

from . import _validate as V
from .analysis import fit_power_law
from .trajectory import Trajectory, _checked_pair

__all__ = ["FiniteSizeFit", "fit_finite_size", "trajectory_gap"]


def trajectory_gap(
    reference: Trajectory,
    other: Trajectory,
    names: str | Iterable[str] | None = None,
    *,
    reduce: Literal["rms", "max"] = "rms",
) -> np.ndarray:
    """Gap between the theory ``reference`` and each trajectory of the batch ``other``.

    At every save time ``t`` of ``other`` the reference is interpolated linearly (per batch
    element of ``other`` if their times differ) and the gap is the Euclidean norm over the
    named observables and their components, ``d(t) = sqrt(sum_name |y_other(t) - y_ref(t)|^2)``;
    it is reduced over time to ``sqrt(mean_t d(t)^2)`` (``reduce="rms"``) or ``max_t d(t)``
    (``reduce="max"``). ``names`` (one name or several) default to the observables the two
    share.

    ``reference`` is unbatched (one theory for every run of ``other``) or batched with axes that
    lead ``other``'s, as in `attnflow.compare`: the same batch shape pairs the runs one to one, and
    a theory over ``(eta,)`` against runs over ``(eta, seed)`` measures each curve against the seeds
    of its ``eta``. Each reference curve must cover the save times of the runs it is measured
    against. The input is checked as `attnflow.compare` checks it, with the same messages (a name
    on one side only, no shared name, other shapes per save time, save times past the reference's
    span up to float32 rounding, a `attnflow.SweepResult` for ``res.values``: ``ValueError``), so
    the two accept the same pairs. Returns an array of ``other``'s batch shape (a 0-d array for an unbatched
    ``other``); a batch element with a non-finite value (a failed sweep point), or measured
    against a failed reference curve (NaN times), gives NaN.
    """
    if reduce not in ("rms", "max"):
        raise ValueError(f"reduce must be 'rms' or 'max', got {reduce!r}")
    # compare's checks, and its messages: the two accept the same pairs
    names = _checked_pair(reference, other, names, "trajectory_gap")
    rb = reference.batch_shape
    R = int(np.prod(rb, dtype=int))  # reference curves; each is measured against S runs of other
    t_ref = np.asarray(reference.ts, dtype=float).reshape(R, -1)  # (R, T_ref)
    ts = np.asarray(other.ts, dtype=float)
    batch, T = ts.shape[:-1], ts.shape[-1]
    rows = ts.reshape(R, -1, T)  # (R, S, T)
    ref_ok = np.all(np.isfinite(t_ref), axis=-1)  # a failed reference curve (NaN times) gives NaN gaps
    sq = np.zeros(rows.shape)  # (R, S, T)
    for n in names:
        a = np.asarray(reference[n], dtype=float).reshape(R, t_ref.shape[1], -1)  # (R, T_ref, F)
        b = np.asarray(other[n], dtype=float).reshape(rows.shape + (-1,))  # (R, S, T, F): same F, checked
        for r in range(R):
            if not ref_ok[r]:
                sq[r] = np.nan
                continue

            def interp(x, r=r):  # the reference curve r at the times x, (len(x), F)
                return np.stack([np.interp(x, t_ref[r], a[r, :, j]) for j in range(a.shape[-1])], axis=-1)

            group = rows[r]
            if np.all(group == group[0]):  # the runs of this curve share their times: interpolate once
                at = interp(group[0])[None]
            else:
                at = np.stack([interp(x) for x in group])
            sq[r] += np.sum((b[r] - at) ** 2, axis=-1)
    d = np.sqrt(sq)
    gap = np.sqrt(np.mean(sq, axis=-1)) if reduce == "rms" else np.max(d, axis=-1)
    return gap.reshape(batch)


@dataclass(frozen=True)
class FiniteSizeFit:
    """The law ``gap = A N^p`` fitted by `fit_finite_size`.

    ``exponent`` ``p`` with its standard error ``stderr`` and ``level`` confidence interval
    ``ci`` (Student t with ``n - 2`` degrees of freedom over all ``n`` (size, seed) points);
    ``prefactor`` ``A``; ``r2``: the coefficient of determination of the line in
    ``(log N, log gap)``. Data: ``sizes`` ``(S,)``, the per-seed ``gaps`` ``(S, R)`` and their
    arithmetic means ``mean_gaps`` ``(S,)``.
    """

    exponent: float
    ci: tuple[float, float]
    stderr: float
    prefactor: float
    r2: float
    level: float
    sizes: np.ndarray
    gaps: np.ndarray
    mean_gaps: np.ndarray

    @property
    def n(self) -> int:
        """Number of (size, seed) points of the fit."""
        return int(self.gaps.size)

    def predict(self, size: Real[ArrayLike, "*s"] | Sequence[float]) -> np.ndarray:
        """``A N^p`` at ``size``."""
        return self.prefactor * np.asarray(size, dtype=float) ** self.exponent

    def contains(self, exponent: float) -> bool:
        """Whether ``exponent`` lies in the confidence interval."""
        return bool(self.ci[0] <= exponent <= self.ci[1])

    def distance(self, exponent: float) -> float:
        """How far ``exponent`` lies outside the confidence interval (0 inside)."""
        return float(max(self.ci[0] - exponent, exponent - self.ci[1], 0.0))

    def label(self) -> str:
        """``"p = -0.51 ± 0.06"``: the exponent and the half width of its interval, for a legend."""
        half = 0.5 * (self.ci[1] - self.ci[0])
        return f"p = {self.exponent:.2f} ± {half:.2f}"


def fit_finite_size(
    sizes: Real[ArrayLike, " S"] | Sequence[float],
    gaps: Real[ArrayLike, " S *R"] | Sequence,
    level: float = 0.95,
) -> FiniteSizeFit:
    """Fit ``gap = A N^p`` to the gaps of ``S`` sizes ``N`` and ``R`` seeds.

    ``gaps`` has shape ``(S,)`` (one value per size) or ``(S, R)`` (row ``i``: the seeds at
    ``sizes[i]``). The fit is the least-squares line through all ``S R`` points ``(log N, log
    gap)`` (`attnflow.fit_power_law`): seeds are independent replicates, and the interval for
    ``p`` is the Student-t interval of that slope with ``S R - 2`` degrees of freedom, which
    assumes the same log-normal scatter at every size. Needs at least 2 distinct sizes and 3
    points. Sizes must be finite, positive and distinct; gaps finite and positive (a failed
    run's NaN or a zero gap raises ``ValueError`` naming the size and seed).
    """
    N = V.reals("sizes", sizes)
    g = V.reals("gaps", gaps)
    if N.ndim != 1 or N.size < 2:
        raise ValueError(f"sizes must be a 1-D array of at least 2 sizes, got {V.show(sizes)}")
    bad = np.flatnonzero(~(np.isfinite(N) & (N > 0)))
    if bad.size:
        raise ValueError(f"sizes must be finite and positive; sizes[{int(bad[0])}] is {float(N[bad[0]])!r}")
    if np.unique(N).size != N.size:
        raise ValueError(f"sizes must be distinct, got {N.tolist()}")
    if g.ndim == 1:
        g = g[:, None]
    if g.ndim != 2 or g.shape[0] != N.size:
        raise ValueError(f"gaps must have shape (S,) or (S, R) with S = {N.size} sizes, got {np.shape(gaps)}")
    bad_points = np.argwhere(~(np.isfinite(g) & (g > 0)))
    if bad_points.size:
        i, r = (int(k) for k in bad_points[0])
        raise ValueError(
            f"gaps must be finite and positive; the gap at size {N[i]:g}, seed index {r} is {float(g[i, r])!r}"
        )
    if g.size < 3:
        raise ValueError(f"a confidence interval needs at least 3 (size, seed) points, got {g.size}")
    V.positive("level", level)
    if not level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    x = np.repeat(N, g.shape[1])
    y = g.ravel()
    fit = fit_power_law(x, y, level)
    lx, ly = np.log(x), np.log(y)
    resid = ly - (fit.slope * lx + fit.intercept)
    ss_tot = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else 1.0
    return FiniteSizeFit(
        exponent=fit.slope,
        ci=fit.ci,
        stderr=fit.stderr,
        prefactor=float(np.exp(fit.intercept)),
        r2=r2,
        level=float(level),
        sizes=N,
        gaps=g,
        mean_gaps=g.mean(axis=1),
    )
