"""Test entry point: float64 on (the package never switches it on at import), JAX's persistent
compilation cache on (in attnflow's cache folder, for this process and the subprocesses the tests
start; ``ATTNFLOW_CACHE=off`` turns it off), and the data folder.

Real-data tests read the corpora beside the checkout, in ``../shared/data``: this file points
``$ATTNFLOW_DATA`` there when the folder exists (tests that need it skip with a message when it
does not).
"""

import ctypes
import gc
import os
from pathlib import Path

# as the attnflow command does (attnflow_command.py), before Equinox is imported: Diffrax's
# compiled-in checks without host callbacks, so JAX's persistent cache can store the solves
os.environ.setdefault("EQX_ON_ERROR", "nan")

import jax
import pytest
from jaxtyping import install_import_hook

from attnflow.cache import MIN_COMPILE_SECONDS, use_compilation_cache

jax.config.update("jax_enable_x64", True)
_CACHE = use_compilation_cache()
if _CACHE is not None:  # subprocesses (docs blocks, examples, the CLI) read these at import
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_CACHE)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(MIN_COMPILE_SECONDS)

# the shapes stated in the signatures of these modules are checked at run time in the tests
with install_import_hook(["attnflow.analysis"], "beartype.beartype"):
    import attnflow.analysis  # noqa: F401

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if SHARED_DATA.is_dir():
    os.environ.setdefault("ATTNFLOW_DATA", str(SHARED_DATA))


# A test process keeps every program it compiled (JAX's and Equinox's in-memory caches), and
# glibc keeps the memory that compiling freed: over the suite a worker grew past 7 GB. After
# each test the freed memory goes back to the system, and past this resident size the caches
# are dropped too (programs needed again load from the persistent cache, or compile again).
MAX_RESIDENT_BYTES = int(float(os.environ.get("ATTNFLOW_TEST_MAX_RSS_GB", "8")) * 2**30)


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


# Each program XLA:CPU keeps loaded holds about three memory mappings (its code, read-only and
# writable sections), and Linux allows a process vm.max_map_count of them (65,530 by default).
# A worker that kept every program of half the suite reached 65,217: XLA's next load or compile
# failed to map memory, and the worker died (a segfault or abort while the error was raised).
# Past half the limit the caches are dropped, which unmaps the programs.
MAX_MAPPINGS = _max_map_count() // 2


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0  # no /proc (macOS): caches are kept


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as fh:
            return fh.read().count(b"\n")
    except OSError:
        return 0  # no /proc (macOS): caches are kept


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc
    _LIBC = None


def _return_freed_memory() -> None:
    """glibc keeps freed memory in its heaps; ``malloc_trim`` hands it back to the system."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


_clear_above = [MAX_RESIDENT_BYTES]


def pytest_runtest_teardown(item, nextitem):
    _return_freed_memory()
    if _resident_bytes() > _clear_above[0] or _mappings() > MAX_MAPPINGS:
        jax.clear_caches()
        gc.collect()
        _return_freed_memory()
        # what the clearing could not free must not make every later test clear (and recompile)
        _clear_above[0] = max(MAX_RESIDENT_BYTES, _resident_bytes() + 2**30)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"../shared/data not found at {SHARED_DATA}; real-corpus tests need it beside the checkout")
    return SHARED_DATA
