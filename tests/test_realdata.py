"""attnflow.qkov.realdata: the loaders of HateXplain, SQuAD and subject-verb agreement data.

Small files written here cover every format, plain and gzip-compressed, folders and malformed
input (each error names the file and the line or record); the real files in ``../shared/data``
are checked against counts measured on them (skipped when the folder is absent).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnflow.qkov.realdata import (
    DATA_FORMATS,
    PAD,
    UNK,
    TextRecord,
    Vocabulary,
    describe,
    load_hatexplain,
    load_squad,
    load_sva,
    official_split,
    resolve_data,
    split_records,
    tokenize,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def write(path: Path, text: str) -> Path:
    """``text`` into ``path``, gzip-compressed when the name ends in ``.gz``."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jsonl(rows: list[Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def raises_at(path: Path, where: str, problem: str):
    """``pytest.raises(ValueError)`` whose message names ``path``, then ``where``, then ``problem``."""
    return pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + where + ".*" + problem)


# ---------------------------------------------------------------------------- tokens, vocabulary


def test_tokenize_keeps_contractions_and_splits_punctuation():
    text = "He hasn't gone, Levi's 24–10!"
    toks = tokenize(text)
    assert [t for t, _, _ in toks] == ["he", "hasn't", "gone", ",", "levi's", "24", "–", "10", "!"]
    assert all(text[s:e].lower() == t for t, s, e in toks)
    assert toks[1] == ("hasn't", 3, 9)
    assert tokenize("  ") == []


def test_vocabulary_order_size_unknown_and_round_trip():
    texts = [["b", "a", "c"], ["a", "c", "d"], ["c", "e"]]
    v = Vocabulary.build(texts, specials=["<sep>"])
    # c (3), then a (2), then the singletons b, d, e in order of first occurrence
    assert v.words == (PAD, UNK, "<sep>", "c", "a", "b", "d", "e")
    assert len(v) == 8 and v.id(PAD) == 0 and v.id(UNK) == 1 and v.id("<sep>") == 2
    assert v.id("zebra") == 1 and "c" in v and "zebra" not in v
    ids = v.encode(["c", "zebra", "e"])
    assert ids.dtype == np.int32 and ids.tolist() == [3, 1, 7]
    assert v.decode(ids) == ["c", UNK, "e"]
    assert v.decode(v.encode(texts[1])) == texts[1]
    assert v.decode([]) == []

    small = Vocabulary.build(texts, max_size=5)
    assert small.words == (PAD, UNK, "c", "a", "b")
    assert Vocabulary.build(texts, min_count=2).words == (PAD, UNK, "c", "a")
    assert Vocabulary.build(texts) == Vocabulary(v.words[:2] + v.words[3:])

    with pytest.raises(ValueError, match="id 8 at position 1 is outside the vocabulary of 8 words"):
        v.decode([0, 8])
    with pytest.raises(ValueError, match="max_size = 2 leaves no room"):
        Vocabulary.build(texts, max_size=2, specials=["<sep>"])
    with pytest.raises(ValueError, match="distinct"):
        Vocabulary.build(texts, specials=[UNK])
    with pytest.raises(ValueError, match="starts with"):
        Vocabulary(("a", "b"))
    with pytest.raises(TypeError, match="not the str"):
        v.encode("abc")


def test_text_record_checks_and_freezes_relevant():
    r = TextRecord("x", ("a", "b"), [0.0, 0.5], 1)
    assert r.relevant.dtype == np.float64 and not r.relevant.flags.writeable
    with pytest.raises(ValueError, match=r"record 'x': relevant has shape \(3,\), expected \(2,\)"):
        TextRecord("x", ("a", "b"), [0.0, 0.5, 1.0], 1)
    with pytest.raises(ValueError, match=r"record 'x': relevant weights must lie in \[0, 1\]"):
        TextRecord("x", ("a", "b"), [0.0, 1.5], 1)


# ---------------------------------------------------------------------------- HateXplain


def hx(pid: str, tokens: list[str], labels: list[Any], rationales: list[list[int]]) -> dict[str, Any]:
    return {"id": pid, "post_tokens": tokens, "annotators": {"label": labels}, "rationales": rationales}


