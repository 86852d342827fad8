"""attnflow.qkov text models, their training over ratio x seed lanes, the metrics on held-out
examples, and the real-data experiments run on files a user writes in the documented formats."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from attnflow.qkov import CONFIDENCES
from attnflow.qkov import realdata as RD
from attnflow.qkov.textmodel import (
    CIRCUIT_GROUPS,
    SPECIALS,
    encode_text,
    make_text_model,
    text_circuit_labels,
    text_loss,
)
from attnflow.qkov.texttrain import (
    TextSchedule,
    _best_span,
    _span_f1,
    evaluate_text,
    ratio_lanes,
    train_text,
    uniform_relevant_mass,
)


def rec(words, relevant, label=0, query=(), **meta):
    return RD.TextRecord(
        id=str(abs(hash((tuple(words), tuple(query))))),
        words=tuple(words),
        relevant=np.asarray(relevant, float),
        label=label,
        query_words=tuple(query),
        meta=meta,
    )


VOCAB = RD.Vocabulary.build([["a", "b", "c", "d", "has", "have"]], specials=tuple(SPECIALS.values()))


# ----------------------------------------------------------------------------- encoding
def test_encode_layouts_of_the_three_tasks():
    b = encode_text([rec("abc", [0, 1, 0.5], label=2)], VOCAB, "classify", 5)
    assert VOCAB.decode(np.asarray(b.tokens[0])) == ["a", "b", "c", "<cls>", "<pad>"]
    assert b.keys[0].tolist() == [True, True, True, False, False]
    assert b.relevant[0].tolist() == [0, 1, 0.5, 0, 0]
    assert (int(b.query[0]), int(b.label[0])) == (3, 2)

    b = encode_text([rec("abcd", [0, 1, 0, 0], correct="has", wrong="have")], VOCAB, "agree", 4, verb_relevant=True)
    # the last length - 1 prefix words, then <verb>, which sees itself (causal)
    assert VOCAB.decode(np.asarray(b.tokens[0])) == ["b", "c", "d", "<verb>"]
    assert b.keys[0].tolist() == [True] * 4
    assert b.relevant[0].tolist() == [1, 0, 0, 1]
    b = encode_text([rec("abcd", [0, 1, 0, 0], correct="has", wrong="have")], VOCAB, "agree", 4)
    assert b.relevant[0].tolist() == [1, 0, 0, 0]
    assert b.candidates[0].tolist() == [VOCAB.id("has"), VOCAB.id("have")]

    b = encode_text([rec("abcd", [0, 1, 1, 0], query=("d", "a"), start=1, end=2)], VOCAB, "span", 8, question_length=2)
    assert VOCAB.decode(np.asarray(b.tokens[0])) == ["d", "a", "<sep>", "a", "b", "c", "d", "<pad>"]
    assert b.pool[0].tolist() == [True, True] + [False] * 6
    assert b.keys[0].tolist() == [False] * 3 + [True] * 4 + [False]
    assert (int(b.query[0]), int(b.label[0]), int(b.end[0])) == (2, 4, 5)
    assert float(uniform_relevant_mass(b)[0]) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("nope", 5), "task must be one of"),
        (("classify", 1), "length must be at least 2"),
    ],
)
def test_encode_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        encode_text([rec("ab", [0, 0])], VOCAB, *args)


def test_encode_names_a_span_that_does_not_fit_and_a_vocabulary_without_specials():
    with pytest.raises(ValueError, match="answer ends at context word 3"):
        encode_text([rec("abcd", [0, 0, 0, 1], query=("a",), start=3, end=3)], VOCAB, "span", 4)
    plain = RD.Vocabulary.build([["a"]])
    with pytest.raises(ValueError, match="lacks '<cls>'"):
        encode_text([rec("a", [0])], plain, "classify", 3)


# ----------------------------------------------------------------------------- model
CALL = eqx.filter_jit(lambda m, b, key_mask=None: m(b, key_mask))


def _batch(n=6, length=7, seed=0):
    rng = np.random.default_rng(seed)
    recs = []
    for _ in range(n):
        k = int(rng.integers(2, length))
        recs.append(rec(rng.choice(list("abcd"), k), rng.random(k) > 0.5, label=int(rng.integers(3))))
    return encode_text(recs, VOCAB, "classify", length)


def test_attention_is_a_distribution_over_the_keys_and_deletion_removes_keys():
    b = _batch()
    m = make_text_model("classify", len(VOCAB), 7, key=0, d_model=8, heads=2, mlp=16, init_std=0.5)
    z, a = CALL(m, b)
    assert z.shape == (6, 3) and a.shape == (6, 7)
    np.testing.assert_allclose(np.sum(a, -1), 1.0, atol=1e-6)
    assert float(jnp.max(jnp.where(b.keys, 0.0, a))) == 0.0
    drop = jnp.zeros_like(b.keys).at[:, 0].set(True)  # delete the first key
    _, a2 = CALL(m, b, ~drop)
    assert float(jnp.max(a2[:, 0])) == 0.0
    np.testing.assert_allclose(np.sum(a2, -1), 1.0, atol=1e-6)


def test_collapsed_circuits_compute_the_factorised_products():
    # CACO with W_QK^h = W_Q^h W_K^h^T and W_OV^h = W_V^h W_O^h gives FAFO's logits exactly
    b = _batch()
    fa = make_text_model("classify", len(VOCAB), 7, key=1, d_model=8, heads=2, mlp=16, init_std=0.5)
    ca = make_text_model("classify", len(VOCAB), 7, key=1, d_model=8, heads=2, mlp=16, parametrisation="CACO")
    ca = eqx.tree_at(
        lambda m: (m.embed, m.position, m.W_QK, m.W_OV, m.mlp_in, m.mlp_out, m.read),
        ca,
        (
            fa.embed,
            fa.position,
            jnp.einsum("hde,hfe->hdf", fa.W_Q, fa.W_K),
            jnp.einsum("hde,hef->hdf", fa.W_V, fa.W_O),
            fa.mlp_in,
            fa.mlp_out,
            fa.read,
        ),
    )
    (z1, a1), (z2, a2) = CALL(fa, b), CALL(ca, b)
    np.testing.assert_allclose(z1, z2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a1, a2, rtol=1e-5, atol=1e-7)


def test_circuit_labels_name_the_four_groups():
    for par, qk, ov in (("FAFO", ("W_Q", "W_K"), ("W_V", "W_O")), ("CACO", ("W_QK",), ("W_OV",))):
        m = eqx.filter_jit(make_text_model)("classify", 10, 5, key=0, d_model=4, heads=2, mlp=8, parametrisation=par)
        labels = text_circuit_labels(m)
        for name in qk:
            assert getattr(labels, name) == "qk"
        for name in ov:
            assert getattr(labels, name) == "ov"
        assert (labels.embed, labels.position, labels.mlp_in, labels.read) == ("embed", "embed", "head", "head")
        assert set(jax.tree_util.tree_leaves(labels)) == set(CIRCUIT_GROUPS)


@pytest.mark.parametrize("task", ["classify", "agree", "span"])
def test_loss_gradients_match_finite_differences(task):
    with jax.enable_x64(True):
        if task == "classify":
            b = _batch(4, 6)
        elif task == "agree":
            b = encode_text([rec("abc", [1, 0, 0], correct="has", wrong="have")] * 2, VOCAB, "agree", 5)
        else:
            b = encode_text([rec("abcd", [0, 1, 1, 0], query=("d",), start=1, end=2)] * 2, VOCAB, "span", 7)
        b = jax.tree_util.tree_map(lambda x: x.astype(jnp.float64) if x.dtype == jnp.float32 else x, b)
        m = make_text_model(task, len(VOCAB), 7, key=jax.random.PRNGKey(2), d_model=4, heads=2, mlp=6, init_std=0.5)
        m = jax.tree_util.tree_map(lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x, m)
        params, static = eqx.partition(m, eqx.is_inexact_array)

        @jax.jit
        def loss(p):
            return text_loss(eqx.combine(p, static), b)

        check_grads(loss, (params,), order=1, modes=["rev"], atol=1e-5)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"task": "x"}, "task must be one of"),
        ({"parametrisation": "FOO"}, "parametrisation must be one of"),
        ({"d_model": 2, "heads": 4}, "smaller than heads"),
        ({"mlp": 0}, "mlp"),
    ],
)
def test_make_text_model_rejects_bad_input(kw, match):
    args = {"task": "classify", "vocab_size": 10, "length": 5, "key": 0, **kw}
    with pytest.raises(ValueError, match=match):
        make_text_model(**args)


# ----------------------------------------------------------------------------- lanes and training
def test_ratio_lanes_builds_the_intervention_and_the_control():
    lanes = ratio_lanes([1, 10], [0, 1], 1e-3)
    assert len(lanes) == 6  # QK x {1, 10} and every group x 10, two seeds each
    assert lanes.kind == ("qk",) * 4 + ("all",) * 2
    i = lanes.select("qk", 10)
    np.testing.assert_allclose(lanes.rates["qk"][i], 1e-2)
    np.testing.assert_allclose(lanes.rates["ov"][i], 1e-3)
    np.testing.assert_allclose(lanes.rates["embed"][lanes.select("all", 10)], 1e-2)
    both = ratio_lanes([3], [0], {"qk": 1.0, "ov": 2.0, "embed": 3.0, "head": 4.0}, fast_groups=("qk", "embed"))
    assert [both.rates[g][0] for g in CIRCUIT_GROUPS] == [3.0, 2.0, 9.0, 4.0]
    with pytest.raises(ValueError, match="fast_groups"):
        ratio_lanes([1], [0], 1e-3, fast_groups=("q",))
    with pytest.raises(ValueError, match="ratio"):
        ratio_lanes([0.0], [0], 1e-3)
    with pytest.raises(ValueError, match="optimizer"):
        TextSchedule(optimizer="lbfgs")


def _toy(n, seed, length=16):
    """Class = which of three signal words the sequence holds; relevant = that word."""
    rng = np.random.default_rng(seed)
    filler = [f"w{i}" for i in range(30)]
    out = []
    for _ in range(n):
        k = int(rng.integers(4, length - 1))
        words = list(rng.choice(filler, k))
        y = int(rng.integers(3))
        p = int(rng.integers(k))
        words[p] = ("hate", "ok", "rude")[y]
        out.append(rec(words, np.eye(k)[p], label=y))
    return out


TOY_VOCAB = RD.Vocabulary.build(
    [[f"w{i}" for i in range(30)] + ["hate", "ok", "rude"]], specials=tuple(SPECIALS.values())
)


def _toy_model(key):
    return make_text_model("classify", len(TOY_VOCAB), 16, key=key, d_model=16, heads=2, mlp=32)


def test_faster_qk_concentrates_attention_on_the_relevant_token_of_a_toy_task():
    tr = encode_text(_toy(480, 0), TOY_VOCAB, "classify", 16)
    ev = encode_text(_toy(200, 1), TOY_VOCAB, "classify", 16)
    lanes = ratio_lanes([1, 10], [0], 3e-3, control=False)
    models, history = train_text(_toy_model, tr, lanes, TextSchedule(epochs=10, batch=16))
    assert history.shape == (2, 10) and np.all(history[:, -1] < 0.25 * history[:, 0])
    out = evaluate_text(models, ev, tau_a=0.5)
    # both lanes solve the task; only the faster QK circuit puts the attention on the signal word
    assert np.all(out["accuracy"] > 0.95)
    floor = float(jnp.mean(uniform_relevant_mass(ev)))
    assert out["relevant_mass"][0] < 2 * floor < 0.5 < out["relevant_mass"][1]
    assert out["ac"][1] > out["ac"][0] + 0.3
    assert out["dtap"].shape == (2, 5, 5) and np.allclose(out["dtap"].sum((1, 2)), 100.0)
    # ACMC: tau_p = 0.1 by default (spec 10.6), on p_true
    has_rel = np.asarray(jnp.any(ev.relevant > 0, axis=-1))
    want = [np.mean(((a >= 0.5) & (p >= 0.1))[has_rel]) for a, p in zip(out["a_rel"], out["p_true"])]
    np.testing.assert_allclose(out["acmc"], want, rtol=1e-6)
    # the confidence options, on the same examples with every label moved to a wrong class: the
    # predictions (and their probabilities) stay, p_true and correctness collapse
    half = evaluate_text(models, ev, tau_a=0.5, tau_p=0.5)["acmc"]
    wrong = eqx.tree_at(lambda b: b.label, ev, (ev.label + 1) % 3)
    acmc = {c: evaluate_text(models, wrong, tau_a=0.5, tau_p=0.5, confidence=c)["acmc"] for c in CONFIDENCES}
    assert half[1] > 0.7 and np.all(acmc["true_prob"] == 0.0) and np.all(acmc["correct"] == 0.0)
    np.testing.assert_allclose(acmc["pred_prob"], half, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown confidence 'p_true'"):
        evaluate_text(models, ev, confidence="p_true")
    with pytest.raises(ValueError, match=r"tau_p = 0 with confidence='correct' counts every example"):
        evaluate_text(models, ev, tau_p=0.0, confidence="correct")
    # lanes do not interact: the same grid in the other order (same compiled epoch) swaps the results
    swapped, _ = train_text(
        _toy_model, tr, ratio_lanes([10, 1], [0], 3e-3, control=False), TextSchedule(epochs=10, batch=16)
    )
    z_grid, _ = jax.tree_util.tree_map(lambda x: x[1], models)(ev)
    z_swap, _ = jax.tree_util.tree_map(lambda x: x[0], swapped)(ev)
    np.testing.assert_allclose(z_grid, z_swap, rtol=1e-4, atol=1e-4)


def test_a_diverging_lane_stops_training_with_its_name():
    tr = encode_text(_toy(64, 0), TOY_VOCAB, "classify", 16)
    lanes = ratio_lanes([1, 1e200], [0], 1.0, control=False)  # 1e200 overflows the float32 rate
    with pytest.raises(FloatingPointError, match="lane 1 .*ratio 1e\\+200"):
        train_text(_toy_model, tr, lanes, TextSchedule(epochs=3, optimizer="sgd", clip=None, warmup=0.0))


def test_span_f1_and_best_span():
    f1 = _span_f1(jnp.array([2, 0, 5]), jnp.array([4, 1, 5]), jnp.array([3, 0, 7]), jnp.array([4, 1, 8]))
    # [2,4] vs [3,4]: P = 2/3, R = 1 -> 0.8; exact; disjoint
    np.testing.assert_allclose(f1, [0.8, 1.0, 0.0], rtol=1e-6)
    z = jnp.array([[0.0, 5.0, 0.0, 9.0], [1.0, 0.0, 4.0, -5.0]])  # the best end lies before the best start
    s, e = _best_span(z, 3)
    assert (int(s), int(e)) == (1, 2)


# ----------------------------------------------------------------------------- experiments on user files
TINY = {"epochs": 6, "seeds": 2, "ratios": (1.0, 3.0), "d_model": 8, "heads": 2, "batch": 8, "n_examples": 2}
TINY_RATE = 0.03


def _gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


def _hatexplain_file(path: Path, n: int = 200) -> Path:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        y = i % 3  # hatespeech holds "vile", offensive "bad", normal neither
        toks = [str(w) for w in rng.choice(["you", "are", "so", "nice", "people", "here"], 8)]
        if y != 1:
            toks[int(rng.integers(8))] = ("vile", "", "bad")[y]
        rats = [] if y == 1 else [[int(t in ("bad", "vile")) for t in toks]] * 2
        rows.append(
            {"id": f"p{i}", "post_tokens": toks, "annotators": {"label": [y, y, (y + 1) % 3]}, "rationales": rats}
        )
    return _gz(path, "".join(json.dumps(r) + "\n" for r in rows))


def _sva_file(path: Path, n: int = 200) -> Path:
    lines = []
    for i in range(n):
        plural = i % 2
        subj = ("dogs", "dog")[1 - plural] if i % 3 else ("cats", "cat")[1 - plural]
        good, bad = ("bark", "barks") if plural else ("barks", "bark")
        lines.append(f"the {subj} near the house {good} loudly\t5\t{good}\t{bad}\t1\t1")
    path.write_text("sentence\tverb_index\tcorrect_form\twrong_form\tn_attractors\tsubject_index\n" + "\n".join(lines))
    return path


def _squad_file(path: Path, n: int = 200) -> Path:
    qas, ctx = [], "the river flows north past the old mill and the bridge in spring"
    for i in range(n):
        ans, question = (("the old mill", "what is old"), ("the bridge", "what crosses"), ("spring", "when"))[i % 3]
        qas.append({"id": f"q{i}", "question": question, "answers": [{"text": ans, "answer_start": ctx.index(ans)}]})
    doc = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": qas}]}]}
    return _gz(path, json.dumps(doc))


@pytest.mark.parametrize(
    ("name", "writer", "extra"),
    [
        pytest.param("qkov-hatexplain", _hatexplain_file, {"length": 10, "mlp": 16}, marks=pytest.mark.slow),
        ("qkov-sva", _sva_file, {"length": 8, "optimizer": "adamw"}),
        pytest.param(
            "qkov-squad", _squad_file, {"window": 10, "question_length": 4, "length": 15}, marks=pytest.mark.slow
        ),
    ],
)
def test_each_real_data_experiment_runs_on_a_file_given_with_set_data(tmp_path, name, writer, extra):
    from attnflow.registry import get_experiment, load_all

    load_all()
    path = writer(tmp_path / {"qkov-sva": "agree.tsv"}.get(name, "data.gz"))
    rep = get_experiment(name).run({"data": str(path), "base_rate": TINY_RATE, **TINY, **extra}, quiet=True)
    assert rep.passed, rep.checks
    score = "f1" if name == "qkov-squad" else "accuracy"
    key = f"QK group x r: {score} [r, mean, 95% CI half-width over 2 seeds]"
    rows = rep.summary[key]
    # every tiny task is learnable: the faster-QK runs reach at least 80% (accuracy or span F1)
    assert [r[0] for r in rows] == [1.0, 3.0] and rows[1][1] >= 0.8 and all(r[2] >= 0 for r in rows)
    assert len(rep.summary["verdict"]) == 1 and rep.summary["verdict"][0].startswith(
        "r = 3 against the baseline r = 1 (the smallest ratio):"
    )
    assert {"metrics_vs_ratio", "dtap_r1", "dtap_r3", "examples"} <= set(rep.figures)
    if name == "qkov-sva":
        assert rep.summary["accuracy with 1 attractor(s) (40 items) [r, mean, CI]"][1][:2] == [3.0, 1.0]
    if name == "qkov-hatexplain":
        # with the official division file the experiment trains on "train" and evaluates on "test"
        divisions = tmp_path / "post_id_divisions.json"
        ids = [f"p{i}" for i in range(200)]
        divisions.write_text(json.dumps({"train": ids[:150], "val": ids[150:170], "test": ids[170:]}))
        settings = {"data": str(path), "divisions": str(divisions), "base_rate": TINY_RATE, **TINY, **extra}
        rep = get_experiment(name).run(settings, quiet=True)
        assert rep.summary["posts: train, evaluation (majority label; no-majority posts dropped)"] == [150, 30]
        assert "official HateXplain train / test divisions" in " ".join(rep.notes)


def test_a_real_data_experiment_without_data_stops_naming_the_option_and_the_variable(tmp_path, monkeypatch):
    from attnflow.registry import get_experiment, load_all

    load_all()
    monkeypatch.setenv("ATTNFLOW_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="(?s)--set data=PATH.*ATTNFLOW_DATA"):
        get_experiment("qkov-squad").run({}, quiet=True)


def test_verdict_reads_the_interval_of_the_difference_and_the_cost():
    from attnflow.qkov.text_experiments import verdict

    table = {
        "qk": {
            "relevant_mass": [[1.0, 0.40, 0.15], [3.0, 0.65, 0.13], [10.0, 0.45, 0.15]],
            "ac": [[1.0, 0.21, 0.46], [3.0, 0.95, 0.09], [10.0, 0.90, 0.10]],
            "accuracy": [[1.0, 0.90, 0.06], [3.0, 0.87, 0.03], [10.0, 0.91, 0.01]],
        },
        "all": {"relevant_mass": [[3.0, 0.57, 0.01]], "ac": [[3.0, 0.83, 0.06]], "accuracy": [[3.0, 0.98, 0.01]]},
    }
    r3, r10 = verdict(table, "accuracy")
    # r = 3: mass +0.25 > hypot(0.13, 0.15) = 0.198 and AC +0.74 > 0.469, but 3 points of accuracy lost
    assert r3.startswith("r = 3 against the baseline r = 1 (the smallest ratio): relevant mass 0.400 -> 0.650")
    assert "(-3.0 points)" in r3 and "but cost more than 2 points" in r3
    assert "control (every group x 3): relevant mass 0.570, AC 0.830, accuracy 98.0" in r3
    # r = 10: mass +0.05 is inside the interval of the difference
    assert "did not raise both" in r10 and "control" not in r10


# ----------------------------------------------------------------------------- probe findings
def test_standalone_metrics_weight_relevance_and_exclude_padding_as_evaluate_text_does():
    from attnflow.qkov import relevant_mass, separability

    # example 0: 3 real tokens + 2 padding; weights as HateXplain gives them (means of 0/1 masks)
    a = jnp.array([[0.5, 0.3, 0.2, 0.0, 0.0], [0.1, 0.2, 0.3, 0.2, 0.2]])
    rel = jnp.array([[1 / 3, 0.0, 0.0, 0.0, 0.0], [0.0, 2 / 3, 0.0, 0.0, 1 / 3]])
    keys = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    # sum_i r_i a_i: 0.5 / 3 and 0.2 * 2/3 + 0.2 / 3
    np.testing.assert_allclose(relevant_mass(a, rel, keys), [0.5 / 3, 0.2], rtol=1e-6)
    # max over R minus min over the other keys: 0.5 - 0.2 (padding is not the minimum), 0.2 - 0.1
    assert float(separability(a, rel, keys)) == pytest.approx((0.3 + 0.1) / 2)
    assert float(separability(a, rel)) == pytest.approx((0.5 + 0.1) / 2)  # without keys padding's 0 is the min
    # an example without relevant tokens is left out, and none at all gives NaN, not -inf
    none = jnp.zeros_like(rel)
    assert float(separability(a, rel.at[1].set(0.0), keys)) == pytest.approx(0.3)
    assert np.isnan(float(separability(a, none, keys)))
    np.testing.assert_allclose(relevant_mass(a, none, keys), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"keys must have the shape of the attention \(2, 5\), got \(5,\)"):
        relevant_mass(a, rel, keys[0])
    # annotator counts are not relevances: the mass would pass 1
    with pytest.raises(ValueError, match=r"relevances in \[0, 1\] .*; entry \(1, 1\) is 2$"):
        relevant_mass(a, rel.at[1, 1].set(2.0), keys)


class _FixedSpan(eqx.Module):
    """A span model whose logits are given: start and end pointers peak where told."""

    z: jax.Array
    task: str = eqx.field(static=True, default="span")

    def __call__(self, batch, key_mask=None):
        keys = batch.keys if key_mask is None else batch.keys & key_mask
        a = keys / jnp.maximum(jnp.sum(keys, axis=-1, keepdims=True), 1)
        return self.z, a


def test_span_f1_and_exact_match_take_the_best_gold_answer():
    # context "a b c d" after a 2-word question: positions 3..6; gold answers (1, 2) and (1, 1) in the window
    r = rec("abcd", [0, 1, 1, 0], query=("d", "a"), start=1, end=2, spans=((1, 2), (1, 1), (3, 3)))
    b = encode_text([r, r], VOCAB, "span", 8, question_length=2)
    assert b.gold.tolist() == [[[4, 5], [4, 4], [6, 6]]] * 2
    z = np.full((1, 2, 2, 8), -10.0, np.float32)
    z[0, 0, 0, 4] = z[0, 0, 1, 4] = 10.0  # example 0 predicts (4, 4): exactly the second answer
    z[0, 1, 0, 5] = z[0, 1, 1, 6] = 10.0  # example 1 predicts (5, 6): F1 2/3 against (4, 5) and (6, 6)
    out = evaluate_text(_FixedSpan(jnp.asarray(z)), b)
    # against the first answer alone example 0 would score F1 2/3 and no exact match
    np.testing.assert_allclose(out["f1"], [(1.0 + 2 / 3) / 2], rtol=1e-6)
    np.testing.assert_allclose(out["exact"], [0.5])
    np.testing.assert_allclose(out["accuracy"], [0.5])
    assert out["correct"].tolist() == [[True, False]]
    # uniform attention over 4 keys, 2 of them relevant: the floor, and the relevant mass equals it
    np.testing.assert_allclose(out["floor"], [0.5])
    np.testing.assert_allclose(out["relevant_mass"], [0.5], rtol=1e-6)
    # an answer outside the window is not scored; a record without spans has only its first answer
    b1 = encode_text([rec("abcd", [0, 1, 1, 0], query=("d", "a"), start=1, end=2)], VOCAB, "span", 8, 2)
    assert b1.gold.tolist() == [[[4, 5]]]


def test_evaluate_text_floor_and_relevant_mass_are_nan_without_relevant_tokens():
    r = rec("abc", [0, 0, 0], query=("d",), start=0, end=0)
    b = encode_text([r], VOCAB, "span", 6, question_length=1)
    z = jnp.zeros((1, 1, 2, 6))
    out = evaluate_text(_FixedSpan(z), b)
    assert np.isnan(out["floor"][0]) and np.isnan(out["relevant_mass"][0]) and np.isnan(out["separability"][0])


def test_verdict_with_one_seed_gives_the_numbers_and_no_claim():
    from attnflow.qkov.text_experiments import verdict
    from attnflow.qkov.texttrain import mean_ci

    def row(r, v):
        return [r, *mean_ci([v])]

    table = {
        "qk": {
            "relevant_mass": [row(1, 0.300), row(10, 0.301)],
            "ac": [row(1, 0.200), row(10, 0.201)],
            "accuracy": [row(1, 0.9), row(10, 0.9)],
        }
    }
    assert verdict(table, "accuracy") == [
        "r = 10 against the baseline r = 1 (the smallest ratio): relevant mass 0.300 -> 0.301, AC 0.200 -> 0.201, "
        "accuracy 90.0 -> 90.0 (+0.0 points): no verdict: one seed per ratio gives no confidence interval "
        "(run with seeds >= 2)"
    ]
    # the baseline is the smallest ratio, whatever it is
    table2 = {m: [[3.0, *v[0][1:]], [30.0, *v[1][1:]]] for m, v in table["qk"].items()}
    assert verdict({"qk": table2}, "accuracy")[0].startswith("r = 30 against the baseline r = 3 (the smallest ratio)")


def test_sva_run_without_subjects_stops_before_training_naming_subject_index(tmp_path):
    from attnflow.registry import get_experiment, load_all

    load_all()
    path = _sva_file(tmp_path / "agree4.tsv")
    four = [ln.rsplit("\t", 2)[0] for ln in path.read_text().splitlines()]
    path.write_text("\n".join(four))
    with pytest.raises(ValueError) as e:
        get_experiment("qkov-sva").run({"data": str(path), "base_rate": TINY_RATE, **TINY}, quiet=True)
    assert str(e.value) == (
        "none of the 40 evaluation examples has a relevant token, so relevant mass, AC, ACMC, separability and "
        f"DTAP would measure nothing: no evaluation item of {path} has a known subject. A TSV gives it in the "
        "optional sixth column, subject_index (0-based word index of the subject; -1, or a 4-column line, leaves "
        "it unknown)"
    )


@pytest.mark.parametrize(
    ("divisions", "why"),
    [
        ({"train": ["p0", "p1"], "val": ["p2"]}, "has no division 'test'"),
        ({"train": ["p0", "p1"], "test": ["nobody"]}, "division 'test' holds none of the 200 loaded posts"),
    ],
)
def test_hatexplain_divisions_without_a_test_division_are_named(tmp_path, divisions, why):
    from attnflow.registry import get_experiment, load_all

    load_all()
    data = _hatexplain_file(tmp_path / "data.jsonl.gz")
    div = tmp_path / "div.json"
    div.write_text(json.dumps(divisions))
    found = ", ".join(f"{k!r} ({len([i for i in v if i != 'nobody'])} posts)" for k, v in divisions.items())
    msg = f"divisions file {div}: {why} (the run trains on 'train' and evaluates on 'test'); divisions found: {found}"
    with pytest.raises(ValueError) as e:
        get_experiment("qkov-hatexplain").run({"data": str(data), "divisions": str(div), **TINY}, quiet=True)
    assert str(e.value) == msg


def test_figures_show_the_floor_in_a_legend_and_the_thresholds_in_the_labels():
    from attnflow.qkov.text_experiments import metrics_figure

    rows = {m: [[1.0, 0.3, 0.01], [3.0, 0.4, 0.02]] for m in ("relevant_mass", "ac", "acmc", "accuracy")}
    fig = metrics_figure({"qk": rows}, ["accuracy", "relevant_mass", "ac", "acmc"], 0.25, "t", 0.5, 0.5)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["uniform attention (floor, 0.250)", "QK group x r"]
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_visible()]
    assert labels[2:] == ["AC (share with A_rel >= tau_a = 0.5)", "ACMC (and p_true >= tau_p = 0.5)"]
    floor_line = next(ln for ln in fig.axes[1].get_lines() if ln.get_label().startswith("uniform"))
    assert floor_line.get_zorder() > max(c.get_zorder() for c in fig.axes[1].get_lines() if c is not floor_line)


def test_sgd_schedule_applies_coupled_l2_decay_through_the_momentum():
    from attnflow.qkov.texttrain import _sgdw

    lr, mom, wd = 0.1, 0.9, 0.5
    opt = _sgdw(lr, momentum=mom, wd=wd)
    theta = jnp.array([2.0])
    s = opt.init(theta)
    g1, g2 = jnp.array([1.0]), jnp.array([-1.0])
    u1, s = opt.update(g1, s, theta)
    m1 = 1.0 + wd * 2.0  # the decay enters the momentum buffer with the gradient
    np.testing.assert_allclose(u1, [-lr * m1])
    theta = theta + u1
    u2, s = opt.update(g2, s, theta)
    np.testing.assert_allclose(u2, [-lr * (mom * m1 + (-1.0 + wd * float(theta[0])))], rtol=1e-6)
