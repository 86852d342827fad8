"""Experiments as named, runnable recipes, and the `Report` they produce.

An experiment is a function ``fn(config, quiet) -> Report`` registered under a name with
its configuration class: a frozen dataclass whose field defaults are the experiment's
defaults and whose type annotations say how a ``--set key=value`` is read
(`config_from`). The `Report` holds trajectories, figures and a summary of numbers
(theory-vs-simulation errors, timings, compilations), and `Report.write` puts them in a
folder: ``*.npz`` + ``*.json`` trajectories, ``*.png`` figures, ``summary.json`` and
``summary.md``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import re
import shlex
import time
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ._io import atomic_write, strict_json
from .compilation import count_compilations
from .plot import save_figure
from .trajectory import Trajectory, versions

__all__ = [
    "Report",
    "Experiment",
    "register",
    "get_experiment",
    "experiments",
    "parse_value",
    "format_value",
    "option_notes",
    "option",
    "config_from",
    "Timer",
]


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
    """What an experiment run produced. ``config`` may be the experiment's configuration
    dataclass (stored as a dict)."""

    name: str
    config: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checks: dict[str, tuple[float, float]] = field(default_factory=dict)
    compilations: dict[str, Any] = field(default_factory=dict)
    references: list[str] = field(default_factory=list)  # one line each (`attnflow.citations`)
    environment: dict[str, Any] = field(default_factory=dict)  # where and how it ran (`environment`)

    def __post_init__(self) -> None:
        if dataclasses.is_dataclass(self.config) and not isinstance(self.config, type):
            self.config = dataclasses.asdict(self.config)

    def check(self, name: str, value: float, tolerance: float) -> None:
        """Record a measured error against the tolerance it should meet."""
        self.checks[name] = (float(value), float(tolerance))

    @property
    def passed(self) -> bool:
        return all(v <= tol for v, tol in self.checks.values())

    def checks_record(self) -> dict[str, dict[str, Any]]:
        """``{check: {"value", "tolerance", "ok"}}``, as ``summary.json`` (and the index of
        ``attnflow reproduce``) write the checks."""
        return {k: {"value": v, "tolerance": t, "ok": v <= t} for k, (v, t) in self.checks.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": self.config,
            "summary": self.summary,
            "checks": self.checks_record(),
            "passed": self.passed,
            "timings_s": self.timings,
            "compilations": self.compilations,
            "notes": self.notes,
            "references": self.references,
            "files": {
                "figures": [f"{k}.png" for k in self.figures],
                "trajectories": [f"{k}.npz" for k in self.trajectories],
            },
            "versions": versions(),
            "environment": self.environment,
        }

    def markdown(self) -> str:
        lines = [f"# {self.name}", ""]
        if self.checks:
            failed = sum(not v <= t for v, t in self.checks.values())
            if len(self.checks) == 1:
                verdict = "the one check passed" if not failed else "**the one check FAILED**"
            else:
                verdict = (
                    f"all {len(self.checks)} checks passed"
                    if not failed
                    else f"**{failed} of {len(self.checks)} checks FAILED**"
                )
            lines += [f"Result: {verdict}.", ""]
        if self.config:
            # as `--set key=VALUE` reads them back, at full precision (cut when long: summary.json has all)
            options = ", ".join(f"`{k}={_cut(format_value(v))}`" for k, v in self.config.items())
            lines += [f"Options: {options}.", ""]
        if self.checks:
            lines += ["| check | measured | tolerance | ok |", "|---|---|---|---|"]
            for k, (v, t) in self.checks.items():
                lines.append(f"| {_cell(k)} | {v:.3e} | {t:.1e} | {'yes' if v <= t else '**NO**'} |")
            lines.append("")
        if self.summary:
            lines += ["| quantity | value |", "|---|---|"]
            for k, v in self.summary.items():
                lines.append(f"| {_cell(k)} | {_cell(_short(v, 400))} |")
            lines.append("")
        if self.timings:
            lines += ["| timing | seconds |", "|---|---|"]
            for k, v in self.timings.items():
                lines.append(f"| {_cell(k)} | {v:.2f} |")
            lines.append("")
            reused = _reused_chunks(self.environment.get("sweep_chunks"))
            if reused:
                lines += [reused, ""]
        if self.compilations:
            lines.append(
                f"XLA compilations: {int(self.compilations['count'])}, "
                f"{self.compilations['seconds']:.2f} s of backend compile time."
            )
            repeated = self.compilations.get("repeated") or {}
            if repeated:
                lines.append(
                    "Compiled more than once (same name: new shapes, static values, or distinct programs): "
                    + ", ".join(f"{k} x{v}" for k, v in repeated.items())
                    + "."
                )
            lines.append("")
        env = self.environment
        if env:
            lines += [
                f"Ran {env.get('date_utc', '?')} on {env.get('backend', '?')} ({env.get('device_count', '?')} "
                f"device(s)), Python {env.get('python', '?')}, {env.get('platform', '?')}"
                + (", by the command:" if env.get("command") else "."),
                "",
            ]
            if env.get("command"):  # shell-quoted, alone in a code block: pasted back, it runs the same
                lines += [*_code_block(shlex.join(str(a) for a in env["command"])), ""]
        for n in self.notes:
            lines.append(f"- {n}")
        if self.figures:
            lines += ["", *[f"![{k}]({k}.png)" for k in self.figures]]
        if self.references:  # last, so every summary ends with what to cite (`attnflow cite NAME`)
            lines += ["", "## References", "", *[f"- {r}" for r in self.references]]
        lines.append("")
        return "\n".join(lines)

    def write(self, out_dir: str | Path) -> Path:
        """Write the report into ``out_dir``: trajectories (``.npz`` + ``.json``), figures (``.png``),
        ``summary.json`` (strict JSON: NaN and infinities as ``null``) and ``summary.md``; every
        file is written atomically."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for k, tr in self.trajectories.items():
            tr.save(out / f"{k}.npz")
        for k, fig in self.figures.items():
            save_figure(fig, out / f"{k}.png")
        payload = strict_json(self.to_dict()).encode()
        atomic_write(out / "summary.json", lambda f: f.write(payload))
        md = self.markdown().encode()
        atomic_write(out / "summary.md", lambda f: f.write(md))
        return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, float) for x in v):
        return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (list, tuple)) for x in v):
        return "[" + ", ".join(_fmt(list(x)) for x in v) + "]"  # rows of numbers at 4 digits
    return str(v)


