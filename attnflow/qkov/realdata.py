"""Real text data for the QK/OV real-data experiments: loaders, vocabulary, splits.

Three labelled corpora, each record a `TextRecord` of lowercased words with a weight per word
saying how relevant it is to the label (the quantity attention is scored against):

- `load_hatexplain`: HateXplain posts (Mathew et al., AAAI 2021), the majority label of the
  annotators and the mean of their rationale masks;
- `load_squad`: SQuAD v1.1 / v2.0 questions (Rajpurkar et al. 2016), the context cropped to a
  window of words around the answer, the answer words relevant;
- `load_sva`: subject-verb agreement items (BLiMP, Warstadt et al. 2020, or a TSV of one's
  own), the prefix before the verb, the subject relevant.

Every loader takes a file (plain or ``.gz``, told apart by the suffix) or, where it makes sense,
a folder, and stops at the first malformed record with a ``ValueError`` that names the file,
the 1-based line (JSONL, TSV) or the record id (JSON) and the problem; a file that yields no
record raises too. `resolve_data` finds a data set given on the command line
(``--set data=PATH``) or in the data folder (``$ATTNFLOW_DATA``, the ``--data-dir`` option);
nothing is read relative to the package's own files and nothing is downloaded.

This module needs only NumPy and the standard library.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from .._io import DATA_ENV

__all__ = [
    "PAD",
    "UNK",
    "DATA_FORMATS",
    "HATEXPLAIN_LABELS",
    "tokenize",
    "Vocabulary",
    "TextRecord",
    "load_hatexplain",
    "load_squad",
    "load_sva",
    "split_records",
    "official_split",
    "describe",
    "resolve_data",
]

PAD = "<pad>"
"""The padding word: id 0 in every `Vocabulary`."""
UNK = "<unk>"
"""The unknown word: id 1 in every `Vocabulary`; `Vocabulary.id` of a word it does not hold."""

HATEXPLAIN_LABELS = ("hatespeech", "normal", "offensive")
"""HateXplain's classes in the order of their ids (0, 1, 2), as in the Hugging Face layout."""

DATA_FORMATS: Mapping[str, str] = MappingProxyType(
    {
        "hatexplain": (
            "HateXplain: either JSONL in the Hugging Face layout, one post a line with 'id', 'post_tokens' "
            "(list of str), 'annotators' ({'label': [one int per annotator, 0 hatespeech / 1 normal / "
            "2 offensive], ...}) and 'rationales' (one 0/1 list per annotator who gave one, as long as "
            "'post_tokens'); or the official dataset.json, a JSON object keyed by post id whose values have "
            "'post_id', 'post_tokens', 'annotators' (a list of {'label': 'hatespeech' | 'normal' | "
            "'offensive', ...}) and 'rationales'. Plain or .gz; a folder holding dataset.json(.gz) or "
            "*.jsonl(.gz) files."
        ),
        "squad": (
            "SQuAD v1.1 or v2.0 JSON (plain or .gz): {'data': [{'paragraphs': [{'context': str, 'qas': "
            "[{'id': str, 'question': str, 'answers': [{'text': str, 'answer_start': int}, ...]}]}]}]}, "
            "answer_start a character offset into the context; v2.0 questions with 'is_impossible': true "
            "are skipped. A folder holding exactly one such file works too."
        ),
        "sva": (
            "subject-verb agreement items: BLiMP JSONL (one minimal pair a line with 'one_prefix_method': "
            "true and 'one_prefix_prefix', 'one_prefix_word_good', 'one_prefix_word_bad'; two-prefix "
            "records are skipped), or TSV lines 'sentence<TAB>verb_index<TAB>correct_form<TAB>wrong_form' "
            "with optional '<TAB>n_attractors<TAB>subject_index' (0-based indices into the whitespace-split "
            "sentence; -1 = unknown; the sentence's word at verb_index is the correct form, or the wrong one "
            "with a warning; '#' lines and blank lines skipped); plain or .gz; or a folder of "
            "*.jsonl, *.jsonl.gz, *.tsv, *.tsv.gz files."
        ),
    }
)
"""The accepted format of each data set, one paragraph each (quoted by `resolve_data`'s errors)."""

_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")

_DETERMINERS = frozenset(
    ("the", "a", "an", "this", "that", "these", "those", "some", "most", "many", "all", "every")
    + ("each", "no", "few", "several", "both", "his", "her", "their", "my", "our", "your", "its")
)
"""First words after which a BLiMP prefix's subject noun is taken to be the second word."""


def tokenize(text: str) -> list[tuple[str, int, int]]:
    """Word-level tokens of ``text``, lowercased, with their character spans.

    Parameters
    ----------
    text : str
        Any text.

    Returns
    -------
    list of (str, int, int)
        ``(token, start, end)`` with ``text[start:end].lower() == token``. A token is a run of
        word characters with inner apostrophes (``"hasn't"``, ``"levi's"`` stay one token) or a
        single other non-space character (punctuation is its own token): the regular expression
        ``\\w+(?:'\\w+)*|[^\\w\\s]``.
    """
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects a str, got {type(text).__name__}")
    return [(m.group().lower(), *m.span()) for m in _TOKEN.finditer(text)]


def _words(text: str) -> list[str]:
    return [w.lower() for w in _TOKEN.findall(text)]


# --------------------------------------------------------------------------------------------
# vocabulary and records


