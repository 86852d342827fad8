"""Training the networks of `attnflow.qkov`.

- `train`: the full matrices of a `Setup`'s theory task, from the invariant-manifold start,
  by gradient flow (default), gradient descent or online SGD, on the clock of `solve`.
- `train_on_generator`: SGD of the authors' code model on their synthetic generator (the
  paper's experiments), with per-circuit rates and an optional linear QK ramp.
- `train_fixed_attention`: SGD of the OV circuit alone under a fixed attention pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import _validate as V
from .._jit import filter_jit
from .._keywords import keyword_hints
from ..ode import integrate, observable_event, require_x64, with_progress
from ..optim import per_circuit
from ..options import LogGrid, SaveGrid, SolverOptions, TimeGrid, train_steps
from ..simulate import FullBatch, OnlineSGD, check_divergence, check_start, run_training, simulate
from ..trajectory import Trajectory
from .data import CodeGenerator
from .metrics import separability
from .model import PARAMETRISATIONS, Init, QKOVModel, TorchDefault, circuit_labels, code_model, cross_entropy
from .observe import OV_READOUTS, QK_READOUTS, _held_out, conserved_quantities, model_observables
from .setup import Setup, _check_factor_ratio
from .theory import _LOSS_OR_EVENT, DEFAULT_SAVE, _check_loss_target
from .theory import _start_loss as _reduced_start_loss

__all__ = [
    "BATCH_SEED_OFFSET",
    "DEFAULT_TRAIN_SAVE",
    "EVAL_SEED",
    "EVAL_SIZE",
    "FINAL_EVAL_SEED",
    "FIXED_ATTENTION_SAVE",
    "FIXED_EVAL_SEED",
    "FLOW_SOLVER",
    "GENERATOR_BATCH",
    "GENERATOR_OBSERVABLES",
    "GENERATOR_SAVE",
    "REFERENCE_T",
    "TRAIN_TOLERANCE",
    "fixed_attention_logits",
    "linear_ramp",
    "train",
    "train_fixed_attention",
    "train_on_generator",
]

DEFAULT_TRAIN_SAVE = DEFAULT_SAVE
"""`train`'s save grid when none is given: `attnflow.qkov.DEFAULT_SAVE`, so that a gradient-flow
run and `solve` save at the same times."""

FLOW_SOLVER = SolverOptions(rtol=1e-8, atol=1e-10, max_steps=100_000)
"""`train`'s solver options for gradient flow when none are given."""

REFERENCE_T = 3000.0
"""Horizon of the documented comparison `TRAIN_TOLERANCE` at the reference `Setup` (the bound
holds for every ``t1 <= REFERENCE_T``)."""

TRAIN_TOLERANCE = MappingProxyType({"mu_ov": 0.025, "mu_qk": 0.05, "alpha": 0.012, "loss": 0.02})
"""Largest gap ``attnflow.compare(solve(Setup(), T), train(Setup(), T))`` (max absolute difference)
allowed per observable for the reference `Setup` and ``T <= REFERENCE_T`` (tested; measured at
``T = 3000``:
0.016, 0.030, 0.0074, 0.013, i.e. at most 0.7% of the values). The gap is the ``O(b / |C|)``
effect of the common scores, which the authors' equations (``kappa = 1``) leave out; with
``Setup(common_correction=True)`` it falls to the solver tolerance (see `train`)."""


# ----------------------------------------------------------------------------- theory task
def _flow_field(t, model, args):
    # dW/dt = -eta_matrix grad L (eq. (9) loss), per factor (Setup.factor_rates); labels are made
    # at trace time
    setup = args["setup"]
    grads = jax.grad(setup.task.population_loss)(model)
    rates = setup.factor_rates
    return jax.tree_util.tree_map(lambda g, lab: -rates[lab] * g, grads, circuit_labels(grads, per_factor=True))


EVAL_SAMPLES = 2048
"""Held-out sequences on which `train` under online SGD measures ``loss`` and ``alpha``."""

