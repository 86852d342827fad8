"""`Setup` of the QK/OV theory: data model, parametrisation, learning rates, start."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .._errors import check_traced
from ..setup import AbstractSetup, array_field, size_field
from .data import COUNTS, QUERY_MODES, TheoryTask
from .model import PARAMETRISATIONS, QKOVModel, make_aligned

__all__ = [
    "PAPER_HORIZON_TAU",
    "PAPER_LOSS_TARGET",
    "PAPER_RATIOS",
    "PAPER_SIZES",
    "REFERENCE_R001",
    "Setup",
    "paper_setup",
]

PAPER_SIZES = {"m": 5, "n": 50, "b": 50, "M": 20}
"""``m, n, b, M`` of the authors' reduced-ODE runs."""

PAPER_RATIOS = (0.01, 0.1, 1.0, 10.0, 100.0)
"""The ratios ``r = eta_QK / eta_OV`` of the authors' reduced-ODE runs (``eta_OV = 1``)."""

PAPER_LOSS_TARGET = 1e-4
"""The authors stop their reduced-ODE runs at the first step with loss ``<= 1e-4``."""

PAPER_HORIZON_TAU = 5e7
"""The authors' largest horizon, in their clock ``tau = t min(eta_QK, eta_OV)``."""

REFERENCE_R001 = {"tau_end": 2.55e6, "mu_ov": 81.669, "mu_qk": 0.559, "alpha": 0.149}
"""The authors' printout for CACO at ``r = 0.01`` (`paper_setup`, loss target `PAPER_LOSS_TARGET`):
the time ``tau`` at which the loss reaches the target and the state there, to the digits printed."""


def _floats(x):
    return jnp.asarray(x, dtype=jnp.result_type(float))


_FACTOR_RATIOS = {"qk": "qk_factor_ratio (eta_Q / eta_K)", "ov": "ov_factor_ratio (eta_O / eta_V)"}


def _check_factor_ratio(circuit: str, rho: Any, parametrisation: str) -> None:
    """``ValueError`` unless the per-factor rate ratio ``rho = eta_A / eta_B`` of ``circuit``
    (``"qk"`` or ``"ov"``) is one positive number, and 1 where ``parametrisation`` collapses the
    circuit (one matrix has one rate). A traced ``rho`` at a point of `attnflow.sweep` marks the
    point failed with the same message instead (`attnflow._errors.check_traced`), as the
    concrete value would have been refused."""
    name = _FACTOR_RATIOS[circuit]
    V.scalar(name, rho)
    V.positive(name, rho)
    factorised = parametrisation[:2] == "FA" if circuit == "qk" else parametrisation[2:] == "FO"
    if factorised:
        return
    message = f"needs a factorised circuit; {parametrisation} collapses it (one matrix, one rate)"
    if V.any_traced(rho):
        check_traced(lambda: jnp.asarray(rho) != 1.0, f"{name} other than 1 {message}")
    elif float(rho) != 1.0:
        raise ValueError(f"{name} = {float(rho):g} {message}")


_STATE = {"mu_ov", "mu_qk"}  # the reduced state (3): the two circuit strengths


