"""The experiment registry: imports every package's ``experiments`` module, and a user's own.

This is the one place that knows the theory packages; the core does not import them. It
also knows which of their experiments run `attnflow.sweep` (`SWEEPING`), so that ``attnflow
run NAME --shard I/N`` and ``--merge`` refuse an experiment without sweeps before running it.

A user's experiments (functions decorated with `attnflow.report.register` in their own module)
join the built-in ones from three places, read by `load_all`: the modules or ``.py`` files
given to the command's ``--import`` option, those listed in ``$ATTNFLOW_EXPERIMENTS``
(comma-separated), and the modules an installed package names under the entry-point group
``attnflow.experiments`` (`ENTRY_POINT_GROUP`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from .report import Experiment, experiments, get_experiment

EXPERIMENT_MODULES = (
    "attnflow.deeplinear.experiments",
    "attnflow.qkov.experiments",
    "attnflow.qkov.text_experiments",
    "attnflow.focus.experiments",
    "attnflow.heads.experiments",
    "attnflow.derive.experiments",
    "attnflow.finite_size_experiment",
)


SWEEPING = frozenset(
    {
        "derive-committee",
        "finite-size",
        "focus-finite",
        "focus-rates",
        "focus-symmetry",
        "heads-activations",
        "heads-ode-vs-sgd",
        "heads-specialisation-time",
        "qkov-fixed-attention",
        "qkov-optimal-ratio",
        "qkov-parametrisations",
        "qkov-ratio-sweep",
        "qkov-reduced",
    }
)
"""The experiments of `EXPERIMENT_MODULES` whose function calls `attnflow.sweep`, directly or
through attnflow functions that do (``tests/test_cli_registry.py`` checks this set against the
source). The others run no sweep, whatever their options."""


def runs_sweeps(exp: Experiment) -> bool | None:
    """Whether experiment ``exp`` runs `attnflow.sweep`: its ``register(..., sweeps=...)`` if
    given, else for the experiments of `EXPERIMENT_MODULES` membership of `SWEEPING`; None
    (not known) for an experiment registered elsewhere without ``sweeps=``."""
    if exp.sweeps is not None:
        return exp.sweeps
    if getattr(exp.fn, "__module__", None) in EXPERIMENT_MODULES:
        return exp.name in SWEEPING
    return None


EXPERIMENTS_ENV = "ATTNFLOW_EXPERIMENTS"
"""Environment variable: comma-separated modules (``mylab.experiments``) or ``.py`` files whose
registered experiments `load_all` adds to the built-in ones."""

ENTRY_POINT_GROUP = "attnflow.experiments"
"""Entry-point group through which an installed package adds its experiments: in its
``pyproject.toml``, ``[project.entry-points."attnflow.experiments"] mylab = "mylab.experiments"``."""


def import_experiments(source: str, where: str = "--import") -> None:
    """Import ``source``, a module name (``mylab.experiments``, found on ``sys.path`` or in the
    working folder) or the path of a ``.py`` file, so that the experiments it registers with
    `attnflow.report.register` join the registry. A file
    is imported as the module named by its stem (``half_time.py``: ``half_time``), its folder
    first on ``sys.path`` while it loads (so it may import its neighbours). ``ValueError`` naming
    ``where`` and ``source`` when there is no such module or file; an error raised by the
    module's own code propagates."""
    text = source.strip()
    if not text:
        raise ValueError(f"{where}: empty module name")
    path = Path(text)
    if text.endswith(".py") or os.sep in text or (os.altsep and os.altsep in text):
        if not path.is_file():
            raise ValueError(f"{where} {source!r}: no such file")
        name = path.stem
        if not name.isidentifier():
            raise ValueError(f"{where} {source!r}: the file's name must be a Python identifier to import it")
        resolved = str(path.resolve())
        loaded = sys.modules.get(name)
        if loaded is not None:
            if getattr(loaded, "__file__", None) == resolved:
                return
            raise ValueError(
                f"{where} {source!r}: a module named {name!r} is already imported (from "
                f"{getattr(loaded, '__file__', None) or 'built-in'}); rename the file"
            )
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            raise ValueError(f"{where} {source!r}: cannot import this file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: pickling and dataclasses look the module up
        folder = str(path.resolve().parent)
        sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            sys.path.remove(folder)
        return
    try:
        _import_here(text)
    except ModuleNotFoundError as err:
        if err.name is not None and text.split(".")[: len(err.name.split("."))] == err.name.split("."):
            raise ValueError(
                f"{where} {source!r}: no module named {err.name!r} (give an importable module or the path of a "
                ".py file)"
            ) from None
        raise


def _import_here(module: str) -> None:
    """Import ``module``, looking in the working folder too, as ``python -m`` would: the
    ``attnflow`` command's own ``sys.path`` starts at its script's folder, not the user's."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if err.name != module.split(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, here)
        try:
            importlib.import_module(module)
        finally:
            sys.path.remove(here)


def _env_sources() -> list[str]:
    return [s.strip() for s in os.environ.get(EXPERIMENTS_ENV, "").split(",") if s.strip()]


def load_all(imports: Iterable[str] = ()) -> dict[str, Experiment]:
    """``{name: Experiment}`` of every registered experiment: the built-in ones (`EXPERIMENT_MODULES`),
    then those of the installed packages' ``attnflow.experiments`` entry points, of
    ``$ATTNFLOW_EXPERIMENTS`` and of ``imports`` (modules or ``.py`` files, see
    `import_experiments`), imported in that order."""
    for mod in EXPERIMENT_MODULES:
        importlib.import_module(mod)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        import_experiments(ep.value.split(":")[0], where=f"entry point {ep.name!r} of group {ENTRY_POINT_GROUP!r}")
    for source in _env_sources():
        import_experiments(source, where=f"${EXPERIMENTS_ENV}")
    for source in imports:
        import_experiments(source)
    return experiments()


def headline() -> list[Experiment]:
    """The headline experiment of each package, in registry order."""
    return [e for e in load_all().values() if e.headline]


__all__ = [
    "ENTRY_POINT_GROUP",
    "EXPERIMENTS_ENV",
    "EXPERIMENT_MODULES",
    "SWEEPING",
    "get_experiment",
    "headline",
    "import_experiments",
    "load_all",
    "runs_sweeps",
]
