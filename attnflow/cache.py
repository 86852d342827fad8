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
cluster). JAX writes an entry in place, so a process could load another's half-written entry
and abort inside XLA; `use_compilation_cache` makes this process write each entry to a
temporary file and rename it into place (an atomic step on a local file system), so a reader
sees a whole entry or none. XLA aborts the process on an entry that is corrupt all the same
(as it can be when written by another program, or by XLA itself): while it loads an entry,
this process names it in a marker file, and `use_compilation_cache` deletes the entries named
by markers of processes that are gone (`remove_entries_that_crashed_a_load`), so that one bad
entry crashes one process, not every later one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import jax

__all__ = [
    "CACHE_ENV",
    "cache_dir",
    "use_compilation_cache",
    "clear_compilation_cache",
    "remove_entries_that_crashed_a_load",
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

    Changes JAX's process-wide configuration (``jax_compilation_cache_dir``): call it once at
    the start of a program. Returns the folder, or ``None`` when ``$ATTNFLOW_CACHE`` turns
    the cache off and no ``path`` is given. A folder that cannot be created is left alone
    (the cache stays off) and ``None`` is returned.
    """
    folder = Path(path).expanduser() if path is not None else cache_dir()
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    _write_entries_atomically()
    _mark_entries_while_loading(folder)
    remove_entries_that_crashed_a_load(folder)
    return folder


_LOADING = ".loading-"
"""Prefix of the marker a process leaves in the cache folder while it loads an entry
(``.loading-<host>-<pid>``)."""


def _mark_entries_while_loading(folder: Path) -> bool:
    """Make this process name the entry it loads in ``<folder>/.loading-<host>-<pid>`` for as long as
    XLA takes to load it. XLA aborts the process on an entry that is corrupt (rather than
    raising), so a marker left behind by a process that is gone names an entry that crashed a
    load: `remove_entries_that_crashed_a_load` deletes it, and the program compiles afresh.
    Returns whether the marking is installed (it wraps JAX's ``get_executable_and_time``)."""
    try:
        from jax._src import compilation_cache
    except ImportError:
        return False
    get = getattr(compilation_cache, "get_executable_and_time", None)
    if get is None:
        return False
    get = getattr(get, "__wrapped__", get) if getattr(get, "_attnflow_marking", False) else get

    def marked_get(cache_key: str, *args: Any, **kwargs: Any) -> Any:
        marker = os.path.join(str(folder), f"{_LOADING}{socket.gethostname()}-{os.getpid()}")
        try:
            with open(marker, "w") as fh:
                fh.write(cache_key)
        except OSError:
            return get(cache_key, *args, **kwargs)
        try:
            return get(cache_key, *args, **kwargs)
        finally:
            with contextlib.suppress(OSError):
                os.remove(marker)

    marked_get._attnflow_marking = True  # type: ignore[attr-defined]
    marked_get.__wrapped__ = get  # type: ignore[attr-defined]
    compilation_cache.get_executable_and_time = marked_get
    return True


def remove_entries_that_crashed_a_load(path: str | os.PathLike | None = None) -> list[str]:
    """Delete the cache entries that a process crashed while loading (named by the markers of
    processes that are gone, `_mark_entries_while_loading`), and those markers; returns the
    keys removed. `use_compilation_cache` calls it, so the next process compiles such a
    program afresh instead of crashing on it again."""
    folder = Path(path).expanduser() if path is not None else cache_dir()
    if folder is None or not folder.is_dir():
        return []
    removed = []
    host = socket.gethostname()
    for marker in folder.glob(f"{_LOADING}*"):
        # another machine's process (a folder shared by a cluster's nodes) cannot be looked up here
        marker_host, _, pid_text = marker.name[len(_LOADING) :].rpartition("-")
        if marker_host != host or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid == os.getpid() or _alive(pid):
            continue
        with contextlib.suppress(OSError):
            key = marker.read_text().strip()
            if key and "/" not in key and os.sep not in key:
                for suffix in ("-cache", "-atime"):
                    with contextlib.suppress(FileNotFoundError):
                        (folder / f"{key}{suffix}").unlink()
                removed.append(key)
            marker.unlink()
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (a crashed process whose
    parent has not collected it yet, as a test worker's that a new worker replaces)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # no /proc (macOS): alive
        return True


def _write_entries_atomically() -> bool:
    """Make JAX's file cache write each entry to a temporary file and rename it into place.

    JAX's ``LRUCache.put`` writes ``<key>-cache`` in place (without its eviction lock when the
    size is unbounded, the default): a process that reads the entry meanwhile, or after the
    writer crashed, gets a truncated executable, which XLA aborts on instead of compiling
    again. Local folders with unbounded size only; any other case (eviction on, which takes
    JAX's file lock; a remote path; a JAX without this class) keeps JAX's own ``put``.
    Returns whether the atomic writer is installed.
    """
    try:
        from jax._src import lru_cache
    except ImportError:
        return False
    cls = getattr(lru_cache, "LRUCache", None)
    put = getattr(cls, "put", None)
    suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
    if cls is None or put is None or not isinstance(suffix, str):
        return False
    if getattr(put, "_attnflow_atomic", False):
        return True

    def atomic_put(self, key: str, value: bytes) -> None:
        folder = os.fspath(getattr(self, "path", ""))
        if not key or getattr(self, "eviction_enabled", True) or "://" in folder or not folder:
            return put(self, key, value)
        target = os.path.join(folder, f"{key}{suffix}")
        if os.path.exists(target):
            return
        partial = os.path.join(folder, f".{key}{suffix}.{os.getpid()}.{threading.get_ident()}.partial")
        try:
            with open(partial, "wb") as fh:
                fh.write(value)
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.remove(partial)

    atomic_put._attnflow_atomic = True  # type: ignore[attr-defined]
    atomic_put.__wrapped__ = put  # type: ignore[attr-defined]
    cls.put = atomic_put
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
