"""JAX's persistent compilation cache, for programs that run attnflow again and again.

A compiled XLA program is kept on disk and reused by later processes that compile the same
program (same function, shapes, static arguments and compiler options), so a second
``attnflow reproduce`` or test run skips most of its compilation. This is JAX's own cache
(``jax_compilation_cache_dir``); attnflow only chooses where it lives.

It changes JAX's configuration for the whole process, so it is an explicit opt-in:
the ``attnflow`` command turns it on at start-up, the test suite too, and a program of
yours calls `use_compilation_cache` once at its start. No other attnflow function turns it
on.

Where: ``$ATTNFLOW_CACHE`` if set, else ``$XDG_CACHE_HOME/attnflow/jax``, else
``~/.cache/attnflow/jax``. ``ATTNFLOW_CACHE=off`` (or ``0``, ``none``) turns it off for the
command and the tests. Clear it with ``attnflow cache --clear`` or `clear_compilation_cache`
(or delete the folder).

Several processes may share the folder (the test suite's workers, the shards of a sweep on a
cluster): JAX reads an entry that another process is still writing as an error, warns, and
compiles that program itself.

A folder this process cannot write in (a shared cache made read-only) is used for reading
only: one warning says so, and JAX is told to write no entry (it would otherwise warn once for
every program it compiles).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import jax

__all__ = [
    "CACHE_ENV",
    "cache_dir",
    "use_compilation_cache",
    "clear_compilation_cache",
]

CACHE_ENV = "ATTNFLOW_CACHE"
"""Environment variable: the folder of the compilation cache, or ``off`` to disable it."""

_OFF = ("off", "0", "none", "false", "no")

MIN_COMPILE_SECONDS = 0.0
"""Programs that compile faster than this are not written to the cache. Zero: every program
is stored, since even the small eager operations of an experiment (a hundred of them in a
run) load faster than they compile."""


def cache_dir() -> Path | None:
    """The folder of the compilation cache: ``$ATTNFLOW_CACHE``, else the user's cache folder;
    ``None`` when ``$ATTNFLOW_CACHE`` turns it off."""
    env = os.environ.get(CACHE_ENV)
    if env is not None and env.strip().lower() in _OFF:
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnflow" / "jax"


def use_compilation_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``path`` (default: `cache_dir`).

    Changes JAX's process-wide configuration (``jax_compilation_cache_dir``,
    ``jax_persistent_cache_min_compile_time_secs``): call it once at the start of a program.
    Returns the folder, or ``None`` when ``$ATTNFLOW_CACHE`` turns the cache off and no ``path``
    is given. A folder that cannot be created is left alone (the cache stays off) and ``None``
    is returned. A folder that exists but cannot be written in is used read-only: the programs
    in it are loaded, none compiled now is saved (the minimum compile time to save one is set
    to infinity, so that JAX does not try and warn for each), and one `UserWarning` says so.
    """
    folder = Path(path).expanduser() if path is not None else cache_dir()
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    writable = _writable(folder)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS if writable else math.inf)
    if not writable:
        warnings.warn(
            f"the compilation cache {folder} is read-only: programs compiled now are not saved in it (reading "
            f"the programs it holds still works); set ${CACHE_ENV} to a folder you can write in to keep them",
            stacklevel=2,
        )
    return folder


def _writable(folder: Path) -> bool:
    """Whether this process can create a file in ``folder`` (a file made and removed: permission
    bits, a read-only mount and access control lists all count)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".attnflow-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return True


def clear_compilation_cache(path: str | os.PathLike | None = None) -> int:
    """Delete the cached programs in ``path`` (default: `cache_dir`); returns how many files
    were removed."""
    folder = Path(path).expanduser() if path is not None else cache_dir()
    if folder is None or not folder.is_dir():
        return 0
    n = sum(1 for p in folder.rglob("*") if p.is_file())
    shutil.rmtree(folder)
    return n
