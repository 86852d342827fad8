"""Order-parameter theory of the heads model: Monte Carlo field bank, ODE, solve, phases.

Order parameters ``M = K K*^T / D`` (H x F) and ``Q = K K^T / D`` (H x H), ``P = Q - M M^T``.
With the signal on token 1 the local fields are ``chi*_l = delta_{l1} theta + zeta_l`` and
``chi_l = M chi*_l + P^{1/2} w_l`` (equation (6) of the heads page). Online SGD on the clock
``t = steps / D`` gives, with ``G = d loss / d chi`` per sample (equation (8)),

    dm_hf/dt  = -eta E[sum_l G_hl chi*_fl],
    dq_hh'/dt = -eta E[sum_l (G_hl chi_h'l + G_h'l chi_hl)] + eta^2 / B E[sum_l G_hl G_h'l],
    db/dt     = -eta_b E[d loss / db],

plus ``-eta gamma M`` and ``-2 eta gamma Q`` with weight decay. The drift is evaluated in one of
three equivalent forms (objects): `ExpectationForm` (as written), `SteinForm` (Gaussian
integration by parts) or `AutodiffForm` (``jax.grad`` of the Monte Carlo risk). The
expectations are means over a fixed `FieldBank` (common random numbers), so the field is a
smooth deterministic function of the state.
"""

from __future__ import annotations

import abc
import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jax.flatten_util import ravel_pytree

from .. import _validate as V
from .._errors import check_traced, fail_if
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..analysis import first_crossing
from ..expect import all_permutations, antithetic_copies, cyclic_permutations, permuted_copies, psd_sqrt
from ..ode import ODE, DivergenceError, integrate, observable_event, require_x64, with_progress
from ..options import LinearGrid, SaveGrid, SolverOptions, _caller_outside_attnflow
from ..saddle import Spectrum, escape_time, fixed_point, spectrum
from ..trajectory import Trajectory
from .data import Prior
from .model import Activation, half_loss
from .observe import order_parameter_observables, specialisation
from .setup import Setup, check_overlaps

__all__ = [
    "BANK_SEED",
    "EVAL_STREAM",
    "DEFAULT_BANK_SIZE",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "ESCAPE_THRESHOLD",
    "PSD_TOLERANCE",
    "AllPermutations",
    "AutodiffForm",
    "BankOptions",
    "CholeskyRoot",
    "CyclicCopies",
    "DriftForm",
    "Dynamics",
    "ExpectationForm",
    "FieldBank",
    "HeadCopies",
    "MatrixRoot",
    "NoCopies",
    "SteinForm",
    "SymmetricRoot",
    "antisymmetric_basis",
    "feature_escape_times",
    "generalisation_error",
    "half_risk",
    "initial_state",
    "order_parameter_field",
    "predicted_escape_time",
    "solve",
    "specialisation_spectrum",
    "symmetrise",
    "unspecialised_point",
]

DEFAULT_BANK_SIZE = 2**14
"""Base draws of the Monte Carlo bank (before support enumeration, antithetic and head-permutation copies)."""

BANK_SEED = 7
"""Seed of the Monte Carlo bank."""

EVAL_STREAM = 1
"""`FieldBank` stream of the independent bank `solve` evaluates its observables on
(`BankOptions.independent_eval`): the key of ``seed`` folded with 1."""

DEFAULT_SAVE = LinearGrid(101)
"""`solve`'s save grid when none is given."""

DEFAULT_SOLVER = SolverOptions(rtol=1e-6, atol=1e-9)
"""`solve`'s solver options when none are given (Tsit5 + PID; the bank's Monte Carlo error is far larger)."""

ESCAPE_THRESHOLD = 0.5
"""Conventional threshold of `specialisation` at which the heads count as specialised."""

PSD_TOLERANCE = 1e-8
"""The spec's relative PSD tolerance (section 6). `solve` stops with `attnflow.DivergenceError` when
``lambda_min(Q - M M^T) < -psd_tolerance tr Q``, with ``psd_tolerance`` (its option) defaulting to
``max(PSD_TOLERANCE, 10 rtol)``."""


# ----------------------------------------------------------------------------- bank options
class HeadCopies(eqx.Module):
    """Which head permutations of the draws ``w`` the bank appends (abstract): `CyclicCopies`,
    `AllPermutations` or `NoCopies`. With a group of copies and the symmetric root the Monte
    Carlo field is exactly equivariant under it, so the equal-heads manifold stays invariant."""

    @abc.abstractmethod
    def permutations(self, H: int) -> list[np.ndarray]:
        """The permutations of ``range(H)`` whose copies the bank holds (the identity included)."""


class CyclicCopies(HeadCopies):
    """The ``H`` cyclic shifts of the heads (the default)."""

    def permutations(self, H):
        return cyclic_permutations(H)


class AllPermutations(HeadCopies):
    """All ``H!`` permutations (refused for ``H > 6``)."""

    def permutations(self, H):
        return all_permutations(H)


class NoCopies(HeadCopies):
    """No copies: the field is equivariant only up to Monte Carlo error."""

    def permutations(self, H):
        return [np.arange(H)]


class MatrixRoot(eqx.Module):
    """How the bank takes a root ``R`` with ``R R^T = P = Q - M M^T`` (abstract): `SymmetricRoot` or `CholeskyRoot`."""

    @abc.abstractmethod
    def __call__(self, P: jax.Array, Q: jax.Array) -> jax.Array:
        """A root of ``P`` (``Q`` sets the scale of any regularisation)."""


class SymmetricRoot(MatrixRoot):
    """``P^{1/2} = U Lambda_+^{1/2} U^T`` (`attnflow.psd_sqrt`, with its Sylvester JVP): permutation-equivariant
    (the default)."""

    def __call__(self, P, Q):
        return psd_sqrt(P)


class CholeskyRoot(MatrixRoot):
    """Cholesky factor of ``P + 1e-14 tr(Q) I``: the same Gaussian law, not permutation-equivariant."""

    def __call__(self, P, Q):
        P = 0.5 * (P + P.T)
        return jnp.linalg.cholesky(P + 1e-14 * jnp.trace(Q) * jnp.eye(P.shape[0]))


