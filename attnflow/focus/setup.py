"""`Setup` of focus and dilution: the chain, the score scale, the widths and the initial draw."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax

from .. import _validate as V
from ..setup import AbstractSetup, array_field, size_field
from .data import SYNTHETIC_PI, MarkovChain
from .model import PARAMETERS, init_theta

__all__ = ["INIT_SEED", "REFERENCE_LAM", "Setup"]

INIT_SEED = 0
"""Seed of the reference initial draw ``theta0``."""

REFERENCE_LAM = 0.5
"""Laziness ``lam`` of the reference chain (`MarkovChain.lazy` on `SYNTHETIC_PI`)."""


def _reference_chain() -> MarkovChain:
    return MarkovChain.lazy(SYNTHETIC_PI, REFERENCE_LAM)


def _check_weights(
    name: str, theta: Any, d: int, m: int | None = None, mk: int | None = None, whose: str = "the setup's widths"
) -> dict[str, Any]:
    """``theta`` as a dict of the weights `attnflow.focus.PARAMETERS` of shapes ``W0 (d, m)``,
    ``W1 (m, d)``, ``WQ (m, mk)``, ``WK (m, mk)``, or ``ValueError`` naming ``name`` and the key:
    a missing or unknown key, a wrong shape (given, and expected), a boolean or complex
    entry, and, where concrete, NaN or Inf. ``m`` and ``mk`` default to the widths of
    ``theta["W0"]`` and ``theta["WQ"]`` (``whose`` says where they come from in the message).
    Traced weights are checked by shape and dtype only."""
    if not isinstance(theta, Mapping):
        raise ValueError(
            f"{name} must be a dict with keys {PARAMETERS} (as setup.theta0()), got {type(theta).__name__}"
        )
    missing = [k for k in PARAMETERS if k not in theta]
    extra = sorted(map(str, set(theta) - set(PARAMETERS)))
    if missing or extra:
        raise ValueError(
            f"{name} must be a dict with keys {PARAMETERS} (as setup.theta0()); got keys {list(theta)}"
            + (f", missing {missing}" if missing else "")
            + (f", unknown {extra}" if extra else "")
        )
    W0 = jax.numpy.shape(theta["W0"])
    if len(W0) != 2 or W0[0] != d:
        raise ValueError(f"{name}['W0'] must have shape ({d}, m) for this chain, got {W0}")
    m = W0[1] if m is None else m
    if mk is None:
        WQ = jax.numpy.shape(theta["WQ"])
        if len(WQ) != 2 or WQ[0] != m:
            raise ValueError(f"{name}['WQ'] must have shape ({m}, mk) for m = {m} ({whose}), got {WQ}")
        mk = WQ[1]
    for key, shape in (("W0", (d, m)), ("W1", (m, d)), ("WQ", (m, mk)), ("WK", (m, mk))):
        got = jax.numpy.shape(theta[key])
        if got != shape:
            raise ValueError(
                f"{name}['{key}'] must have shape {shape} for d = {d}, m = {m}, mk = {mk} ({whose}), got {got}"
            )
    for key in PARAMETERS:  # True would count as 1.0, 1+0j lose its imaginary part
        if V.any_traced(theta[key]):
            V.floats(f"{name}['{key}']", theta[key])
        else:
            V.reals(f"{name}['{key}']", theta[key])
    V.finite_tree(name, dict(theta))
    return dict(theta)


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

    The static fields are stored as Python ints: a NumPy integer (``np.int64(3)``) or a whole
    float is converted, an array or a traced value refused by name.
    """

    chain: MarkovChain = eqx.field(default_factory=_reference_chain)
    tau: jax.Array = array_field("tau (score scale)", 1.0)
    eps: jax.Array = array_field("eps (initial scale)", 1e-3)
    eta: jax.Array = array_field("eta (learning rate)", 1.0)
    m: int = size_field("m (embedding width)", 16)
    mk: int = size_field("mk (query-key width)", 16)
    init_seed: int = size_field("init_seed", INIT_SEED, minimum=0)

    def validate(self) -> None:
        if not isinstance(self.chain, MarkovChain):
            raise ValueError(f"chain must be an attnflow.focus.MarkovChain, got {self.chain!r}")
        for name in ("tau", "eps", "eta"):
            V.scalar(name, getattr(self, name))
        V.positive("tau (score scale)", self.tau)
        V.positive("eps (initial scale)", self.eps)
        V.positive("eta (learning rate)", self.eta)

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
        return _check_weights("initial", initial, self.d, self.m, self.mk)
