"""Training `TextAttention` models over learning-rate ratios and seeds in one compiled call,
and the paper's attention metrics on held-out examples (spec sections 10 and 12).

Every run of a grid is a *lane*: a seed and a learning rate per parameter group
(`CIRCUIT_GROUPS`). `ratio_lanes` builds the paper's intervention (the QK group's rate times
``r``, everything else fixed) and the control (every group's rate times ``r``);
`train_text` trains all lanes at once (``vmap`` over lanes, one compiled epoch reused for
every epoch); `evaluate_text` measures accuracy, relevant mass, AC / ACMC, separability,
DTAP and ERASER comprehensiveness / sufficiency per lane.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import _validate as V
from .._jit import filter_jit
from ..optim import per_circuit
from .metrics import CONFIDENCES, DTAP_EDGES, comprehensiveness_sufficiency, dtap, relevant_mass, separability
from .textmodel import CIRCUIT_GROUPS, TextAttention, TextBatch, text_circuit_labels, text_loss

__all__ = [
    "Lanes",
    "TextSchedule",
    "evaluate_text",
    "mean_ci",
    "ratio_lanes",
    "ratio_table",
    "train_text",
    "uniform_relevant_mass",
]


@dataclass(frozen=True)
class TextSchedule:
    """Optimisation of `train_text`: ``epochs`` passes over the training examples in batches
    of ``batch`` (a seeded shuffle per epoch and lane, the last partial batch dropped);
    ``optimizer`` ``"adamw"`` (decoupled weight decay ``weight_decay``) or ``"sgd"``
    (heavy-ball ``momentum`` with coupled L2 decay: ``g + weight_decay * theta`` enters the
    momentum buffer, ``m <- momentum * m + g + weight_decay * theta``, ``theta <- theta - lr * m``,
    so the decay is scaled by the rate and carried by the momentum); a linear warm-up over the first ``warmup``
    fraction of the steps, then cosine decay to zero; gradients clipped to global norm
    ``clip`` (``None``: no clipping)."""

    epochs: int = 30
    batch: int = 32
    optimizer: str = "adamw"
    momentum: float = 0.9
    weight_decay: float = 1e-4
    warmup: float = 0.1
    clip: float | None = 1.0

    def __post_init__(self) -> None:
        V.positive_int("epochs", self.epochs)
        V.positive_int("batch", self.batch)
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not self.weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup!r}")
        if self.clip is not None:
            V.positive("clip", self.clip)

    def unit_schedule(self, total_steps: int) -> optax.Schedule:
        """The rate multiplier of step ``s``: warm-up to 1, then cosine to 0."""
        warm = max(1, int(round(self.warmup * total_steps)))
        return optax.warmup_cosine_decay_schedule(0.0, 1.0, warm, max(total_steps, warm + 1), 0.0)

    def optimizer_for(self, model: TextAttention, rates: Mapping[str, Any], total_steps: int) -> Any:
        """Clipping, then `attnflow.per_circuit` with the scheduled rate of each group."""
        unit = self.unit_schedule(total_steps)
        scheduled = {g: (lambda step, r=r: r * unit(step)) for g, r in rates.items()}
        if self.optimizer == "adamw":
            opt = per_circuit(
                text_circuit_labels(model),
                scheduled,
                base=optax.adamw,
                allow_unused=True,
                weight_decay=self.weight_decay,
            )
        else:
            opt = per_circuit(
                text_circuit_labels(model),
                scheduled,
                base=_sgdw,
                allow_unused=True,
                momentum=self.momentum,
                wd=self.weight_decay,
            )
        return opt if self.clip is None else optax.chain(optax.clip_by_global_norm(self.clip), opt)


def _sgdw(learning_rate: Any, momentum: float = 0.9, wd: float = 0.0) -> optax.GradientTransformation:
    """SGD with heavy-ball momentum and coupled L2 weight decay: ``wd * theta`` is added to the
    gradient before the momentum (not decoupled, unlike AdamW's)."""
    return optax.chain(optax.add_decayed_weights(wd), optax.sgd(learning_rate, momentum=momentum))


@dataclass(frozen=True)
class Lanes:
    """A grid of training runs: per lane a ``seed``, a rate per group (``rates[g]``, shape
    (lanes,)) and a label (``kind``: ``"qk"`` for the QK intervention, ``"all"`` for the
    every-group control; ``ratio``: the factor ``r``)."""

    seed: np.ndarray
    ratio: np.ndarray
    kind: tuple[str, ...]
    rates: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.seed.size)

    def select(self, kind: str, ratio: float) -> np.ndarray:
        """Indices of the lanes of one (kind, ratio) cell, in seed order."""
        return np.flatnonzero((np.asarray(self.kind) == kind) & np.isclose(self.ratio, ratio))


