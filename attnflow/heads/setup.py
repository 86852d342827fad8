"""`Setup` of the heads model, and its initial conditions.

The order-parameter ODE started exactly on the equal-heads manifold never specialises; it is
seeded with the overlaps of a finite-``D`` draw (`FiniteDDraw`, the default), explicit overlaps
(`Overlaps`), or a symmetric point plus an antisymmetric seed of size ``kappa / sqrt(D)``
(`SymmetricSeed`). `attnflow.heads.solve` starts from these overlaps and
`attnflow.heads.train` builds keys with exactly these overlaps (`attnflow.heads.keys_from_overlaps`),
so theory and simulation start at the same point.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._jit import filter_jit
from ..setup import AbstractSetup, array_field, size_field
from .data import FlippedSpike, Prior, Target, TokenTarget
from .model import Activation, Softmax

__all__ = [
    "INIT_SEED",
    "REFERENCE_D",
    "REFERENCE_ETA",
    "REFERENCE_SIGMA0",
    "REFERENCE_SIGNAL",
    "FiniteDDraw",
    "InitialCondition",
    "Overlaps",
    "Setup",
    "SymmetricSeed",
    "check_overlaps",
    "from_finite_D",
    "symmetric_seed",
]

REFERENCE_SIGNAL = 3.0
"""Signal strength ``s`` of the reference prior, ``FlippedSpike(3.0, 0.5)``."""

REFERENCE_ETA = 1.0
"""Learning rate of the reference setup."""

REFERENCE_SIGMA0 = 0.5
"""Initial key scale ``sigma0`` of the reference setup (``k_h ~ N(0, sigma0^2 I_D)``)."""

REFERENCE_D = 1000
"""Dimension of the reference initial draw, and `attnflow.heads.train`'s default ``D``."""

INIT_SEED = 0
"""Seed of the reference initial draw."""


def _seed(x: Any) -> jax.Array:
    if not V.any_traced(x):
        v = V.reals("seed", x)
        if not np.all(np.isfinite(v)) or not np.all(v == np.round(v)) or np.any(np.abs(v) > 2**31 - 1):
            raise ValueError(f"seed must be an integer (int32), got {V.show(x)}")
    return jnp.asarray(x, dtype=jnp.int32)


def check_overlaps(name: str, M: Any, Q: Any, H: int, F: int, tol: float = 1e-10) -> None:
    """Raise ``ValueError`` (prefixed by ``name``) unless ``M`` is ``(H, F)`` and ``Q`` ``(H, H)``, both
    finite, ``Q`` symmetric and ``Q - M M^T`` positive semidefinite (down to ``-tol tr Q``).
    Traced values are checked for their shapes only."""
    if np.shape(M) != (H, F) or np.shape(Q) != (H, H):
        raise ValueError(f"{name}: M must be (H, F) = ({H}, {F}) and Q (H, H), got {np.shape(M)} and {np.shape(Q)}")
    if V.any_traced((M, Q)):
        return
    M, Q = np.asarray(M, float), np.asarray(Q, float)
    if not (np.all(np.isfinite(M)) and np.all(np.isfinite(Q))):
        raise ValueError(f"{name}: M and Q must be finite")
    if not np.allclose(Q, Q.T, atol=1e-12 * (1 + np.abs(Q).max())):
        raise ValueError(f"{name}: Q must be symmetric, got {Q.tolist()}")
    ev = np.linalg.eigvalsh(Q - M @ M.T)
    if ev[0] < -tol * max(1.0, float(np.trace(Q))):
        raise ValueError(f"{name}: Q - M M^T must be positive semidefinite; its smallest eigenvalue is {ev[0]:.3g}")