class BankOptions(eqx.Module):
    """How `FieldBank` draws its Monte Carlo bank (section "Evaluating the expectations").

    - ``n``: base draws of ``(zeta, w)`` (default `DEFAULT_BANK_SIZE`), from ``seed`` (`BANK_SEED`);
    - ``enumerate_support``: a prior with finite support is enumerated with its weights on shared
      ``(zeta, w)`` instead of sampled;
    - ``antithetic``: append ``(-theta, -zeta, +w)`` so that the field is exactly equivariant under
      ``M -> -M``. ``None`` (default): on where the prior's ``sign_symmetric`` is true. ``True``: on,
      for a sign-symmetric prior only: a prior with concrete parameters that is not is refused at
      once (``ValueError``); with traced parameters (a sweep over ``p`` or a Gaussian mean) the
      copies are kept and ``sign_symmetric_array`` is checked at run time (`attnflow._errors.fail_if`:
      in `attnflow.sweep` a point that is not symmetric fails with that message and its values
      are NaN; elsewhere the traced program raises it). ``False``: off;
    - ``copies``: head permutations of ``w`` (`CyclicCopies` default, `AllPermutations`, `NoCopies`);
    - ``root``: the root of ``P`` (`SymmetricRoot` default, `CholeskyRoot`);
    - ``independent_eval``: the observables `solve` records (``error``, ``attention``) are
      expectations over a second bank of the same options, drawn independently (`EVAL_STREAM`),
      as SGD's are on held-out samples (default ``True``). The field's own bank is what the
      ODE fits: a state trained on it reads a lower error there than on fresh draws (about
      0.01 at ``n = 1024``, below the Bayes risk where a model nears it). ``False``: the
      field's bank.

    ``antithetic=None`` reads the prior's ``sign_symmetric`` from its values when the bank is
    drawn (a prior edited with ``eqx.tree_at`` answers for its new values); a traced parameter
    counts as not symmetric, so inside a sweep over ``p`` the copies are off at every point,
    ``p = 1/2`` included; ``antithetic=True`` keeps them there, checked per point as above.
    """

    n: int = eqx.field(static=True, default=DEFAULT_BANK_SIZE)
    seed: int = eqx.field(static=True, default=BANK_SEED)
    antithetic: bool | None = eqx.field(static=True, default=None)
    enumerate_support: bool = eqx.field(static=True, default=True)
    copies: HeadCopies = eqx.field(default_factory=CyclicCopies)
    root: MatrixRoot = eqx.field(default_factory=SymmetricRoot)
    independent_eval: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        V.positive_int("n (bank size)", self.n)
        if not isinstance(self.independent_eval, bool):
            raise ValueError(f"independent_eval must be True or False, got {self.independent_eval!r}")
        V.positive_int("seed", self.seed, minimum=0)
        if self.antithetic not in (None, True, False):
            raise ValueError(f"antithetic must be None, True or False, got {self.antithetic!r}")
        if not isinstance(self.copies, HeadCopies):
            raise ValueError(f"copies must be CyclicCopies(), AllPermutations() or NoCopies(), got {self.copies!r}")
        if not isinstance(self.root, MatrixRoot):
            raise ValueError(f"root must be SymmetricRoot() or CholeskyRoot(), got {self.root!r}")