@dataclass(frozen=True)
class Vocabulary:
    """Words and their integer ids.

    Attributes
    ----------
    words : tuple of str
        ``words[i]`` is the word of id ``i``; ``words[0] == PAD``, ``words[1] == UNK``, no repeats.
    """

    words: tuple[str, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        words = tuple(self.words)
        if len(words) < 2 or words[0] != PAD or words[1] != UNK:
            raise ValueError(f"a Vocabulary starts with {PAD!r}, {UNK!r}; got {list(words[:2])!r}")
        bad = [w for w in words if not isinstance(w, str)]
        if bad:
            raise ValueError(f"Vocabulary words must be str, got {bad[0]!r}")
        index = {w: i for i, w in enumerate(words)}
        if len(index) != len(words):
            dup = next(w for w, c in Counter(words).items() if c > 1)
            raise ValueError(f"Vocabulary words must be distinct; {dup!r} repeats")
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "_index", index)

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        max_size: int = 20000,
        min_count: int = 1,
        specials: Sequence[str] = (),
    ) -> Vocabulary:
        """The vocabulary of the words in ``token_lists``.

        Parameters
        ----------
        token_lists : iterable of sequences of str
            The texts, e.g. ``[r.words for r in records]``.
        max_size : int
            Most words in all, ``PAD``, ``UNK`` and ``specials`` included (at least
            ``2 + len(specials)``).
        min_count : int
            Words seen fewer times are left out (they encode as ``UNK``).
        specials : sequence of str
            Words given ids ``2, 3, ...`` whether or not they occur (e.g. a separator).

        Returns
        -------
        Vocabulary
            ``PAD``, ``UNK``, ``specials``, then the other words by decreasing count, ties in
            order of first occurrence, cut at ``max_size``.
        """
        max_size = _int("max_size", max_size, minimum=2)
        min_count = _int("min_count", min_count, minimum=1)
        if isinstance(specials, str):
            raise TypeError(f"specials must be a sequence of str, not the str {specials!r}")
        specials = tuple(specials)
        head = (PAD, UNK, *specials)
        if any(not isinstance(s, str) for s in specials) or len(set(head)) != len(head):
            raise ValueError(f"specials must be distinct str other than {PAD!r} and {UNK!r}, got {specials!r}")
        if max_size < len(head):
            raise ValueError(f"max_size = {max_size} leaves no room for {PAD!r}, {UNK!r} and {len(specials)} specials")
        counts: Counter[str] = Counter()
        for i, tokens in enumerate(token_lists):
            if isinstance(tokens, str):
                raise TypeError(f"token_lists[{i}] is a str ({tokens[:40]!r}); give a list of words")
            counts.update(tokens)
        taken = set(head)
        # Counter keeps first-occurrence order and sorted() is stable: ties stay in that order
        ranked = [w for w, c in sorted(counts.items(), key=lambda wc: -wc[1]) if c >= min_count and w not in taken]
        bad = [w for w in ranked if not isinstance(w, str)]
        if bad:
            raise TypeError(f"words must be str, got {bad[0]!r}")
        return cls(head + tuple(ranked[: max_size - len(head)]))

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def id(self, word: str) -> int:
        """The id of ``word``; the id of ``UNK`` (1) when the vocabulary does not hold it."""
        return self._index.get(word, 1)

    def encode(self, words: Sequence[str]) -> np.ndarray:
        """The ids of ``words`` (``UNK`` for unknown ones), an int32 array of ``len(words)``."""
        if isinstance(words, str):
            raise TypeError(f"encode expects a sequence of words, not the str {words[:40]!r}")
        get = self._index.get
        return np.fromiter((get(w, 1) for w in words), dtype=np.int32, count=len(words))

    def decode(self, ids: Iterable[int] | np.ndarray) -> list[str]:
        """The words of the ids ``ids`` (a 1-D sequence); ``ValueError`` for an id out of range."""
        arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        if arr.size == 0:
            return []
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"decode expects a 1-D sequence of integer ids, got shape {arr.shape} of {arr.dtype}")
        out = (arr < 0) | (arr >= len(self.words))
        if out.any():
            i = int(np.argmax(out))
            raise ValueError(f"id {int(arr[i])} at position {i} is outside the vocabulary of {len(self.words)} words")
        return [self.words[i] for i in arr.tolist()]


@dataclass(frozen=True, eq=False)
class TextRecord:
    """One labelled text.

    Attributes
    ----------
    id : str
        Unique within a loaded file: the post id (HateXplain), question id (SQuAD),
        ``"<paradigm>:<pairID>"`` (BLiMP) or ``"<file stem>:<line>"`` (SVA TSV).
    words : tuple of str
        The input words, lowercased: the post's tokens (HateXplain), the cropped context
        (SQuAD), the prefix before the verb (SVA).
    relevant : numpy.ndarray
        float64, one weight in ``[0, 1]`` per word: the mean rationale mask of the annotators
        (HateXplain), 1 on the answer words (SQuAD), 1 on the subject when known (SVA).
    label : int
        HateXplain: the majority class (0 hatespeech, 1 normal, 2 offensive); SQuAD: 0; SVA: 0
        (the correct verb form is candidate 0, the wrong one candidate 1).
    query_words : tuple of str
        SQuAD: the question's tokens; otherwise empty.
    meta : mapping
        HateXplain: ``n_annotators``, ``has_rationale`` (bool). SQuAD: ``start``, ``end`` (inclusive
        indices of the first answer in ``words``), ``answers`` (the answer texts), ``spans`` (the
        ``(start, end)`` of every distinct gold answer inside ``words``), ``question_id``,
        ``offset`` (index of ``words[0]`` in the whole context), ``n_context`` (words in the whole
        context). SVA: ``correct``, ``wrong`` (single-token verb forms), ``continuation`` (words
        after the verb shared by both forms, e.g. ``("with",)`` for "works with" / "work with";
        usually empty), ``n_attractors`` (-1 unknown), ``subject_index`` (int or None),
        ``source`` (BLiMP paradigm or file stem).

    Records compare by identity (``eq=False``): ``relevant`` is an array. ``relevant`` is
    read-only.
    """

    id: str
    words: tuple[str, ...]
    relevant: np.ndarray
    label: int
    query_words: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        words = tuple(self.words)
        if not all(isinstance(w, str) for w in words):
            raise ValueError(f"record {self.id!r}: words must be str")
        rel = np.array(self.relevant, dtype=np.float64)
        if rel.shape != (len(words),):
            raise ValueError(f"record {self.id!r}: relevant has shape {rel.shape}, expected ({len(words)},)")
        if rel.size and not (rel.min() >= 0.0 and rel.max() <= 1.0):  # NaN fails too
            raise ValueError(f"record {self.id!r}: relevant weights must lie in [0, 1], got {rel.tolist()}")
        rel.setflags(write=False)
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "relevant", rel)
        object.__setattr__(self, "query_words", tuple(self.query_words))
        object.__setattr__(self, "label", int(self.label))
        object.__setattr__(self, "meta", dict(self.meta))


