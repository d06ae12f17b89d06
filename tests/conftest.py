from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data` beside the checkout (ORL faces, LFW pairs, johns); the test skips without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real face data not found at {SHARED_DATA}")
    return SHARED_DATA
