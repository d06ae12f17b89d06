import functools
import inspect
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from tests.support.fault_helpers import uninterrupted_two_rank_run
from tests.support.train_helpers import trained_tiny_run

# Without a GPU, Triton's kernels (tests/test_head_triton.py) run through its interpreter. Triton reads
# the variable when a function is decorated, its own library's included, so it is set before anything
# in the session imports triton (torch.compile may); spawned ranks inherit it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# xdist workers run in-process tests side by side, one core each: one intra-op thread per worker.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

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
    return trained_tiny_run(tmp_path_factory.mktemp("finished"), steps=2, every=2)


@pytest.fixture(scope="session")
def uninterrupted_two_ranks(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank run that test_faults_ranks's restarted run and test_stop_signals's
    stopped runs end on bit for bit (tests/support/fault_helpers.py): trained once for both, on the
    ranks worker that runs them."""
    return uninterrupted_two_rank_run(tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture
def one_thread():
    """One intra-op thread for the test: spawned ranks and small models are faster without contention,
    and float sums do not depend on the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def stop_signals_as_they_were():
    """A `facetrain train` run in the test's own process (click's runner) ends by ignoring the stop
    signals for the rest of the process (`step_gate.ignore_stop_signals`). Every process the session
    starts later would inherit SIG_IGN through exec, and a rank told to stop would go on: each test
    ends with the session's handlers put back."""
    stop_signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)  # not imported: see TRITON_INTERPRET
    handlers = {sig: signal.getsignal(sig) for sig in stop_signals}
    yield
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def no_quiet_from_an_earlier_test(monkeypatch):
    """`-q` sets FACETRAIN_QUIET for the command's lifetime and its context's close restores it; a
    test that only parses a command line (click's make_context, tests/test_readme.py) never closes
    that context, so each test starts and ends without the variable."""
    monkeypatch.delenv("FACETRAIN_QUIET", raising=False)


# What a test, a fixture it uses or a function of tests/ either calls says when it starts several
# ranks or processes that run at once. A test whose ranks are started by a script or a documented
# command it runs (tools/demo.sh, README blocks) says so with @pytest.mark.ranks.
STARTS_RANKS = re.compile(
    r"\b(run_distributed|WorkerPool|torchrun|torch\.distributed\.run|slurm_cluster|mp\.spawn|nnodes)\b"
    r"|--nproc|\"nproc\""
)


# Ranks tests that mostly wait, each in a group of its own beside the `ranks` group: the real-Slurm
# tests wait for daemons, requeues and slurmctld's time-limit check (every 30 s) and train a few dozen
# steps. Under `--dist loadgroup` the worker that runs the in-process tests takes such a group when its
# queue reaches it (xdist queues the groups largest first, so late), instead of the ranks worker after
# everything else: the suite's critical path loses their minutes and the 2 cores carry at most two
# multi-rank tests at once, one of them mostly asleep.
WAITING_GROUPS = {"tests.test_slurm": "ranks-slurm"}


def pytest_addoption(parser):
    parser.addoption(
        "--ranks",
        choices=("run", "only", "skip"),
        default="run",
        help="tests marked `ranks` (several processes at once, found by tests/conftest.py's STARTS_RANKS or "
        "marked by hand): run them with the rest (default), run only them, or skip them. Under "
        "`--dist loadgroup` (`make test`) they run one after another on one worker, beside the rest.",
    )


def starts_ranks(item) -> bool:
    if item.get_closest_marker("ranks"):
        return True
    functions = [getattr(item, "function", None)]
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        functions += [definition.func for definition in definitions]
    return any(_starts_ranks(function) for function in functions if function is not None)


_SCANNING: set = set()


@functools.cache
def _starts_ranks(function) -> bool:
    """Whether `function`'s source, or that of a tests/ function it names, matches STARTS_RANKS."""
    try:
        if STARTS_RANKS.search(inspect.getsource(function)):
            return True
    except (OSError, TypeError):  # no Python source (a builtin)
        return False
    if function in _SCANNING:  # a function that calls itself, or two that call each other
        return False
    _SCANNING.add(function)
    try:
        namespace = getattr(function, "__globals__", {})
        return any(
            _starts_ranks(called)
            for name in _names(getattr(function, "__code__", None))
            if inspect.isfunction(called := namespace.get(name)) and called.__module__.startswith("tests")
        )
    finally:
        _SCANNING.discard(function)


def _names(code) -> set[str]:
    """The global names a function's code uses, its inner functions' and lambdas' included."""
    if code is None:
        return set()
    names = set(code.co_names)
    for constant in code.co_consts:
        if inspect.iscode(constant):
            names |= _names(constant)
    return names


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Marks the tests that start ranks, keeps the half `--ranks` asks for, and groups the tests for
    `--dist loadgroup` (what `make test` runs): the ranks tests are one group, run one after another on
    one worker while the other workers take the in-process tests a module at a time (a module's shared
    fixtures stay in one worker) and the WAITING_GROUPS."""
    choice = config.getoption("ranks")
    kept, left = [], []
    for item in items:
        ranks = starts_ranks(item)
        if ranks:
            item.add_marker("ranks")
        module = item.module.__name__
        group = WAITING_GROUPS.get(module, "ranks") if ranks else module
        item.add_marker(pytest.mark.xdist_group(group))
        (kept if choice == "run" or (choice == "only") == ranks else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_sessionfinish(session, exitstatus):
    """`--ranks only|skip` picks half of the suite: a half that selects nothing has not failed."""
    if session.config.getoption("ranks") != "run" and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK
