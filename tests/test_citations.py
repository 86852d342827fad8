"""`attnflow cite` and the References sections: valid BibTeX, the right papers per name."""

import re
import subprocess
import sys

import pytest

from attnflow.citations import ENTRIES, bibtex, keys_for, references
from attnflow.report import Report


def _parse_bibtex(text: str) -> dict[str, dict[str, str]]:
    """A strict little BibTeX reader: ``@type{key, field = {value}, ...}`` entries with balanced
    braces; raises AssertionError on anything else."""
    entries, i = {}, 0
    while True:
        m = re.compile(r"\s*@(\w+)\{([\w:-]+),").match(text, i)
        if m is None:
            assert text[i:].strip() == "", f"unparsed text: {text[i : i + 80]!r}"
            return entries
        key, i, fields = m.group(2), m.end(), {}
        while True:
            f = re.compile(r"\s*(\w+)\s*=\s*\{").match(text, i)
            if f is None:
                break
            depth, j = 1, f.end()
            while depth:
                assert j < len(text), f"unbalanced braces in {key}"
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            fields[f.group(1).lower()] = text[f.end() : j - 1]
            i = j
            c = re.compile(r"\s*,?").match(text, i)
            i = c.end()
        close = re.compile(r"\s*\}").match(text, i)
        assert close is not None, f"entry {key} not closed"
        i = close.end()
        assert key not in entries, f"duplicate key {key}"
        entries[key] = fields


def test_every_entry_is_valid_bibtex_with_title_author_year():
    parsed = _parse_bibtex(bibtex(ENTRIES))
    assert set(parsed) == set(ENTRIES)
    for key, fields in parsed.items():
        assert {"title", "author", "year"} <= set(fields), key
        assert re.fullmatch(r"\d{4}", fields["year"]), key


def test_cite_command_prints_the_qkov_paper_for_qkov_reduced():
    out = subprocess.run(
        [sys.executable, "-m", "attnflow.cli", "cite", "qkov-reduced"], capture_output=True, text=True, check=True
    ).stdout
    parsed = _parse_bibtex(out)
    assert "vashisht2026faster" in parsed
    title = parsed["vashisht2026faster"]["title"]
    assert title == "Faster Query-Key Learning Sharpens Attention in Self-Attention Models"
    assert {"jax2018github", "kidger2021on", "kidger2021equinox", "deepmind2020jax"} <= set(parsed)
    assert "chen2026focus" not in parsed and "sagitova2026specialization" not in parsed


@pytest.mark.parametrize(
    ("name", "paper"),
    [
        ("focus", "chen2026focus"),
        ("heads-staged", "sagitova2026specialization"),
        ("deep-linear", "saxe2014exact"),
        ("qkov", "vashisht2026faster"),
    ],
)
def test_keys_for_packages_and_experiments(name, paper):
    keys = keys_for(name)
    assert keys[0] == paper and len(keys) == 5


def test_real_data_experiments_cite_the_paper_the_data_and_the_metrics():
    assert keys_for("qkov-sva")[:4] == [
        "vashisht2026faster",
        "warstadt2020blimp",
        "linzen2016assessing",
        "deyoung2020eraser",
    ]
    assert keys_for("qkov-hatexplain")[1] == "mathew2021hatexplain"
    assert keys_for("qkov-squad")[1] == "rajpurkar2016squad"
    # an experiment over all three theories cites the three papers, once each
    assert keys_for("finite-size")[:3] == ["sagitova2026specialization", "vashisht2026faster", "chen2026focus"]


def test_cite_without_name_lists_all_papers_and_bad_name_is_named():
    assert set(keys_for(None)) == set(ENTRIES)
    with pytest.raises(ValueError, match="'qkov-nope'"):
        keys_for("qkov-nope")
    with pytest.raises(ValueError, match="unknown citation key"):
        bibtex(["nobody2020"])
    proc = subprocess.run([sys.executable, "-m", "attnflow.cli", "cite", "qkov-nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "'qkov-nope'" in proc.stderr


def test_cite_without_name_prints_what_reproduce_runs():
    """``attnflow cite``: the papers of the headline experiments (what ``reproduce`` runs), then
    the software; not the data sets of experiments reproduce does not run."""
    from attnflow.citations import SOFTWARE_KEYS, reproduce_keys
    from attnflow.registry import headline

    keys = reproduce_keys()
    want = {k for e in headline() for k in keys_for(e.name)}
    assert set(keys) == want and keys[-len(SOFTWARE_KEYS) :] == list(SOFTWARE_KEYS)
    assert "saxe2014exact" in keys and "rajpurkar2016squad" not in keys
    proc = subprocess.run([sys.executable, "-m", "attnflow.cli", "cite"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.count("\n@") + proc.stdout.startswith("@") == len(keys)


def test_summary_ends_with_references():
    rep = Report("x", {}, references=references(keys_for("heads")))
    text = rep.markdown().rstrip()
    tail = text[text.rindex("## References") :].splitlines()
    assert tail[0] == "## References" and tail[2].startswith("- M. Sagitova")
    assert text.splitlines()[-1].startswith("- DeepMind")


def test_focus_corpus_cites_its_default_corpora():
    """``focus-corpus`` reads Tiny Shakespeare and WikiText-2 by default: after the focus paper, it
    cites char-rnn (Karpathy 2015) and the Pointer Sentinel paper that released WikiText-2."""
    from attnflow.focus.experiments import CorpusConfig

    assert [c.split(":")[0] for c in CorpusConfig().corpora] == ["tinyshakespeare.txt", "wikitext2_valid.txt"]
    assert keys_for("focus-corpus")[:3] == ["chen2026focus", "karpathy2015charrnn", "merity2017pointer"]
    parsed = _parse_bibtex(bibtex(["karpathy2015charrnn", "merity2017pointer"]))
    assert parsed["merity2017pointer"]["title"] == "Pointer Sentinel Mixture Models"
    assert parsed["merity2017pointer"]["eprint"] == "1609.07843" and parsed["merity2017pointer"]["year"] == "2017"
    assert parsed["karpathy2015charrnn"]["url"] == "https://github.com/karpathy/char-rnn"
    assert "karpathy2015charrnn" not in keys_for("focus-cycle")  # the synthetic chains cite no corpus
