"""Registered real-data experiments of `attnflow.qkov` (spec section 12): does raising the QK
group's learning rate, everything else fixed, raise attention on the tokens humans mark as
relevant, at what cost in accuracy?

- ``qkov-hatexplain``: hate-speech classification, relevant = the annotators' rationales;
- ``qkov-squad``: answer-span localisation, the question attends to the context, relevant =
  the answer span;
- ``qkov-sva``: subject-verb agreement (choose the verb form from the prefix), relevant = the
  subject and the verb position; accuracy by number of attractors.

Each trains ratios x seeds, plus the every-group control, in one compiled call
(`attnflow.qkov.train_text`), and reports per-ratio metrics with 95% confidence intervals over
seeds, the uniform-attention floor, DTAP heatmaps and example attention maps.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from ..plot import heatmap
from ..report import Report, Timer, option, register
from . import realdata as RD
from .metrics import DTAP_EDGES
from .textmodel import SPECIALS, TextBatch, encode_text, make_text_model
from .texttrain import (
    Lanes,
    TextSchedule,
    evaluate_text,
    mean_ci,
    ratio_lanes,
    ratio_table,
    train_text,
)

__all__: list[str] = []

METRICS = ("accuracy", "exact", "f1", "relevant_mass", "ac", "acmc", "separability", "comprehensiveness", "sufficiency")
_MIN_EPOCHS_LOSS_CHECK = 5
"""Fewest epochs for the check that training lowered the loss: the first epoch is mostly
warm-up, and a shorter run need not lower its loss by 5%."""

_LABELS = {
    "accuracy": "accuracy",
    "exact": "exact match (word positions)",
    "f1": "span F1 (word positions)",
    "relevant_mass": "relevant attention mass",
    "ac": "AC (share with A_rel >= tau_a)",
    "acmc": "ACMC (and p_true >= tau_p)",
    "separability": "separability",
    "comprehensiveness": "comprehensiveness (higher: faithful)",
    "sufficiency": "sufficiency (lower: faithful)",
}


# ----------------------------------------------------------------------------- shared recipe
@dataclass(frozen=True)
class _Common:
    """Options shared by the real-data experiments (each sets its own defaults)."""

    data: str | None = None  # a file or folder; default: the dataset under --data-dir / $ATTNFLOW_DATA
    ratios: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0)
    seeds: int = 3
    control: bool = True  # also every group at r x its rate
    fast_groups: tuple[str, ...] = ("qk",)  # groups sped up by r (add "embed" for the paper's HateXplain / SVA runs)
    base_rate: float = 1e-3
    optimizer: str = "adamw"
    momentum: float = 0.9
    weight_decay: float = 1e-4
    warmup: float = 0.1
    clip: float = 1.0
    epochs: int = 30
    batch: int = 32
    d_model: int = 64
    heads: int = 4
    mlp: int = 256  # 0: attention only
    parametrisation: str = "FAFO"
    length: int = 64
    vocab_size: int = 8000
    eval_fraction: float = 0.2
    split_seed: int = 0
    tau_a: float = 0.33
    tau_p: float = option(
        0.5, "ACMC's p_true threshold, more likely than not (evaluate_text's 0.1 is below chance for 2 or 3 classes)"
    )
    top_percent: float = 5.0
    n_examples: int = 3


def _schedule(cfg: Any) -> TextSchedule:
    return TextSchedule(
        epochs=cfg.epochs,
        batch=cfg.batch,
        optimizer=cfg.optimizer,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        warmup=cfg.warmup,
        clip=cfg.clip if cfg.clip > 0 else None,
    )


def _vocabulary(train: Sequence[RD.TextRecord], cfg: Any) -> RD.Vocabulary:
    words = [(*r.words, *r.query_words, *(r.meta[k] for k in ("correct", "wrong") if k in r.meta)) for r in train]
    return RD.Vocabulary.build(words, max_size=cfg.vocab_size, specials=tuple(SPECIALS.values()))


def run_real(
    rep: Report,
    task: str,
    dataset: str,
    train: Sequence[RD.TextRecord],
    evaluation: Sequence[RD.TextRecord],
    cfg: Any,
    quiet: bool,
    encode_kw: dict | None = None,
    no_relevant_hint: str = "",
) -> tuple[Lanes, dict[str, np.ndarray], TextBatch, RD.Vocabulary]:
    """Train the ratio x seed grid on ``train`` and evaluate on ``evaluation``; fills ``rep``
    with the per-ratio table, the floor, the checks, the verdict and the figures. Stops
    before training with a ``ValueError`` (ending in ``no_relevant_hint``) when no evaluation
    example has a relevant token: then no attention metric would measure anything."""
    rep.summary["training data: counts, labels, relevant-token coverage (describe)"] = RD.describe(train)
    rep.summary["evaluation data (describe)"] = RD.describe(evaluation)
    vocab = _vocabulary(train, cfg)
    kw = encode_kw or {}
    tr = encode_text(train, vocab, task, cfg.length, **kw)
    ev = encode_text(evaluation, vocab, task, cfg.length, **kw)
    has_rel = np.asarray(jnp.any(ev.relevant > 0, axis=-1))
    if not has_rel.any():
        raise ValueError(
            f"none of the {len(ev)} evaluation examples has a relevant token, so relevant mass, AC, ACMC, "
            f"separability and DTAP would measure nothing{no_relevant_hint}"
        )
    lanes = ratio_lanes(cfg.ratios, range(cfg.seeds), cfg.base_rate, cfg.fast_groups, cfg.control)
    rep.summary["examples: train, evaluation; vocabulary size; lanes (ratio x seed x kind)"] = [
        len(tr),
        len(ev),
        len(vocab),
        len(lanes),
    ]

    def make(key):
        return make_text_model(
            task,
            len(vocab),
            cfg.length,
            key=key,
            d_model=cfg.d_model,
            heads=cfg.heads,
            mlp=cfg.mlp or None,
            parametrisation=cfg.parametrisation,
        )

    with Timer() as tm:
        models, history = train_text(make, tr, lanes, _schedule(cfg), progress=not quiet)
    rep.timings[f"training {len(lanes)} lanes x {cfg.epochs} epochs (one compiled epoch)"] = tm.seconds
    with Timer() as tm:
        out = evaluate_text(
            models,
            ev,
            tau_a=cfg.tau_a,
            tau_p=cfg.tau_p,
            dtap_edges=DTAP_EDGES[dataset],
            top_percent=cfg.top_percent,
        )
    rep.timings["evaluation"] = tm.seconds
    floor = float(out["floor"][0])  # uniform attention, over the examples with relevant tokens
    # span: accuracy is the exact match, shown under its own name
    names = [m for m in METRICS if (m in ("f1", "exact")) == (task == "span") or m not in ("f1", "exact", "accuracy")]
    table = ratio_table(lanes, out, names)
    for kind, rows in table.items():
        who = "QK group x r" if kind == "qk" else "control: every group x r"
        for m, rr in rows.items():
            rep.summary[f"{who}: {m} [r, mean, 95% CI half-width over {cfg.seeds} seeds]"] = [
                [round(x, 4) for x in row] for row in rr
            ]
    rep.summary["relevant mass under uniform attention over the real tokens (the floor)"] = floor
    rep.summary["examples with relevant tokens (evaluation)"] = int(has_rel.sum())
    rep.notes.append(
        "Padding is masked from attention: the read-out row attends only to real tokens, and the relevant mass, AC, "
        "ACMC and DTAP are measured on the evaluation examples that have relevant tokens."
    )
    # software checks: every lane learned, attention rows are distributions over the keys
    if history.shape[1] >= _MIN_EPOCHS_LOSS_CHECK:
        drop = float(np.max(history[:, -1] / history[:, 0]))
        rep.check("training loss, last epoch / first epoch, worst lane", drop, 0.95)
    else:
        rep.notes.append(
            f"check of the training loss (last epoch / first epoch < 0.95 in every lane) skipped: it needs at least "
            f"{_MIN_EPOCHS_LOSS_CHECK} epochs, this run has {history.shape[1]}"
        )
    row_sums = np.sum(out["attention"], axis=-1)
    rep.check("attention row sums, max |sum - 1|", float(np.max(np.abs(row_sums - 1.0))), 1e-4)
    score = "f1" if task == "span" else "accuracy"
    rep.summary["verdict"] = verdict(table, score)
    rep.figures["metrics_vs_ratio"] = metrics_figure(table, names, floor, rep.name, cfg.tau_a, cfg.tau_p)
    r_max = max(cfg.ratios)
    for r in sorted({min(cfg.ratios), r_max}):
        i = lanes.select("qk", r)
        H = out["dtap"][i].mean(axis=0)
        edges = DTAP_EDGES[dataset]
        last = len(edges) - 2
        bins = [f"[{a:g},{b:g}{']' if j == last else ')'}" for j, (a, b) in enumerate(itertools.pairwise(edges))]
        rep.figures[f"dtap_r{r:g}"] = heatmap(
            H.T,
            bins,
            bins,
            xlabel="relevant attention mass A_rel",
            ylabel="p(true answer)",
            colorbar_label="% of examples (with relevant tokens)",
            fmt="{:.1f}",  # the spec's cells: percentages rounded to 0.1
            title=f"DTAP, QK x {r:g}, {cfg.seeds} seeds",
        )
    rep.figures["examples"] = examples_figure(ev, vocab, lanes, out, cfg, has_rel)
    return lanes, out, ev, vocab


def verdict(table: dict[str, dict[str, list]], score: str) -> list[str]:
    """One sentence per ratio r above the baseline, the smallest ratio r_0 (1 in the defaults):
    did the QK intervention raise relevant mass and AC over r_0 (the 95% interval of the
    difference of the two means, half-width ``sqrt(h_r^2 + h_0^2)``, above zero), what did it
    cost in ``score``, and what did the every-group control reach at the same r? Without an
    interval (one seed per ratio: ``mean_ci`` gives a NaN half-width) each sentence gives the
    numbers and says that there is no verdict."""
    rows = table["qk"]
    control = table.get("all", {})
    base = {m: rows[m][0] for m in ("relevant_mass", "ac", score)}
    r0 = base[score][0]
    lines = []
    for j in range(1, len(rows[score])):
        r = rows[score][j][0]
        d = {m: rows[m][j][1] - base[m][1] for m in base}
        halves = {m: float(np.hypot(rows[m][j][2], base[m][2])) for m in ("relevant_mass", "ac")}
        raised = {m: d[m] - halves[m] > 0 for m in halves}
        cost = -100 * d[score]
        both = raised["relevant_mass"] and raised["ac"]
        if not all(np.isfinite(h) for h in halves.values()):
            answer = "no verdict: one seed per ratio gives no confidence interval (run with seeds >= 2)"
        elif both and cost <= 2.0:
            answer = "faster QK raised relevant attention and AC without costing more than 2 points"
        elif both:
            answer = "faster QK raised relevant attention and AC but cost more than 2 points"
        else:
            answer = "faster QK did not raise both relevant attention and AC beyond the seed-to-seed spread"
        line = (
            f"r = {r:g} against the baseline r = {r0:g} (the smallest ratio): "
            f"relevant mass {base['relevant_mass'][1]:.3f} -> {rows['relevant_mass'][j][1]:.3f}, "
            f"AC {base['ac'][1]:.3f} -> {rows['ac'][j][1]:.3f}, {score} {100 * base[score][1]:.1f} -> "
            f"{100 * rows[score][j][1]:.1f} ({-cost:+.1f} points): {answer}"
        )
        ctl = [row for row in control.get("relevant_mass", []) if row[0] == r]
        if ctl:
            k = control["relevant_mass"].index(ctl[0])
            line += (
                f"; control (every group x {r:g}): relevant mass {ctl[0][1]:.3f}, AC {control['ac'][k][1]:.3f}, "
                f"{score} {100 * control[score][k][1]:.1f}"
            )
        lines.append(line)
    return lines


def metrics_figure(
    table: dict[str, dict[str, list]],
    names: Sequence[str],
    floor: float,
    title: str,
    tau_a: float | None = None,
    tau_p: float | None = None,
) -> Figure:
    """Each metric against r (log axis), QK intervention and every-group control, error bars =
    95% CI over seeds; the uniform-attention floor on the relevant-mass panel; one legend for
    the figure, below the panels. ``tau_a``, ``tau_p``: the thresholds, shown in the AC and
    ACMC axis labels."""
    n = len(names)
    ncols = 3
    nrows = -(-n // ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.1 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).ravel()
    styles = {"qk": ("C0", "o", "QK group x r"), "all": ("C3", "s", "control: every group x r")}
    for ax, m in zip(axes, names):
        for kind, rows in table.items():
            c, mk, lab = styles[kind]
            a = np.asarray(rows[m], float)
            ax.errorbar(a[:, 0], a[:, 1], yerr=np.nan_to_num(a[:, 2]), color=c, marker=mk, capsize=3, label=lab)
        if m == "relevant_mass":
            # drawn above the data and dotted black, so a curve near the floor does not hide it
            ax.axhline(floor, color="k", ls=":", lw=1.5, zorder=5, label=f"uniform attention (floor, {floor:.3f})")
        label = _LABELS[m]
        if tau_a is not None:
            label = label.replace("tau_a", f"tau_a = {tau_a:g}")
        if tau_p is not None:
            label = label.replace("tau_p", f"tau_p = {tau_p:g}")
        ax.set_xscale("log")
        ax.set_xlabel("learning-rate ratio r")
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    # the legend of the relevant-mass panel holds every entry (both kinds and the floor)
    with_floor = axes[list(names).index("relevant_mass")] if "relevant_mass" in names else axes[0]
    handles, labels = with_floor.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(f"{title}: metrics against r (error bars: 95% CI over seeds)")
    return fig


def examples_figure(
    ev: TextBatch, vocab: RD.Vocabulary, lanes: Lanes, out: dict[str, np.ndarray], cfg: Any, has_rel: np.ndarray
) -> Figure:
    """``cfg.n_examples`` evaluation inputs: the read-out row's attention at the smallest and
    the largest r (seed 0), and the human relevance drawn beneath as a gray strip."""
    picks = np.flatnonzero(has_rel)[: cfg.n_examples]
    r_lo, r_hi = min(cfg.ratios), max(cfg.ratios)
    i_lo, i_hi = lanes.select("qk", r_lo)[0], lanes.select("qk", r_hi)[0]
    fig = Figure(figsize=(12, 2.6 * max(1, len(picks))), layout="constrained")
    axes = np.atleast_1d(fig.subplots(max(1, len(picks)), 1))
    for ax, b in zip(axes, picks):
        keys = np.flatnonzero(np.asarray(ev.keys[b]))
        words = vocab.decode(np.asarray(ev.tokens[b])[keys])
        x = np.arange(keys.size)
        ax.bar(x - 0.2, out["attention"][i_lo, b, keys], 0.4, color="C0", label=f"attention, QK x {r_lo:g}")
        ax.bar(x + 0.2, out["attention"][i_hi, b, keys], 0.4, color="C1", label=f"attention, QK x {r_hi:g}")
        rel = np.asarray(ev.relevant[b])[keys]
        top = max(float(out["attention"][[i_lo, i_hi]][:, b, keys].max()), 1e-3)
        ax.bar(
            x,
            -0.25 * top * rel,
            0.9,
            color="0.5",
            label="relevant tokens (human rationale, answer span or subject; below the axis)",
        )
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xticks(x, words, rotation=70, fontsize=7)
        ax.set_ylabel("attention weight")
        ax.set_xlim(-0.7, keys.size - 0.3)
    # below the panels: inside the first one it would cover its bars or the relevant-token strip
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle("example inputs: read-out attention, and the relevant tokens beneath")
    return fig


def _records(cfg: Any, default: str, dataset: str, load: Callable[..., list], **kw: Any) -> list:
    path = RD.resolve_data(cfg.data, default, dataset)
    return load(path, **kw)


# =============================================================================== qkov-hatexplain
@dataclass(frozen=True)
class HateXplainConfig(_Common):
    """Options of ``qkov-hatexplain``: a one-layer classifier (d 64, 4 heads, GELU MLP 256,
    learned positions) read out at a ``<cls>`` position, AdamW with cosine schedule and 10%
    warm-up, clip 1; the given file is split ``1 - eval_fraction`` / ``eval_fraction``
    (seeded) unless it is the full official data (then pass ``divisions``)."""

    divisions: str | None = option(None, 'HateXplain\'s post_id_divisions.json: train on "train", evaluate on "test"')
    epochs: int = 20
    length: int = option(48, "posts here: median 20.5 words, 95% at most 49, longest 70 (cut to length - 1)")


@register(
    "qkov-hatexplain",
    config=HateXplainConfig,
    description="real data: faster QK learning and attention on human rationales (HateXplain), with controls",
)
def qkov_hatexplain(cfg: HateXplainConfig, quiet: bool) -> Report:
    rep = Report("qkov-hatexplain", asdict(cfg))
    records = _records(cfg, "hatexplain/val.jsonl.gz", "hatexplain", RD.load_hatexplain)
    if cfg.divisions:
        parts = RD.official_split(records, cfg.divisions)
        for name in ("train", "test"):
            if not parts.get(name):
                found = ", ".join(f"{k!r} ({len(v)} posts)" for k, v in parts.items()) or "none"
                why = (
                    f"has no division {name!r}"
                    if name not in parts
                    else f"division {name!r} holds none of the {len(records)} loaded posts"
                )
                raise ValueError(
                    f"divisions file {cfg.divisions}: {why} (the run trains on 'train' and evaluates on 'test'); "
                    f"divisions found: {found}"
                )
        train, evaluation = parts["train"], parts["test"]
        rep.notes.append("split: the official HateXplain train / test divisions")
    else:
        train, evaluation = RD.split_records(records, cfg.eval_fraction, cfg.split_seed)
        rep.notes.append(
            f"split: the given file alone ({len(records)} posts with a majority label), seeded "
            f"{1 - cfg.eval_fraction:.0%} / {cfg.eval_fraction:.0%} train / evaluation split (seed {cfg.split_seed}); "
            "the paper trains on the official 15,383-post training split, which is not here"
        )
    rep.summary["posts: train, evaluation (majority label; no-majority posts dropped)"] = [len(train), len(evaluation)]
    rep.summary["train label counts (hatespeech, normal, offensive)"] = np.bincount(
        [r.label for r in train], minlength=3
    ).tolist()
    run_real(rep, "classify", "hatexplain", train, evaluation, cfg, quiet, None, ": no evaluation post has a rationale")
    return rep


# =============================================================================== qkov-squad
@dataclass(frozen=True)
class SquadConfig(_Common):
    """Options of ``qkov-squad``: answer-span localisation; the question (pooled into the
    ``<sep>`` query) attends over a ``window``-word context crop containing the answer at a
    seeded offset; start / end pointers read out from the attended vector."""

    window: int = 40
    question_length: int = 16
    max_questions: int = 2500
    epochs: int = 20
    length: int = option(57, "question_length + 1 + window")
    mlp: int = 0
    tau_a: float = 0.1


@register(
    "qkov-squad",
    config=SquadConfig,
    description="real data: faster QK learning and attention on the answer span (SQuAD), with controls",
)
def qkov_squad(cfg: SquadConfig, quiet: bool) -> Report:
    rep = Report("qkov-squad", asdict(cfg))
    if cfg.length < cfg.question_length + 1 + cfg.window:
        raise ValueError(
            f"length = {cfg.length} must hold question_length + 1 + window = {cfg.question_length + 1 + cfg.window}"
        )
    records = _records(
        cfg,
        "squad/dev-v1.1.json.gz",
        "squad",
        RD.load_squad,
        window=cfg.window,
        seed=cfg.split_seed,
        max_questions=cfg.max_questions,
    )
    train, evaluation = RD.split_records(records, cfg.eval_fraction, cfg.split_seed)
    rep.notes.append(
        f"data: the first {len(records)} answerable questions of the given file, context cropped to {cfg.window} words "
        f"around the first answer at a seeded offset; seeded {1 - cfg.eval_fraction:.0%} / {cfg.eval_fraction:.0%} "
        "split (questions of one paragraph may fall on both sides)"
    )
    run_real(rep, "span", "squad", train, evaluation, cfg, quiet, {"question_length": cfg.question_length})
    return rep


# =============================================================================== qkov-sva
@dataclass(frozen=True)
class SvaConfig(_Common):
    """Options of ``qkov-sva``: choose the verb form after a prefix with a one-layer
    attention-only model (causal mask: the ``<verb>`` position sees the prefix and itself);
    SGD with momentum as in the paper's agreement runs. Relevant: the subject (BLiMP: the
    loaders' determiner heuristic; a TSV gives it), and the verb position with
    ``verb_relevant``."""

    length: int = option(12, "BLiMP prefixes: at most 10 words")
    mlp: int = 0
    optimizer: str = "sgd"
    momentum: float = 0.9
    base_rate: float = 0.05
    weight_decay: float = 1e-5
    epochs: int = 30
    tau_a: float = option(0.5, 'prefixes are short (median 4 words): "mostly on the subject"')
    verb_relevant: bool = option(
        False, "count the verb position as relevant too (the paper's full-sentence definition)"
    )


@register(
    "qkov-sva",
    config=SvaConfig,
    description="real data: faster QK learning and attention on the subject (subject-verb agreement), with controls",
)
def qkov_sva(cfg: SvaConfig, quiet: bool) -> Report:
    rep = Report("qkov-sva", asdict(cfg))
    path = RD.resolve_data(cfg.data, "blimp", "sva")
    records = RD.load_sva(path)
    train, evaluation = RD.split_records(records, cfg.eval_fraction, cfg.split_seed)
    rep.summary["items: train, evaluation"] = [len(train), len(evaluation)]
    hint = (
        f": no evaluation item of {path} has a known subject. A TSV gives it in the optional sixth column, "
        "subject_index (0-based word index of the subject; -1, or a 4-column line, leaves it unknown)"
    )
    lanes, out, _, _ = run_real(
        rep, "agree", "sva", train, evaluation, cfg, quiet, {"verb_relevant": cfg.verb_relevant}, hint
    )
    n_attr = np.asarray([r.meta.get("n_attractors", -1) for r in evaluation])
    for k in sorted(set(n_attr.tolist())):
        sel = n_attr == k
        rows = []
        for r in sorted(set(lanes.ratio[np.asarray(lanes.kind) == "qk"])):
            idx = lanes.select("qk", r)
            rows.append([float(r), *(round(x, 4) for x in mean_ci(out["correct"][idx][:, sel].mean(axis=1)))])
        label = "unknown" if k < 0 else str(k)
        rep.summary[f"accuracy with {label} attractor(s) ({int(sel.sum())} items) [r, mean, CI]"] = rows
    return rep