# --------------------------------------------------------------------------------------------
# reading files


def _int(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _existing(path: str | os.PathLike, what: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: path must be a str or path, got {path!r}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what}: no file or folder {str(p)!r}")
    return p


def _glob(folder: Path, patterns: Sequence[str]) -> list[Path]:
    """The files of ``folder`` matching any of ``patterns``, sorted, each once."""
    return sorted({f for pattern in patterns for f in folder.glob(pattern)})


def _folder_files(folder: Path, patterns: Sequence[str], dataset: str, what: str) -> list[Path]:
    """`_glob`, or a ``ValueError`` naming the folder, ``what`` it lacks and the accepted format."""
    files = _glob(folder, patterns)
    if not files:
        raise ValueError(f"{folder}: folder holds no {what} file. {DATA_FORMATS[dataset]}")
    return files


def _read_text(path: Path) -> str:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path}: cannot read it as {'gzip-compressed ' if path.name.endswith('.gz') else ''}UTF-8 text: {e}"
        ) from None


def _stem(path: Path) -> str:
    name = path.name
    if name.endswith(".gz"):
        name = name[:-3]
    return name.rsplit(".", 1)[0] if "." in name else name


def _lines(text: str) -> Iterator[tuple[int, str]]:
    # split on "\n" only: JSON strings may hold U+2028 and the like, which splitlines() splits on
    for i, line in enumerate(text.split("\n"), 1):
        yield i, line.rstrip("\r")


def _jsonl(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The (1-based line, object) of each non-blank line of a JSONL text."""
    for i, line in _lines(text):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {i}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: line {i}: expected a JSON object, got {type(obj).__name__}")
        yield i, obj


def _load_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None


def _need(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise ValueError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ValueError(f"{where}: field {key!r} must be {names}, got {_show(value)}")
    return value


def _show(value: Any, limit: int = 80) -> str:
    s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _no_duplicates(records: list[TextRecord], where: str) -> None:
    seen: set[str] = set()
    for r in records:
        if r.id in seen:
            raise ValueError(f"{where}: record id {r.id!r} occurs more than once")
        seen.add(r.id)


# --------------------------------------------------------------------------------------------
# HateXplain


def load_hatexplain(path: str | os.PathLike, *, drop_no_majority: bool = True) -> list[TextRecord]:
    """HateXplain posts with their majority label and mean rationale.

    Parameters
    ----------
    path : str or path
        A JSONL file in the Hugging Face layout or the official ``dataset.json`` (told apart by
        content; plain or ``.gz``), or a folder holding ``dataset.json(.gz)`` (then used alone)
        or else ``*.jsonl(.gz)`` files (read in sorted order). See ``DATA_FORMATS["hatexplain"]``.
    drop_no_majority : bool
        A post's label is the class chosen by more than half of its annotators; posts without
        such a majority are dropped (as in the paper). With ``False`` they are kept with the
        plurality class, ties going to the lowest class id.

    Returns
    -------
    list of TextRecord
        In file order. ``words``: ``post_tokens`` lowercased; ``relevant``: the sum of the
        annotators' 0/1 rationale masks divided by the number of annotators (an annotator who
        gave no mask counts as all zeros, as in the paper); ``meta``: ``n_annotators``,
        ``has_rationale`` (at least one mask given).

    Raises
    ------
    ValueError
        Naming the file and line (JSONL) or post id (``dataset.json``): bad JSON, a missing or
        mistyped field, a label out of range, a rationale whose length differs from the number
        of tokens or with values other than 0 and 1, more masks than annotators, a repeated
        post id; or no post kept.
    """
    if not isinstance(drop_no_majority, bool):
        raise ValueError(f"drop_no_majority must be True or False, got {drop_no_majority!r}")
    root = _existing(path, "load_hatexplain")
    if root.is_dir():  # the official dataset.json when there is one, else the JSONL files
        files = _glob(root, ("dataset.json", "dataset.json.gz"))[:1] or _folder_files(
            root, ("*.jsonl", "*.jsonl.gz"), "hatexplain", "dataset.json(.gz) or *.jsonl(.gz)"
        )
    else:
        files = [root]
    records: list[TextRecord] = []
    n_read = 0
    for f in files:
        for where, post in _hatexplain_posts(f):
            n_read += 1
            rec = _hatexplain_record(post, where, drop_no_majority)
            if rec is not None:
                records.append(rec)
    _no_duplicates(records, str(root))
    if not records:
        raise ValueError(
            f"{root}: no HateXplain post kept ({n_read} read, "
            f"{'all without a majority label' if n_read else 'none found'})"
        )
    return records


def _hatexplain_posts(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, post dict in a common layout) for each post of one file."""
    text = _read_text(path)
    stripped = text.lstrip()
    whole: Any = None
    if stripped.startswith("{"):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # JSONL of several lines, or bad JSON: the line-by-line reader says which
    if isinstance(whole, dict) and not {"id", "post_id", "post_tokens", "annotators"} & whole.keys():
        # the official dataset.json: {post_id: {post_id, post_tokens, annotators: [...], rationales}}
        for key, post in whole.items():
            where = f"{path}: record {key!r}"
            if not isinstance(post, dict):
                raise ValueError(f"{where}: expected a JSON object, got {_show(post)}. {DATA_FORMATS['hatexplain']}")
            pid = post.get("post_id", key)
            if pid != key:
                raise ValueError(f"{where}: 'post_id' {_show(pid)} differs from its key")
            annotators = _need(post, "annotators", list, where)
            labels = []
            for j, a in enumerate(annotators):
                if not isinstance(a, dict) or "label" not in a:
                    raise ValueError(f"{where}: annotators[{j}] must be an object with a 'label', got {_show(a)}")
                labels.append(a["label"])
            yield (
                where,
                {
                    "id": key,
                    "tokens": post.get("post_tokens"),
                    "labels": labels,
                    "rationales": post.get("rationales", []),
                },
            )
        return
    for i, obj in _jsonl(path, text):
        where = f"{path}: line {i}"
        pid = obj.get("id", obj.get("post_id"))
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"{where}: missing field 'id' (a non-empty str), got {_show(pid)}")
        where = f"{path}: line {i} (post {pid!r})"
        annotators = _need(obj, "annotators", (dict, list), where)
        if isinstance(annotators, dict):
            labels = _need(annotators, "label", list, where + ": annotators")
        else:  # one object per annotator, as in dataset.json
            labels = [a.get("label") if isinstance(a, dict) else a for a in annotators]
        yield (
            where,
            {"id": pid, "tokens": obj.get("post_tokens"), "labels": labels, "rationales": obj.get("rationales", [])},
        )