EVAL_SEED = 7
"""Seed of the held-out sequences of `train` (``eval_samples`` of them) and of
`train_on_generator`'s default evaluation set (`EVAL_SIZE` of them): fixed, not drawn from
``key``, so every training seed is measured on the same sequences (as `attnflow.heads.train`
does with its own ``EVAL_SEED``)."""


def _observe(model, setup, conserved, eval_set=None, readouts=("projection", "gap")):
    out = model_observables(model, setup.task, eval_set=eval_set, ov_readout=readouts[0], qk_readout=readouts[1])
    if conserved:
        out.update(conserved_quantities(model, (setup.qk_factor_ratio, setup.ov_factor_ratio)))
    return out


class _FlowObserve(eqx.Module):
    """What gradient-flow `train` records: a module, so that a new call with the same options
    is the same observe function to the compilation cache."""

    conserved: bool = eqx.field(static=True)
    readouts: tuple[str, str] = eqx.field(static=True)

    def __call__(self, t, model, args):
        return _observe(model, args["setup"], self.conserved, None, self.readouts)


class _FlowLossEvent(eqx.Module):
    """Gradient-flow `train`'s ``loss_target`` event, ``loss - loss_target`` on the recorded
    ``loss``: the target travels in the solve's ``args`` (data, not a closure), so a new or traced
    target reuses the compiled solve."""

    observe: _FlowObserve = eqx.field(static=True)

    def __call__(self, t, model, args):
        return self.observe(t, model, args)["loss"] - args["loss_target"]


