"""Reference values and post-training analysis: Bayes risk, the Bayes-softmax oracle, the
softmax floor, and pruning of trained heads (equations (12) to (14) and (16) of the heads page)."""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _validate as V
from .data import Prior
from .model import Activation
from .theory import FieldBank, _check_bank_overlaps, generalisation_error

__all__ = [
    "BAYES_SAMPLES",
    "BAYES_SEED",
    "ByMass",
    "GivenOrder",
    "Greedy",
    "PruneOrder",
    "RandomOrder",
    "bayes_posterior",
    "bayes_risk",
    "oracle_config",
    "prune",
    "softmax_floor",
]

BAYES_SEED = 0
"""Default seed of `bayes_risk`'s Monte Carlo draws."""

BAYES_SAMPLES = 200_000
"""Default number of Monte Carlo samples of `bayes_risk`."""


def bayes_posterior(prior: Prior, chi_star: jax.Array) -> jax.Array:
    """Location posterior ``p_l = softmax_l(log Z(chi*_l))`` for projections ``chi* (..., L, F)``, shape
    ``(..., L)`` (equation (12))."""
    return jax.nn.softmax(prior.log_Z(chi_star), axis=-1)


def bayes_risk(prior: Prior, L: int, key: Any = BAYES_SEED, n: int = BAYES_SAMPLES) -> tuple[jax.Array, jax.Array]:
    """Monte Carlo Bayes risk ``E_Bayes = 1 - E[p_eps]`` (signal on token 1 by exchangeability) and its
    standard error (equation (12); add ``Delta`` for the scalar target)."""
    if not isinstance(prior, Prior):
        raise ValueError(f"prior must be a Prior, got {prior!r}")
    L = V.positive_int("L", L, minimum=2)  # one token is no location problem, as for Setup
    n = V.positive_int("n (samples)", n)
    k1, k2 = jax.random.split(V.prng_key(key))
    theta = prior.sample(k1, n)
    chi = jax.random.normal(k2, (n, L, prior.F)).at[:, 0].add(theta)
    p1 = bayes_posterior(prior, chi)[:, 0]
    return 1.0 - jnp.mean(p1), jnp.std(p1) / jnp.sqrt(n)


