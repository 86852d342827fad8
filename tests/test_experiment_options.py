"""The options of the experiments of qkov, focus, heads, deep-linear and derive are checked when
their configuration is made, before any computing: a bad ``--set`` value raises one
``ValueError`` line that names the option as the user spells it and shows plain numbers."""

import numpy as np
import pytest

from attnflow.registry import get_experiment, load_all
from attnflow.report import config_from

PACKAGES = ("qkov", "focus", "heads", "deeplinear", "derive")
TEXT_EXPERIMENTS = ("qkov-hatexplain", "qkov-squad", "qkov-sva")  # attnflow/qkov/text_experiments.py


def _experiments() -> list[str]:
    load_all()
    from attnflow.report import experiments

    return sorted(n for n, e in experiments().items() if e.package in PACKAGES and n not in TEXT_EXPERIMENTS)


def _error(name: str, overrides: dict) -> str:
    load_all()
    exp = get_experiment(name)
    with pytest.raises(ValueError) as info:
        config_from(exp.config, overrides, name)
    return str(info.value)


@pytest.mark.parametrize("name", _experiments())
def test_defaults_pass_their_own_checks(name):
    exp = get_experiment(name)
    assert config_from(exp.config, {}, name) == exp.defaults
    assert exp.options()  # `attnflow show NAME` builds the defaults too


BAD = [
    # (experiment, --set values, the message, matched from its start)
    ("qkov-reduced", {"ratios": "[0]"}, r"ratios must be finite and positive, got \[0\.0\]$"),
    ("qkov-reduced", {"ratios": "[]"}, r"ratios must hold at least one value, got \[\]$"),
    ("qkov-reduced", {"ratios": "[0.1]"}, r"ratios must hold at least 2 distinct values .*got \[0\.1\]$"),
    ("qkov-reduced", {"loss_target": "2"}, r"loss_target must lie in \(0, 1\) .*got 2$"),
    ("qkov-reduced", {"M": "2"}, r"with m, n, b, M = 5, 50, 50, 2 the initial loss L\(0\) = 0\.6931 is not above 1"),
    ("qkov-flow", {"t_end": "0.5"}, r"t_end must exceed 1 .*got 0\.5$"),
    ("qkov-flow", {"loss_thresholds": "[0.1, -1]"}, r"loss_thresholds must be finite and positive, got \[0\.1, -1"),
    ("qkov-parametrisations", {"scale": "0"}, r"scale must be finite and positive, got 0\.0$"),
    ("qkov-fixed-attention", {"alphas": "[0.5, 1.5]"}, r"alphas \(fixed attention masses\) must lie in \[0, 1\]"),
    ("qkov-ratio-sweep", {"n_ratios": "2"}, r"n_ratios must be an integer >= 3, got 2$"),
    ("qkov-ratio-sweep", {"matched_losses": "[0.1, 5]"}, r"matched_losses must lie below the initial loss L\(0\)"),
    ("qkov-optimal-ratio", {"ratio_max": "0.001"}, r"ratio_max must exceed ratio_min = 0\.01, got 0\.001$"),
    ("focus-cycle", {"pi": "[0.5, 0.6]"}, r"pi must sum to 1 within 1e-12, got sum 1\.1 \(pi = \[0\.5, 0\.6\]\)$"),
    ("focus-cycle", {"lam": "-1"}, r"lam must lie in \[-0\.010101, 1\] for pi = \[0\.75, 0\.19, 0\.05, 0\.01\] .*-1$"),
    ("focus-cycle", {"eps": "2"}, r"eps \(initial scale\) must lie in \(0, 1\), got 2$"),
    ("focus-finite", {"seeds": "0"}, r"seeds must be an integer >= 1, got 0$"),
    ("focus-rates", {"lams": "[]"}, r"lams must hold at least one value, got \[\]$"),
    ("focus-rates", {"lams": "[-1]"}, r"lams must lie in \(0, 1\] .*got \[-1\.0\]$"),
    ("focus-rates", {"n_save": "0"}, r"n_save must be an integer >= 2, got 0$"),
    ("focus-rates", {"pi": "[0.5, 0.5]"}, r"pi must not be uniform"),
    ("focus-corpus", {"corpora": '["a.txt"]'}, r"corpora entry 'a\.txt' must be 'FILE:TOKENIZER'"),
    (
        "focus-rates",
        {"eps": "0.005"},
        r"eps = 0\.005 is too large to measure the rates: the Stage I rate 2 sigma is fit while \|M\| grows from "
        r"30 \|M\(0\)\| = 0\.00853 to 0\.01, the linear regime, and needs a growth by 3 there; with m = 8, mk = 8 "
        r"that holds for eps <= 0\.00312: give a smaller eps$",
    ),
    (
        "focus-rates",
        {"eps": "0.003", "mk": "64"},
        r"eps = 0\.003 is too large to measure the rates: the Stage II rate c is fit while q\+ grows from "
        r"q\+\(0\) = 0\.0237 to 0\.05, the linear regime, and needs a growth by 3 there; with m = 8, mk = 64 that "
        r"holds for eps <= 0\.0021: give a smaller eps$",
    ),
    (
        "focus-cycle",
        {"eps": "0.005"},
        r"eps = 0\.005 is too large .* with m = 16, mk = 16 that holds for eps <= 0\.00319:",
    ),
    ("focus-symmetry", {"deltas": "[0, 0.2]"}, r"deltas must lie in \(-0\.0833333, 0\.0833333\) .*got \[0\.0, 0\.2\]$"),
    ("focus-symmetry", {"threshold": "1"}, r"threshold must exceed 1"),
    ("heads-ode-vs-sgd", {"Ds": "[500]"}, r"Ds must hold 2 distinct values .*got \[500\]$"),
    ("heads-ode-vs-sgd", {"p": "1.5"}, r"p must be a probability in \[0, 1\], got 1\.5$"),
    ("heads-specialisation-time", {"sgd_Ds": "[2, 500]"}, r"sgd_Ds must all be at least 3 .*got \[2, 500\]$"),
    ("heads-staged", {"D_init": "3"}, r"D_init must be an integer >= 7, got 3$"),
    ("heads-excursion", {"m_init": "[0.4]"}, r"m_init must hold one overlap per head"),
    ("heads-activations", {"bank": "-1"}, r"bank must be an integer >= 1, got -1$"),
    ("heads-activations", {"H": "3"}, r"H must be an even number of heads >= 2 .*got 3$"),
    ("heads-pruning", {"H": "2"}, r"H must be an integer of at least F = 3 .*got 2$"),
    ("derive-committee", {"q0": "0.001"}, r"q0 must be at least 0\.0144, .*got 0\.001$"),
    ("derive-committee", {"sgd_r0s": "[]"}, r"sgd_r0s must be positive initial specialisations, got \[\]$"),
    ("deep-linear", {"u0": "2"}, r"u0 must lie in \(0, min\(s\) / 2\) = \(0, 0\.25\) .*got 2$"),
    ("deep-linear", {"dts": "[0.04, 20]"}, r"dts must be below t_end = 14, got \[0\.04, 20\.0\]$"),
]


