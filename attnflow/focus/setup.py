"""`Setup` of focus and dilution: the chain, the score scale, the widths and the initial draw."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax

from .. import _validate as V
from ..setup import AbstractSetup, array_field
from .data import SYNTHETIC_PI, MarkovChain
from .model import PARAMETERS, init_theta

__all__ = ["INIT_SEED", "REFERENCE_LAM", "Setup"]

INIT_SEED = 0
"""Seed of the reference initial draw ``theta0``."""

REFERENCE_LAM = 0.5
"""Laziness ``lam`` of the reference chain (`MarkovChain.lazy` on `SYNTHETIC_PI`)."""


def _reference_chain() -> MarkovChain:
    return MarkovChain.lazy(SYNTHETIC_PI, REFERENCE_LAM)


class Setup(AbstractSetup):
    """One-layer attention learning a Markov chain from small initialisation.

    Fields (numbers are arrays, so any of them can be a `attnflow.sweep` axis and a new value
    never compiles again):

    - ``chain``: the data, a `MarkovChain` (reference: the lazy chain with ``lam = 0.5`` on
      ``pi = (0.75, 0.19, 0.05, 0.01)``); its ``pi`` and ``P`` may be traced;
    - ``tau``: the score scale (attention logits ``tau Phi``), reference 1;
    - ``eps``: the initial scale, every weight ``N(0, eps^2)``, reference ``1e-3``;
    - ``eta``: the learning rate of the flow ``d theta/dt = -eta grad L`` (reference 1); SGD
      with time step ``dt`` uses the learning rate ``eta dt``, so ``t = dt * step``;
    - ``m``, ``mk`` (static): embedding and query-key widths, reference 16 and 16;
    - ``init_seed`` (static): the seed of the initial draw ``theta0`` (`theta0`), shared by
      `attnflow.focus.solve` and `attnflow.focus.train`, so both start from the same weights.
    """

    chain: MarkovChain = eqx.field(default_factory=_reference_chain)
    tau: jax.Array = array_field("tau (score scale)", 1.0)
    eps: jax.Array = array_field("eps (initial scale)", 1e-3)
    eta: jax.Array = array_field("eta (learning rate)", 1.0)
    m: int = eqx.field(static=True, default=16)
    mk: int = eqx.field(static=True, default=16)
    init_seed: int = eqx.field(static=True, default=INIT_SEED)

    def validate(self) -> None:
        if not isinstance(self.chain, MarkovChain):
            raise ValueError(f"chain must be an attnflow.focus.MarkovChain, got {self.chain!r}")
        for name in ("tau", "eps", "eta"):
            V.scalar(name, getattr(self, name))
        V.positive("tau (score scale)", self.tau)
        V.positive("eps (initial scale)", self.eps)
        V.positive("eta (learning rate)", self.eta)
        V.positive_int("m (embedding width)", self.m)
        V.positive_int("mk (query-key width)", self.mk)
        V.positive_int("init_seed", self.init_seed, minimum=0)

    @property
    def d(self) -> int:
        """Vocabulary size (of the chain)."""
        return self.chain.d

    def theta0(self) -> dict[str, jax.Array]:
        """The initial weights: `attnflow.focus.init_theta` with ``init_seed``, the widths and
        ``eps``."""
        return init_theta(self.init_seed, self.d, self.m, self.mk, self.eps)

    def initial_state(self, initial: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The weights `attnflow.focus.solve` and `attnflow.focus.train` start from: `theta0`, or
        ``initial`` (a dict with the keys `attnflow.focus.PARAMETERS` of shapes ``W0 (d, m)``,
        ``W1 (m, d)``, ``WQ (m, mk)``, ``WK (m, mk)``, the setup's widths) checked against this
        setup, finite where concrete; ``ValueError`` naming the key otherwise."""
        if initial is None:
            return self.theta0()
        if not isinstance(initial, Mapping):
            raise ValueError(
                f"initial must be a dict with keys {PARAMETERS} (as setup.theta0()), got {type(initial).__name__}"
            )
        missing = [k for k in PARAMETERS if k not in initial]
        extra = sorted(map(str, set(initial) - set(PARAMETERS)))
        if missing or extra:
            raise ValueError(
                f"initial must be a dict with keys {PARAMETERS} (as setup.theta0()); got keys {list(initial)}"
                + (f", missing {missing}" if missing else "")
                + (f", unknown {extra}" if extra else "")
            )
        W0 = jax.numpy.shape(initial["W0"])
        if len(W0) != 2 or W0[0] != self.d:
            raise ValueError(f"initial['W0'] must have shape ({self.d}, m) for this chain, got {W0}")
        d, m, mk = self.d, self.m, self.mk
        for name, shape in (("W0", (d, m)), ("W1", (m, d)), ("WQ", (m, mk)), ("WK", (m, mk))):
            got = jax.numpy.shape(initial[name])
            if got != shape:
                raise ValueError(
                    f"initial['{name}'] must have shape {shape} for d = {d}, m = {m}, mk = {mk} (the setup's "
                    f"widths), got {got}"
                )
        V.finite_tree("initial", dict(initial))
        return dict(initial)