POSTS = [
    # majority 0 (2 of 3); two of three annotators gave masks: relevant = (m1 + m2) / 3
    hx("p1", ["You", "are", "vermin"], [0, 2, 0], [[0, 0, 1], [0, 1, 1]]),
    hx("p2", ["nice", "day"], [1, 1, 1], []),
    # no majority (one vote each): dropped, or kept with the lowest id on a tie
    hx("p3", ["what", "ever"], [2, 1, 0], [[1, 0]]),
    # 2 of 4: not more than half; plurality tie between 1 and 2 -> 1
    hx("p4", ["so", "so"], [2, 1, 1, 2], []),
]


@pytest.mark.parametrize("name", ["val.jsonl", "val.jsonl.gz"])
def test_hatexplain_majority_and_mean_rationale(tmp_path, name):
    path = write(tmp_path / name, jsonl(POSTS))
    recs = load_hatexplain(path)
    assert [r.id for r in recs] == ["p1", "p2"]
    p1 = recs[0]
    assert p1.words == ("you", "are", "vermin") and p1.label == 0 and p1.query_words == ()
    np.testing.assert_allclose(p1.relevant, [0.0, 1 / 3, 2 / 3])
    assert p1.meta == {"n_annotators": 3, "has_rationale": True}
    assert recs[1].label == 1 and recs[1].relevant.tolist() == [0.0, 0.0] and not recs[1].meta["has_rationale"]

    kept = load_hatexplain(path, drop_no_majority=False)
    assert [(r.id, r.label) for r in kept] == [("p1", 0), ("p2", 1), ("p3", 0), ("p4", 1)]
    np.testing.assert_allclose(kept[2].relevant, [1 / 3, 0.0])

    d = describe(recs)
    assert d["n"] == 2 and d["labels"] == {0: 1, 1: 1} and d["n_with_rationale"] == 1
    assert d["rationale_coverage"] == 0.5 and d["mean_length"] == 2.5
    assert d["mean_relevant_fraction"] == pytest.approx((2 / 3 + 0) / 2)


def test_hatexplain_official_layout_and_folders(tmp_path):
    names = ["hatespeech", "normal", "offensive"]
    official = {
        p["id"]: {
            "post_id": p["id"],
            "post_tokens": p["post_tokens"],
            "annotators": [
                {"label": names[lab], "annotator_id": k, "target": ["None"]}
                for k, lab in enumerate(p["annotators"]["label"])
            ],
            "rationales": p["rationales"],
        }
        for p in POSTS
    }
    ref = load_hatexplain(write(tmp_path / "ref.jsonl", jsonl(POSTS)), drop_no_majority=False)

    folder = tmp_path / "official"
    folder.mkdir()
    write(folder / "dataset.json.gz", json.dumps(official))
    write(folder / "post_id_divisions.json", json.dumps({"train": ["p1"], "val": ["p2"], "test": []}))
    for source in (folder / "dataset.json.gz", folder):
        got = load_hatexplain(source, drop_no_majority=False)
        assert [(r.id, r.words, r.label) for r in got] == [(r.id, r.words, r.label) for r in ref]
        assert all(np.array_equal(a.relevant, b.relevant) for a, b in zip(got, ref))

    split = official_split(load_hatexplain(folder), folder / "post_id_divisions.json")
    assert {k: [r.id for r in v] for k, v in split.items()} == {"train": ["p1"], "val": ["p2"], "test": []}

    shards = tmp_path / "shards"
    shards.mkdir()
    write(shards / "b.jsonl.gz", jsonl(POSTS[1:2]))
    write(shards / "a.jsonl", jsonl(POSTS[:1]))
    assert [r.id for r in load_hatexplain(shards)] == ["p1", "p2"]

    official["p2"]["annotators"][1]["label"] = "nice"
    write(folder / "dataset.json.gz", json.dumps(official))
    with raises_at(folder / "dataset.json.gz", "record 'p2'", "label 'nice' of annotator 1"):
        load_hatexplain(folder)


