"""Experiments as named, runnable recipes, and the `Report` they produce.

An experiment is a function ``fn(config, quiet) -> Report`` registered under a name with
its default configuration. The `Report` holds trajectories, figures and a summary of
numbers (theory-vs-simulation errors, timings), and `Report.write` puts them in a folder:
``*.npz`` + ``*.json`` trajectories, ``*.png`` figures, ``summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from .plot import save_figure
from .trajectory import Trajectory, _atomic_write, _json_default, versions

__all__ = ["Report", "Experiment", "register", "get_experiment", "experiments", "parse_value", "apply_overrides", "Timer"]


class Timer:
    """``with Timer() as t: ...``; ``t.seconds`` afterwards."""

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        return False


@dataclass
class Report:
    """What an experiment run produced."""

    name: str
    config: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checks: dict[str, tuple[float, float]] = field(default_factory=dict)

    def check(self, name: str, value: float, tolerance: float) -> None:
        """Record a measured error against the tolerance it should meet."""
        self.checks[name] = (float(value), float(tolerance))

    @property
    def passed(self) -> bool:
        return all(v <= tol for v, tol in self.checks.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": self.config,
            "summary": self.summary,
            "checks": {k: {"value": v, "tolerance": t, "ok": v <= t} for k, (v, t) in self.checks.items()},
            "passed": self.passed,
            "timings_s": self.timings,
            "notes": self.notes,
            "files": {
                "figures": [f"{k}.png" for k in self.figures],
                "trajectories": [f"{k}.npz" for k in self.trajectories],
            },
            "versions": versions(),
        }

    def markdown(self) -> str:
        lines = [f"# {self.name}", ""]
        if self.checks:
            lines += ["| check | measured | tolerance | ok |", "|---|---|---|---|"]
            for k, (v, t) in self.checks.items():
                lines.append(f"| {k} | {v:.3e} | {t:.1e} | {'yes' if v <= t else '**NO**'} |")
            lines.append("")
        if self.summary:
            lines += ["| quantity | value |", "|---|---|"]
            for k, v in self.summary.items():
                lines.append(f"| {k} | {_fmt(v)} |")
            lines.append("")
        if self.timings:
            lines += ["| timing | seconds |", "|---|---|"]
            for k, v in self.timings.items():
                lines.append(f"| {k} | {v:.2f} |")
            lines.append("")
        for n in self.notes:
            lines.append(f"- {n}")
        if self.figures:
            lines += ["", *[f"![{k}]({k}.png)" for k in self.figures]]
        lines.append("")
        return "\n".join(lines)

    def write(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for k, tr in self.trajectories.items():
            tr.save(out / f"{k}.npz")
        for k, fig in self.figures.items():
            save_figure(fig, out / f"{k}.png")
        payload = json.dumps(self.to_dict(), indent=2, default=_json_default).encode()
        _atomic_write(out / "summary.json", lambda f: f.write(payload))
        md = self.markdown().encode()
        _atomic_write(out / "summary.md", lambda f: f.write(md))
        return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, float) for x in v):
        return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"
    return str(v)


@dataclass(frozen=True)
class Experiment:
    name: str
    fn: Callable[[dict[str, Any], bool], Report]
    defaults: Mapping[str, Any]
    description: str
    package: str
    headline: bool = False

    def run(self, overrides: Mapping[str, Any] | None = None, quiet: bool = True) -> Report:
        config = apply_overrides(self.defaults, overrides or {}, self.name)
        t0 = time.perf_counter()
        report = self.fn(config, quiet)
        report.timings.setdefault("total", time.perf_counter() - t0)
        return report


_REGISTRY: dict[str, Experiment] = {}


def register(name: str, *, defaults: Mapping[str, Any], description: str, headline: bool = False):
    """Decorator registering ``fn(config, quiet) -> Report`` as experiment ``name``."""

    def deco(fn):
        if name in _REGISTRY and _REGISTRY[name].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"experiment {name!r} is registered twice")
        package = fn.__module__.split(".")[1] if fn.__module__.count(".") >= 1 else fn.__module__
        _REGISTRY[name] = Experiment(name, fn, dict(defaults), description, package, headline)
        return fn

    return deco


def experiments() -> dict[str, Experiment]:
    return dict(_REGISTRY)


def get_experiment(name: str) -> Experiment:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def parse_value(text: str) -> Any:
    """Parse a ``--set`` value: JSON (numbers, lists, true/false/null) or a bare string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        low = text.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        return text


def apply_overrides(defaults: Mapping[str, Any], overrides: Mapping[str, Any], name: str = "experiment") -> dict[str, Any]:
    """Defaults updated by overrides; unknown keys and type mismatches raise ValueError."""
    config = dict(defaults)
    for k, v in overrides.items():
        if k not in config:
            raise ValueError(f"{name} has no option {k!r}; options: {', '.join(sorted(config))}")
        d = config[k]
        if isinstance(v, str) and not isinstance(d, str):
            v = parse_value(v)
        if isinstance(d, bool):
            ok = isinstance(v, bool)
        elif isinstance(d, int):
            ok = isinstance(v, int) and not isinstance(v, bool)
        elif isinstance(d, float):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            v = float(v) if ok else v
        elif isinstance(d, (list, tuple)):
            ok = isinstance(v, list)
        elif isinstance(d, str):
            ok = isinstance(v, str)
        else:
            ok = True
        if not ok:
            raise ValueError(f"option {k!r} of {name} expects {type(d).__name__} (default {d!r}), got {v!r}")
        config[k] = v
    return config