@pytest.mark.parametrize(("name", "overrides", "message"), BAD, ids=[f"{n}:{next(iter(o))}" for n, o, _ in BAD])
def test_a_bad_option_is_named_with_plain_numbers(name, overrides, message):
    err = _error(name, overrides)
    assert "\n" not in err and "np." not in err and "float64" not in err, err
    assert next(iter(overrides)) in err, err  # the option, as --set spells it
    assert __import__("re").match(message, err), err


def test_the_cli_stops_before_computing(monkeypatch, tmp_path, capsys):
    import attnflow.qkov.experiments as qkov_experiments
    from attnflow.cli import main

    def never(*args, **kwargs):
        raise AssertionError("the experiment started computing")

    monkeypatch.setattr(qkov_experiments, "sweep", never)
    rc = main(["run", "qkov-reduced", "--set", "ratios=[0]", "--out", str(tmp_path / "out"), "--quiet"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == "attnflow: error: ratios must be finite and positive, got [0.0]"
    assert not (tmp_path / "out").exists()


def test_focus_chain_messages_show_plain_numbers():
    from attnflow.focus import MarkovChain

    with pytest.raises(ValueError, match=r"^lam must lie in \[-0\.010101, 1\] for this pi \(a lazy chain\), got -1$"):
        MarkovChain.lazy((0.75, 0.19, 0.05, 0.01), np.float64(-1.0))
    with pytest.raises(ValueError, match=r"^pi must sum to 1 within 1e-12, got sum 1\.1 \(pi = \[0\.5, 0\.6\]\)$"):
        MarkovChain.lazy(np.asarray([0.5, 0.6]), 0.5)
    with pytest.raises(ValueError, match=r"^pi must be strictly positive; entry 1 is -0\.5$"):
        MarkovChain.lazy(np.asarray([1.5, -0.5]), 0.5)


def test_focus_eps_limit_is_the_largest_that_works():
    """The largest eps that the focus-rates message gives is accepted, one just above it refused
    (Stage I's window [30 |M(0)|, 1e-2], |M(0)| = 11.37 eps^2 for the default draw, m = mk = 8)."""
    load_all()
    exp = get_experiment("focus-rates")
    assert config_from(exp.config, {"eps": "0.00312"}, "focus-rates").eps == 0.00312
    assert "eps <= 0.00312" in _error("focus-rates", {"eps": "0.00313"})
    # mk = 64: q+(0) = 7.91 eps, so Stage II's window [q+(0), 0.05] sets the limit, 0.05 / (3 x 7.91)
    assert config_from(exp.config, {"eps": "0.0021", "mk": "64"}, "focus-rates").mk == 64


def test_a_failed_rate_fit_says_why_and_only_advice_that_helps():
    from attnflow.focus.experiments import _fit_failure

    t_end = 30.0
    grows = np.exp(np.linspace(0.0, 6.0, 7)) * 1e-3  # 1e-3 ... 0.40, one e-fold per save
    assert _fit_failure(grows, 0.2, 0.1, t_end, "raise n_save") == (
        "the window from 0.2 to 0.1 is empty: give a smaller eps"
    )
    assert _fit_failure(grows, 1e-3, 1.0, t_end, "raise n_save") == (
        "it grew from 0.001 only to 0.403, not to 1, within t = 30"
    )
    assert _fit_failure(grows, 0.005, 0.05, t_end, "raise n_save") == (  # 0.0074 and 0.020 inside
        "only 2 of the 7 saves lie in the fit window from 0.005 to 0.05 (the fit needs 3): raise n_save"
    )


def test_focus_rates_refuses_a_large_eps_before_computing(monkeypatch, tmp_path, capsys):
    """eps = 0.2 used to run the whole grid and fail its checks, advising to raise n_save."""
    import attnflow.focus.experiments as focus_experiments
    from attnflow.cli import main

    def never(*args, **kwargs):
        raise AssertionError("the experiment started computing")

    monkeypatch.setattr(focus_experiments, "sweep", never)
    rc = main(["run", "focus-rates", "--set", "eps=0.2", "--out", str(tmp_path / "out"), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnflow: error: eps = 0.2 is too large to measure the rates: ") and "\n" not in err
    assert err.endswith("that holds for eps <= 0.00312: give a smaller eps") and "n_save" not in err
    assert not (tmp_path / "out").exists()