def oracle_config(prior: Prior) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(M, Q, b)`` at which Bayes-softmax is the Bayes estimator, for a prior with finite support
    (equation (13)): one head per support point of positive weight, ``M = Theta``,
    ``Q = Theta Theta^T``, ``b_h = log pi_h - |theta_h|^2 / 2`` (a point of weight 0, as in
    ``FlippedSpike(s, p=1)``, gets no head: its ``b`` would be ``-inf``, and the posterior
    never puts mass there)."""
    support = prior.support() if isinstance(prior, Prior) else None
    if support is None:
        raise ValueError(
            f"the oracle configuration needs a prior with finite support (Discrete, FlippedSpike), got {prior!r}"
        )
    Th, pw = support
    if not V.any_traced(pw):
        keep = np.flatnonzero(np.asarray(pw) > 0)
        Th, pw = Th[keep], pw[keep]
    return Th, Th @ Th.T, jnp.log(pw) - 0.5 * jnp.sum(Th**2, axis=1)


def softmax_floor(L: int, p: float = 0.5, n_plus: int | None = None, H: int | None = None) -> float:
    """Infinite-signal floor of the softmax error (FlippedSpike, ``s -> inf``): ``L / (4 (L - 1))`` for
    an even split at ``p = 1/2``; ``L/(L-1) [p (1 - n/H)^2 + (1 - p)(n/H)^2]`` with ``n = n_plus`` of
    ``H`` heads on ``+`` (equation (14)); ``p != 1/2`` needs ``n_plus`` and ``H``."""
    L = V.positive_int("L", L, minimum=2)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    if n_plus is None:
        if p != 0.5:  # the even split is the floor at p = 1/2 only (equation (14)); p would be ignored
            raise ValueError(f"softmax_floor without n_plus is the p = 1/2 even split; for p = {p!r} give n_plus and H")
        return L / (4 * (L - 1))
    H = V.positive_int("H", H)
    if isinstance(n_plus, bool) or not float(n_plus).is_integer():
        raise ValueError(f"n_plus must be a whole number of heads in [0, H = {H}], got {n_plus!r}")
    if not 0 <= n_plus <= H:
        raise ValueError(f"n_plus must be in [0, H = {H}], got {n_plus!r}")
    f = n_plus / H
    return L / (L - 1) * (p * (1 - f) ** 2 + (1 - p) * f**2)


# ----------------------------------------------------------------------------- pruning
class PruneOrder(eqx.Module):
    """Which head `prune` removes next (abstract): `Greedy`, `ByMass`, `RandomOrder`, `GivenOrder`."""

    @abc.abstractmethod
    def pick(
        self, kept: list[int], step: int, H: int, error: Callable[[list[int]], float], mass: Callable[[], np.ndarray]
    ) -> int | None:
        """The head to remove at ``step`` from ``kept`` (``None``: stop); ``error(keep)`` is the error
        of a sub-model, ``mass()`` the mean attention mass of each head in the full model."""


class Greedy(PruneOrder):
    """The head whose removal increases the error least (the default)."""

    def pick(self, kept, step, H, error, mass):
        trials = {h: error([k for k in kept if k != h]) for h in kept}
        return min(trials, key=trials.get)


class ByMass(PruneOrder):
    """The kept head with the lowest mean attention mass in the full model."""

    def pick(self, kept, step, H, error, mass):
        m = mass()
        return min(kept, key=lambda h: (m[h], h))


class RandomOrder(PruneOrder):
    """A random order, from ``seed``."""

    seed: int = eqx.field(static=True, default=0)

    def pick(self, kept, step, H, error, mass):
        return int(np.random.default_rng(self.seed).permutation(H)[step])


class GivenOrder(PruneOrder):
    """The heads in the given order (distinct indices, at least one head kept); stops when they run out."""

    heads: Sequence[int] = eqx.field(static=True, converter=lambda hs: tuple(int(h) for h in hs))

    def pick(self, kept, step, H, error, mass):
        if len(set(self.heads)) != len(self.heads) or any(not 0 <= h < H for h in self.heads) or len(self.heads) >= H:
            raise ValueError(
                f"GivenOrder must list distinct head indices in [0, {H}) and keep at least one head, "
                f"got {list(self.heads)}"
            )
        return self.heads[step] if step < len(self.heads) else None


def _head_indices(x: Any) -> tuple[int, ...] | None:
    """``x`` (a sequence or generator of integer head indices) as a tuple, else ``None``."""
    if isinstance(x, (str, bytes)):
        return None
    try:
        return tuple(operator.index(h) for h in x)
    except TypeError:
        return None


def prune(
    M: Any,
    Q: Any,
    activation: Activation,
    bank: FieldBank,
    order: PruneOrder | Sequence[int] | None = None,
    renormalise: bool = False,
) -> dict:
    """Remove heads one at a time and re-evaluate the error ``E`` on the kept sub-matrices ``M_S``,
    ``Q_SS`` (equation (16)).

    ``order``: a `PruneOrder` (default `Greedy()`) or a sequence of head indices (`GivenOrder`).
    Aggregation: softmax averages over the kept heads; Bayes-softmax drops removed heads from its
    joint normaliser; softmax-1 keeps the ``1/H`` and ``c`` of the full model (removed heads are
    masked), or with ``renormalise=True`` averages over the kept heads.
    Returns ``{"removed": [h, ...], "error": E after 0, 1, ... removals}``.
    """
    M, Q = jnp.asarray(M, dtype=float), jnp.asarray(Q, dtype=float)
    H = M.shape[0]
    _check_bank_overlaps("prune", M, Q, bank)
    if not isinstance(activation, Activation):
        raise ValueError(f"activation must be Softmax(), Softmax1(...) or BayesSoftmax(...), got {activation!r}")
    activation.check_heads(H)
    order = Greedy() if order is None else order
    if not isinstance(order, PruneOrder):
        heads = _head_indices(order)
        if heads is None:
            raise ValueError(
                "order must be Greedy(), ByMass(), RandomOrder(seed), GivenOrder(heads) or a sequence of head "
                f"indices, got {order!r:.80}"
            )
        order = GivenOrder(heads)

    def error(keep):
        keep = np.asarray(sorted(keep))
        return float(
            generalisation_error(M[keep], Q[np.ix_(keep, keep)], activation.restrict(keep, H, renormalise), bank)
        )

    def mass():
        chi, _ = bank.fields(M, Q)
        return np.asarray(bank.mean(jax.vmap(lambda c: jnp.sum(activation.head_weights(c), axis=1))(chi)))

    kept = list(range(H))
    errors, removed = [error(kept)], []
    for step in range(H - 1):
        h = order.pick(kept, step, H, error, mass)
        if h is None:
            break
        kept.remove(h)
        removed.append(int(h))
        errors.append(error(kept))
    return {"removed": removed, "error": np.asarray(errors)}
