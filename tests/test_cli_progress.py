"""The progress meter of `integrate` (shown by the `attnflow` command unless ``--quiet``): a
labelled, throttled bar on a terminal, a few plain lines in a log."""

import io
import sys

import pytest

import attnflow as af
from attnflow import deeplinear as dl
from attnflow import ode

# a solve of a few thousand steps: tight tolerances on the reference setup
SOLVER = af.SolverOptions(progress=True, rtol=1e-13, atol=1e-15, max_steps=1_000_000)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_in_a_log_progress_is_a_few_plain_lines(monkeypatch):
    monkeypatch.setattr(ode._ProgressMeter, "LOG_SECONDS", 0.0)  # this solve is short: no time floor
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    dl.solve(dl.Setup(), 8.0, solver=SOLVER)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and 3 <= len(lines) <= 11, lines
    assert all(ln.startswith("[attnflow] integrate: ") for ln in lines)
    assert "% after " in lines[0] and " s left" in lines[0] and lines[-1].startswith("[attnflow] integrate: done in")
    percents = [int(ln.split(": ")[1].split("%")[0]) for ln in lines[:-1]]
    assert percents == sorted(percents) and min(b - a for a, b in zip([0, *percents], percents)) >= 10


def test_in_a_log_a_short_solve_prints_nothing(monkeypatch):
    monkeypatch.setattr(ode._ProgressMeter, "LOG_SECONDS", 3600.0)  # "short" whatever the load
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    dl.solve(dl.Setup(), 8.0, solver=SOLVER)  # well under LOG_SECONDS
    assert log.getvalue() == ""


@pytest.mark.parametrize("interval, most", [(0.0, None), (3600.0, 2)])
def test_on_a_terminal_a_labelled_bar_redrawn_at_most_every_interval(interval, most, monkeypatch):
    monkeypatch.setattr(ode._ProgressMeter, "MIN_INTERVAL", interval)
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    dl.solve(dl.Setup(), 8.0, solver=SOLVER)
    draws = [d for d in term.getvalue().split("\r") if d.strip()]
    assert draws and all(d.startswith("integrate: ") for d in draws) and "%/s" not in term.getvalue()
    if most is None:  # no throttle: a redraw per update of the meter
        assert len(draws) > 5
    else:  # the first draw, and the last one when the bar closes
        assert len(draws) <= most


def test_solve_progress_keeps_the_packages_solver(monkeypatch):
    """``P.solve(setup, t1, progress=True)`` shows the meter and solves with the package's
    ``DEFAULT_SOLVER`` (identical values), or with the ``solver`` given; bad values are named."""
    monkeypatch.setattr(ode._ProgressMeter, "LOG_SECONDS", 0.0)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    s = dl.Setup()
    shown = dl.solve(s, 8.0, progress=True)
    assert log.getvalue().splitlines()[-1].startswith("[attnflow] integrate: done in")
    quiet = dl.solve(s, 8.0)
    assert shown.stats["num_steps"] == quiet.stats["num_steps"]
    assert float(abs(shown["u"] - quiet["u"]).max()) == 0.0
    tight = dl.solve(s, 8.0, solver=SOLVER.replace(progress=False), progress=True)
    assert tight.stats["num_steps"] > 2 * quiet.stats["num_steps"]
    log.seek(0)
    log.truncate(0)
    dl.solve(s, 8.0, solver=SOLVER, progress=False)
    assert log.getvalue() == ""
    with pytest.raises(ValueError, match="progress must be True, False or None, got 'yes'"):
        dl.solve(s, 8.0, progress="yes")