@keyword_hints("qkov.train", D="the sizes are fields of the setup, qkov.Setup(m=..., n=..., b=..., M=...)")
def train(
    setup: Setup,
    t1: Any,
    *,
    key: Any = 0,
    dt: float | None = None,
    batch: int | None = None,
    initial: dict | None = None,
    model: QKOVModel | None = None,
    conserved: bool = False,
    save: SaveGrid | None = None,
    solver: SolverOptions | None = None,
    loss_target: Any = None,
    event: Callable[[Any, Mapping[str, Any]], Any] | None = None,
    return_model: bool = False,
    progress: bool = False,
    eval_samples: int | None = None,
    ov_readout: str = "projection",
    qk_readout: str = "gap",
) -> Any:
    """The full matrices of ``setup``'s theory task (`Setup.task`, ``V = M b + |C|`` tokens, the
    model of `Setup.parametrisation` with ``n_out = M``, query not attended), trained to time
    ``t1`` from the invariant-manifold start (`Setup.model`, the start of `solve`):

    - ``dt=None`` (default): gradient flow ``dW/dt = -eta grad L`` per circuit on the
      population loss (eq. (9)), integrated (``solver``, default `FLOW_SOLVER`): the exact
      flow whose reduction is `solve`;
    - ``dt``: gradient descent with learning rates ``eta_qk dt``, ``eta_ov dt`` (``t = dt *
      step``), the Euler scheme of that flow (error ``O(dt)``);
    - ``dt`` and ``batch``: online SGD on ``batch`` fresh sequences of the task per step
      (``key`` seeds the draws; may be traced, a sweep over seeds), whose mean gradient is the
      same on the manifold.

    ``model`` (a network of this setup's task, e.g. one returned by ``return_model=True``) is
    trained on from instead of the start, the clock starting at 0 again.

    Records `attnflow.qkov.OBSERVABLES` at the save grid (default `DEFAULT_TRAIN_SAVE`, in time
    units; for gradient flow the same times as `solve`); the factors of a factorised circuit
    train at `Setup.factor_rates`. ``loss`` and ``alpha`` are the
    mean-embedding forms, exact on the invariant manifold, which gradient flow and full-batch
    descent keep; online SGD leaves it (its sampling noise moves the matrices off it), so there
    they are the network's own mean cross-entropy and attention mass on the distinct positions
    over ``eval_samples`` held-out sequences (default `EVAL_SAMPLES` with ``batch``; give a
    number for full-batch descent too; drawn from the fixed seed `EVAL_SEED`, whatever ``key``).
    ``ov_readout`` / ``qk_readout`` pick the readouts of ``mu_ov`` / ``mu_qk`` (`OV_READOUTS`,
    `QK_READOUTS`; ``"attention"`` reads ``mu_qk`` from the held-out attention).
    ``conserved=True`` adds, per factorised circuit ``W = A B``, ``conserved_qk`` /
    ``conserved_ov`` = ``eta (A^T A / eta_A - B B^T / eta_B)``, ``A^T A - B B^T`` at equal factor
    rates (constant under gradient flow, eq. (8)). A diverging descent raises
    `attnflow.DivergenceError` naming the step.

    Agreement with `solve`: on the manifold the full matrices follow eq. (3) exactly except that
    their common scores fall at ``b/|C|`` times the distinct rate, so the collapsed-QK rate is
    ``kappa = 1 + b/|C|`` times the authors' (``Setup.common_correction=True`` puts it in
    `solve`; for factorised QK it puts the open analogue ``1 + b/(2|C|)``, `Setup.kappa`). For the
    reference ``Setup()`` and
    ``t1 <= 3000`` the gap per observable is below `TRAIN_TOLERANCE`.

    ``event(t, obs) -> scalar`` (as in `solve`) sets ``t_event``: under gradient flow the
    solve stops there, found by the solver as in `solve`; under descent it is the first time
    the event changes sign on the saved points, placed linearly between them
    (`attnflow.event_time`), and the run goes on to ``t1``. ``loss_target=L`` is
    ``event=lambda t, o: o["loss"] - L`` (give one of the two), checked as in `solve`: finite,
    positive and below the start's ``loss`` (``ValueError``; traced, at a point of
    `attnflow.sweep`, the point fails with the same message).

    ``return_model=True`` returns ``(trajectory, trained network)``: the `QKOVModel` at ``t1``
    (or at the event, under gradient flow).

    New learning rates (``setup.replace(eta_qk=...)``) and, for descent, new ``t1`` with as
    many save points reuse the compiled run.
    """
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be an attnflow.qkov.Setup, got {setup!r}")
    if batch is not None:
        batch = V.positive_int("batch", batch)
        if dt is None:
            raise ValueError(f"online SGD (batch={batch}) needs a time step dt")
    readouts = (V.choice("ov_readout", ov_readout, OV_READOUTS), V.choice("qk_readout", qk_readout, QK_READOUTS))
    if qk_readout == "attention" and batch is None and eval_samples is None:
        raise ValueError(
            'qk_readout="attention" reads mu_QK from attention measured on held-out sequences: give eval_samples '
            "(with dt), or train by online SGD"
        )
    if eval_samples is not None:
        eval_samples = V.positive_int("eval_samples", eval_samples)
        if dt is None:
            raise ValueError(
                "eval_samples measures loss and alpha on held-out sequences under descent (dt=...); gradient flow "
                "stays on the invariant manifold, where the recorded mean-embedding forms are exact"
            )
    elif batch is not None:
        eval_samples = EVAL_SAMPLES
    save = DEFAULT_TRAIN_SAVE if save is None else save
    st = setup.initial_state(initial)
    if model is not None:  # train on from a given network (one returned by return_model=True)
        if initial is not None:
            raise ValueError("give initial (circuit strengths of the start) or model (a network to train on), not both")
        check_start(model, eqx.filter_eval_shape(setup.model, st), "a QKOVModel of this setup's task")
    if loss_target is not None:
        if event is not None:
            raise ValueError(_LOSS_OR_EVENT)
        # the recorded loss at t = 0: the reduced loss (2) of the start, or the given network's
        _check_loss_target(loss_target, lambda: _start_loss(setup, initial, model))
    meta = {
        "theory": "qkov",
        "parametrisation": setup.parametrisation,
        "dt": dt,
        "batch": batch,
        "clock": "t; gradient flow dW/dt = -eta grad L per circuit",
    }
    if eval_samples is not None:
        meta["observed on"] = f"loss and alpha on {eval_samples} held-out sequences"
    if dt is None:
        require_x64("qkov.train (gradient flow, dt=None; dt=... trains by gradient descent in float32)")
        observe = _FlowObserve(bool(conserved), readouts)
        solver = with_progress(solver, FLOW_SOLVER, progress or None)  # False: the solver as given
        flow_args: dict[str, Any] = {"setup": setup}
        stop: Any = observable_event(event, observe)
        if loss_target is not None:
            flow_args["loss_target"] = jnp.asarray(loss_target, jnp.result_type(float))
            stop = _FlowLossEvent(observe)
        return integrate(
            _flow_field,
            setup.model(st) if model is None else model,
            t1,
            args=flow_args,
            save=save,
            solver=solver,
            observe=observe,
            event=stop,
            meta={**meta, "method": "gradient flow"},
            return_state=return_model,
        )
    dt = V.finite_scalar("dt", dt)
    V.positive("dt", dt)
    total, steps = train_steps(save, DEFAULT_TRAIN_SAVE, t1, dt)
    init = {k: jnp.asarray(st[k], jnp.result_type(float)) for k in ("mu_ov", "mu_qk")}
    args = (
        setup,
        V.prng_key(key),
        init,
        model,
        np.asarray(steps, np.int32),
        np.asarray(total, np.int32),
        dt,
        batch,
        conserved,
        bool(return_model),
        progress,
        {
            **meta,
            "method": "gradient descent" if batch is None else "online SGD",
            "clock": "t = steps * dt; gradient flow dW/dt = -eta grad L per circuit",
        },
        eval_samples,
        readouts,
    )
    if loss_target is not None:

        def event(t, obs):
            return obs["loss"] - loss_target

    return run_training(_descend, args, clock=dt, total=total, event=event)