@pytest.mark.parametrize(
    ("lines", "where", "problem"),
    [
        ([json.dumps(POSTS[0]), "{not json"], "line 2", "not valid JSON"),
        ([json.dumps(POSTS[1]), "", json.dumps({"id": "q", "annotators": {"label": [1]}})], "line 3", "post_tokens"),
        (
            [json.dumps(hx("q", ["a", "b"], [0, 0, 0], [[1, 0, 0]]))],
            "line 1 \\(post 'q'\\)",
            "rationales\\[0\\] has 3 entries for 2 post tokens",
        ),
        ([json.dumps(hx("q", ["a"], [0, 3, 0], []))], "line 1", "label 3 of annotator 1 is not one of 0, 1, 2"),
        ([json.dumps(hx("q", ["a"], [0, 0], [[1], [1], [0]]))], "line 1", "3 rationales for 2 annotators"),
        ([json.dumps(hx("q", ["a"], [0], [[2]]))], "line 1", "holds 2; masks are 0/1"),
        ([json.dumps(hx("q", ["a"], ["0"], []))], "line 1", "label '0'"),
        ([json.dumps({"id": "q", "post_tokens": ["a"]})], "line 1", "missing field 'annotators'"),
        (
            [json.dumps(hx("q", ["a"], [1], [])), json.dumps(hx("q", ["b"], [1], []))],
            "",
            "record id 'q' occurs more than once",
        ),
        ([json.dumps(hx("q", ["a"], [0, 1], []))], "", "no HateXplain post kept \\(1 read, all without a majority"),
        (["[1, 2]", "[3]"], "line 1", "expected a JSON object"),
    ],
)
def test_hatexplain_malformed(tmp_path, lines, where, problem):
    path = write(tmp_path / "bad.jsonl", "\n".join(lines) + "\n")
    with raises_at(path, where, problem):
        load_hatexplain(path)


# ---------------------------------------------------------------------------- SQuAD

CONTEXT = (
    "The quick brown fox, known locally as Reynard the Red, jumped over the lazy dog near the old mill "
    "on a cold morning in early November while the farmer's children watched from the barn door."
)