def _short(v: Any, most: int = 80) -> str:
    """`_fmt`, cut to ``most`` characters (the whole value is in ``summary.json``)."""
    return _cut(_fmt(v), most)


def _cut(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[: most - 4] + " ..."


def _reused_chunks(counts: Any) -> str | None:
    """The sentence under the timings of a run that loaded sweep chunks computed earlier (an interrupted
    run, the shards of ``--merge``): its timings cover only the chunks it computed. ``counts`` is
    ``environment["sweep_chunks"]`` (``total``, ``computed``, ``loaded``); None when nothing was loaded."""
    if not isinstance(counts, Mapping) or not counts.get("loaded"):
        return None
    loaded, total, computed = int(counts["loaded"]), int(counts.get("total", 0)), int(counts.get("computed", 0))
    if not computed:
        return (
            f"Timings: this run computed none of its {total} sweep chunks, it loaded them from disk (computed "
            "earlier), so the timings include no sweep computation."
        )
    return (
        f"Timings: this run computed {computed} of its {total} sweep chunks and loaded {loaded} from disk "
        "(computed earlier), so the timings cover only part of the sweeps."
    )


def _code_block(text: str) -> list[str]:
    """``text`` as a fenced markdown code block, its fence longer than any run of backticks in it."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}bash", text, fence]


def _cell(text: Any) -> str:
    """A markdown table cell: ``|`` escaped (check names such as ``max |u - s|`` split the row)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True)