def ratio_lanes(
    ratios: Sequence[float],
    seeds: Sequence[int],
    base_rate: float | Mapping[str, float],
    fast_groups: Sequence[str] = ("qk",),
    control: bool = True,
) -> Lanes:
    """The paper's intervention: for each ratio ``r`` and seed, the groups in ``fast_groups``
    learn at ``r`` times their base rate and the others at their base rate (``kind = "qk"``);
    with ``control``, also every group at ``r`` times its base rate (``kind = "all"``, for
    each ``r != 1``: at ``r = 1`` the two coincide). ``base_rate``: one rate for every group or
    ``{group: rate}`` over `CIRCUIT_GROUPS`."""
    for r in ratios:
        V.positive("ratio", r)
    ratios = [float(r) for r in ratios]
    if not ratios:
        raise ValueError("ratios must not be empty")
    if not seeds:
        raise ValueError("seeds must not be empty")
    seeds = [int(s) for s in seeds]
    unknown = set(fast_groups) - set(CIRCUIT_GROUPS)
    if unknown or not fast_groups:
        raise ValueError(f"fast_groups must be a non-empty subset of {CIRCUIT_GROUPS}, got {tuple(fast_groups)}")
    base = {g: base_rate for g in CIRCUIT_GROUPS} if not isinstance(base_rate, Mapping) else dict(base_rate)
    if set(base) != set(CIRCUIT_GROUPS):
        raise ValueError(f"base_rate must give a rate for each of {CIRCUIT_GROUPS}, got {sorted(base)}")
    for g, r in base.items():
        V.positive(f"base rate of {g!r}", r)
    cells = [("qk", r) for r in ratios] + ([("all", r) for r in ratios if r != 1.0] if control else [])
    seed, ratio, kind = [], [], []
    rates: dict[str, list[float]] = {g: [] for g in CIRCUIT_GROUPS}
    for k, r in cells:
        for s in seeds:
            seed.append(s)
            ratio.append(r)
            kind.append(k)
            for g in CIRCUIT_GROUPS:
                fast = k == "all" or g in fast_groups
                rates[g].append(base[g] * (r if fast else 1.0))
    return Lanes(np.asarray(seed), np.asarray(ratio), tuple(kind), {g: np.asarray(v) for g, v in rates.items()})