# ----------------------------------------------------------------------------- initial conditions
def from_finite_D(
    D: Any, H: int, F: int, sigma0: Any = REFERENCE_SIGMA0, key: Any = INIT_SEED
) -> tuple[jax.Array, jax.Array]:
    """Overlaps ``(M0, Q0)`` of ``H`` keys ``k_h ~ N(0, sigma0^2 I_D)`` with ``F`` orthonormal spikes
    (equation (11)): ``m_hf ~ N(0, sigma0^2 / D)``, ``q_hh ~ sigma0^2``, ``q_hh' ~ N(0, sigma0^4 / D)``.

    Exact in law at any ``D``: in a basis whose first ``F`` vectors are the spikes, ``M0`` is the
    first ``F`` coordinates over ``sqrt(D)`` and ``Q0 - M0 M0^T`` is ``sigma0^2 / D`` times a Wishart
    matrix with ``D - F`` degrees of freedom, drawn by Bartlett's decomposition (chi-square
    diagonal, Gaussian lower triangle). The cost does not grow with ``D``, and ``D``, ``sigma0``
    and ``key`` may be traced (a `attnflow.sweep` axis). Needs ``D >= F + H + 1``.
    """
    H, F = V.positive_int("H", H), V.positive_int("F", F)
    V.positive("sigma0", sigma0)
    if not V.any_traced(D) and not float(D) >= F + H + 1:
        raise ValueError(f"need D >= F + H + 1 = {F + H + 1}, got D = {D!r}")
    if isinstance(key, (int, np.integer)):
        key = jnp.asarray(key, dtype=jnp.int32)  # data, not a static argument: a new seed compiles nothing
    return _finite_D_overlaps(jnp.asarray(D, dtype=float), H, F, jnp.asarray(sigma0, dtype=float), key)


def _chi_square(key: jax.Array, k: jax.Array, candidates: int = 16) -> jax.Array:
    """``chi^2_k = 2 Gamma(k / 2)`` for ``k >= 2`` (any shape, may be traced): Marsaglia-Tsang's
    squeeze with a fixed number of candidates instead of a rejection loop. Each candidate is
    accepted with probability above 0.95, so the first accepted one has the exact law except on
    an event of probability below ``0.05^16`` (then the last candidate is used)."""
    a = jnp.asarray(k, dtype=float) / 2.0
    d = a - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * d)
    kx, ku = jax.random.split(key)
    x = jax.random.normal(kx, (candidates, *a.shape))
    u = jax.random.uniform(ku, (candidates, *a.shape))
    v = (1.0 + c * x) ** 3
    ok = (v > 0) & (jnp.log(u) < 0.5 * x**2 + d - d * v + d * jnp.log(jnp.where(v > 0, v, 1.0)))
    first = jnp.argmax(ok.at[-1].set(True), axis=0)
    return 2.0 * d * jnp.take_along_axis(v, first[None], axis=0)[0]


@filter_jit
def _finite_D_overlaps(D, H, F, sigma0, key):
    kM, kd, ko = jax.random.split(V.prng_key(key), 3)
    M = sigma0 * jax.random.normal(kM, (H, F)) / jnp.sqrt(D)
    dof = D - F - jnp.arange(H)  # Bartlett: A_ii^2 ~ chi^2_{n - i}, A_ij ~ N(0, 1) below the diagonal
    diag = jnp.sqrt(_chi_square(kd, dof))
    A = jnp.tril(jax.random.normal(ko, (H, H)), -1) + jnp.diag(diag)
    return M, M @ M.T + sigma0**2 * (A @ A.T) / D


def symmetric_seed(M_bar: Any, Q_bar: Any, kappa: Any, D: Any, direction: Any = None) -> tuple[jax.Array, jax.Array]:
    """A symmetric point ``(M_bar, Q_bar)`` plus an antisymmetric seed (section "Initial conditions"):
    ``M = M_bar + (kappa / sqrt(D)) u w^T`` with ``u`` the alternating vector ``(1, -1, 1, ...)``
    centred and normalised to ``|u| = 1`` and ``w`` = ``direction`` normalised to ``|w| = 1``
    (default: the first feature axis). The seed thus has Frobenius norm ``kappa / sqrt(D)``: at a
    point with equal rows ``specialisation(M) = kappa / sqrt(D)``. ``Q`` keeps ``P = Q - M M^T`` of
    the symmetric point, so the seed does not change the noise part of the fields. ``kappa`` and
    ``D`` may be traced.
    """
    M_bar, Q_bar = jnp.asarray(M_bar, dtype=float), jnp.asarray(Q_bar, dtype=float)
    H, F = M_bar.shape
    if H < 2:
        raise ValueError(f"an antisymmetric seed needs H >= 2 heads, got H = {H}")
    V.positive("D", D)
    u = jnp.where(jnp.arange(H) % 2 == 0, 1.0, -1.0)
    u = u - jnp.mean(u)
    u = u / jnp.linalg.norm(u)
    w = jnp.eye(F)[0] if direction is None else jnp.asarray(direction, dtype=float)
    if w.shape != (F,):
        raise ValueError(f"direction must have shape (F,) = ({F},), got {w.shape}")
    if not V.any_traced(w) and not float(jnp.linalg.norm(w)) > 0:
        raise ValueError("direction must be a nonzero vector")
    w = w / jnp.linalg.norm(w)
    M = M_bar + kappa / jnp.sqrt(jnp.asarray(D, dtype=float)) * jnp.outer(u, w)
    return M, Q_bar + M @ M.T - M_bar @ M_bar.T