def squad_doc(qas: list[dict[str, Any]], context: str = CONTEXT, version: str = "1.1") -> dict[str, Any]:
    return {"version": version, "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


def qa(qid: str, text: str, start: Any = None, question: str = "Who jumped?", **extra: Any) -> dict[str, Any]:
    start = CONTEXT.index(text) if start is None else start
    return {
        "id": qid,
        "question": question,
        "answers": [{"text": text, "answer_start": start}, {"text": "The", "answer_start": 0}],
        **extra,
    }


def test_squad_window_holds_exactly_the_answer(tmp_path):
    answers = ["Reynard the Red", "the lazy dog", "early November", "The quick", "barn door.", "farmer's children"]
    qas = [qa(f"q{i}", a) for i, a in enumerate(answers)]
    qas.insert(2, {"id": "imp", "question": "?", "answers": [], "is_impossible": True})
    path = write(tmp_path / "dev-v2.0.json.gz", json.dumps(squad_doc(qas, version="v2.0")))
    full = [t for t, _, _ in tokenize(CONTEXT)]
    assert len(full) == 38

    recs = load_squad(path, window=8, seed=3)
    assert [r.id for r in recs] == [f"q{i}" for i in range(6)]  # the impossible question skipped
    for r, a in zip(recs, answers):
        s, e, off = r.meta["start"], r.meta["end"], r.meta["offset"]
        assert len(r.words) == 8 and r.words == tuple(full[off : off + 8]) and r.meta["n_context"] == 38
        assert " ".join(r.words[s : e + 1]) == " ".join(t for t, _, _ in tokenize(a))
        assert r.relevant.tolist() == [1.0 if s <= i <= e else 0.0 for i in range(8)]
        assert r.label == 0 and r.query_words == ("who", "jumped", "?")
        assert r.meta["answers"] == (a, "The") and r.meta["question_id"] == r.id
    offsets = [r.meta["offset"] for r in recs]
    assert offsets == [r.meta["offset"] for r in load_squad(path, window=8, seed=3)]
    assert len({tuple(r.meta["offset"] for r in load_squad(path, window=8, seed=k)) for k in range(4)}) > 1
    # the first k records do not depend on max_questions
    assert [r.meta["offset"] for r in load_squad(path, window=8, seed=3, max_questions=2)] == offsets[:2]

    assert [r.id for r in load_squad(path, window=2)] == ["q2", "q3", "q5"]  # the 3-word answers skipped
    whole = load_squad(path, window=100)
    assert all(r.words == tuple(full) and r.meta["offset"] == 0 for r in whole)
    # every distinct gold answer inside the window, the first first: "The" (context word 0) is a second
    # answer everywhere, and inside an 8-word window only when the window starts at word 0
    assert all(r.meta["spans"] == ((r.meta["start"], r.meta["end"]), (0, 0)) for r in whole)
    assert [len(r.meta["spans"]) for r in recs] == [1 + (r.meta["offset"] == 0) for r in recs]
    assert recs[3].meta["spans"] == ((0, 1), (0, 0))  # "The quick": the window starts at word 0
    d = describe(whole)
    assert d["n"] == 6 and d["labels"] == {0: 6} and d["rationale_coverage"] == 1.0 and d["mean_query_length"] == 3.0


def test_squad_answer_inside_a_word_takes_the_whole_word(tmp_path):
    start = CONTEXT.index("farmer's") + 2
    path = write(tmp_path / "dev.json", json.dumps(squad_doc([qa("q", "rmer", start)])))
    (r,) = load_squad(path, window=4)
    assert r.words[r.meta["start"] : r.meta["end"] + 1] == ("farmer's",)


@pytest.mark.parametrize(
    ("doc", "where", "problem"),
    [
        (
            squad_doc([qa("q1", "fox"), qa("q2", "fox", 999)]),
            "record 'q2'",
            "answer_start 999 with text of 3 characters lies outside the context",
        ),
        (
            squad_doc([qa("q1", "lazy dog", 4)]),
            "record 'q1'",
            "answer text 'lazy dog' does not match the context at answer_start 4: 'quick br'",
        ),
        (
            squad_doc([qa("q1", "fox", "12")]),
            "record 'q1': answers\\[0\\]",
            "field 'answer_start' must be int, got '12'",
        ),
        (
            squad_doc(
                [
                    {
                        "id": "q1",
                        "question": "?",
                        "answers": [{"text": "fox", "answer_start": 16}] * 2 + [{"text": "dog", "answer_start": 16}],
                    }
                ]
            ),
            "record 'q1'",
            "answers\\[2\\] 'dog' at answer_start 16 does not match the context there: 'fox'",
        ),
        (squad_doc([{"id": "q1", "answers": []}]), "record 'q1'", "missing field 'question'"),
        (squad_doc([{"id": "q1", "question": "?", "answers": []}]), "record 'q1'", "no answers"),
        (squad_doc([qa("q1", "fox"), qa("q1", "dog")]), "", "record id 'q1' occurs more than once"),
        ({"data": [{"paragraphs": [{"qas": []}]}]}, "data\\[0\\].paragraphs\\[0\\]", "missing field 'context'"),
        ({"version": "1.1"}, "", "expected a JSON object with a 'data' list"),
        (
            squad_doc([{"id": "i", "question": "?", "answers": [], "is_impossible": True}]),
            "",
            "no SQuAD question kept \\(1 read, 1 impossible",
        ),
    ],
)
def test_squad_malformed(tmp_path, doc, where, problem):
    path = write(tmp_path / "bad.json", json.dumps(doc))
    with raises_at(path, where, problem):
        load_squad(path)


def test_squad_bad_json_and_folder(tmp_path):
    path = write(tmp_path / "bad.json.gz", '{"data": [\n  {"paragraphs": oops}\n]}')
    with raises_at(path, "line 2", "not valid JSON"):
        load_squad(path)
    # a folder with one SQuAD file reads it; with two it names them
    folder = tmp_path / "squad"
    folder.mkdir()
    good = {
        "data": [
            {
                "paragraphs": [
                    {
                        "context": "a b c",
                        "qas": [{"id": "q", "question": "b?", "answers": [{"text": "b", "answer_start": 2}]}],
                    }
                ]
            }
        ]
    }
    write(folder / "dev.json", json.dumps(good))
    assert [r.id for r in load_squad(folder)] == ["q"]
    write(folder / "other.json.gz", json.dumps(good))
    with raises_at(folder, "", "exactly one .*found: dev.json, other.json.gz"):
        load_squad(folder)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_squad(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        load_squad(path, window=0)


# ---------------------------------------------------------------------------- subject-verb agreement


def blimp(uid: str, pair: int, prefix: str, good: str, bad: str) -> dict[str, Any]:
    return {
        "one_prefix_prefix": prefix,
        "one_prefix_word_good": good,
        "one_prefix_word_bad": bad,
        "UID": uid,
        "one_prefix_method": True,
        "two_prefix_method": False,
        "pairID": str(pair),
    }


TWO_PREFIX = {
    "two_prefix_prefix_good": "The cats",
    "two_prefix_word": "sleep",
    "one_prefix_method": False,
    "two_prefix_method": True,
    "UID": "regular_plural_subject_verb_agreement_2",
    "pairID": "0",
}

BLIMP_ROWS = [
    blimp("distractor_agreement_relational_noun", 0, "A niece of most senators", "hasn't", "haven't"),
    TWO_PREFIX,
    blimp("distractor_agreement_relative_clause", 1, "Boys that aren't disturbing Natalie", "Work with", "works with"),
    blimp("regular_plural_subject_verb_agreement_1", 2, "Paula", "is", "are"),
]

TSV = (
    "# sentence, verb index, correct, wrong, attractors, subject\n"
    "sentence\tverb_index\tcorrect\twrong\tn_attractors\tsubject_index\n"
    "The cabinet-maker's keys to the door are here .\t6\tare\tis\t1\t2\n"
    "\n"
    "Dogs bark .\t1\tbark\tbarks\n"
    "The author that the guards like laughs .\t6\tlaughs\tlaugh\t1\t-1\n"
)


def test_sva_blimp_tsv_and_folder(tmp_path):
    path = write(tmp_path / "blimp.jsonl.gz", jsonl(BLIMP_ROWS))
    recs = load_sva(path)  # the two-prefix record has no verb-form pair: skipped
    assert [r.id for r in recs] == [
        "distractor_agreement_relational_noun:0",
        "distractor_agreement_relative_clause:1",
        "regular_plural_subject_verb_agreement_1:2",
    ]
    a, b, c = recs
    assert a.words == ("a", "niece", "of", "most", "senators") and a.label == 0
    assert a.relevant.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]  # after the determiner
    assert a.meta == {
        "correct": "hasn't",
        "wrong": "haven't",
        "continuation": (),
        "n_attractors": 1,
        "subject_index": 1,
        "source": "distractor_agreement_relational_noun",
    }
    assert b.words == ("boys", "that", "aren't", "disturbing", "natalie") and b.meta["subject_index"] == 0
    assert (b.meta["correct"], b.meta["wrong"], b.meta["continuation"]) == ("work", "works", ("with",))
    assert c.words == ("paula",) and c.relevant.tolist() == [1.0] and c.meta["n_attractors"] == 0

    tsv = write(tmp_path / "mine.tsv", TSV)
    t1, t2, t3 = load_sva(tsv)
    assert t1.id == "mine:3" and t1.words == ("the", "cabinet", "-", "maker's", "keys", "to", "the", "door")
    assert t1.meta["subject_index"] == 4 and t1.relevant[4] == 1.0 and t1.relevant.sum() == 1.0  # word 2 = token 4
    assert (t1.meta["correct"], t1.meta["wrong"], t1.meta["n_attractors"], t1.meta["source"]) == (
        "are",
        "is",
        1,
        "mine",
    )
    assert (
        t2.id == "mine:5"
        and t2.words == ("dogs",)
        and t2.meta["n_attractors"] == -1
        and t2.meta["subject_index"] is None
    )
    assert t3.meta["subject_index"] is None and t3.relevant.sum() == 0.0 and len(t3.words) == 6

    folder = tmp_path / "sva"
    folder.mkdir()
    write(folder / "b.tsv.gz", TSV)
    write(folder / "a.jsonl", jsonl(BLIMP_ROWS))
    write(folder / "notes.txt", "ignored")
    both = load_sva(folder)
    assert [r.id for r in both] == [r.id for r in recs] + ["b:3", "b:5", "b:6"]
    d = describe(both)
    assert d["n"] == 6 and d["labels"] == {0: 6} and d["n_attractors"] == {-1: 1, 0: 1, 1: 4}
    assert d["subject_known"] == 4 and d["n_with_rationale"] == 4 and d["sources"]["b"] == 3

    only_two = write(tmp_path / "two.jsonl", jsonl([TWO_PREFIX]))
    with raises_at(only_two, "", "no subject-verb agreement item \\(1 two-prefix records skipped"):
        load_sva(only_two)


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("Dogs bark .\t1\tbark\n", "line 1", "3 tab-separated columns; expected 4"),
        ("# c\nDogs bark .\t1\tbark\tbarks\t1\n", "line 2", "5 tab-separated columns"),
        ("Dogs bark .\tone\tbark\tbarks\n", "line 1", "verb_index 'one' is not an integer"),
        (
            "Dogs bark .\t1\tbark\tbarks\n\nDogs bark .\t3\tbark\tbarks\n",
            "line 3",
            "verb_index 3 is outside the sentence's 3 words",
        ),
        ("Bark !\t0\tbark\tbarks\n", "line 1", "the prefix before the verb has no words"),
        ("The dogs bark .\t2\tbark\tbarks\t0\t2\n", "line 1", "subject_index 2 must point at a word before the verb"),
        ("The dogs bark .\t2\tbark\tbarks\tx\t1\n", "line 1", "n_attractors 'x' is not an integer"),
        ("The dogs are not here .\t2\tare not\tis\n", "line 1", "verb forms 'are not' / 'is' must each be one token"),
        ("The dogs bark .\t2\tbark\tBark\n", "line 1", "the same word"),
    ],
)
def test_sva_tsv_malformed(tmp_path, text, where, problem):
    path = write(tmp_path / "bad.tsv.gz", text)
    with raises_at(path, where, problem):
        load_sva(path)