def train_text(
    make_model: Callable[[jax.Array], TextAttention],
    train: TextBatch,
    lanes: Lanes,
    schedule: TextSchedule = TextSchedule(),
    progress: bool = False,
) -> tuple[TextAttention, np.ndarray]:
    """Train one model per lane of ``lanes`` on ``train``, all lanes in one compiled epoch.

    ``make_model(key)`` builds a model from a PRNG key (lane ``i`` uses
    ``PRNGKey(lanes.seed[i])``, its shuffles ``fold_in(PRNGKey(seed), 1 + epoch)``).
    Returns the trained models stacked along a leading lane axis and the mean training loss
    per lane and epoch, shape (lanes, epochs). Stops with an error naming the lane and epoch
    when a loss is not finite.
    """
    if not isinstance(train, TextBatch):
        raise TypeError(f"train must be a TextBatch (see attnflow.qkov.encode_text), got {type(train).__name__}")
    n = len(train)
    steps_per_epoch = n // schedule.batch
    if steps_per_epoch < 1:
        raise ValueError(f"batch = {schedule.batch} is larger than the {n} training examples")
    total = steps_per_epoch * schedule.epochs
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(lanes.seed))
    rates = {g: jnp.asarray(v, jnp.float32) for g, v in lanes.rates.items()}
    models = eqx.filter_vmap(make_model)(keys)
    params, static = eqx.partition(models, eqx.is_inexact_array)

    def init_one(p, r):
        m = eqx.combine(p, static)
        return schedule.optimizer_for(m, r, total).init(eqx.filter(m, eqx.is_inexact_array))

    opt_state = jax.vmap(init_one)(params, rates)
    history = np.zeros((len(lanes), schedule.epochs))
    bar = None
    if progress:
        from .._io import progress_bar

        bar = progress_bar(total=schedule.epochs, desc=f"train {len(lanes)} lanes", unit="epoch")
    try:
        for epoch in range(schedule.epochs):
            params, opt_state, loss = _epoch(
                params, opt_state, static, keys, rates, train, jnp.asarray(epoch), schedule, steps_per_epoch, total
            )
            history[:, epoch] = np.asarray(loss)
            bad = np.flatnonzero(~np.isfinite(history[:, epoch]))
            if bad.size:
                i = int(bad[0])
                raise FloatingPointError(
                    f"training diverged: lane {i} (kind {lanes.kind[i]!r}, ratio {lanes.ratio[i]:g}, seed "
                    f"{int(lanes.seed[i])}) has a non-finite loss in epoch {epoch}; lower the rates or clip gradients"
                )
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{np.mean(history[:, epoch]):.4f}")
    finally:
        if bar is not None:
            bar.close()
    return eqx.combine(params, static), history


@filter_jit
def _epoch(params, opt_state, static, keys, rates, train, epoch, schedule, steps_per_epoch, total):
    def lane(p, s, key, r):
        m0 = eqx.combine(p, static)
        opt = schedule.optimizer_for(m0, r, total)
        order = jax.random.permutation(jax.random.fold_in(key, 1 + epoch), len(train))
        batches = order[: steps_per_epoch * schedule.batch].reshape(steps_per_epoch, schedule.batch)

        def step(carry, idx):
            p, s = carry
            loss, g = jax.value_and_grad(lambda q: text_loss(eqx.combine(q, static), train.take(idx)))(p)
            u, s = opt.update(g, s, p)
            return (optax.apply_updates(p, u), s), loss

        (p, s), losses = jax.lax.scan(step, (p, s), batches)
        return p, s, jnp.mean(losses)

    return jax.vmap(lane)(params, opt_state, keys, rates)


def uniform_relevant_mass(batch: TextBatch) -> jax.Array:
    """Relevant mass under uniform attention over the keys, per example:
    ``sum_{i in keys} r_i / |keys|``, the floor that trained attention must beat. Compare its
    mean over the examples with relevant tokens (``evaluate_text``'s ``floor``) with
    ``evaluate_text``'s ``relevant_mass``, which averages over those examples only."""
    n = jnp.sum(batch.keys, axis=-1)
    return jnp.sum(jnp.where(batch.keys, batch.relevant, 0.0), axis=-1) / jnp.maximum(n, 1)


def _span_f1(start, end, gold_start, gold_end):
    overlap = jnp.maximum(0, jnp.minimum(end, gold_end) - jnp.maximum(start, gold_start) + 1)
    precision = overlap / (end - start + 1)
    recall = overlap / (gold_end - gold_start + 1)
    return jnp.where(overlap > 0, 2 * precision * recall / jnp.maximum(precision + recall, 1e-12), 0.0)


def _best_span(z: jax.Array, max_length: int) -> tuple[jax.Array, jax.Array]:
    """Start and end maximising ``start logit + end logit`` with ``0 <= end - start < max_length``."""
    L = z.shape[-1]
    i, j = jnp.arange(L)[:, None], jnp.arange(L)[None, :]
    ok = (j >= i) & (j - i < max_length)
    score = jnp.where(ok, z[0][:, None] + z[1][None, :], -jnp.inf)
    flat = jnp.argmax(score.reshape(-1))
    return flat // L, flat % L