class Experiment:
    """A registered recipe: ``fn(config, quiet) -> Report`` with its configuration class."""

    name: str
    fn: Callable[[Any, bool], Report]
    config: type
    description: str
    package: str
    headline: bool = False
    sweeps: bool | None = None  # whether fn calls `sweep` (None: not said; see `attnflow.registry.runs_sweeps`)

    @property
    def defaults(self) -> Any:
        """The default configuration (an instance of the configuration class)."""
        return self.config()

    def options(self) -> dict[str, tuple[str, Any]]:
        """``{option: (type, default)}`` of the configuration class."""
        hints = typing.get_type_hints(self.config)
        return {
            f.name: (_type_name(hints[f.name]), getattr(self.defaults, f.name)) for f in dataclasses.fields(self.config)
        }

    def option_notes(self) -> dict[str, str]:
        """A one-line meaning of each option that has one: the field's ``metadata["help"]``, else
        the comment that ends the field's line in the configuration class's source
        (``u0: float = 1e-3  # initial strength``). Options without either are left out."""
        return option_notes(self.config)

    def run(self, overrides: Mapping[str, Any] | None = None, quiet: bool = True) -> Report:
        """Run the recipe on its defaults with ``overrides`` applied (`config_from`: values or
        ``--set`` strings, checked before running) and return its `Report`, with the warnings
        the run raised in its notes, its total time, its references and the compilations it
        made (`attnflow.count_compilations`)."""
        config = config_from(self.config, overrides or {}, self.name)
        t0 = time.perf_counter()
        caught: list = []
        try:
            with count_compilations() as compiled, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                report = self.fn(config, quiet)
        finally:  # shown as they would have been, also by a run that fails (often its cause)
            for w in list(caught):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        # a warning of the run (an unstable learning rate, a failed sweep point) is part of its
        # result: in the report's notes too
        for message in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught):
            report.notes.append(f"warning: {message}")
        report.timings.setdefault("total", time.perf_counter() - t0)
        report.environment = {**environment(), **report.environment}
        if not report.references:
            from .citations import experiment_keys, references

            report.references = references(experiment_keys(self.name, self.package))
        report.compilations = {
            "count": compiled.n,
            "seconds": compiled.seconds,
            "programs": len(compiled.by_name),
            "repeated": compiled.repeated(),
        }
        return report


def environment() -> dict[str, Any]:
    """Where and how a result was computed, as `Experiment.run` records it in ``summary.json``:
    the date (UTC), Python and the platform, JAX's backend, its devices and whether 64-bit mode
    was on (the command adds its own command line and options)."""
    import platform
    import sys
    from datetime import UTC, datetime

    import jax

    from .ode import x64_enabled

    devices = jax.devices()
    return {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in devices],
        "device_count": len(devices),
        "x64": x64_enabled(),
        "argv": list(sys.argv),
    }


_REGISTRY: dict[str, Experiment] = {}


