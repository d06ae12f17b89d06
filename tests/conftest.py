import os
from pathlib import Path

import pytest
import torch

from tests.train_helpers import trained_tiny_run

# Without a GPU, Triton's kernels (tests/test_head_triton.py) run through its interpreter. Triton reads
# the variable when a function is decorated, its own library's included, so it is set before anything
# in the session imports triton (torch.compile may); spawned ranks inherit it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data` beside the checkout (ORL faces, LFW pairs, johns); the test skips without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real face data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2-step run of tiny_config with one checkpoint (run/), beside it the synthetic set it
    trained on (synth/, 12 identities) and its config (run.yaml). Trained once for every test that only
    needs a finished run; a test that changes anything in it copies it first."""
    return trained_tiny_run(tmp_path_factory.mktemp("finished"), steps=2, checkpoint_every=2)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test: spawned ranks and small models are faster without contention,
    and float sums do not depend on the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_quiet_from_an_earlier_test(monkeypatch):
    """`-q` sets FACETRAIN_QUIET for the command's lifetime and its context's close restores it; a
    test that only parses a command line (click's make_context, tests/test_readme.py) never closes
    that context, so each test starts and ends without the variable."""
    monkeypatch.delenv("FACETRAIN_QUIET", raising=False)