class InitialCondition(eqx.Module):
    """Where the order parameters start (abstract): `FiniteDDraw`, `Overlaps` or `SymmetricSeed`."""

    @abc.abstractmethod
    def overlaps(self, H: int, F: int) -> tuple[jax.Array, jax.Array]:
        """``(M0 (H, F), Q0 (H, H))``."""

    @abc.abstractmethod
    def check(self, H: int, F: int) -> None:
        """Raise ``ValueError`` naming the value if this does not fit ``H`` heads and ``F`` features."""


class FiniteDDraw(InitialCondition):
    """The overlaps of keys ``k_h ~ N(0, sigma0^2 I_D)`` drawn from ``seed`` (`from_finite_D`).
    Every field is an array: ``sigma0``, ``D`` and ``seed`` can be sweep axes."""

    sigma0: jax.Array = array_field("sigma0", REFERENCE_SIGMA0)
    D: jax.Array = array_field("D", REFERENCE_D)
    seed: jax.Array = eqx.field(converter=_seed, default=INIT_SEED)

    def __check_init__(self):
        # the checks that need neither H nor F run here, with the messages `check` gives; a
        # traced value (a sweep axis) is checked by `check` when the Setup is built
        if not V.any_traced(self.sigma0):
            V.positive("sigma0 (initial key scale)", self.sigma0)
        if not V.any_traced(self.D):
            V.positive("D", self.D)

    def overlaps(self, H, F):
        return from_finite_D(self.D, H, F, self.sigma0, self.seed)

    def check(self, H, F):
        V.positive("sigma0 (initial key scale)", self.sigma0)
        V.positive("D", self.D)  # D = inf would give Q = NaN (as SymmetricSeed refuses it)
        if not V.any_traced(self.D) and not float(self.D) >= F + H + 1:
            raise ValueError(f"FiniteDDraw needs D >= F + H + 1 = {F + H + 1}, got D = {float(self.D)!r}")


class Overlaps(InitialCondition):
    """Explicit initial overlaps ``M (H, F)`` and ``Q (H, H)`` (``Q - M M^T`` positive semidefinite)."""

    M: jax.Array = array_field("M", dataclasses.MISSING)
    Q: jax.Array = array_field("Q", dataclasses.MISSING)

    def overlaps(self, H, F):
        return self.M, self.Q

    def check(self, H, F):
        check_overlaps("initial overlaps", self.M, self.Q, H, F)


class SymmetricSeed(InitialCondition):
    """A symmetric point ``(M_bar, Q_bar)`` plus the antisymmetric seed ``kappa / sqrt(D)`` of
    `symmetric_seed` along ``direction`` (default the first feature; normalised). ``kappa`` and
    ``D`` are arrays (sweep axes)."""

    M_bar: jax.Array = array_field("M_bar", dataclasses.MISSING)
    Q_bar: jax.Array = array_field("Q_bar", dataclasses.MISSING)
    kappa: jax.Array = array_field("kappa", 1.0)
    D: jax.Array = array_field("D", REFERENCE_D)
    direction: jax.Array | None = eqx.field(
        converter=lambda x: None if x is None else V.floats("direction", x), default=None
    )

    def __check_init__(self):
        # as FiniteDDraw: what needs neither H nor F is checked on construction
        if not V.any_traced(self.D):
            V.positive("D", self.D)
        if not V.any_traced(self.kappa):
            V.finite_tree("kappa", self.kappa)

    def overlaps(self, H, F):
        return symmetric_seed(self.M_bar, self.Q_bar, self.kappa, self.D, self.direction)

    def check(self, H, F):
        V.positive("D", self.D)
        V.finite_tree("kappa", self.kappa)
        check_overlaps("symmetric point", self.M_bar, self.Q_bar, H, F)