def _hatexplain_record(post: dict[str, Any], where: str, drop_no_majority: bool) -> TextRecord | None:
    tokens = post["tokens"]
    if tokens is None:
        raise ValueError(f"{where}: missing field 'post_tokens'")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{where}: 'post_tokens' must be a non-empty list of str, got {_show(tokens)}")
    labels = []
    for j, lab in enumerate(post["labels"]):
        if isinstance(lab, str) and lab in HATEXPLAIN_LABELS:
            lab = HATEXPLAIN_LABELS.index(lab)
        if isinstance(lab, bool) or not isinstance(lab, int) or not 0 <= lab < len(HATEXPLAIN_LABELS):
            raise ValueError(
                f"{where}: label {_show(lab)} of annotator {j} is not one of 0, 1, 2 "
                f"or {', '.join(repr(s) for s in HATEXPLAIN_LABELS)}"
            )
        labels.append(lab)
    if not labels:
        raise ValueError(f"{where}: no annotator labels")
    rationales = post["rationales"]
    if rationales is None:
        rationales = []
    if not isinstance(rationales, list):
        raise ValueError(f"{where}: 'rationales' must be a list of 0/1 lists, got {_show(rationales)}")
    if len(rationales) > len(labels):
        raise ValueError(f"{where}: {len(rationales)} rationales for {len(labels)} annotators")
    total = np.zeros(len(tokens))
    for j, mask in enumerate(rationales):
        if not isinstance(mask, list):
            raise ValueError(f"{where}: rationales[{j}] must be a list of 0/1, got {_show(mask)}")
        if len(mask) != len(tokens):
            raise ValueError(f"{where}: rationales[{j}] has {len(mask)} entries for {len(tokens)} post tokens")
        if any(isinstance(v, bool) or v not in (0, 1) for v in mask):
            bad = next(v for v in mask if isinstance(v, bool) or v not in (0, 1))
            raise ValueError(f"{where}: rationales[{j}] holds {_show(bad)}; masks are 0/1")
        total += np.asarray(mask, dtype=np.float64)
    counts = np.bincount(labels, minlength=len(HATEXPLAIN_LABELS))
    label = int(np.argmax(counts))  # the lowest id among the most chosen
    if 2 * counts[label] <= len(labels) and drop_no_majority:
        return None
    return TextRecord(
        id=post["id"],
        words=tuple(t.lower() for t in tokens),
        relevant=total / len(labels),
        label=label,
        meta={"n_annotators": len(labels), "has_rationale": bool(rationales)},
    )


# --------------------------------------------------------------------------------------------
# SQuAD