def register(
    name: str,
    *,
    config: type,
    description: str,
    headline: bool = False,
    package: str | None = None,
    sweeps: bool | None = None,
):
    """Decorator registering ``fn(config, quiet) -> Report`` as experiment ``name``; ``config``
    is a dataclass whose fields (with defaults and type annotations) are the options.
    ``package`` (default: the theory package of ``fn``'s module) labels it in ``attnflow list``
    and picks the paper to cite. ``sweeps``: whether ``fn`` runs `attnflow.sweep` (``attnflow run
    --shard`` and ``--merge`` refuse an experiment registered with ``sweeps=False`` before
    running it); ``None`` (default) leaves it to `attnflow.registry.runs_sweeps`."""
    if sweeps not in (None, True, False):
        raise ValueError(f"sweeps of experiment {name!r} must be True, False or None, got {sweeps!r}")
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise ValueError(f"config of experiment {name!r} must be a dataclass, got {config!r}")

    def deco(fn):
        module = getattr(fn, "__module__", None) or "__main__"
        # the same function registering again is a re-import (a reloaded module): it replaces itself;
        # any other function under a taken name would silently shadow a built-in or another user's
        if name in _REGISTRY:
            old = _REGISTRY[name].fn
            where = f"{getattr(old, '__module__', '?')}.{getattr(old, '__qualname__', '?')}"
            if where != f"{module}.{getattr(fn, '__qualname__', '?')}":
                raise ValueError(
                    f"experiment {name!r} is already registered by {where}; register yours under another name"
                )
        pkg = package or (module.split(".")[1] if module.startswith("attnflow.") else module)
        _REGISTRY[name] = Experiment(name, fn, config, description, pkg, headline, sweeps)
        return fn

    return deco


def experiments() -> dict[str, Experiment]:
    """``{name: Experiment}`` of the experiments registered so far in this process (the
    ``attnflow`` command's are those of `attnflow.registry.load_all`)."""
    return dict(_REGISTRY)


def get_experiment(name: str) -> Experiment:
    """The registered experiment ``name``; ``ValueError`` naming the closest registered names
    (and listing all) when there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ValueError(f"unknown experiment {name!r}; {hint}known: {', '.join(sorted(_REGISTRY))}") from None


def parse_value(text: str) -> Any:
    """Parse a ``--set`` value: JSON (numbers, lists, true/false/null), ``nan``/``inf`` as floats, or a
    bare string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        low = text.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"):
            return float(low)  # a number all the same: the option's own check names what is wrong with it
        return text


def config_from(cls: type, overrides: Mapping[str, Any], name: str = "experiment") -> Any:
    """An instance of the configuration dataclass ``cls`` with ``overrides`` applied.

    Each value is read as the field's annotated type: a string (from ``--set key=value``) is
    parsed (JSON numbers and lists, ``true``/``false``, bare strings), lists become tuples,
    ints become floats where a float is expected. Unknown keys and values of the wrong type
    raise ``ValueError`` naming the option, its type and its default.
    """
    hints = typing.get_type_hints(cls)
    defaults = cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for k, v in overrides.items():
        if k not in fields:
            close = difflib.get_close_matches(k, list(fields), n=2, cutoff=0.6)
            close += [f for f in fields if f.lower() == k.lower() and f not in close]
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise ValueError(f"{name} has no option {k!r}; {hint}options: {', '.join(sorted(fields))}")
        tp = hints[k]
        try:
            values[k] = _coerce(v, tp)
        except _NotFinite:
            raise ValueError(f"option {k!r} of {name} must be a finite number, got {v!r}") from None
        except (TypeError, ValueError):
            example = shlex.quote(f"{k}={format_value(getattr(defaults, k))}")
            raise ValueError(
                f"option {k!r} of {name} expects {_type_name(tp)}, written as in --set {example} (the default); "
                f"got {v!r}"
            ) from None
    return dataclasses.replace(defaults, **values)