@filter_jit
def _draw_bank(prior: Prior, L: int, H: int, options: BankOptions, antithetic: bool, key: jax.Array) -> dict:
    """The bank's draws as `BankOptions` says, from ``key`` (one compiled call per sizes and
    options; the seed is data)."""
    n = options.n
    k1, k2, k3 = jax.random.split(key, 3)
    zeta = jax.random.normal(k2, (n, L, prior.F))
    w = jax.random.normal(k3, (n, L, H))
    support = prior.support() if options.enumerate_support else None
    if support is not None:
        pts, pw = support
        J = pts.shape[0]
        theta = jnp.repeat(pts[None], n, axis=0).reshape(n * J, prior.F)
        weights = jnp.tile(pw, n) / n
        zeta, w = jnp.repeat(zeta, J, axis=0), jnp.repeat(w, J, axis=0)
    else:
        theta = prior.sample(k1, n)
        weights = jnp.full(n, 1.0 / n)
    # the base draw each row comes from: its support points and copies are not independent of it
    groups = jnp.repeat(jnp.arange(n, dtype=jnp.int32), theta.shape[0] // n)
    draws = {"theta": theta, "zeta": zeta, "w": w, "weights": weights, "groups": groups}
    if antithetic:
        draws = antithetic_copies(draws, {"theta": True, "zeta": True, "w": False, "weights": False, "groups": False})
        draws["weights"] = draws["weights"] / 2
    perms = options.copies.permutations(H)
    if len(perms) > 1:
        draws = permuted_copies(draws, perms, {"theta": None, "zeta": None, "w": 2, "weights": None, "groups": None})
        draws["weights"] = draws["weights"] / len(perms)
    return draws


class FieldBank(eqx.Module):
    """Fixed draws ``theta (B, F)``, ``zeta (B, L, F)``, ``w (B, L, H)`` with weights ``(B,)`` (common
    random numbers for every evaluation of the field), built as `BankOptions` says."""

    theta: jax.Array
    zeta: jax.Array
    w: jax.Array
    weights: jax.Array
    groups: jax.Array
    root: MatrixRoot
    n: int = eqx.field(static=True)

    def __init__(self, prior: Prior, L: int, H: int, options: BankOptions | None = None, *, stream: int = 0):
        """Draws for ``prior``, ``L`` tokens and ``H`` heads as ``options`` says (default
        `BankOptions()`). ``stream``: another bank of the same options, independent of stream 0
        (`EVAL_STREAM` is the one `solve` evaluates its observables on)."""
        if not isinstance(prior, Prior):
            raise ValueError(f"prior must be a Prior, got {prior!r}")
        L = V.positive_int("L", L, minimum=2)
        H = V.positive_int("H", H)
        options = BankOptions() if options is None else options
        if not isinstance(options, BankOptions):
            raise ValueError(f"options must be BankOptions(...), got {options!r}")
        # the symmetry is read from the prior's values now: a prior edited with eqx.tree_at answers for
        # its new values, and a traced parameter is never averaged with its mirror unasked
        check_later = False
        if options.antithetic is None:
            antithetic = prior.sign_symmetric
        else:
            antithetic = options.antithetic
            if antithetic and not prior.sign_symmetric:
                with jax.ensure_compile_time_eval():
                    symmetric = prior.sign_symmetric_array()
                if not V.any_traced(symmetric):
                    raise ValueError(
                        f"antithetic copies need a sign-symmetric prior; {type(prior).__name__} is not "
                        f"(its sign_symmetric is False): use antithetic=None or False"
                    )
                check_later = True  # traced parameters (a sweep over p): checked at run time, per point
        # the seed as a key, not a static option: a bank of another seed compiles nothing
        key = jax.random.PRNGKey(options.seed)
        stream = V.positive_int("stream", stream, minimum=0)
        if stream:
            key = jax.random.fold_in(key, stream)
        draws = _draw_bank(prior, L, H, dataclasses.replace(options, seed=0), antithetic, key)
        if check_later:
            draws["weights"] = fail_if(
                draws["weights"],
                ~symmetric,
                f"antithetic copies need a sign-symmetric prior; this {type(prior).__name__}'s (traced) parameters "
                "are not sign-symmetric: use antithetic=None or False",
            )
        self.theta, self.zeta, self.w, self.weights = draws["theta"], draws["zeta"], draws["w"], draws["weights"]
        self.groups, self.n = draws["groups"], options.n
        self.root = options.root

    @property
    def size(self) -> int:
        """Number of draws (with all copies)."""
        return self.weights.shape[0]

    def mean(self, x: jax.Array) -> jax.Array:
        """Bank average of per-draw values ``x (B, ...)``."""
        return jnp.tensordot(self.weights, x, axes=1)

    def stderr(self, x: jax.Array) -> jax.Array:
        """Monte Carlo standard error of `mean` ``(x)``: the spread of its ``n`` independent base
        draws (each averaged with its support points, antithetic and head-permutation copies,
        which are not independent of it), ``std / sqrt(n)``."""
        wx = self.weights.reshape((-1,) + (1,) * (jnp.ndim(x) - 1)) * x
        per_draw = self.n * jax.ops.segment_sum(wx, self.groups, num_segments=self.n)
        return jnp.std(per_draw, axis=0, ddof=1) / jnp.sqrt(self.n)

    def fields(self, M: jax.Array, Q: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``chi (B, H', L)`` and ``chi* (B, L, F)`` for order parameters ``(M, Q)`` with ``H' <= H``
        heads (equation (6))."""
        R = self.root(Q - M @ M.T, Q)
        chi_star = self.zeta.at[:, 0].add(self.theta)
        Hs = M.shape[0]
        chi = jnp.einsum("hf,blf->bhl", M, chi_star) + jnp.einsum("hg,blg->bhl", R, self.w[..., :Hs])
        return chi, chi_star


def _check_bank_overlaps(name: str, M: Any, Q: Any, bank: FieldBank) -> None:
    """``ValueError`` (prefixed by ``name``) unless ``M`` has as many columns as the bank's prior
    has features and at most as many rows as the bank has heads, and ``(M, Q)`` pass
    `check_overlaps` (finite, ``Q`` symmetric, ``Q - M M^T`` positive semidefinite)."""
    if not isinstance(bank, FieldBank):
        raise ValueError(f"{name}: bank must be a FieldBank, got {bank!r}")
    F, H_bank = bank.theta.shape[-1], bank.w.shape[-1]
    if np.ndim(M) != 2 or np.shape(M)[1] != F:
        raise ValueError(f"{name}: M must be (H, F) with F = {F}, the bank prior's features; got shape {np.shape(M)}")
    H = np.shape(M)[0]
    if H_bank < H:
        raise ValueError(f"{name}: M has {H} rows (heads), but the bank was drawn for H = {H_bank}")
    check_overlaps(name, M, Q, H, F)


def half_risk(M: jax.Array, Q: jax.Array, activation: Activation, bank: FieldBank) -> jax.Array:
    """Half-risk ``R(M, Q) = E |e_1 - a(chi)|^2 / 2`` on the bank (equation (7)); the generalisation
    error is ``E = 2 R`` (`generalisation_error`). An activation whose per-head parameters do
    not fit the ``H`` rows of ``M`` raises ``ValueError`` (JAX would clamp the head index), as do
    overlaps that do not fit the bank or are not those of keys (`check_overlaps`)."""
    _check_bank_overlaps("half_risk", M, Q, bank)
    return _half_risk(M, Q, activation, bank)


def _half_losses(M: jax.Array, Q: jax.Array, activation: Activation, bank: FieldBank) -> jax.Array:
    """The half-loss of each draw of the bank (equation (7) before the average)."""
    activation.check_heads(jnp.shape(M)[0])
    chi, _ = bank.fields(M, Q)
    return jax.vmap(lambda c: half_loss(activation, c))(chi)


def _half_risk(M: jax.Array, Q: jax.Array, activation: Activation, bank: FieldBank) -> jax.Array:
    return bank.mean(_half_losses(M, Q, activation, bank))


def generalisation_error(
    M: jax.Array, Q: jax.Array, activation: Activation, bank: FieldBank, *, stderr: bool = False
) -> Any:
    """Generalisation error ``E(M, Q) = E |e_1 - a(chi)|^2 = 2 R`` on the bank (equation (7); token
    target; add ``Delta`` for the scalar target). ``stderr=True``: ``(E, its Monte Carlo standard
    error)`` (`FieldBank.stderr`)."""
    _check_bank_overlaps("generalisation_error", M, Q, bank)
    if not stderr:
        return 2 * _half_risk(M, Q, activation, bank)
    losses = 2 * _half_losses(M, Q, activation, bank)
    return bank.mean(losses), bank.stderr(losses)


# ----------------------------------------------------------------------------- drift forms
class DriftForm(eqx.Module):
    """How the drift of equation (8) is evaluated (abstract): `ExpectationForm`, `SteinForm`,
    `AutodiffForm`. The three agree within Monte Carlo error."""

    @abc.abstractmethod
    def gradients(
        self,
        M: jax.Array,
        Q: jax.Array,
        activation: Activation,
        bank: FieldBank,
        G: jax.Array,
        chi: jax.Array,
        chi_star: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        """``(gM, gQ)`` with ``dM/dt = -eta gM`` and ``dQ/dt = -eta gQ`` before the ``eta^2`` term."""


class ExpectationForm(DriftForm):
    """``gM = E[sum_l G_hl chi*_fl]``, ``gQ = A + A^T`` with ``A = E[sum_l G_hl chi_h'l]`` (equation (8), default)."""

    def gradients(self, M, Q, activation, bank, G, chi, chi_star):
        gM = bank.mean(jnp.einsum("bhl,blf->bhf", G, chi_star))
        A = bank.mean(jnp.einsum("bhl,bgl->bhg", G, chi))
        return gM, A + A.T


class SteinForm(DriftForm):
    """Gaussian integration by parts (equation (10a)):
    ``E[G_hl chi*_fl] = delta_l1 E[G_h1 theta_f] + sum_h' m_h'f E[d G_hl / d chi_h'l]``."""

    def gradients(self, M, Q, activation, bank, G, chi, chi_star):
        def stein_matrix(c):  # J_hg = sum_l d^2 loss / d chi_hl d chi_gl
            return jnp.einsum("hlgl->hg", jax.hessian(lambda x: half_loss(activation, x))(c))

        Jbar = bank.mean(jax.vmap(stein_matrix)(chi))
        g1 = bank.mean(jnp.einsum("bh,bf->bhf", G[:, :, 0], bank.theta))  # E[G_h1 theta_f]
        A = g1 @ M.T + Jbar @ Q
        return g1 + Jbar @ M, A + A.T


class AutodiffForm(DriftForm):
    """``jax.grad`` of the Monte Carlo half-risk with the ``H^2`` entries of ``Q`` independent
    (equation (10b)): with ``S = dR/dQ + (dR/dQ)^T``, ``gM = dR/dM + S M`` and
    ``gQ = (dR/dM) M^T + M (dR/dM)^T + S Q + Q S``."""

    def gradients(self, M, Q, activation, bank, G, chi, chi_star):
        gM, gQ = jax.grad(half_risk, argnums=(0, 1))(M, Q, activation, bank)
        S = gQ + gQ.T
        return gM + S @ M, gM @ M.T + M @ gM.T + S @ Q + Q @ S


# ----------------------------------------------------------------------------- the ODE
class Dynamics(eqx.Module):
    """What `order_parameter_field` needs besides the state: the `Setup`, its `FieldBank` and the
    `DriftForm`, and the bank the observables are evaluated on (``eval_bank``; ``None``: the
    field's). ``Dynamics.build(setup, bank, form)`` draws the banks from `BankOptions`."""

    setup: Setup
    bank: FieldBank
    form: DriftForm
    eval_bank: FieldBank | None = None

    @property
    def observe_bank(self) -> FieldBank:
        """The bank `solve`'s observables are expectations over."""
        return self.bank if self.eval_bank is None else self.eval_bank

    def __check_init__(self):
        if not isinstance(self.setup, Setup):
            raise ValueError(f"setup must be an attnflow.heads.Setup, got {self.setup!r}")
        if not isinstance(self.form, DriftForm):
            raise ValueError(f"form must be ExpectationForm(), SteinForm() or AutodiffForm(), got {self.form!r}")

    @classmethod
    def build(cls, setup: Setup, bank: BankOptions | None = None, form: DriftForm | None = None) -> Dynamics:
        """The dynamics of ``setup`` with a bank drawn from ``bank`` (default `BankOptions()`) and the
        drift ``form`` (default `ExpectationForm()`)."""
        if not isinstance(setup, Setup):
            raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r}")
        options = BankOptions() if bank is None else bank
        field_bank = FieldBank(setup.prior, setup.L, setup.H, options)
        eval_bank = (
            FieldBank(setup.prior, setup.L, setup.H, options, stream=EVAL_STREAM)
            if isinstance(options, BankOptions) and options.independent_eval
            else None
        )
        return cls(setup, field_bank, ExpectationForm() if form is None else form, eval_bank)


def _param_loss(chi: jax.Array, params: dict, activation: Activation) -> jax.Array:
    return half_loss(activation.with_params(params), chi)


def order_parameter_field(t: Any, y: dict, dyn: Dynamics) -> dict:
    """Right-hand side of the order-parameter ODE (8) on the state ``{"M", "Q", "act"}`` (``act``:
    the activation's learned parameters), in the form ``dyn.form``, with the ``eta^2`` term of
    ``dyn.setup.target`` (equations (8)-(9)) when ``sgd_noise`` is on."""
    s, bank = dyn.setup, dyn.bank
    M, Q, p = y["M"], y["Q"], y["act"]
    act = s.activation.with_params(p)
    chi, chi_star = bank.fields(M, Q)
    G, gp = jax.vmap(jax.grad(_param_loss, argnums=(0, 1)), in_axes=(0, None, None))(chi, p, s.activation)
    gM, gQ = dyn.form.gradients(M, Q, act, bank, G, chi, chi_star)
    dM = -s.eta * (gM + s.weight_decay * M)
    dQ = -s.eta * (gQ + 2 * s.weight_decay * Q)
    if s.sgd_noise:
        GG = jax.vmap(s.target.gradient_moment, in_axes=(None, 0, 0))(act, chi, G)
        dQ = dQ + s.eta**2 / s.minibatch * bank.mean(GG)
    dp = jax.tree_util.tree_map(lambda g: -s.rate_b * bank.mean(g), gp)
    return {"M": dM, "Q": dQ, "act": dp}


def initial_state(setup: Setup, M: Any = None, Q: Any = None) -> dict:
    """The ODE state ``{"M", "Q", "act"}``: the overlaps ``(M, Q)`` (default: the setup's initial
    condition) and the activation's initial learned parameters."""
    if M is None or Q is None:
        return setup.initial_state()
    return {"M": jnp.asarray(M, dtype=float), "Q": jnp.asarray(Q, dtype=float), "act": setup.activation.params()}


def _field(t, y, args):
    return order_parameter_field(t, y, args[0])


def _dynamics_observe(t, y, dyn):
    s = dyn.setup
    return order_parameter_observables(
        y["M"], y["Q"], s.activation.with_params(y["act"]), dyn.observe_bank, s.target.label_noise()
    )


def _observe(t, y, args):
    return _dynamics_observe(t, y, args[0])


def ode(setup: Setup, *, bank: BankOptions | None = None, form: DriftForm | None = None) -> ODE:
    """The order-parameter ODE (8) of ``setup`` as an `attnflow.ODE`: ``ode(t, y)`` is
    `order_parameter_field`, ``ode.y0`` the setup's initial condition (`initial_state`),
    ``ode.observables(y)`` `attnflow.heads.OBSERVABLES`, and ``ode.solve(t1)`` is
    ``solve(setup, t1)`` (without its positive-semidefiniteness check along the path). Its state
    is ``{"M", "Q", "act"}``; ``args`` is the `Dynamics` (setup, Monte Carlo bank drawn from
    ``bank``, drift ``form``), built once here.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r}")
    y0 = initial_state(setup)
    check_overlaps("initial condition", y0["M"], y0["Q"], setup.H, setup.F)
    dyn = Dynamics.build(setup, bank, form)
    return ODE(
        order_parameter_field,
        dyn,
        y0,
        _dynamics_observe,
        DEFAULT_SAVE,
        DEFAULT_SOLVER,
        meta=(
            ("theory", "heads"),
            ("clock", "t = steps / D"),
            # what rebuilds it (BankOptions.n), and the draws averaged with their copies
            ("bank n", int((BankOptions() if bank is None else bank).n)),
            ("bank draws", dyn.bank.size),
            ("form", type(dyn.form).__name__),
        ),
    )


def _escape_event(t, y, args):
    return args[1] - specialisation(y["M"])


@keyword_hints(
    "heads.solve",
    initial="the start is setup.init: heads.Setup(init=heads.Overlaps(M, Q)) (or FiniteDDraw, SymmetricSeed)",
    loss_target="event=lambda t, obs: obs['error'] - L stops there (escape=s stops at specialisation s)",
)
def solve(
    setup: Setup,
    t1: Any,
    *,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    bank: BankOptions | None = None,
    form: DriftForm | None = None,
    escape: Any = None,
    event: Callable[[Any, dict], Any] | None = None,
    progress: bool | None = None,
    psd_tolerance: float | None = None,
) -> Trajectory:
    """The order-parameter ODE (8) of ``setup`` from its initial condition, integrated to ``t1``
    on the clock ``t = steps / D`` of `attnflow.heads.train`.

    Records `attnflow.heads.OBSERVABLES` (``M (T, H, F)``, ``Q (T, H, H)``, ``specialisation``,
    ``error``, ``attention (T,)`` and the learned ``b``, ``c``) as expectations over the Monte
    Carlo bank drawn from ``bank`` (default `BankOptions()`), with the drift ``form`` (default
    `ExpectationForm()`). Save grid `DEFAULT_SAVE`, solver `DEFAULT_SOLVER` unless given.

    ``escape``: a threshold of `attnflow.heads.specialisation` (``|(I - 11^T/H) M|_F``, i.e.
    ``|m_1 - m_2| / sqrt(2)`` for two heads and one feature; `ESCAPE_THRESHOLD` is the usual
    value): the solve stops when it is reached and ``traj.t_event`` is that time (NaN if never),
    a traceable array, so escape times can be the output of a `attnflow.sweep`.
    ``event(t, obs) -> scalar`` on the observables ``obs`` (a dict of `attnflow.heads.OBSERVABLES` at time
    ``t``) stops the solve where it first changes sign, e.g. ``lambda t, o: o["error"] - 0.2``;
    ``traj.t_event`` is that time (NaN if it never does) and the save points after it hold the
    event state; traceable under ``jit``, ``vmap`` and `attnflow.sweep` (`attnflow.ObservableEvent`).
    ``escape=s`` is ``event=lambda t, o: o["specialisation"] - s``; give one of the two.

    Raises `attnflow.DivergenceError` when a value is not finite, or when at a save time
    ``lambda_min(Q - M M^T) < -psd_tolerance tr Q`` (spec section 6), the message naming
    ``lambda_min`` and the bound. ``psd_tolerance`` (a positive float) defaults to
    ``max(PSD_TOLERANCE, 10 rtol)`` with the solver's ``rtol``, not to the spec's ``1e-8``
    (`PSD_TOLERANCE`) alone: the solver's own error in ``Q`` is about ``rtol |Q|``, so at the
    default ``rtol = 1e-6`` a bound of ``1e-8 tr Q`` would stop sound flows whose keys coincide
    off the signal (``Q - M M^T`` singular); pass ``psd_tolerance=1e-8`` with ``rtol <= 1e-9``
    for the spec's bound. The check runs on concrete trajectories (not under ``jit``, ``vmap``
    or a sweep). Compiled once per (setup structure, save grid,
    solver, bank size, form, event on/off): new learning rates, prior parameters, initial
    conditions or thresholds reuse it.
    ``progress=True`` shows the solve's progress meter with the solver it would use anyway
    (``solver``, else `DEFAULT_SOLVER`), where ``solver=af.SolverOptions(progress=True)`` would
    replace the package's solver and tolerances by the core's defaults.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r}")
    require_x64("heads.solve")
    if escape is not None and event is not None:
        raise ValueError("give escape or event, not both (escape=s is event=lambda t, o: o['specialisation'] - s)")
    V.positive("t1", t1)  # before the bank is drawn (seconds at 2^14 draws)
    if psd_tolerance is not None:
        V.positive("psd_tolerance", psd_tolerance)
    o = ode(setup, bank=bank, form=form)
    solver = with_progress(solver, o.solver, progress)
    if escape is not None:
        V.positive("escape (threshold of the specialisation)", escape)
        check_escape_start(setup, escape, "escape")
    threshold = jnp.asarray(jnp.inf if escape is None else escape, dtype=float)
    traj = integrate(
        _field,
        o.y0,
        t1,
        args=(o.args, threshold),
        save=o.save if save is None else save,
        solver=solver,
        observe=_observe,
        event=_escape_event if escape is not None else observable_event(event, _observe),
        meta=dict(o.meta),
    )
    if not V.any_traced((traj.ts, traj.ys)):
        _check_psd_along(traj, solver, psd_tolerance)
    return traj


def check_escape_start(setup: Setup, threshold: Any, name: str) -> None:
    """``ValueError`` unless the heads start below the specialisation ``threshold`` (called
    ``name``): an escape event would never fire from above it. Traced (a sweep over the
    threshold or the initialisation; over the learning rate it is checked at once): the point
    is marked failed with that message instead (`check_traced`), not left to read as "no
    escape by t1"."""
    with jax.ensure_compile_time_eval():  # M0 of a concrete initialisation is a value, also in a sweep
        M0, _ = setup.initial_overlaps()
    if V.any_traced((M0, threshold)):
        check_traced(
            lambda: ~(specialisation(jnp.asarray(M0)) < threshold),
            f"{name} must lie above the initial specialisation S(M0): the heads start specialised, so there is "
            "no escape to time",
        )
        return
    with jax.ensure_compile_time_eval():
        s0 = float(specialisation(jnp.asarray(M0)))
    if not s0 < float(threshold):
        raise ValueError(
            f"{name} = {V.show(threshold)} must lie above the initial specialisation S(M0) = {s0:.4g}: "
            "the heads start specialised, so there is no escape to time"
        )


def _check_psd_along(traj: Trajectory, solver: SolverOptions, psd_tolerance: float | None = None) -> None:
    """`attnflow.DivergenceError` at the first save time with ``lambda_min(Q - M M^T) <
    -psd_tolerance tr Q`` (default ``max(PSD_TOLERANCE, 10 rtol)``; `solve`)."""
    M, Q = np.asarray(traj["M"]), np.asarray(traj["Q"])
    P = 0.5 * (Q + np.swapaxes(Q, -1, -2)) - M @ np.swapaxes(M, -1, -2)
    p_min = np.linalg.eigvalsh(P)[:, 0]
    trQ = np.trace(Q, axis1=1, axis2=2)
    tol = max(PSD_TOLERANCE, 10 * float(np.max(solver.rtol))) if psd_tolerance is None else float(psd_tolerance)
    bad = np.flatnonzero(p_min < -tol * trQ)
    if bad.size:
        i = int(bad[0])
        raise DivergenceError(
            f"solve: Q - M M^T lost positive semidefiniteness at t = {float(traj.ts[i]):.4g}: "
            f"lambda_min = {p_min[i]:.3g} < -psd_tolerance tr Q = {-tol * trQ[i]:.3g} (psd_tolerance {tol:.3g}, "
            f"tr Q {trQ[i]:.3g}); lower rtol or eta"
        )


# ----------------------------------------------------------------------------- phases
def _head_distance(H: int) -> np.ndarray:
    """``min(|h - h'|, H - |h - h'|)``: the distance of two heads on the cycle of the cyclic copies."""
    d = np.abs(np.arange(H)[:, None] - np.arange(H)[None, :])
    return np.minimum(d, H - d)


def _circulant(setup: Setup, bank: BankOptions | None) -> bool:
    """Whether the field of ``setup`` on ``bank`` keeps only the cyclically invariant states (a
    circulant ``Q``) invariant, not the fully symmetric ones: `CyclicCopies` with ``H >= 4``."""
    return isinstance((BankOptions() if bank is None else bank).copies, CyclicCopies) and setup.H > 3


def _symmetric_coords(y: dict, circulant: bool = False) -> jax.Array:
    """Coordinates of a permutation-invariant state: row mean of ``M``, mean diagonal and mean
    off-diagonal of ``Q``, and the head-mean of each learned parameter. ``circulant``: of a
    state invariant under the cyclic shifts of the heads only, ``Q``'s mean at each distance
    of two heads on the cycle (`_head_distance`; the same coordinates for ``H <= 3``)."""
    M, Q = y["M"], y["Q"]
    H = M.shape[0]
    parts = [jnp.mean(M, axis=0)]
    if circulant:
        dist = _head_distance(H)
        parts += [jnp.mean(Q[dist == d])[None] for d in range(H // 2 + 1)]
    else:
        parts.append(jnp.mean(jnp.diag(Q))[None])
        if H > 1:
            parts.append(((jnp.sum(Q) - jnp.trace(Q)) / (H * (H - 1)))[None])
    parts += [jnp.mean(x)[None] for x in jax.tree_util.tree_leaves(y["act"])]
    return jnp.concatenate(parts)


def _symmetric_state(z: jax.Array, like: dict, circulant: bool = False) -> dict:
    H, F = like["M"].shape
    M = jnp.broadcast_to(z[:F], (H, F))
    if circulant:
        Q = z[F + _head_distance(H)]
        k = F + H // 2 + 1
    else:
        d, k = z[F], F + 1
        off = z[k] if H > 1 else 0.0
        k += H > 1
        Q = off * jnp.ones((H, H)) + (d - off) * jnp.eye(H)
    leaves, tdef = jax.tree_util.tree_flatten(like["act"])
    vals = [jnp.broadcast_to(z[k + i], x.shape) for i, x in enumerate(leaves)]
    return {"M": M, "Q": Q, "act": jax.tree_util.tree_unflatten(tdef, vals)}


def symmetrise(y: dict) -> dict:
    """Projection of a state onto the permutation-invariant states: equal rows of ``M``, equal
    diagonal and equal off-diagonal entries of ``Q``, equal per-head parameters."""
    return _symmetric_state(_symmetric_coords(y), y)


def plateau_state(setup: Setup, traj: Trajectory, t: Any) -> dict:
    """The state ``{"M", "Q", "act"}`` of a `solve` trajectory ``traj`` of ``setup`` at time ``t``
    (interpolated linearly between saves), symmetrised (`symmetrise`): the point of the flow's
    own plateau at which to linearise (`specialisation_spectrum`) when the plateau drifts and is
    not a root of the equal-heads field (see `unspecialised_point`'s warnings)."""
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r:.80}")
    learned = tuple(setup.activation.learned)
    if not isinstance(traj, Trajectory) or not {"M", "Q", *learned} <= set(traj.names):
        raise ValueError(
            f"traj must be a Trajectory of heads.solve with the observables M, Q{''.join(', ' + n for n in learned)}, "
            f"got {sorted(traj.names) if isinstance(traj, Trajectory) else V.show(traj)}"
        )
    if traj.batch_shape:
        raise ValueError(f"traj must be one run, got a batch of shape {traj.batch_shape}: pick one with traj.batch(i)")
    t = V.finite_scalar("t", t)
    ts = np.asarray(traj.ts)
    if not ts[0] <= t <= ts[-1]:
        raise ValueError(f"t = {t!r} is outside the saved times [{ts[0]:g}, {ts[-1]:g}] of traj")
    row = {k: v[0] for k, v in traj.at(t, ("M", "Q", *learned)).items()}
    return symmetrise({"M": row["M"], "Q": row["Q"], "act": {n: row[n] for n in learned}})


def _symmetric_field(t, z, args):
    dyn, like = args
    return _symmetric_coords(order_parameter_field(t, _symmetric_state(z, like), dyn))


def _circulant_field(t, z, args):
    dyn, like = args
    return _symmetric_coords(order_parameter_field(t, _symmetric_state(z, like, True), dyn), True)


def unspecialised_point(
    setup: Setup,
    guess: tuple[Any, Any] | None = None,
    *,
    bank: BankOptions | None = None,
    form: DriftForm | None = None,
    solver: Any = None,
    max_steps: int = 256,
) -> dict:
    """The fixed point of the ODE (8) on the equal-heads manifold (the unspecialised phase), as a
    state ``{"M", "Q", "act"}``.

    A root find in the manifold's own coordinates (mean row of ``M``, mean diagonal and
    off-diagonal of ``Q``, mean learned parameters; with the default `CyclicCopies` and
    ``H >= 4``, the mean of ``Q`` at each distance of two heads on the cycle instead, the
    manifold the cyclic copies keep exactly invariant, so that the point is a root of the full
    field; `AllPermutations` keeps all off-diagonal entries equal) from the symmetrised ``guess = (M, Q)``
    (default: the setup's initial overlaps, close to ``M = 0``, ``Q = sigma0^2 I``). ``solver``
    (any Optimistix root finder or least-squares solver, passed to `attnflow.fixed_point`)
    defaults to Levenberg-Marquardt: its damped steps keep ``Q - M M^T`` positive semidefinite
    where an undamped Newton step from ``Q = sigma0^2 I`` overshoots.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r}")
    require_x64("heads.unspecialised_point")
    M, Q = setup.initial_overlaps() if guess is None else guess
    like = symmetrise(initial_state(setup, M, Q))
    dyn = Dynamics.build(setup, bank, form)
    # the cyclic copies make the field exactly equivariant under the cyclic shifts only: for
    # H >= 4 the invariant manifold has a circulant Q (neighbouring and opposite heads apart),
    # on which the root is a fixed point of the full field; equal off-diagonal entries are not
    circulant = _circulant(setup, bank)
    solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12) if solver is None else solver
    field = _circulant_field if circulant else _symmetric_field
    z = fixed_point(field, _symmetric_coords(like, circulant), (dyn, like), solver=solver, max_steps=max_steps)
    y = _symmetric_state(z, like, circulant)
    if not V.any_traced(z):
        P = np.asarray(y["Q"] - y["M"] @ y["M"].T)
        ev = float(np.linalg.eigvalsh(P)[0])
        if ev < -PSD_TOLERANCE * max(1.0, float(np.trace(P))):
            raise RuntimeError(
                f"unspecialised_point: the root found has Q - M M^T with eigenvalue {ev:.3g} < 0, not a "
                "state of keys; try another guess or a larger bank"
            )
        rank = int(np.sum(np.linalg.eigvalsh(P) > 1e-8 * max(float(np.trace(P)), 1e-300)))
        row = np.round(np.asarray(y["Q"])[0], 4).tolist()
        if setup.H > 1 and rank < min(setup.H, np.linalg.matrix_rank(np.asarray(like["Q"] - like["M"] @ like["M"].T))):
            warnings.warn(
                f"unspecialised_point: at the root found the keys coincide off the signal (Q - M M^T has rank {rank} "
                f"of {setup.H}; first row of Q {row}). The equal-heads field has such roots besides the plateau, and "
                "the ODE need not come near them: check the point against a solve's plateau, or linearise on the "
                f"flow's own state: {_ON_THE_FLOW}",
                stacklevel=_caller_outside_attnflow(),
            )
        elif setup.H > 1:
            rates = np.abs(np.real(np.linalg.eigvals(np.asarray(jax.jacfwd(field, argnums=1)(0.0, z, (dyn, like))))))
            if rates.min() < SLOW_RELAXATION * rates.max():
                warnings.warn(
                    "unspecialised_point: on the equal-heads manifold the field relaxes onto the root found "
                    f"(first row of Q {row}) at rate {rates.min():.2g}, against {rates.max():.2g} in its fastest "
                    "direction: a curve of near-roots, along which the flow's plateau drifts without reaching this "
                    f"point. Its escape rate need not be the flow's; linearise on the flow's own state: {_ON_THE_FLOW}",
                    stacklevel=_caller_outside_attnflow(),
                )
    return y


SLOW_RELAXATION = 1e-2
"""`unspecialised_point` warns when the slowest relaxation rate of the equal-heads field at its
root is below this fraction of the fastest (a near-neutral direction: the plateau drifts)."""

_ON_THE_FLOW = (
    "specialisation_spectrum(setup, plateau_state(setup, solve(setup, ...), t)) at a time t on the plateau; "
    "for the escape time, drifting_escape_time(plateau_rates(setup, t1), D)"
)


def antisymmetric_basis(y: dict, circulant: bool = False) -> jax.Array:
    """Orthonormal basis ``(n, k)`` of the antisymmetric sector at the state ``y`` (flattened by
    ``ravel_pytree``): the directions with symmetric ``Q`` orthogonal to the permutation-invariant
    states; ``circulant``: orthogonal to the states invariant under the cyclic shifts of the heads
    (``Q`` set by the distance of two heads on the cycle), the invariant manifold of a field with
    `CyclicCopies` at ``H >= 4``, on whose complement its Jacobian acts."""
    flat, unravel = ravel_pytree(y)

    def sym_Q(x):  # physical states have symmetric Q: q_hh' - q_h'h is not a direction of the dynamics
        s = unravel(x)
        return ravel_pytree({**s, "Q": 0.5 * (s["Q"] + s["Q"].T)})[0]

    Pq = jax.jacfwd(sym_Q)(flat)

    def project(x):
        z = unravel(x)
        return ravel_pytree(_symmetric_state(_symmetric_coords(z, circulant), z, circulant))[0]

    Ps = jax.jacfwd(project)(flat)
    evals, evecs = jnp.linalg.eigh(Pq - 0.5 * (Ps + Ps.T))
    return evecs[:, evals > 0.5]


def specialisation_spectrum(
    setup: Setup, y: dict, *, bank: BankOptions | None = None, form: DriftForm | None = None
) -> Spectrum:
    """Spectrum of the Jacobian of the full right-hand side (8) at ``y`` (``jax.jacfwd``),
    restricted to the antisymmetric sector (`antisymmetric_basis`, `attnflow.spectrum` with
    ``basis=``; with the default `CyclicCopies` and ``H >= 4``, the complement of the cyclically
    invariant states, which that field keeps invariant). Its ``lambda_max`` is the escape rate
    ``lambda`` of equation (15); eigenvectors are states shaped like ``y``."""
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r:.80}")
    if not isinstance(y, Mapping) or not {"M", "Q"} <= set(y):
        raise ValueError(
            'y must be a state {"M", "Q", "act"} of the ODE (8), e.g. unspecialised_point(setup) or '
            f"heads.ode(setup).y0, got {V.show(y) if not isinstance(y, Mapping) else sorted(y)}"
        )
    require_x64("heads.specialisation_spectrum")
    dyn = Dynamics.build(setup, bank, form)
    circulant = _circulant(setup, bank)
    return spectrum(order_parameter_field, y, dyn, basis=antisymmetric_basis(y, circulant))


class _PlateauObserve(eqx.Module):
    """What `plateau_rates` records at a state of the equal-heads manifold (coordinates ``z``):
    the overlaps and the escape rate there. A module, so that a new setup reuses the compiled
    solve."""

    circulant: bool = eqx.field(static=True)

    def __call__(self, t, z, args):
        dyn, like = args
        y = _symmetric_state(z, like, self.circulant)
        # the sector depends on the shapes only: a constant of the program, built at trace time
        with jax.ensure_compile_time_eval():
            basis = antisymmetric_basis(jax.tree_util.tree_map(lambda x: np.zeros(np.shape(x)), y), self.circulant)
        lam = spectrum(order_parameter_field, y, dyn, basis=basis).lambda_max
        return {"lambda": jnp.real(lam), "M": y["M"], "Q": y["Q"], **y["act"]}


def plateau_rates(
    setup: Setup,
    t1: Any,
    *,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    bank: BankOptions | None = None,
    form: DriftForm | None = None,
) -> Trajectory:
    """Spec section 9 on a drifting plateau: the flow (8) restricted to the equal-heads manifold
    from the setup's symmetrised start (`symmetrise`; integrated in the manifold's own
    coordinates, as `unspecialised_point` finds its root, so it never leaves the manifold),
    which is the plateau the ODE follows until its heads split, continued past that. At each
    save time it records ``lambda``, the escape rate there (the leading eigenvalue of the
    Jacobian of (8) on the antisymmetric sector, `specialisation_spectrum`), its integral
    ``exponent = int_0^t lambda ds`` (trapezoids on the save grid), and the state ``M``,
    ``Q`` and learned parameters. `drifting_escape_time` reads the escape time off it.

    Defaults: `DEFAULT_SAVE` (the integral's resolution), `DEFAULT_SOLVER`."""
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.heads.Setup, got {setup!r:.80}")
    require_x64("heads.plateau_rates")
    V.positive("t1", t1)
    if setup.H < 2:
        raise ValueError(f"plateau_rates needs H >= 2 heads (an antisymmetric sector), got H = {setup.H}")
    dyn = Dynamics.build(setup, bank, form)
    circulant = _circulant(setup, bank)
    like = symmetrise(setup.initial_state())
    traj = integrate(
        _circulant_field if circulant else _symmetric_field,
        _symmetric_coords(like, circulant),
        t1,
        args=(dyn, like),
        save=DEFAULT_SAVE if save is None else save,
        solver=DEFAULT_SOLVER if solver is None else solver,
        observe=_PlateauObserve(circulant),
        meta={"theory": "heads", "equation": "(8) on the equal-heads manifold; escape rate (15) along it"},
    )
    lam = traj["lambda"]
    steps = 0.5 * (lam[..., 1:] + lam[..., :-1]) * jnp.diff(traj.ts, axis=-1)
    exponent = jnp.concatenate([jnp.zeros_like(lam[..., :1]), jnp.cumsum(steps, axis=-1)], axis=-1)
    return traj.with_ys(exponent=exponent)


def drifting_escape_time(rates: Trajectory, D: Any, t0: Any = 0.0) -> jax.Array:
    """Spec section 9: on a drifting plateau the antisymmetric components, started at
    ``O(D^{-1/2})``, grow as ``exp(int lambda dt)``, and the heads split at ``t0 + t`` with
    ``int_0^t lambda ds = ln(D) / 2`` (``rates`` from `plateau_rates`; read between saves
    linearly), the form of (15) (`predicted_escape_time`, ``t0 + ln D / (2 lambda)``) with a
    rate that changes along the plateau. ``t0`` is the ``O(1)`` shift of (15) (the seed's
    prefactor, the threshold). NaN when the integral has not reached ``ln(D) / 2`` by the last
    save. Traceable in ``D`` and ``t0``."""
    if not isinstance(rates, Trajectory) or not {"lambda", "exponent"} <= set(rates.names):
        raise ValueError(f"rates must be a Trajectory of heads.plateau_rates, got {rates!r:.80}")
    V.positive("D", D)
    if not V.any_traced(D) and np.any(np.asarray(D) <= 1):
        raise ValueError(f"D must be > 1 (the escape starts at D^(-1/2) < 1), got {V.show(D)}")
    target = 0.5 * jnp.log(jnp.asarray(D, dtype=float))
    # one D or an array of them (each read off the one curve)
    cross = jnp.vectorize(lambda x: first_crossing(rates.ts, rates["exponent"], x, interpolate=True))
    return t0 + cross(target)


def predicted_escape_time(lam: Any, D: Any, t0: Any = 0.0) -> Any:
    """``t_spec = t0 + ln D / (2 lambda)`` (equation (15)): antisymmetric components start at
    ``O(D^{-1/2})`` and grow as ``e^{lambda t}``."""
    V.positive("lambda (escape rate)", lam)
    V.positive("D", D)
    if not V.any_traced(D) and np.any(np.asarray(D) <= 1):
        raise ValueError(f"D must be > 1 (the escape starts at D^(-1/2) < 1), got {V.show(D)}")
    # the linearised escape from eps = D^{-1/2} to r = 1 at rate lambda
    return t0 + escape_time(lam, eps=jnp.asarray(D, dtype=float) ** -0.5)


def feature_escape_times(traj: Trajectory, threshold: Any = ESCAPE_THRESHOLD) -> jax.Array:
    """Per feature ``f``, the first save time at which ``|(I - 11^T/H) M[:, f]|`` reaches
    ``threshold`` (NaN if never), shape ``(F,)``: the order in which the features are learned by
    specialised heads. Traceable."""
    M = traj["M"]
    spread = jnp.sqrt(jnp.sum((M - jnp.mean(M, axis=-2, keepdims=True)) ** 2, axis=-2))  # (T, F)
    ts = jnp.broadcast_to(traj.ts, spread.T.shape)
    return first_crossing(ts, spread.T, threshold)