def _start_loss(setup: Setup, initial: dict | None, model: QKOVModel | None) -> Any:
    """The ``loss`` `train` records at ``t = 0``: eq. (2) at the start of `solve`, or the
    mean-embedding loss of a given ``model``."""
    if model is None:
        return _reduced_start_loss(setup, initial)
    return model_observables(model, setup.task)["loss"]


@filter_jit
def _descend(
    setup, key, initial, model, steps, total, dt, batch, conserved, return_model, progress, meta, n_eval, readouts
):
    task = setup.task
    eval_set = None if n_eval is None else task.sample(jax.random.PRNGKey(EVAL_SEED), n_eval)
    if model is None:
        model = setup.model(initial)  # weighted-balanced for the factor rates
    opt = per_circuit(
        circuit_labels(model, per_factor=True),
        {k: v * dt for k, v in setup.factor_rates.items()},
        allow_unused=True,
    )
    if batch is None:
        mode = FullBatch()

        def loss(m, _):
            return task.population_loss(m)
    else:
        mode = OnlineSGD(task.sample, batch)
        loss = cross_entropy
    return simulate(
        loss,
        model,
        opt,
        total,
        mode=mode,
        key=key,
        observe=lambda m: _observe(m, setup, conserved, eval_set, readouts),
        save=TimeGrid(steps),
        clock=dt,
        progress=progress,
        throw=False,
        return_model=return_model,
        meta=meta,
    )


# ----------------------------------------------------------------------------- code generator
GENERATOR_OBSERVABLES = MappingProxyType(
    {
        "loss": "cross-entropy on the evaluation set",
        "a_rel": "mean attention mass on the distinct (class-informative) tokens, A_rel",
        "accuracy": "fraction of the evaluation set classified correctly",
        "separability": "mean of max_{relevant} a_i - min_{other} a_i",
    }
)
"""What `train_on_generator` records."""

GENERATOR_BATCH = 32
"""The authors' SGD batch size."""

GENERATOR_SAVE = LogGrid(30)
"""`train_on_generator`'s save grid (on the step axis) when none is given."""

EVAL_SIZE = 2000
"""Size of `train_on_generator`'s default evaluation set."""