def load_squad(
    path: str | os.PathLike, *, window: int = 48, seed: int = 0, max_questions: int | None = None
) -> list[TextRecord]:
    """SQuAD questions, each with a window of context words around its (first) answer.

    Parameters
    ----------
    path : str or path
        A SQuAD v1.1 or v2.0 JSON file, plain or ``.gz`` (see ``DATA_FORMATS["squad"]``).
    window : int
        Words of context kept: a window of ``window`` consecutive context words containing the
        whole answer, at an offset drawn uniformly from the windows that do (the whole context
        when it is shorter). Questions whose answer is longer than ``window`` words are
        skipped (none in v1.1 dev at the default 48: the longest answer there has 37 words).
    seed : int
        Seed of ``numpy.random.default_rng`` drawing the offsets, one draw per kept question
        in file order (so the first ``k`` records do not depend on ``max_questions``).
    max_questions : int or None
        Stop after this many kept questions (file order); ``None``: all.

    Returns
    -------
    list of TextRecord
        ``id`` and ``meta["question_id"]``: the question id; ``words``: the window of
        ``tokenize(context)``; ``query_words``: ``tokenize(question)``; ``relevant``: 1 on the
        answer words (the context tokens overlapping the first answer's characters
        ``[answer_start, answer_start + len(text))``), 0 elsewhere; ``label``: 0;
        ``meta``: ``start``, ``end`` (inclusive), ``answers`` (all answer texts), ``spans``
        (``(start, end)`` of every distinct gold answer lying wholly inside the window, the first
        answer first; what `attnflow.qkov.evaluate_text` scores against), ``offset``,
        ``n_context``. Questions with ``is_impossible: true`` (v2.0) are skipped.

    Raises
    ------
    ValueError
        Naming the file and the question id (or the article/paragraph index): bad JSON, a
        missing or mistyped field, an answer offset outside the context or whose text differs
        from the context there, a repeated question id; or no question kept.
    """
    window = _int("window", window, minimum=1)
    seed = _int("seed", seed, minimum=0)
    if max_questions is not None:
        max_questions = _int("max_questions", max_questions, minimum=1)
    p = _existing(path, "load_squad")
    if p.is_dir():  # a folder holding exactly one SQuAD file
        found = _glob(p, ("*.json", "*.json.gz"))
        if len(found) != 1:
            listed = ", ".join(f.name for f in found) or "none"
            raise ValueError(
                f"{p}: load_squad reads one JSON file; a folder must hold exactly one *.json or *.json.gz "
                f"(found: {listed}). {DATA_FORMATS['squad']}"
            )
        p = found[0]
    doc = _load_json(p, _read_text(p))
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError(f"{p}: expected a JSON object with a 'data' list. {DATA_FORMATS['squad']}")
    rng = np.random.default_rng(seed)
    records: list[TextRecord] = []
    n_questions = n_long = n_impossible = 0
    for a, article in enumerate(doc["data"]):
        where_a = f"{p}: data[{a}]"
        if not isinstance(article, dict):
            raise ValueError(f"{where_a}: expected an object, got {_show(article)}")
        for q_, para in enumerate(_need(article, "paragraphs", list, where_a)):
            where_p = f"{where_a}.paragraphs[{q_}]"
            if not isinstance(para, dict):
                raise ValueError(f"{where_p}: expected an object, got {_show(para)}")
            context = _need(para, "context", str, where_p)
            qas = _need(para, "qas", list, where_p)
            spans: list[tuple[str, int, int]] | None = None
            for k, qa in enumerate(qas):
                if max_questions is not None and len(records) >= max_questions:
                    break
                if not isinstance(qa, dict):
                    raise ValueError(f"{where_p}.qas[{k}]: expected an object, got {_show(qa)}")
                qid = qa.get("id")
                if not isinstance(qid, str) or not qid:
                    raise ValueError(f"{where_p}.qas[{k}]: missing field 'id' (a non-empty str), got {_show(qid)}")
                where = f"{p}: record {qid!r}"
                question = _need(qa, "question", str, where)
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise ValueError(f"{where}: 'is_impossible' must be true or false, got {_show(impossible)}")
                n_questions += 1
                if impossible:
                    n_impossible += 1
                    continue
                answers = _need(qa, "answers", list, where)
                if not answers:
                    raise ValueError(f"{where}: no answers (and not marked 'is_impossible')")
                for j, ans in enumerate(answers):
                    if not isinstance(ans, dict):
                        raise ValueError(f"{where}: answers[{j}] must be an object, got {_show(ans)}")
                    _need(ans, "text", str, f"{where}: answers[{j}]")
                first = answers[0]
                text = first["text"]
                begin = _need(first, "answer_start", int, f"{where}: answers[0]")
                stop = begin + len(text)
                if not text.strip():
                    raise ValueError(f"{where}: answers[0] has an empty text")
                if begin < 0 or stop > len(context):
                    raise ValueError(
                        f"{where}: answer_start {begin} with text of {len(text)} characters lies outside "
                        f"the context of {len(context)} characters"
                    )
                if context[begin:stop] != text:
                    raise ValueError(
                        f"{where}: answer text {_show(text)} does not match the context at answer_start "
                        f"{begin}: {_show(context[begin:stop])}"
                    )
                if spans is None:
                    spans = tokenize(context)
                    starts, ends = [s for _, s, _ in spans], [e for _, _, e in spans]
                # the words overlapping [begin, stop): spans are disjoint and sorted
                first_w, last_w = bisect.bisect_right(ends, begin), bisect.bisect_left(starts, stop) - 1
                if first_w > last_w:
                    raise ValueError(f"{where}: answer {_show(text)} covers no word of the context")
                n = len(spans)
                if last_w - first_w + 1 > window:
                    n_long += 1
                    continue
                if n <= window:
                    lo = hi = 0
                else:
                    lo, hi = max(0, last_w - window + 1), min(first_w, n - window)
                offset = int(rng.integers(lo, hi + 1))
                words = tuple(t for t, _, _ in spans[offset : offset + window])
                start, end = first_w - offset, last_w - offset
                gold = [(start, end)]
                for j, ans in enumerate(answers[1:], 1):
                    span = _answer_words(ans, j, context, starts, ends, where)
                    inside = (span[0] - offset, span[1] - offset)
                    if inside[0] >= 0 and inside[1] < len(words) and inside not in gold:
                        gold.append(inside)
                relevant = np.zeros(len(words))
                relevant[start : end + 1] = 1.0
                records.append(
                    TextRecord(
                        id=qid,
                        words=words,
                        relevant=relevant,
                        label=0,
                        query_words=tuple(_words(question)),
                        meta={
                            "start": start,
                            "end": end,
                            "answers": tuple(ans["text"] for ans in answers),
                            "spans": tuple(gold),
                            "question_id": qid,
                            "offset": offset,
                            "n_context": n,
                        },
                    )
                )
    _no_duplicates(records, str(p))
    if not records:
        raise ValueError(
            f"{p}: no SQuAD question kept ({n_questions} read, {n_impossible} impossible, "
            f"{n_long} with an answer longer than window = {window} words)"
        )
    return records


def _answer_words(
    ans: Mapping[str, Any], j: int, context: str, starts: list[int], ends: list[int], where: str
) -> tuple[int, int]:
    """First and last (inclusive) context word of ``answers[j]``, checked against the context."""
    text = ans["text"]
    begin = _need(ans, "answer_start", int, f"{where}: answers[{j}]")
    stop = begin + len(text)
    if not text.strip() or begin < 0 or stop > len(context) or context[begin:stop] != text:
        raise ValueError(
            f"{where}: answers[{j}] {_show(text)} at answer_start {begin} does not match the context there: "
            f"{_show(context[max(begin, 0) : stop])}"
        )
    first_w, last_w = bisect.bisect_right(ends, begin), bisect.bisect_left(starts, stop) - 1
    if first_w > last_w:
        raise ValueError(f"{where}: answers[{j}] {_show(text)} covers no word of the context")
    return first_w, last_w