def evaluate_text(
    models: TextAttention,
    batch: TextBatch,
    *,
    tau_a: float = 0.1,
    tau_p: float = 0.1,
    confidence: str = "true_prob",
    dtap_edges: Sequence[float] = DTAP_EDGES["synthetic"],
    top_percent: float = 5.0,
    max_span: int = 15,
) -> dict[str, np.ndarray]:
    """Metrics of each lane's model (``models`` stacked along a leading lane axis) on ``batch``.

    Per lane: ``accuracy`` (classify, agree: the share of correct answers; span: the same as
    ``exact``); span ``f1`` and ``exact`` (span; the predicted span is the best of at most
    ``max_span`` words; ``exact`` is the share whose start and end positions equal those of
    some gold answer, ``f1`` the mean of the word-position overlap F1, the maximum over the
    gold answers in ``batch.gold``, as the official SQuAD script takes the maximum over its
    answers; unlike that script, words are compared by position, after `tokenize`'s
    lowercasing and punctuation splitting, with no removal of articles or punctuation; for
    classify and agree ``f1`` equals ``accuracy``), ``relevant_mass`` (mean over examples with
    relevant tokens of ``A_rel = sum_i r_i a_i`` over the keys, `attnflow.qkov.relevant_mass`,
    ``r`` the relevant weights), ``floor`` (the same mean under uniform attention over the
    keys, `uniform_relevant_mass`, over the same examples: the value ``relevant_mass`` must
    beat; these averages over the examples with relevant tokens are NaN when there are none),
    ``ac`` (share with
    ``A_rel >= tau_a``), ``acmc`` (and confidence ``>= tau_p``; ``tau_a = tau_p = 0.1`` and
    ``confidence="true_prob"`` by default, as `attnflow.qkov.confident_concentration`: the
    confidence is ``p_true``, or with ``"pred_prob"`` the predicted answer's probability, or
    with ``"correct"`` 1 for a correct answer, else 0; span: ``p_true`` is that of the first
    gold answer's start and end), ``separability`` (`attnflow.qkov.separability` with the keys;
    NaN when no example has both relevant and other keys),
    ``comprehensiveness`` and ``sufficiency`` (top ``top_percent`` percent of the keys), and
    ``dtap`` (lanes, bins, bins), percent of the examples with relevant tokens per bin of
    ``A_rel`` (rows) and ``p_true`` (columns, `attnflow.qkov.dtap`). Per example (lanes, B):
    ``a_rel``, ``p_true``, ``correct`` and ``attention`` (lanes, B, L) of the read-out row.
    """
    if not isinstance(batch, TextBatch):
        raise TypeError(f"batch must be a TextBatch, got {type(batch).__name__}")
    for name, v in (("tau_a", tau_a), ("tau_p", tau_p)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {v!r}")
    V.choice("confidence", confidence, CONFIDENCES)
    if confidence == "correct" and float(tau_p) == 0.0:
        raise ValueError("tau_p = 0 with confidence='correct' counts every example as confident: use tau_p in (0, 1]")
    V.positive_int("max_span", max_span)
    edges = tuple(float(e) for e in dtap_edges)
    out = {
        k: np.asarray(v)
        for k, v in _evaluate(
            models, batch, float(tau_a), float(tau_p), confidence, float(top_percent), int(max_span)
        ).items()
    }
    # DTAP over the examples that have relevant tokens (a post without a rationale has no A_rel)
    keep = np.asarray(jnp.any(batch.relevant > 0, axis=-1))
    out["dtap"] = np.stack([np.asarray(dtap(ar[keep], pt[keep], edges)) for ar, pt in zip(out["a_rel"], out["p_true"])])
    return out


@filter_jit
def _evaluate(models, batch, tau_a, tau_p, confidence, top_percent, max_span):
    has_relevant = jnp.any(batch.relevant > 0, axis=-1)
    n_relevant = jnp.sum(has_relevant)
    # NaN, not 0, when no example has a relevant token: then nothing is measured
    w = jnp.where(n_relevant > 0, has_relevant / jnp.maximum(n_relevant, 1), jnp.nan)
    floor = jnp.sum(w * uniform_relevant_mass(batch))

    def one(model):
        z, a = model(batch)
        if model.task == "span":
            start, end = jax.vmap(lambda zz: _best_span(zz, max_span))(z)
            # the best match over the gold answers, as the official SQuAD script (here on word positions)
            gs, ge = batch.gold[..., 0], batch.gold[..., 1]
            f1 = jnp.max(_span_f1(start[:, None], end[:, None], gs, ge), axis=-1)
            correct = jnp.any((start[:, None] == gs) & (end[:, None] == ge), axis=-1)
            p = jax.nn.softmax(z, axis=-1)
            p_true = (
                jnp.take_along_axis(p[:, 0], batch.label[:, None], 1)[:, 0]
                * jnp.take_along_axis(p[:, 1], batch.end[:, None], 1)[:, 0]
            )
            p_pred = (
                jnp.take_along_axis(p[:, 0], start[:, None], 1)[:, 0]
                * jnp.take_along_axis(p[:, 1], end[:, None], 1)[:, 0]
            )
        else:
            target = batch.label if model.task == "classify" else jnp.zeros_like(batch.label)
            p = jax.nn.softmax(z, -1)
            p_true = jnp.take_along_axis(p, target[:, None], 1)[:, 0]
            p_pred = jnp.max(p, axis=-1)
            correct = jnp.argmax(z, -1) == target
            f1 = correct.astype(z.dtype)
        conf = {"true_prob": p_true, "pred_prob": p_pred, "correct": correct.astype(p_true.dtype)}[confidence]
        a_rel = relevant_mass(a, batch.relevant, batch.keys)

        def model_for_eraser(b, key_mask=None):
            zz, aa = model(b, key_mask)
            return (zz[:, 0] if model.task == "span" else zz), aa

        cs = comprehensiveness_sufficiency(model_for_eraser, batch, top_percent, lengths=jnp.sum(batch.keys, axis=-1))
        return {
            "accuracy": jnp.mean(correct),
            "exact": jnp.mean(correct),
            "f1": jnp.mean(f1),
            "relevant_mass": jnp.sum(w * a_rel),
            "ac": jnp.sum(w * (a_rel >= tau_a)),
            "acmc": jnp.sum(w * ((a_rel >= tau_a) & (conf >= tau_p))),
            "separability": separability(a, batch.relevant, batch.keys),
            "floor": floor,
            "comprehensiveness": cs["comprehensiveness"],
            "sufficiency": cs["sufficiency"],
            "a_rel": a_rel,
            "p_true": p_true,
            "correct": correct,
            "attention": a,
        }

    return eqx.filter_vmap(one)(models)


def mean_ci(values: Any, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval of the mean of ``values``
    (NaN half-width for a single value)."""
    from scipy import stats

    v = np.asarray(values, float).ravel()
    if v.size == 0:
        raise ValueError("mean_ci needs at least one value")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if v.size == 1:
        return float(v[0]), float("nan")
    half = stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
    return float(v.mean()), float(half)


def ratio_table(lanes: Lanes, metrics: dict[str, np.ndarray], names: Sequence[str]) -> dict[str, dict[str, list]]:
    """``{kind: {metric: [[ratio, mean, ci half-width], ...]}}`` over the lanes' cells."""
    table: dict[str, dict[str, list]] = {}
    for kind in dict.fromkeys(lanes.kind):
        rows: dict[str, list] = {m: [] for m in names}
        for r in sorted(set(lanes.ratio[np.asarray(lanes.kind) == kind])):
            idx = lanes.select(kind, r)
            for m in names:
                rows[m].append([float(r), *mean_ci(metrics[m][idx])])
        table[kind] = rows
    return table