def test_sva_tsv_checks_the_verb_forms_against_the_sentence(tmp_path):
    text = "the dog barks\t2\tbarks\tbark\t0\t1\nthe dogs near the house barks\t5\truns\trun\n"
    path = write(tmp_path / "forms.tsv", text)
    with raises_at(
        path,
        "line 2",
        "the sentence's word at verb_index 5 is 'barks', neither the correct form 'runs' nor the wrong form 'run'",
    ):
        load_sva(path)
    swapped = write(tmp_path / "swapped.tsv", "the dog barks\t2\tbark\tbarks\t0\t1\nthe dogs bark .\t2\tbark\tbarks\n")
    with pytest.warns(UserWarning) as w:
        recs = load_sva(swapped)
    assert [str(x.message) for x in w] == [
        f"{swapped}: on 1 of 2 lines (first: line 1) the sentence holds the wrong form at verb_index, not the "
        "correct one: are the correct_form and wrong_form columns swapped?"
    ]
    # the forms are kept as given; a word with punctuation attached is compared by its first token
    assert [(r.meta["correct"], r.meta["wrong"]) for r in recs] == [("bark", "barks")] * 2
    assert len(load_sva(write(tmp_path / "p.tsv", "The dog Barks, loudly\t2\tbarks\tbark\n"))) == 1