# --------------------------------------------------------------------------------------------
# subject-verb agreement


def load_sva(path: str | os.PathLike) -> list[TextRecord]:
    """Subject-verb agreement items: a prefix, the correct and the wrong verb form.

    Parameters
    ----------
    path : str or path
        A BLiMP JSONL file, a TSV file (plain or ``.gz``; ``.jsonl``/``.json`` and ``.tsv``
        suffixes say which, other names are told apart by content) or a folder, whose
        ``*.jsonl``, ``*.jsonl.gz``, ``*.tsv`` and ``*.tsv.gz`` files are read in sorted order.
        See ``DATA_FORMATS["sva"]``.

    Returns
    -------
    list of TextRecord
        ``words``: the prefix before the verb, tokenized and lowercased; ``label``: 0 (the
        correct form is candidate 0); ``relevant``: 1 at ``meta["subject_index"]`` when known,
        zeros otherwise (the experiment adds the verb position itself); ``meta``: ``correct``,
        ``wrong``, ``continuation``, ``n_attractors``, ``subject_index``, ``source``.

    Notes
    -----
    BLiMP: records with ``one_prefix_method: true`` (or without the flag) are read: words =
    ``tokenize(one_prefix_prefix)``, correct / wrong = ``one_prefix_word_good`` / ``_bad``.
    Two-prefix records (the subject differs, the verb is shared) have no verb-form pair and are
    skipped. ``n_attractors`` is 1 for the ``distractor_agreement_*`` paradigms, else 0.
    ``subject_index`` is a heuristic: 1 when the first word is a determiner or quantifier
    (the, a, an, this, that, these, those, some, most, many, all, every, each, no, few, several,
    both, his, her, their, my, our, your, its), else 0; ``source``: the ``UID`` (paradigm).

    TSV: ``sentence<TAB>verb_index<TAB>correct_form<TAB>wrong_form`` and optionally
    ``<TAB>n_attractors<TAB>subject_index`` (0-based indices into ``sentence.split()``; -1 =
    unknown; without them n_attractors is -1 and the subject unknown). Lines starting with ``#``,
    blank lines and a first line whose second column reads ``verb_index`` (a header) are skipped.
    Each whitespace word before ``verb_index`` is tokenized; ``subject_index`` points at the
    first token of its word. ``id``: ``"<file stem>:<line>"``; ``source``: the file stem. The
    sentence's word at ``verb_index`` (its first token under `tokenize`) must be the correct
    form (the sentence is the grammatical one); the wrong form there draws a ``UserWarning``
    per file (the two form columns may be swapped: the records keep them as given), any other
    word is an error.

    Verb forms are lowercased and must be one token under `tokenize` each, or (BLiMP has a
    hundred such pairs, e.g. "works with" / "work with") a verb followed by the same words in
    both forms: then the forms are the first tokens and the shared rest is
    ``meta["continuation"]``.

    Raises
    ------
    ValueError
        Naming the file and line: bad JSON, a missing or mistyped field, a TSV line with a
        wrong number of columns, a non-integer or out-of-range index, a TSV sentence whose word
        at ``verb_index`` is neither verb form, verb forms that are not
        single tokens (as above) or are equal, an empty prefix; or no item at all.
    """
    root = _existing(path, "load_sva")
    if root.is_dir():
        files = _folder_files(
            root, ("*.jsonl", "*.jsonl.gz", "*.tsv", "*.tsv.gz"), "sva", "*.jsonl, *.jsonl.gz, *.tsv or *.tsv.gz"
        )
    else:
        files = [root]
    records: list[TextRecord] = []
    skipped = 0
    for f in files:
        text = _read_text(f)
        name = f.name[:-3] if f.name.endswith(".gz") else f.name
        if name.endswith((".jsonl", ".json")):
            is_json = True
        elif name.endswith(".tsv"):
            is_json = False
        else:
            first = next((ln for _, ln in _lines(text) if ln.strip() and not ln.startswith("#")), "")
            is_json = first.lstrip().startswith("{")
        if is_json:
            got, n_skip = _sva_blimp(f, text)
        else:
            got, n_skip = _sva_tsv(f, text)
        records += got
        skipped += n_skip
    _no_duplicates(records, str(root))
    if not records:
        why = f" ({skipped} two-prefix records skipped: they have no verb-form pair)" if skipped else ""
        raise ValueError(f"{root}: no subject-verb agreement item{why}. {DATA_FORMATS['sva']}")
    return records


def _verb_forms(correct: str, wrong: str, where: str) -> tuple[str, str, tuple[str, ...]]:
    c, w = _words(correct), _words(wrong)
    if len(c) == len(w) >= 1 and c[1:] == w[1:] and c[0] != w[0]:
        return c[0], w[0], tuple(c[1:])
    if len(c) == len(w) == 1:
        raise ValueError(f"{where}: the correct and wrong verb forms are the same word, {correct!r}")
    raise ValueError(
        f"{where}: verb forms {correct!r} / {wrong!r} must each be one token under tokenize "
        f"(got {c} / {w}), or one token followed by the same words in both"
    )


def _sva_record(
    rid: str,
    words: list[str],
    correct: str,
    wrong: str,
    n_attractors: int,
    subject: int | None,
    source: str,
    where: str,
) -> TextRecord:
    if not words:
        raise ValueError(f"{where}: the prefix before the verb has no words")
    good, bad, rest = _verb_forms(correct, wrong, where)
    relevant = np.zeros(len(words))
    if subject is not None:
        relevant[subject] = 1.0
    return TextRecord(
        id=rid,
        words=tuple(words),
        relevant=relevant,
        label=0,
        meta={
            "correct": good,
            "wrong": bad,
            "continuation": rest,
            "n_attractors": n_attractors,
            "subject_index": subject,
            "source": source,
        },
    )