# ----------------------------------------------------------------------------- Setup
class Setup(AbstractSetup):
    """The multi-head single-location model and its training (equations (1)-(9) of the heads page).

    Fields (numbers are arrays, so any of them can be a `attnflow.sweep` axis through `replace`):

    - ``prior``: the amplitude prior (reference ``FlippedSpike(3.0, 0.5)``, `REFERENCE_SIGNAL`);
    - ``activation``: `attnflow.heads.Softmax` (reference), ``Softmax1`` or ``BayesSoftmax``;
      its learned parameters start at the values it holds;
    - ``eta``: learning rate of the keys (reference `REFERENCE_ETA`); ``eta_b``: learning rate of
      the activation's learned parameters, whose step is ``eta_b / D`` (``None``: ``eta``);
    - ``weight_decay`` ``gamma``: a step adds ``-eta gamma k_h / D``;
    - ``target``: ``TokenTarget()`` (reference) or ``ScalarTarget(Delta)``;
    - ``init``: the initial condition, `FiniteDDraw` (reference: ``sigma0 = 0.5``, ``D = 1000``,
      seed `INIT_SEED`), `Overlaps` or `SymmetricSeed`;
    - static: ``L`` tokens (4), ``H`` heads (2), ``sgd_noise`` (the ``eta^2`` term of online SGD;
      ``False`` is the gradient-flow limit, theory only), ``minibatch`` samples per step (1; divides
      the ``eta^2`` term).

    The clock is ``t = steps / D`` (``n = minibatch D t`` samples).
    """

    prior: Prior = eqx.field(default_factory=lambda: FlippedSpike(REFERENCE_SIGNAL, 0.5))
    activation: Activation = eqx.field(default_factory=Softmax)
    eta: jax.Array = array_field("eta", REFERENCE_ETA)
    eta_b: jax.Array | None = eqx.field(converter=lambda x: None if x is None else V.floats("eta_b", x), default=None)
    weight_decay: jax.Array = array_field("weight_decay", 0.0)
    target: Target = eqx.field(default_factory=TokenTarget)
    init: InitialCondition = eqx.field(default_factory=FiniteDDraw)
    L: int = size_field("L (tokens)", 4, minimum=2)
    H: int = size_field("H (heads)", 2)
    sgd_noise: bool = eqx.field(static=True, default=True)
    minibatch: int = size_field("minibatch", 1)

    def validate(self) -> None:
        if not isinstance(self.prior, Prior):
            raise ValueError(f"prior must be a Prior (FlippedSpike, AnisotropicGaussian, Discrete), got {self.prior!r}")
        if not isinstance(self.activation, Activation):
            raise ValueError(
                f"activation must be Softmax(), Softmax1(...) or BayesSoftmax(...), got {self.activation!r}"
            )
        if not isinstance(self.target, Target):
            raise ValueError(f"target must be TokenTarget() or ScalarTarget(Delta), got {self.target!r}")
        if not isinstance(self.init, InitialCondition):
            raise ValueError(f"init must be FiniteDDraw(...), Overlaps(M, Q) or SymmetricSeed(...), got {self.init!r}")
        if not isinstance(self.sgd_noise, bool):
            raise ValueError(f"sgd_noise must be True or False, got {self.sgd_noise!r}")
        V.scalar("eta (learning rate)", self.eta)
        V.positive("eta (learning rate)", self.eta)
        if self.eta_b is not None:
            V.scalar("eta_b (learning rate of the activation parameters)", self.eta_b)
            V.positive("eta_b (learning rate of the activation parameters)", self.eta_b)
        V.nonnegative("weight_decay", self.weight_decay)
        self.activation.check_heads(self.H)
        self.init.check(self.H, self.prior.F)

    @property
    def F(self) -> int:
        """Number of features of the prior."""
        return self.prior.F

    @property
    def rate_b(self) -> jax.Array:
        """The learning rate of the activation's parameters: ``eta_b``, or ``eta`` when ``eta_b`` is ``None``."""
        return self.eta if self.eta_b is None else self.eta_b

    def initial_overlaps(self) -> tuple[jax.Array, jax.Array]:
        """``(M0, Q0)`` of the initial condition."""
        return self.init.overlaps(self.H, self.F)

    def initial_state(self) -> dict[str, Any]:
        """The start of `attnflow.heads.solve`: ``{"M": M0, "Q": Q0, "act": ...}``, the overlaps of
        the initial condition and the activation's initial learned parameters."""
        M, Q = self.initial_overlaps()
        return {"M": jnp.asarray(M, dtype=float), "Q": jnp.asarray(Q, dtype=float), "act": self.activation.params()}