class Setup(AbstractSetup):
    """The theory's data model, one parametrisation, per-circuit learning rates and the start.

    Numeric fields are arrays (any of them can be a `attnflow.sweep` axis; a new value never
    compiles again):

    - ``eta_qk``, ``eta_ov``: learning rates of the QK and OV circuits (``r = eta_qk / eta_ov``);
      gradient flow ``dW/dt = -eta grad L`` per circuit, on the clock ``t`` of `solve`;
    - ``mu0``: the initial ``mu`` of each *factorised* circuit (``W = 0`` is stationary for a
      factorised circuit, which therefore starts on the invariant manifold at ``mu0 > 0``
      with balanced factors); collapsed circuits start at ``mu = 0``.
    - ``qk_factor_ratio``, ``ov_factor_ratio``: per-factor learning rates of a factorised
      circuit ``W = A B`` (spec section 4), as the ratio ``rho = eta_A / eta_B`` of its factors'
      rates around the circuit's rate, their geometric mean: ``eta_Q = eta_qk sqrt(rho_qk)``,
      ``eta_K = eta_qk / sqrt(rho_qk)`` (``A = W_Q^T``, ``B = W_K``), ``eta_O = eta_ov
      sqrt(rho_ov)``, ``eta_V = eta_ov / sqrt(rho_ov)`` (`factor_rates`). Weighted-balanced
      factors (``A^T A / eta_A = B B^T / eta_B``, the start `train` uses) act with rate
      ``sqrt(eta_A eta_B)``, so the reduced ODE is that of ``eta_qk``, ``eta_ov`` whatever
      ``rho``. Default 1 (equal rates); a ratio other than 1 on a collapsed circuit is refused.

    Static fields (shapes and code paths; a new value compiles once):

    - ``parametrisation``: ``"CACO"``, ``"FACO"``, ``"CAFO"`` or ``"FAFO"``;
    - ``m``, ``n``: distinct and common context positions; ``b``: distinct tokens per class;
      ``M``: classes; ``n_common``: common tokens ``|C|``; ``query_mode``:
      ``"distinct_uniform"`` (the query is a uniform distinct token of the class) or
      ``"dedicated"`` (one query token per class); ``counts``: ``"fixed"`` (``m``, ``n`` in
      every sequence, the theory's model) or ``"binomial"`` (each position distinct with
      probability ``m / (m + n)``; spec 3.2 [open]: the reduced ODE (3) is then the fixed-count
      approximation);
    - ``common_correction``: use ``kappa = 1 + b / |C|`` in the collapsed-QK rate, the exact
      rate of the full matrices (their common scores fall too); off by default, giving the
      authors' equations (``kappa = 1``), exact for ``|C| >> b``. With factorised QK it is
      ``kappa = 1 + b / (2 |C|)``, the spec's open FA analogue (the common columns move through
      one factor): not derived exactly, but it cuts the gap to the full matrices (see `kappa`);
    - ``score_scale``: ``c`` in ``s_i = c x_T^T W_QK x_i``; 1 in the theory.

    The defaults are the reference configuration of `attnflow.qkov`: CACO, ``m, n, b, M =
    5, 50, 4, 4``, ``|C| = 400`` (``V = 416`` tokens, ``b / |C| = 0.01``), ``eta_OV = 1``,
    ``eta_QK = 3``. `solve` and `train` of it agree to the tolerance
    documented in `attnflow.qkov.train`. The authors' reduced-ODE configuration is
    `paper_setup`.
    """

    eta_qk: jax.Array = array_field("eta_qk (QK learning rate)", 3.0)
    eta_ov: jax.Array = array_field("eta_ov (OV learning rate)", 1.0)
    mu0: jax.Array = array_field("mu0 (start of factorised circuits)", 0.05)
    qk_factor_ratio: jax.Array = array_field("qk_factor_ratio (eta_Q / eta_K)", 1.0)
    ov_factor_ratio: jax.Array = array_field("ov_factor_ratio (eta_O / eta_V)", 1.0)
    parametrisation: str = eqx.field(static=True, default="CACO")
    m: int = size_field("m (distinct positions)", 5)
    n: int = size_field("n (common positions)", 50)
    b: int = size_field("b (distinct tokens per class)", 4)
    M: int = size_field("M (classes)", 4, minimum=2)
    n_common: int = size_field("n_common (common tokens |C|)", 400)
    query_mode: str = eqx.field(static=True, default="distinct_uniform")
    counts: str = eqx.field(static=True, default="fixed")
    common_correction: bool = eqx.field(static=True, default=False)
    score_scale: float = eqx.field(static=True, default=1.0)

    def validate(self) -> None:
        if self.parametrisation not in PARAMETRISATIONS:
            raise ValueError(
                f"unknown parametrisation {self.parametrisation!r}; expected one of {', '.join(PARAMETRISATIONS)}"
            )
        V.choice("query_mode", self.query_mode, QUERY_MODES)
        V.choice("counts", self.counts, COUNTS)
        V.scalar("eta_qk (QK learning rate)", self.eta_qk)
        V.scalar("eta_ov (OV learning rate)", self.eta_ov)
        V.positive("eta_qk (QK learning rate)", self.eta_qk)
        V.positive("eta_ov (OV learning rate)", self.eta_ov)
        V.positive("mu0 (initial mu of a factorised circuit)", self.mu0)
        _check_factor_ratio("qk", self.qk_factor_ratio, self.parametrisation)
        _check_factor_ratio("ov", self.ov_factor_ratio, self.parametrisation)
        if not isinstance(self.common_correction, bool):
            raise ValueError(f"common_correction must be True or False, got {self.common_correction!r}")
        if isinstance(self.score_scale, bool) or not isinstance(self.score_scale, (int, float)):
            raise ValueError(f"score_scale must be a Python number (static), got {self.score_scale!r}")
        V.positive("score_scale", self.score_scale)

    # -- derived quantities ---------------------------------------------------------------
    @property
    def ratio(self) -> jax.Array:
        """``r = eta_qk / eta_ov``."""
        return self.eta_qk / self.eta_ov

    def with_ratio(self, ratio: Any) -> Setup:
        """A copy at the learning-rate ratio ``r = eta_QK / eta_OV`` = ``ratio``, ``eta_OV`` kept
        (``eta_QK = r eta_OV``). Traceable: ``sweep(lambda r: solve(s.with_ratio(r), T).final(),
        {"r": rs})``."""
        if not V.any_traced(ratio):
            V.positive("ratio (eta_QK / eta_OV)", ratio)
        return self.replace(eta_qk=ratio * self.eta_ov)

    @property
    def factor_rates(self) -> dict[str, jax.Array]:
        """Learning rates per matrix, as `attnflow.qkov.circuit_labels` (``per_factor=True``)
        names them: ``q``, ``k`` (``eta_qk sqrt(rho_qk)``, ``eta_qk / sqrt(rho_qk)``), ``o``,
        ``v`` (alike with ``rho_ov``), and the collapsed ``qk``, ``ov`` (the circuit rates)."""
        rq, ro = jnp.sqrt(self.qk_factor_ratio), jnp.sqrt(self.ov_factor_ratio)
        return {
            "q": self.eta_qk * rq,
            "k": self.eta_qk / rq,
            "o": self.eta_ov * ro,
            "v": self.eta_ov / ro,
            "qk": self.eta_qk,
            "ov": self.eta_ov,
        }

    @property
    def factorised_qk(self) -> bool:
        return self.parametrisation[:2] == "FA"

    @property
    def factorised_ov(self) -> bool:
        return self.parametrisation[2:] == "FO"

    @property
    def kappa(self) -> float:
        """With ``common_correction``: ``1 + b / |C|`` for collapsed QK (exact), ``1 + b / (2 |C|)``
        for factorised QK (the spec's open FA analogue: the common columns move through one
        factor, at half the collapsed rate); else 1."""
        if not self.common_correction:
            return 1.0
        return 1.0 + self.b / (2.0 * self.n_common) if self.factorised_qk else 1.0 + self.b / self.n_common

    @property
    def query_power(self) -> int:
        """``p`` in the ``b^p`` of the QK rate: 2 for ``distinct_uniform`` queries, 1 for ``dedicated``."""
        return 2 if self.query_mode == "distinct_uniform" else 1

    @property
    def s_qk(self) -> float:
        """The singular value ``s_QK`` of the QK direction the flow moves along (the
        factorisation multiplier ``2 s_QK mu_QK / c``, section 5.3): ``b`` for
        ``distinct_uniform`` queries (``D_QK = sum_c 1_{D_c} 1_{D_c}^T``), ``sqrt(b)`` for
        ``dedicated`` ones (``sum_c e_{q_c} 1_{D_c}^T``, one query row per class)."""
        return float(self.b) if self.query_mode == "distinct_uniform" else float(np.sqrt(self.b))

    @property
    def task(self) -> TheoryTask:
        """The data model as a `TheoryTask` (for the full matrices of `train`)."""
        return TheoryTask(
            m=self.m,
            n=self.n,
            b=self.b,
            M=self.M,
            n_common=self.n_common,
            query_mode=self.query_mode,
            counts=self.counts,
        )

    def initial_state(self, initial: dict[str, Any] | None = None) -> dict[str, jax.Array]:
        """The start of `solve` and `train`: ``mu0`` on factorised circuits, 0 on collapsed ones;
        or ``initial``, a dict with the keys ``mu_ov`` and ``mu_qk`` (a state of `solve` or
        `state_at_loss`, whose ``alpha`` and ``loss`` are left out; other keys raise ``ValueError``
        naming them), as arrays of JAX's default float."""
        if initial is None:
            zero = jnp.zeros_like(self.mu0)
            return {
                "mu_ov": self.mu0 if self.factorised_ov else zero,
                "mu_qk": self.mu0 if self.factorised_qk else zero,
            }
        # a state of solve or state_at_loss may come back as a start: its alpha and loss follow from mu
        if not isinstance(initial, dict) or not _STATE <= set(initial) <= _STATE | {"alpha", "loss"}:
            got = sorted(initial) if isinstance(initial, dict) else repr(initial)[:80]
            raise ValueError(f"initial must be a dict with the keys ['mu_ov', 'mu_qk'], got {got}")
        dtype = jnp.result_type(float)
        state = {k: jnp.asarray(V.floats(f"initial['{k}']", initial[k]), dtype) for k in sorted(_STATE)}
        for k, v in state.items():
            if v.shape != jnp.shape(self.mu0):
                raise ValueError(
                    f"initial['{k}'] must have the shape of mu0, {jnp.shape(self.mu0)} (one circuit strength), "
                    f"got shape {v.shape}"
                )
        # a factorised circuit's mu is the singular value of W = A B (balanced: A, B ~ sqrt(mu)),
        # so it is positive, and 0 is a stationary point the flow never leaves
        for k, factorised in (("mu_ov", self.factorised_ov), ("mu_qk", self.factorised_qk)):
            if factorised and not V.any_traced(state[k]) and not bool(jnp.all(state[k] > 0)):
                raise ValueError(
                    f"initial['{k}'] must be > 0 on the factorised circuit of {self.parametrisation} "
                    f"(mu is the singular value of a product of factors; W = 0 is stationary), got {V.show(state[k])}"
                )
        return state

    def model(self, initial: dict[str, Any] | None = None) -> QKOVModel:
        """The full matrices of the theory task on the invariant manifold at ``initial``
        (default `initial_state`), factors weighted-balanced for `factor_rates`: the start of
        `attnflow.qkov.train`."""
        st = self.initial_state(initial)
        return make_aligned(
            self.task,
            self.parametrisation,
            st["mu_ov"],
            st["mu_qk"],
            score_scale=self.score_scale,
            factor_ratios=(self.qk_factor_ratio, self.ov_factor_ratio),
        )


def paper_setup(ratio: Any = 0.01, parametrisation: str = "CACO", **changes: Any) -> Setup:
    """The authors' reduced-ODE configuration: ``m, n, b, M = 5, 50, 50, 20`` (`PAPER_SIZES`),
    ``eta_OV = 1``, ``eta_QK = ratio * eta_OV``, ``kappa = c = 1``; ``|C| = 50`` (it enters only the full
    matrices and the optional common correction). ``changes`` override any field. Factorised
    circuits start at ``mu0 = 1e-3``."""
    eta_ov = changes.pop("eta_ov", 1.0)
    fields = dict(
        PAPER_SIZES,
        n_common=50,
        eta_ov=eta_ov,
        eta_qk=_floats(ratio) * _floats(eta_ov),
        parametrisation=parametrisation,
        mu0=1e-3,
    )
    fields.update(changes)
    return Setup(**fields)