def _sva_blimp(path: Path, text: str) -> tuple[list[TextRecord], int]:
    records, skipped = [], 0
    for i, obj in _jsonl(path, text):
        where = f"{path}: line {i}"
        one = obj.get("one_prefix_method", True)  # without the flag: a one-prefix item, its fields required
        if not isinstance(one, bool):
            raise ValueError(f"{where}: 'one_prefix_method' must be true or false, got {_show(one)}")
        if not one:
            skipped += 1
            continue
        prefix = _need(obj, "one_prefix_prefix", str, where)
        good = _need(obj, "one_prefix_word_good", str, where)
        bad = _need(obj, "one_prefix_word_bad", str, where)
        uid = obj.get("UID")
        source = uid if isinstance(uid, str) and uid else _stem(path)
        pair = obj.get("pairID")
        rid = (
            f"{source}:{pair}" if isinstance(pair, (str, int)) and not isinstance(pair, bool) else f"{_stem(path)}:{i}"
        )
        words = _words(prefix)
        subject: int | None = 1 if words and words[0] in _DETERMINERS else 0
        if subject is not None and subject >= len(words):
            subject = None
        n_attr = 1 if source.startswith("distractor_agreement") else 0
        records.append(_sva_record(rid, words, good, bad, n_attr, subject, source, where))
    return records, skipped


def _sva_tsv(path: Path, text: str) -> tuple[list[TextRecord], int]:
    records: list[TextRecord] = []
    swapped: list[int] = []
    stem = _stem(path)
    seen_data = False
    for i, line in _lines(text):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{path}: line {i}"
        cols = [c.strip() for c in line.split("\t")]
        if not seen_data and len(cols) >= 2 and cols[1].lower() == "verb_index":
            seen_data = True
            continue  # a header line
        seen_data = True
        if len(cols) not in (4, 6):
            raise ValueError(
                f"{where}: {len(cols)} tab-separated columns; expected 4 (sentence, verb_index, correct_form, "
                f"wrong_form) or 6 (... n_attractors, subject_index)"
            )
        sentence, correct, wrong = cols[0], cols[2], cols[3]
        split = sentence.split()
        verb = _tsv_int(cols[1], "verb_index", where)
        if not 0 <= verb < len(split):
            raise ValueError(f"{where}: verb_index {verb} is outside the sentence's {len(split)} words")
        n_attr, subj_word = -1, -1
        if len(cols) == 6:
            n_attr = _tsv_int(cols[4], "n_attractors", where)
            subj_word = _tsv_int(cols[5], "subject_index", where)
            if n_attr < -1:
                raise ValueError(f"{where}: n_attractors {n_attr} must be >= 0 (or -1, unknown)")
            if not -1 <= subj_word < verb:
                raise ValueError(
                    f"{where}: subject_index {subj_word} must point at a word before the verb "
                    f"(0..{verb - 1}) or be -1 (unknown)"
                )
        good, bad, _ = _verb_forms(correct, wrong, where)
        at_verb = (_words(split[verb]) or [""])[0]
        if at_verb == bad:
            swapped.append(i)
        elif at_verb != good:
            raise ValueError(
                f"{where}: the sentence's word at verb_index {verb} is {split[verb]!r}, neither the correct form "
                f"{correct!r} nor the wrong form {wrong!r}"
            )
        words: list[str] = []
        subject: int | None = None
        for j, w in enumerate(split[:verb]):
            if j == subj_word:
                subject = len(words)
            words += _words(w)
        records.append(_sva_record(f"{stem}:{i}", words, correct, wrong, n_attr, subject, stem, where))
    if swapped:
        warnings.warn(
            f"{path}: on {len(swapped)} of {len(records)} lines (first: line {swapped[0]}) the sentence holds the "
            "wrong form at verb_index, not the correct one: are the correct_form and wrong_form columns swapped?",
            stacklevel=3,
        )
    return records, 0


def _tsv_int(value: str, name: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{where}: {name} {value!r} is not an integer") from None


# --------------------------------------------------------------------------------------------
# splits, summaries, finding the data


def split_records(
    records: Sequence[TextRecord], eval_fraction: float = 0.2, seed: int = 0
) -> tuple[list[TextRecord], list[TextRecord]]:
    """A seeded random split into a training and an evaluation part.

    Parameters
    ----------
    records : sequence of TextRecord
        At least two.
    eval_fraction : float
        In ``(0, 1)``: the evaluation part has ``round(eval_fraction * n)`` records, at least
        one and at most ``n - 1``.
    seed : int
        Seed of ``numpy.random.default_rng`` choosing the evaluation records.

    Returns
    -------
    (train, eval) : tuple of lists of TextRecord
        Disjoint, together all of ``records``, each in the order of ``records``.
    """
    records = list(records)
    n = len(records)
    if n < 2:
        raise ValueError(f"split_records needs at least 2 records, got {n}")
    if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float, np.floating, np.integer)):
        raise ValueError(f"eval_fraction must be a number in (0, 1), got {eval_fraction!r}")
    if not 0.0 < float(eval_fraction) < 1.0:
        raise ValueError(f"eval_fraction must lie in (0, 1), got {eval_fraction!r}")
    seed = _int("seed", seed, minimum=0)
    n_eval = min(n - 1, max(1, int(round(float(eval_fraction) * n))))
    chosen = np.zeros(n, dtype=bool)
    chosen[np.random.default_rng(seed).permutation(n)[:n_eval]] = True
    return [r for r, c in zip(records, chosen) if not c], [r for r, c in zip(records, chosen) if c]