BATCH_SEED_OFFSET = 10_000
"""`train_on_generator` draws its batches from seed ``key + BATCH_SEED_OFFSET`` (the model from ``key``)."""


def linear_ramp(base: Any, factor: Any, total_steps: Any) -> optax.Schedule:
    """The QK ramp of the authors' code: ``base * (1 + (factor - 1) step / total_steps)``, an
    Optax schedule for `attnflow.per_circuit`; ``base``, ``factor`` and ``total_steps`` may be
    traced."""
    V.positive("base learning rate", base)
    V.positive("ramp factor", factor)
    total = total_steps if V.any_traced(total_steps) else V.positive_int("total_steps", total_steps)
    base, factor = jnp.asarray(base), jnp.asarray(factor)
    return lambda step: base * (1.0 + (factor - 1.0) * step / total)


def train_on_generator(
    parametrisation: str,
    eta_qk: Any,
    eta_ov: Any,
    steps: int,
    *,
    key: Any = 0,
    init: Init | Mapping[str, Init] | None = None,
    generator: CodeGenerator | None = None,
    batch: int = GENERATOR_BATCH,
    eval_set: tuple | None = None,
    qk_ramp: Any = None,
    qk_factor_ratio: Any = 1.0,
    ov_factor_ratio: Any = 1.0,
    save: SaveGrid | None = None,
    progress: bool = False,
) -> tuple[Trajectory, QKOVModel]:
    """Online SGD of the authors' code model on their synthetic generator (the paper's experiments).

    The model is `code_model` (``V = 50``, score scale ``1/sqrt(50)``, float32, the query
    attended) of ``parametrisation`` with ``init`` (default PyTorch's), drawn from the integer
    seed ``key``; each step draws ``batch`` fresh sequences of ``generator`` (default
    ``CodeGenerator()``, length 64) from seed ``key + BATCH_SEED_OFFSET`` and takes a plain SGD
    step with learning rate ``eta_qk`` on the QK matrices and ``eta_ov`` on the OV matrices
    (arrays allowed, possibly traced: one compilation serves a sweep over rates and seeds, and
    every ``steps`` whose save grid has as many points).
    ``qk_ramp=R`` multiplies the QK rate by ``1 + (R - 1) step / steps`` (`linear_ramp`).
    ``qk_factor_ratio`` / ``ov_factor_ratio`` (``rho = eta_A / eta_B``, as in `Setup`) give the
    factors of a factorised circuit their own rates around the circuit's: ``eta_Q = eta_qk
    sqrt(rho_qk)``, ``eta_K = eta_qk / sqrt(rho_qk)``, ``eta_O = eta_ov sqrt(rho_ov)``, ``eta_V =
    eta_ov / sqrt(rho_ov)`` (the ramp scales both QK factors); the factors start as ``init``
    draws them, not weighted-balanced. A ratio other than 1 on a collapsed circuit is refused
    (in a sweep, where it is traced, that point fails with the same message).

    Records `GENERATOR_OBSERVABLES` on ``eval_set`` ((tokens, targets, relevant mask); default
    `EVAL_SIZE` sequences from seed `EVAL_SEED`) at the steps of ``save`` (default
    `GENERATOR_SAVE`); ``ts`` counts steps. Returns the trajectory and the trained model.
    """
    steps = V.positive_int("steps", steps)
    batch = V.positive_int("batch", batch)
    generator = CodeGenerator() if generator is None else generator
    if not isinstance(generator, CodeGenerator):
        raise ValueError(f"generator must be a CodeGenerator, got {generator!r}")
    if not (V.any_traced(key) or (np.ndim(key) == 0 and np.issubdtype(np.asarray(key).dtype, np.integer))):
        raise ValueError(f"key must be an integer seed, got {key!r}")
    V.positive("eta_qk", eta_qk)
    V.positive("eta_ov", eta_ov)
    if qk_ramp is not None:
        V.positive("qk_ramp", qk_ramp)
        qk_ramp = jnp.asarray(qk_ramp, jnp.result_type(float))
    if parametrisation not in PARAMETRISATIONS:
        raise ValueError(f"unknown parametrisation {parametrisation!r}; expected one of {', '.join(PARAMETRISATIONS)}")
    _check_factor_ratio("qk", qk_factor_ratio, parametrisation)
    _check_factor_ratio("ov", ov_factor_ratio, parametrisation)
    if eval_set is None:
        eval_set = generator.sample(jax.random.PRNGKey(EVAL_SEED), EVAL_SIZE)
    # the step count and save grid are traced: a new length with as many save points compiles nothing
    s_save = np.asarray((save or GENERATOR_SAVE).steps(steps), np.int32)
    f = jnp.result_type(float)
    traj, model, bad = _generator_run(
        parametrisation,
        jnp.asarray(eta_qk, f),
        jnp.asarray(eta_ov, f),
        (jnp.asarray(qk_factor_ratio, f), jnp.asarray(ov_factor_ratio, f)),
        np.asarray(steps, np.int32),
        jnp.asarray(key),
        init,
        generator,
        batch,
        tuple(eval_set),
        qk_ramp,
        s_save,
        progress,
    )
    return check_divergence(traj, bad).with_meta(steps=steps), model


