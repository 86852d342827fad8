"""Test entry point: float64 on (the package never switches it on at import)."""

from pathlib import Path

import jax
import pytest

jax.config.update("jax_enable_x64", True)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"../shared/data not found at {SHARED_DATA}; real-corpus tests need it beside the checkout")
    return SHARED_DATA