def format_value(v: Any) -> str:
    """``v`` written as ``--set key=VALUE`` reads it back (`parse_value`, `config_from`): JSON-like
    (``[0.04, 0.02, 0.01]``, ``null``, ``true``, ``1e-05``); a string as its text (JSON-quoted
    inside a list)."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, str):
        return v  # a str option takes the text as given
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return repr(float(v)) if math.isfinite(v) else json.dumps(float(v))
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(json.dumps(x) if isinstance(x, str) else format_value(x) for x in v) + "]"
    return str(v)


def option(default: Any, help: str) -> Any:
    """A field of an experiment's configuration with its default and its meaning, which
    ``attnflow show NAME`` prints (``dataclasses.field(default=..., metadata={"help": ...})``)."""
    return dataclasses.field(default=default, metadata={"help": help})


def option_notes(cls: type) -> dict[str, str]:
    """``{option: meaning}`` of the configuration dataclass ``cls``: each field's ``metadata["help"]``
    (`option`), else the comment that ends the field's line in the source of ``cls``
    (``u0: float = 1e-3  # initial strength``; for a field written over several lines, the comment
    ending its last line), else that of the dataclass ``cls`` inherits the field from (a subclass
    that changes a default keeps the meaning). Tool directives (``# noqa``, ``# type: ignore``) are
    no meaning; a class whose source cannot be read has only its ``help``."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's own line wins over the one it overrides
        if dataclasses.is_dataclass(klass):
            comments.update(_field_comments(klass))
    notes = {}
    for f in dataclasses.fields(cls):
        if "help" in f.metadata:
            notes[f.name] = str(f.metadata["help"])
        elif comments.get(f.name):
            notes[f.name] = comments[f.name]
    return notes


_DIRECTIVES = ("noqa", "type:", "pragma:", "fmt:", "pylint:", "mypy:", "pyright:", "ruff:")


def _field_comments(cls: type) -> dict[str, str]:
    """``{name: comment}`` for each annotated line ``name: T = ...  # comment`` of the class body of
    ``cls`` (its own source, `inspect.getsource`); empty when the source cannot be read or parsed."""
    import inspect
    import io
    import tokenize

    try:
        source = inspect.getsource(cls)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return {}
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}
    out: dict[str, str] = {}
    depth, body, statement = 0, None, []
    for tok in tokens:
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        if body is None and tok.type == tokenize.NAME and tok.string == "class":
            body = depth + 1  # the class statement (decorators come before it): its fields are one level in
        if tok.type not in (tokenize.NEWLINE, tokenize.ENDMARKER):
            statement.append(tok)
            continue
        words = [t for t in statement if t.type not in skip]
        if (
            body is not None
            and depth == body
            and len(words) >= 2
            and words[0].type == tokenize.NAME
            and words[1].string == ":"
        ):
            ending = [t for t in statement if t.type == tokenize.COMMENT and t.start[0] == tok.start[0]]
            text = ending[-1].string.lstrip("#").strip() if ending else ""
            if text and not text.lower().startswith(_DIRECTIVES):
                out[words[0].string] = text
        statement = []
    return out


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        args = typing.get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is typing.Literal:
        return "one of " + ", ".join(format_value(a) for a in typing.get_args(tp))
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


class _NotFinite(ValueError):
    """A float option given ``nan`` or ``inf``."""


def _coerce(v: Any, tp: Any) -> Any:
    """``v`` as a value of type ``tp`` (raises TypeError or ValueError)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return parse_value(v) if isinstance(v, str) else v
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(tp)
        if type(None) in arms and (v is None or (isinstance(v, str) and v.strip().lower() in ("null", "none"))):
            return None
        for arm in arms:
            if arm is type(None):
                continue
            try:
                return _coerce(v, arm)
            except (TypeError, ValueError):
                continue
        raise TypeError(v)
    if origin is typing.Literal:
        if v not in typing.get_args(tp):
            raise ValueError(v)
        return v
    if origin in (tuple, list):
        if isinstance(v, str):
            v = parse_value(v)
        if not isinstance(v, (list, tuple)):
            raise TypeError(v)
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return tuple(_coerce(x, item) for x in v)
    if tp is bool:
        if isinstance(v, str):
            v = parse_value(v)
        if not isinstance(v, bool):
            raise TypeError(v)
        return v
    if tp is int:
        if isinstance(v, str):
            v = parse_value(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(v)
        return v
    if tp is float:
        if isinstance(v, str):
            v = parse_value(v)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(v)
        if not math.isfinite(float(v)):
            raise _NotFinite(v)
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise TypeError(v)
        return v
    if isinstance(v, tp):
        return v
    raise TypeError(v)