def _eval_observe(eval_set):
    _, y, rel = eval_set

    def observe(m):
        z, logp, a, mass = _held_out(m, eval_set)
        return {
            "loss": -jnp.mean(logp),
            "a_rel": jnp.mean(mass),
            "accuracy": jnp.mean(jnp.argmax(z, -1) == y),
            "separability": separability(a, rel),
        }

    return observe


@filter_jit
def _generator_run(
    parametrisation, eta_qk, eta_ov, ratios, steps, seed, init, generator, batch, eval_set, qk_ramp, s_save, progress
):
    model = code_model(parametrisation, init=init, key=jax.random.PRNGKey(seed), vocab=generator.vocab)

    def qk(rate):
        return rate if qk_ramp is None else linear_ramp(rate, qk_ramp, steps)

    rq, ro = jnp.sqrt(ratios[0]), jnp.sqrt(ratios[1])
    rates = {"q": qk(eta_qk * rq), "k": qk(eta_qk / rq), "qk": qk(eta_qk), "o": eta_ov * ro, "v": eta_ov / ro}
    opt = per_circuit(circuit_labels(model, per_factor=True), {**rates, "ov": eta_ov}, allow_unused=True)
    return simulate(
        cross_entropy,
        model,
        opt,
        steps,
        mode=OnlineSGD(generator.sample, batch),
        key=seed + BATCH_SEED_OFFSET,
        observe=_eval_observe(eval_set),
        save=TimeGrid(s_save),
        progress=progress,
        return_model=True,
        throw=False,
        meta={
            "theory": "qkov",
            "clock": "t = steps (the authors' generator: the rates are per step)",
            "dt": 1.0,
            "parametrisation": parametrisation,
            "batch": batch,
        },
    )


# ----------------------------------------------------------------------------- fixed attention
FIXED_ATTENTION_SAVE = LogGrid(25)
"""`train_fixed_attention`'s save grid (on the step axis) when none is given."""

FIXED_EVAL_SEED = 5
"""Seed of the 2000 sequences on which `train_fixed_attention` records the loss during training."""

FINAL_EVAL_SEED = 123
"""Seed of the fresh batches on which `train_fixed_attention` measures the final loss."""


def fixed_attention_logits(
    W_ov: jax.Array, bias: jax.Array | None, tokens: jax.Array, relevant: jax.Array, alpha: Any
) -> jax.Array:
    """Logits ``W_OV h (+ bias)`` with the attention fixed: mass ``alpha`` spread uniformly on the
    relevant positions, ``1 - alpha`` on the others (all positions of ``tokens`` attended)."""
    n_rel = jnp.maximum(jnp.sum(relevant, -1, keepdims=True), 1)
    n_oth = jnp.maximum(jnp.sum(~relevant, -1, keepdims=True), 1)
    a = jnp.where(relevant, alpha / n_rel, (1 - alpha) / n_oth)
    h = jnp.einsum("bl,blv->bv", a, jax.nn.one_hot(tokens, W_ov.shape[1], dtype=W_ov.dtype))
    z = h @ W_ov.T
    return z if bias is None else z + bias


