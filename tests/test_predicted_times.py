"""Predicted against measured event times: `attnflow.plot.mark_times` and an experiment's summary."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.figure import Figure

from attnflow.plot import mark_times
from attnflow.registry import get_experiment, load_all


def _axes(log: bool = False):
    ax = Figure().subplots()
    ax.plot([0.1, 10.0], [0.0, 1.0], label="curve")
    if log:
        ax.set_xscale("log")
    return ax


def _vlines(ax) -> dict[str, float]:
    """Labelled vertical lines of ``ax``: label -> x."""
    out = {}
    for line in ax.get_lines():
        x = np.asarray(line.get_xdata(), dtype=float)
        if len(x) == 2 and x[0] == x[1] and not line.get_label().startswith("_"):
            out[line.get_label()] = float(x[0])
    return out


def test_draws_predicted_and_measured_lines_at_their_times_with_labels():
    ax = _axes()
    rows = mark_times(ax, {"escape": 3.0, "plateau end": 7.5}, {"escape": [2.5, 3.5], "plateau end": 6.0})
    lines = _vlines(ax)
    assert lines == {
        "escape: theory t=3": 3.0,
        "escape: measured t=3 (mean of 2)": 2.5,
        "plateau end: theory t=7.5": 7.5,
        "plateau end: measured t=6": 6.0,
    }
    every_x = sorted(float(line.get_xdata()[0]) for line in ax.get_lines()[1:] if len(line.get_xdata()) == 2)
    assert every_x == [2.5, 3.0, 3.5, 6.0, 7.5]  # the second seed is drawn too, without a legend entry
    styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines()}
    assert styles["escape: theory t=3"] == "--" and styles["escape: measured t=3 (mean of 2)"] == ":"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "escape: theory t=3" in legend and "curve" in legend
    assert rows == {"escape": (3.0, 3.0, 1.0), "plateau end": (7.5, 6.0, 1.25)}


def test_events_that_never_happen_are_listed_but_not_drawn():
    ax = _axes(log=True)
    rows = mark_times(ax, {"a": float("nan"), "b": 0.0, "c": 2.0}, {"c": [float("nan")]}, legend=False)
    assert _vlines(ax) == {"c: theory t=2": 2.0}  # NaN, and 0 on a log axis, are skipped
    assert math.isnan(rows["a"][0]) and math.isnan(rows["c"][1]) and math.isnan(rows["c"][2])
    assert ax.get_legend() is None


def test_a_time_past_the_data_keeps_the_axis_and_is_listed_off_the_axis():
    """A prediction far past the data (t = 500 for data up to t = 10) would squash the curves:
    the x range stays the data's, and the legend names the time with "(off the axis)"."""
    ax = _axes()
    before = ax.get_xlim()
    rows = mark_times(ax, {"late": 500.0, "early": 2.0}, {"late": [400.0, 5.0]})
    assert ax.get_xlim() == before
    assert _vlines(ax) == {"early: theory t=2": 2.0, "late: measured t=202 (mean of 2) (1 off the axis)": 5.0}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "late: theory t=500 (off the axis)" in legend
    assert rows["late"] == (500.0, 202.5, 500.0 / 202.5)
    empty = Figure().subplots()  # nothing drawn yet: the lines set the range
    mark_times(empty, {"a": 500.0}, legend=False)
    assert _vlines(empty) == {"a: theory t=500": 500.0}


@pytest.mark.parametrize(
    ("times", "measured", "kw", "argument"),
    [
        ([1.0, 2.0], None, {}, "times"),
        ({"a": "soon"}, None, {}, "times"),
        ({"a": [1.0, 2.0]}, None, {}, "times"),
        ({1: 1.0}, None, {}, "times"),
        ({"a": 1.0}, {"b": 1.0}, {}, "measured"),
        ({"a": 1.0}, {"a": [[1.0]]}, {}, "measured"),
        ({"a": 1.0}, [1.0], {}, "measured"),
        ({"a": 1.0}, None, {"colors": []}, "colors"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(times, measured, kw, argument):
    with pytest.raises(ValueError, match=argument):
        mark_times(_axes(), times, measured, **kw)


def test_deep_linear_summary_lists_predicted_against_measured_times():
    # two modes, a short run and the two coarsest steps: each mode's half-learning time from the saddle rate
    # 2 s against gradient descent at dt = 0.04, which lags the flow by O(dt): ratio within 10% of 1
    load_all()
    rep = get_experiment("deep-linear").run({"s": (3.0, 1.0), "t_end": 6.0, "dts": (0.04, 0.02)}, quiet=True)
    assert rep.passed, rep.checks
    rows = {k: v for k, v in rep.summary.items() if k.startswith("predicted vs measured time of")}
    assert len(rows) == 2
    for k, (t_pred, t_meas, ratio) in rows.items():
        assert ratio == pytest.approx(1.0, abs=0.1), k
        assert ratio == pytest.approx(t_pred / t_meas)
    t_pred = rows["predicted vs measured time of mode s=3 half learned (t_pred, t_meas, ratio)"][0]
    assert t_pred == pytest.approx(np.log(3.0 / 1e-3 - 1) / 6.0)
    drawn = _vlines(rep.figures["modes"].axes[0])
    assert drawn["mode s=3 half learned: theory t=1.33"] == pytest.approx(t_pred)
