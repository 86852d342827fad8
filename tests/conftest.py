"""Test entry point: float64 on (the package never switches it on at import), and the data folder.

Real-data tests read the corpora beside the checkout, in ``../shared/data``: this file points
``$ATTNFLOW_DATA`` there when the folder exists (tests that need it skip with a message when it
does not).
"""

import os
from pathlib import Path

import jax
import pytest
from jaxtyping import install_import_hook

jax.config.update("jax_enable_x64", True)

# the shapes stated in the signatures of these modules are checked at run time in the tests
with install_import_hook(["attnflow.analysis"], "beartype.beartype"):
    import attnflow.analysis  # noqa: F401

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if SHARED_DATA.is_dir():
    os.environ.setdefault("ATTNFLOW_DATA", str(SHARED_DATA))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"../shared/data not found at {SHARED_DATA}; real-corpus tests need it beside the checkout")
    return SHARED_DATA