def train_fixed_attention(
    alpha: Any,
    *,
    factorised_ov: bool,
    steps: int,
    lr: Any = 1e-2,
    batch: int = 128,
    key: Any = 0,
    generator: CodeGenerator | None = None,
    eval_batches: int = 1000,
    save: SaveGrid | None = None,
) -> tuple[Trajectory, jax.Array]:
    """Only the OV circuit trained, under attention fixed at ``alpha`` on the distinct tokens
    (`fixed_attention_logits`): online SGD (rate ``lr``, ``batch`` fresh sequences of
    ``generator`` per step, drawn from ``key``) of a collapsed OV map with bias
    (``factorised_ov=False``; PyTorch default init) or a factorised ``W_o W_v`` without bias,
    in float32 with ``V = generator.vocab``.

    Returns the trajectory of ``loss`` on `FIXED_EVAL_SEED`'s 2000 sequences (``ts`` counts
    steps; save grid ``save``, default `FIXED_ATTENTION_SAVE`) and the final loss, the mean
    over ``eval_batches`` fresh batches (seed `FINAL_EVAL_SEED`). ``alpha``, ``lr`` and an
    integer ``key`` may be traced; a new ``steps`` whose save grid has as many points compiles
    nothing.
    """
    steps = V.positive_int("steps", steps)
    batch = V.positive_int("batch", batch)
    eval_batches = V.positive_int("eval_batches", eval_batches)
    if not V.any_traced(alpha):
        a = V.finite_scalar("alpha", alpha)
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"alpha (fixed attention mass) must lie in [0, 1], got {alpha!r}")
    V.positive("lr", lr)
    generator = CodeGenerator() if generator is None else generator
    s_save = np.asarray((save or FIXED_ATTENTION_SAVE).steps(steps), np.int32)
    f = jnp.result_type(float)
    traj, final, bad = _fixed_run(
        jnp.asarray(alpha, f),
        bool(factorised_ov),
        np.asarray(steps, np.int32),
        jnp.asarray(lr, f),
        batch,
        V.prng_key(key),
        generator,
        eval_batches,
        s_save,
    )
    return check_divergence(traj, bad).with_meta(steps=steps), final


@filter_jit
def _fixed_run(alpha, factorised_ov, steps, lr, batch, key, generator, eval_batches, s_save):
    vocab = generator.vocab
    k1, k2 = jax.random.split(key)
    if factorised_ov:
        params = {"W_o": TorchDefault()(k1, (vocab, vocab)), "W_v": TorchDefault()(k2, (vocab, vocab))}
    else:
        bound = 1.0 / np.sqrt(vocab)
        params = {
            "W_ov": TorchDefault()(k1, (vocab, vocab)),
            "b": jax.random.uniform(k2, (vocab,), minval=-bound, maxval=bound),
        }
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)

    def loss(p, data):
        W, bias = (p["W_o"] @ p["W_v"], None) if factorised_ov else (p["W_ov"], p["b"])
        z = fixed_attention_logits(W, bias, data[0], data[2], alpha.astype(W.dtype))
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z, -1), data[1][:, None], 1))

    ev = generator.sample(jax.random.PRNGKey(FIXED_EVAL_SEED), 2000)
    traj, p, bad = simulate(
        loss,
        params,
        optax.sgd(lr),
        steps,
        mode=OnlineSGD(generator.sample, batch),
        key=key,
        observe=lambda q: {"loss": loss(q, ev)},
        save=TimeGrid(s_save),
        return_model=True,
        throw=False,
    )
    keys = jax.random.split(jax.random.PRNGKey(FINAL_EVAL_SEED), eval_batches)
    final = jnp.mean(jax.lax.map(lambda k: loss(p, generator.sample(k, batch)), keys))
    return traj, final, bad