def test_sva_blimp_malformed(tmp_path):
    row = blimp("x", 0, "The dogs", "bark", "barks")
    del row["one_prefix_word_bad"]
    path = write(tmp_path / "bad.jsonl", jsonl([BLIMP_ROWS[0], row]))
    with raises_at(path, "line 2", "missing field 'one_prefix_word_bad'"):
        load_sva(path)
    path = write(tmp_path / "bad.jsonl", jsonl([blimp("x", 0, "The dogs", "barks loudly", "bark")]))
    with raises_at(path, "line 1", "must each be one token"):
        load_sva(path)
    path = write(tmp_path / "bad.jsonl", jsonl([{"sentence_good": "Dogs bark."}]))
    with raises_at(path, "line 1", "missing field 'one_prefix_prefix'"):
        load_sva(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with raises_at(empty, "", r"folder holds no \*.jsonl"):
        load_sva(empty)


# ---------------------------------------------------------------------------- splits, finding data


def records(n: int) -> list[TextRecord]:
    return [TextRecord(f"r{i}", ("w",), np.zeros(1), i % 3) for i in range(n)]


def test_split_records_disjoint_complete_seeded():
    recs = records(50)
    train, ev = split_records(recs, 0.2, seed=1)
    assert len(train) == 40 and len(ev) == 10
    ids = [r.id for r in train] + [r.id for r in ev]
    assert sorted(ids) == sorted(r.id for r in recs) and len(set(ids)) == 50
    assert [r.id for r in train] == [r.id for r in recs if r in train]  # input order kept
    assert [r.id for r in split_records(recs, 0.2, seed=1)[1]] == [r.id for r in ev]
    assert [r.id for r in split_records(recs, 0.2, seed=2)[1]] != [r.id for r in ev]
    assert [len(p) for p in split_records(records(3), 0.01)] == [2, 1]
    with pytest.raises(ValueError, match=r"eval_fraction must lie in \(0, 1\), got 1.0"):
        split_records(recs, 1.0)
    with pytest.raises(ValueError, match="at least 2 records, got 1"):
        split_records(recs[:1])


def test_official_split_by_ids(tmp_path):
    recs = records(6)
    out = official_split(recs, {"train": ["r0", "r5", "r3", "zz"], "val": ["r1"], "test": []})
    assert {k: [r.id for r in v] for k, v in out.items()} == {"train": ["r0", "r3", "r5"], "val": ["r1"], "test": []}
    path = write(tmp_path / "div.json.gz", json.dumps({"train": ["r2"], "test": ["r4"]}))
    assert {k: [r.id for r in v] for k, v in official_split(recs, path).items()} == {"train": ["r2"], "test": ["r4"]}
    with pytest.raises(ValueError, match="id 'r1' is in both division 'train' and 'val'"):
        official_split(recs, {"train": ["r1"], "val": ["r1"]})
    with pytest.raises(
        ValueError, match="none of the 6 records' ids \\(e.g. 'r0'\\) is in any division \\(a: 1 ids\\)"
    ):
        official_split(recs, {"a": ["x"]})


def test_resolve_data_names_the_ways_to_give_data(tmp_path, monkeypatch):
    (tmp_path / "blimp").mkdir()
    f = write(tmp_path / "x.tsv", "")
    assert resolve_data(f, "blimp", "sva") == f
    monkeypatch.setenv("ATTNFLOW_DATA", str(tmp_path))
    assert resolve_data(None, "blimp", "sva") == tmp_path / "blimp"
    assert resolve_data("x.tsv", "blimp", "sva") == tmp_path / "x.tsv"  # relative: also in $ATTNFLOW_DATA
    with pytest.raises(FileNotFoundError) as e:
        resolve_data(None, "squad/dev-v1.1.json.gz", "squad")
    msg = str(e.value)
    for part in (
        "--set data=PATH",
        "ATTNFLOW_DATA",
        "--data-dir",
        str(tmp_path / "squad/dev-v1.1.json.gz"),
        DATA_FORMATS["squad"],
    ):
        assert part in msg
    monkeypatch.delenv("ATTNFLOW_DATA")
    with pytest.raises(
        FileNotFoundError, match=r"\$ATTNFLOW_DATA is not set.*--set data=PATH.*HateXplain: either JSONL"
    ):
        resolve_data(None, "hatexplain/val.jsonl.gz", "hatexplain")
    with pytest.raises(FileNotFoundError, match=r"looked at '.*nowhere\.jsonl'.*--set data=PATH"):
        resolve_data(tmp_path / "nowhere.jsonl", "blimp", "sva")
    with pytest.raises(ValueError, match="dataset must be one of 'hatexplain', 'squad', 'sva'"):
        resolve_data(None, "blimp", "blimp")


# ---------------------------------------------------------------------------- the real files


@pytest.fixture(scope="module")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"../shared/data not present: the real-data checks need it at {SHARED}")
    return SHARED