def official_split(
    records: Sequence[TextRecord], divisions: Mapping[str, Iterable[str]] | str | os.PathLike
) -> dict[str, list[TextRecord]]:
    """``records`` divided by id, as a published split says.

    Parameters
    ----------
    records : sequence of TextRecord
    divisions : mapping or str or path
        ``{"train": [ids], "val": [ids], "test": [ids]}`` (any names), or the path of a JSON
        file holding one (plain or ``.gz``), such as HateXplain's ``post_id_divisions.json``.

    Returns
    -------
    dict of str to list of TextRecord
        One entry per division, in the order of ``divisions``, its records in the order of
        ``records`` (``len`` gives the count per division; a division may be empty). Records
        whose id is in no division are dropped.

    Raises
    ------
    ValueError
        An id in two divisions, a malformed divisions file, repeated record ids, or no record
        in any division (the ids do not match: likely the wrong file).
    """
    where = "divisions"
    if isinstance(divisions, (str, os.PathLike)):
        p = _existing(divisions, "official_split")
        where = str(p)
        divisions = _load_json(p, _read_text(p))
    if not isinstance(divisions, Mapping):
        raise ValueError(f"{where}: expected a mapping of division name to a list of ids, got {_show(divisions)}")
    owner: dict[str, str] = {}
    for name, ids in divisions.items():
        if isinstance(ids, str) or not isinstance(ids, Iterable):
            raise ValueError(f"{where}: division {name!r} must be a list of ids, got {_show(ids)}")
        for rid in ids:
            if not isinstance(rid, str):
                raise ValueError(f"{where}: division {name!r} holds the non-str id {_show(rid)}")
            if rid in owner and owner[rid] != name:
                raise ValueError(f"{where}: id {rid!r} is in both division {owner[rid]!r} and {name!r}")
            owner[rid] = str(name)
    records = list(records)
    _no_duplicates(records, "official_split records")
    out: dict[str, list[TextRecord]] = {str(name): [] for name in divisions}
    for r in records:
        division = owner.get(r.id)
        if division is not None:
            out[division].append(r)
    if records and not any(out.values()):
        sizes = Counter(owner.values())
        raise ValueError(
            f"{where}: none of the {len(records)} records' ids (e.g. {records[0].id!r}) is in any division "
            f"({', '.join(f'{name}: {sizes[str(name)]} ids' for name in divisions)})"
        )
    return out


def describe(records: Sequence[TextRecord]) -> dict[str, Any]:
    """Counts and balances of a list of records (plain Python numbers, ready for JSON).

    Returns
    -------
    dict
        ``n``; ``labels`` (count per label, by label); ``n_with_rationale`` and
        ``rationale_coverage`` (the number and fraction of records with some ``relevant > 0``);
        ``mean_length`` (words); ``mean_relevant_fraction`` (mean over records of the fraction
        of words with ``relevant > 0``); ``mean_query_length`` when records have query words;
        ``n_attractors`` (count per value), ``subject_known`` and ``sources`` (count per source)
        when records carry ``meta["n_attractors"]`` (SVA).
    """
    records = list(records)
    if not records:
        raise ValueError("describe needs at least one record")
    with_rel = [bool(np.any(r.relevant > 0)) for r in records]
    out: dict[str, Any] = {
        "n": len(records),
        "labels": dict(sorted(Counter(r.label for r in records).items())),
        "n_with_rationale": int(sum(with_rel)),
        "rationale_coverage": float(np.mean(with_rel)),
        "mean_length": float(np.mean([len(r.words) for r in records])),
        "mean_relevant_fraction": float(np.mean([np.mean(r.relevant > 0) if r.words else 0.0 for r in records])),
    }
    if any(r.query_words for r in records):
        out["mean_query_length"] = float(np.mean([len(r.query_words) for r in records]))
    if all("n_attractors" in r.meta for r in records):
        out["n_attractors"] = dict(sorted(Counter(int(r.meta["n_attractors"]) for r in records).items()))
        out["subject_known"] = sum(r.meta.get("subject_index") is not None for r in records)
        out["sources"] = dict(Counter(str(r.meta.get("source")) for r in records))
    return out


def resolve_data(path: str | os.PathLike | None, default: str, dataset: str) -> Path:
    """Where a data set is: the path given, or the default place in the data folder.

    Parameters
    ----------
    path : str or path or None
        A file or folder (the ``data`` option, ``--set data=PATH``). Used as given when it
        exists; a relative path that does not is also looked for in ``$ATTNFLOW_DATA``.
    default : str
        The path inside the data folder used when ``path`` is None, e.g.
        ``"hatexplain/val.jsonl.gz"``, ``"squad/dev-v1.1.json.gz"``, ``"blimp"``.
    dataset : str
        ``"hatexplain"``, ``"squad"`` or ``"sva"`` (a key of `DATA_FORMATS`), for the message.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    FileNotFoundError
        Naming the places looked at, how to give the data (``--set data=PATH``, the
        ``ATTNFLOW_DATA`` environment variable, the ``--data-dir`` option) and the format.
    """
    if dataset not in DATA_FORMATS:
        raise ValueError(f"dataset must be one of {', '.join(map(repr, DATA_FORMATS))}, got {dataset!r}")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str, a path or None, got {path!r}")
    if not isinstance(default, str) or not default:
        raise ValueError(f"default must be a non-empty str, got {default!r}")
    env = os.environ.get(DATA_ENV)
    looked = []
    if path is not None:
        p = Path(path)
        if p.exists():
            return p
        looked.append(f"{str(p)!r}")
        if env and not p.is_absolute():
            cand = Path(env) / p
            if cand.exists():
                return cand
            looked.append(f"{str(cand)!r} (in ${DATA_ENV})")
    elif env:
        cand = Path(env) / default
        if cand.exists():
            return cand
        looked.append(f"{str(cand)!r} (${DATA_ENV}/{default})")
    else:
        looked.append(f"${DATA_ENV}/{default}, but ${DATA_ENV} is not set")
    raise FileNotFoundError(
        f"no {dataset} data: looked at {'; '.join(looked)}. Give the file or folder with --set data=PATH, "
        f"or point the environment variable {DATA_ENV} (the attnflow command's --data-dir option) at a data "
        f"folder holding {default}. Accepted format: {DATA_FORMATS[dataset]}"
    )
