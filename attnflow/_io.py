"""Files and folders: atomic writes, JSON of arrays, and where data files are found.

The package never reads a path relative to its own source files: data comes from an
explicit folder or from the ``ATTNFLOW_DATA`` environment variable (`data_path`).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = [
    "atomic_write",
    "json_default",
    "strict_json",
    "data_path",
    "optional_import",
    "DATA_ENV",
    "progress_bar",
    "save_arrays",
]

DATA_ENV = "ATTNFLOW_DATA"
"""Environment variable naming the folder of data files (corpora) when no folder is given."""


LOG_INTERVAL = 10.0
"""Seconds between redraws of a progress bar written to a log file rather than a terminal."""


def progress_bar(**kwargs: Any) -> Any:
    """A tqdm bar on stderr (``kwargs`` as tqdm's). On a terminal it redraws as usual; written to
    a log file (stderr not a terminal, as under Slurm) it redraws at most every `LOG_INTERVAL`
    seconds, so a long run leaves a few lines rather than thousands of carriage returns."""
    import sys

    from tqdm.auto import tqdm

    stream = sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        kwargs.setdefault("mininterval", LOG_INTERVAL)
    return tqdm(file=stream, **kwargs)


def save_arrays(path: Path, arrays: dict[str, np.ndarray], meta: Any) -> Path:
    """Write ``arrays`` to ``path`` (``.npz``) and ``meta`` to ``path`` with suffix ``.json``, each
    atomically (`atomic_write`); ``path``'s folder is created. The format of `Trajectory.save`
    and `SweepResult.save`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]
    atomic_write(path.with_suffix(".json"), lambda f: f.write(strict_json(meta).encode()))
    return path


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` through ``write(f)`` on a temporary file in the same folder, then rename.

    An interrupted write never leaves a half-written file; the file gets the permissions
    a plain ``open`` would give (``0o666`` less the umask).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


@functools.cache
def _umask() -> int:
    # the only portable way to read the umask is to set it; done once, at the first write
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def json_default(obj: Any) -> Any:
    """``json.dumps(default=...)`` for arrays, NumPy scalars and paths (anything else: ``repr``)."""
    import jax

    if isinstance(obj, (np.ndarray, jax.Array)):
        return np.asarray(obj).tolist()
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def strict_json(obj: Any, indent: int | None = 2) -> str:
    """``obj`` as strict JSON (RFC 8259, readable by any JSON reader): NaN and infinities become
    ``null``, arrays lists, NumPy scalars numbers."""
    import json
    import math

    def clean(x: Any) -> Any:
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (str, int, bool)) or x is None:
            return x
        return clean(json.loads(json.dumps(json_default(x))))

    return json.dumps(clean(obj), indent=indent, allow_nan=False)


def data_path(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The data file ``name`` in ``data_dir``, or else in the folder named by ``$ATTNFLOW_DATA``.

    A path that exists as given (absolute, or relative to the working directory) is returned
    as is. Raises ``FileNotFoundError`` naming both places looked at when the file is missing.
    """
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        raise TypeError(f"data file name must be a non-empty str or path, got {name!r}")
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"data_dir must be a str or path, got {data_dir!r}")
    p = Path(name)
    if p.is_file():
        return p
    env = os.environ.get(DATA_ENV)
    folders = [("data_dir", data_dir), (f"${DATA_ENV}", env)]
    looked = []
    for label, folder in folders:
        if folder:
            cand = Path(folder) / name
            if cand.is_file():
                return cand
            looked.append(f"{label} = {folder}")
        else:
            looked.append(f"{label} not set")
    raise FileNotFoundError(
        f"data file {name!r} not found ({'; '.join(looked)}). Pass the folder that holds it as data_dir "
        f"(on the command line: --data-dir DIR, for any experiment) or set the environment variable {DATA_ENV}."
    )


def optional_import(module: str, what: str) -> Any:
    """``import module`` for a feature (``what``) that needs an optional dependency; a clear
    ``ImportError`` naming the extra to install when it is absent."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f'{what} needs the optional dependency {module}: pip install "attnflow[xarray]"') from None