def test_real_hatexplain(shared):
    path = shared / "hatexplain" / "val.jsonl.gz"
    recs = load_hatexplain(path)
    # the official validation split: every post has a majority label, three annotators each
    assert len(recs) == 1922 and len(load_hatexplain(path, drop_no_majority=False)) == 1922
    d = describe(recs)
    assert d["labels"] == {0: 593, 1: 781, 2: 548}
    # a rationale for every hate-speech and offensive post, none for a normal one
    assert d["n_with_rationale"] == 1141 == sum(r.meta["has_rationale"] for r in recs) == 593 + 548
    assert d["rationale_coverage"] == pytest.approx(1141 / 1922)
    assert {r.meta["n_annotators"] for r in recs} == {3}
    assert sum(r.label != 1 for r in recs if r.meta["has_rationale"]) == 1141
    assert set(np.round(np.concatenate([r.relevant for r in recs]) * 3, 9)) == {0.0, 1.0, 2.0, 3.0}
    assert d["mean_length"] == pytest.approx(23.461, abs=1e-3)
    train, ev = split_records(recs, 0.2, seed=0)
    assert (len(train), len(ev)) == (1538, 384)


def test_real_squad(shared):
    path = shared / "squad" / "dev-v1.1.json.gz"
    recs = load_squad(path)  # window = 48 words: every answer fits (the longest has 37)
    assert len(recs) == 10570 and len({r.id for r in recs}) == 10570
    assert all(len(r.words) == 48 or (r.meta["offset"] == 0 and len(r.words) == r.meta["n_context"]) for r in recs)
    # the answer words are the tokenized answer, but for 83 answers that start or end inside a word
    # ("gold" in "golden", "8" in "18")
    off = [
        r
        for r in recs
        if " ".join(r.words[r.meta["start"] : r.meta["end"] + 1])
        != " ".join(t for t, _, _ in tokenize(r.meta["answers"][0]))
    ]
    assert len(off) == 83
    assert all(r.relevant.sum() == r.meta["end"] - r.meta["start"] + 1 for r in recs)
    assert [r.meta["offset"] for r in load_squad(path, max_questions=20)] == [r.meta["offset"] for r in recs[:20]]
    # the distinct gold answers inside the window, scored by evaluate_text (the first is always there)
    assert all(r.meta["spans"][0] == (r.meta["start"], r.meta["end"]) for r in recs)
    assert Counter(len(r.meta["spans"]) for r in recs) == {1: 5396, 2: 3958, 3: 1105, 4: 88, 5: 23}
    # window = 16 would skip the 148 answers longer than 16 words (keep 10,422)
    assert sum(r.meta["end"] - r.meta["start"] + 1 > 16 for r in recs) == 148


def test_real_blimp(shared):
    recs = load_sva(shared / "blimp")
    d = describe(recs)
    # 6 paradigms x 1,000 pairs; the two *_2 paradigms are two-prefix (2,000 skipped)
    assert d["n"] == 4000 and d["n_attractors"] == {0: 2000, 1: 2000}
    assert d["sources"] == {
        "distractor_agreement_relational_noun": 1000,
        "distractor_agreement_relative_clause": 1000,
        "irregular_plural_subject_verb_agreement_1": 1000,
        "regular_plural_subject_verb_agreement_1": 1000,
    }
    assert sum(r.meta["subject_index"] == 1 for r in recs) == 3278 and d["subject_known"] == 4000
    assert sum(bool(r.meta["continuation"]) for r in recs) == 108  # "works with" / "work with" and the like
    assert all(len(tokenize(r.meta["correct"])) == len(tokenize(r.meta["wrong"])) == 1 for r in recs)
    two = shared / "blimp" / "regular_plural_subject_verb_agreement_2.jsonl.gz"
    with raises_at(two, "", "1000 two-prefix records skipped"):
        load_sva(two)


def test_real_resolve_data(shared, monkeypatch):
    monkeypatch.setenv("ATTNFLOW_DATA", str(shared))
    assert resolve_data(None, "hatexplain/val.jsonl.gz", "hatexplain") == shared / "hatexplain" / "val.jsonl.gz"
    assert resolve_data(None, "blimp", "sva").is_dir()


def test_real_hatexplain_floor_is_taken_over_the_examples_that_relevant_mass_averages(shared):
    import jax

    from attnflow import qkov

    recs = load_hatexplain(shared / "hatexplain" / "val.jsonl.gz")
    train, held_out = split_records(recs, 0.2, 0)
    vocab = Vocabulary.build([r.words for r in train], max_size=8000, specials=tuple(qkov.SPECIALS.values()))
    ev = qkov.encode_text(held_out, vocab, "classify", length=48)
    keys = jax.random.split(jax.random.PRNGKey(0), 1)
    models = jax.vmap(lambda k: qkov.make_text_model("classify", len(vocab), 48, key=k, d_model=16, heads=2, mlp=None))(
        keys
    )
    out = qkov.evaluate_text(models, ev)
    # an untrained model attends uniformly (init 0.02): its relevant mass is the floor, both over the
    # 222 of 384 posts with a rationale; the mean over all posts (0.1274) is not comparable
    assert int(np.asarray(ev.relevant > 0).any(axis=-1).sum()) == 222 and len(ev) == 384
    assert float(out["floor"][0]) == pytest.approx(0.220438, abs=1e-6)
    assert float(out["relevant_mass"][0]) == pytest.approx(float(out["floor"][0]), abs=1e-6)
    assert float(np.mean(qkov.uniform_relevant_mass(ev))) == pytest.approx(0.127441, abs=1e-6)
    # evaluate_text's separability is the public function's on the same attention
    sep = qkov.separability(out["attention"][0], ev.relevant, ev.keys)
    assert float(out["separability"][0]) == pytest.approx(float(sep), rel=1e-6)
