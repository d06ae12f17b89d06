"""What a first NCCL run would hit, pinned on the CPU (issue 22, items 1-3).

1. Host-side work (writing the run config, generating and scanning the data, verification, finishing a
   checkpoint) waits on the CPU control group, never in a device collective; NCCL joins with its device
   set first and bound (`device_id`).
2. A failed collective keeps its real cause: NCCL's key line, the rank and the collective; a rank is
   called lost only when it never checks in, the cause is the rank that claimed the failure first at the
   store, never a reading of the message; `@record` leaves the traceback of an unexpected error.
3. With nccl, more ranks on a node than visible GPUs are refused in one line, at the launcher and at init.

NCCL itself cannot run here: its errors are the messages torch builds from NCCL's results, raised as the
`DistBackendError` torch raises them as.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from facetrain.errors import CollectiveError, EveryRankError, FacetrainError, PeerLost
from facetrain.heads import collectives
from facetrain.parallel import dims, failures, launch
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.parallel.failures import (
    collective_failure_error,
    collective_name,
    is_collective_failure,
    key_line,
)
from facetrain.train.run_config import load_config
from facetrain.train.step_gate import STOP_SIGNALS
from tests.support.distributed import run_distributed
from tests.support.train_helpers import tiny_config

SOCKET_INTERFACE = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
    "Last error:\n"
    "Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=eth9)"
)
DUPLICATE_GPU = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage (run with "
    "NCCL_DEBUG=WARN for details), NCCL version 2.27.3\n"
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
    "Last error:\n"
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"
)
REMOTE_EXITED = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2010, remote process exited "
    "or there was a network error, NCCL version 2.27.3\n"
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
    "Last error:\n"
    "NET/IB : Got completion from peer 10.0.0.2<40405> with status=12 opcode=0 len=0 vendor err 129"
)
WATCHDOG = (
    "[PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout: WorkNCCL("
    "SeqNum=41, OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=300000) ran for 300013 milliseconds "
    "before timing out."
)
GLOO_CLOSED = (  # as gloo raised it in this torch when the peer process exited
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
    "[127.0.0.1]:47490. This is typically caused by a remote worker crashing. Check the logs of the remote "
    "worker before reporting an error. GLHF!"
)


# item 1: host-side waits


def _recording(calls: list, name: str, real, group_at: int):
    """`real`, noting for each call whether its group (keyword, or positional `group_at`) is the control
    group the test made."""

    def call(*args, **kwargs):
        group = kwargs["group"] if "group" in kwargs else (args[group_at] if len(args) > group_at else None)
        calls.append((name, group))
        return real(*args, **kwargs)

    return call


def host_waits_worker(rank: int, world_size: int) -> dict:
    control = dist.new_group(backend="gloo")
    calls: list = []
    real_broadcast, real_all_reduce = dist.broadcast, dist.all_reduce
    dist.broadcast = _recording(calls, "broadcast", real_broadcast, 2)
    dist.all_reduce = _recording(calls, "all_reduce", real_all_reduce, 99)
    try:
        order = collectives.primary_first(lambda: rank, group=control)
        scanned = collectives.on_every_rank(lambda: f"index of rank {rank}", group=control)
    finally:
        dist.broadcast, dist.all_reduce = real_broadcast, real_all_reduce

    def outcome(fn) -> str:
        try:
            return f"returned {fn()}"
        except FacetrainError as error:
            return f"{type(error).__name__}: {error}"

    def fail_on(*ranks: int):
        def fn():
            if rank in ranks:
                raise FacetrainError(f"data missing on rank {rank}")
            return "ok"

        return fn

    real_get_backend = dist.get_backend
    dist.get_backend = lambda group=None: "nccl"
    try:
        collectives.primary_first(lambda: None, group=None)
        refused = None
    except ValueError as error:
        refused = str(error)
    finally:
        dist.get_backend = real_get_backend
    return {
        "groups": [(name, group is control) for name, group in calls],
        "order": order,
        "scanned": scanned,
        "rank_0_fails_first": outcome(lambda: collectives.primary_first(fail_on(0), group=control)),
        "rank_1_fails_alone": outcome(lambda: collectives.on_every_rank(fail_on(1), group=control)),
        "both_fail": outcome(lambda: collectives.on_every_rank(fail_on(0, 1), group=control)),
        "device_group_refused": refused,
    }


def test_host_side_work_waits_on_the_control_group_and_failures_still_reach_every_rank():
    rank_0, rank_1 = run_distributed(host_waits_worker, 2)
    for result in (rank_0, rank_1):
        assert result["groups"] and all(on_control for _, on_control in result["groups"]), result["groups"]
        assert {name for name, _ in result["groups"]} == {"broadcast", "all_reduce"}
        assert "gloo group (ParallelDims.control_group), not nccl" in result["device_group_refused"]
    assert (rank_0["order"], rank_1["order"]) == (0, 1)  # rank 0's result there, its own run elsewhere
    assert (rank_0["scanned"], rank_1["scanned"]) == ("index of rank 0", "index of rank 1")
    assert rank_0["rank_0_fails_first"] == "FacetrainError: data missing on rank 0"
    assert rank_1["rank_0_fails_first"].startswith("PeerFailed")
    assert rank_0["rank_1_fails_alone"].startswith("PeerFailed")
    assert rank_1["rank_1_fails_alone"] == "FacetrainError: data missing on rank 1"
    assert rank_0["both_fail"] == "FacetrainError: data missing on rank 0"  # printed once, by rank 0
    assert rank_1["both_fail"].startswith("PeerFailed")


def trainer_control_group_worker(rank: int, world_size: int, config_path: str) -> dict:
    """A whole 2-step run with verification, with a control group other than the default group (as on
    NCCL), noting the group of every host-side wait."""
    import facetrain.train.trainer as trainer

    control = dist.new_group(backend="gloo")
    calls: list = []
    real = {name: getattr(collectives, name) for name in ("primary_first", "on_every_rank", "broadcast_")}
    real_init = trainer.init_parallel
    trainer.init_parallel = lambda *a, **k: dataclasses.replace(real_init(*a, **k), control_group=control)
    collectives.primary_first = _recording(calls, "primary_first", real["primary_first"], 99)
    collectives.on_every_rank = _recording(calls, "on_every_rank", real["on_every_rank"], 99)
    collectives.broadcast_ = _recording(calls, "broadcast_", real["broadcast_"], 2)
    try:
        summary = trainer.train(load_config(config_path))
    finally:
        trainer.init_parallel = real_init
        for name, fn in real.items():
            setattr(collectives, name, fn)
    waits = [(name, group is control) for name, group in calls]
    return {"steps": summary["steps"], "evaluated": bool(summary["evaluation"]), "waits": waits}


def test_the_trainer_waits_for_rank_0_on_the_control_group(tmp_path):
    config = tiny_config(
        tmp_path,
        "run",
        train={"steps": 2},
        checkpoint={"every": 2},
        eval={"pairs": str(tmp_path / "synth" / "heldout" / "pairs.txt"), "every": 1, "batch_size": 16},
    )
    for result in run_distributed(trainer_control_group_worker, 2, str(config), timeout=120):
        assert result["steps"] == 2 and result["evaluated"]
        names = [name for name, _ in result["waits"]]
        assert names.count("on_every_rank") == 1  # the data scan
        # run config, data generation, pairs check, then clearing and finishing each checkpoint
        assert names.count("primary_first") >= 5
        assert names.count("broadcast_") == names.count("primary_first") + 2  # and the 2 verifications
        assert all(on_control for _, on_control in result["waits"]), result["waits"]


class _Recorder:
    def __init__(self):
        self.events: list = []


def _fake_gpus(monkeypatch, count: int, join_error: Exception | None = None) -> _Recorder:
    """A machine with `count` GPUs as far as init_parallel can tell, recording what it asks of CUDA and
    of init_process_group (which raises `join_error`, or stops the test's init there)."""
    recorder = _Recorder()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda device: recorder.events.append(("set_device", device))
    )

    def join(**kwargs):
        recorder.events.append(("init_process_group", kwargs))
        raise join_error or KeyboardInterrupt

    monkeypatch.setattr(dist, "init_process_group", join)
    monkeypatch.setattr(  # torch's rendezvous, without a store server to wait for
        dist,
        "rendezvous",
        lambda url, rank, world_size, timeout: iter([(dist.HashStore(), rank, world_size)]),
    )
    return recorder


def _rank_env(monkeypatch, rank: int, world: int, local_world: int) -> None:
    for name, value in {
        "RANK": rank,
        "WORLD_SIZE": world,
        "LOCAL_RANK": rank,
        "LOCAL_WORLD_SIZE": local_world,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": 29599,
    }.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def test_nccl_joins_on_its_own_device_set_first_and_reports_a_failed_join_with_its_key_line(monkeypatch):
    recorder = _fake_gpus(monkeypatch, 2, join_error=dist.DistBackendError(DUPLICATE_GPU))
    _rank_env(monkeypatch, rank=1, world=2, local_world=2)
    with pytest.raises(CollectiveError) as raised:
        dims.init_parallel(backend="auto")
    assert str(raised.value) == (
        "rank 1 of 2: joining the nccl process group failed: NCCL invalid usage: Duplicate GPU detected : "
        "rank 1 and rank 0 both on CUDA device 1000; NCCL_DEBUG=INFO prints NCCL's own account "
        "(docs/training.md, NCCL errors)"
    )
    (first, device), (second, kwargs) = recorder.events
    assert (first, device, second) == ("set_device", torch.device("cuda", 1), "init_process_group")
    assert kwargs["backend"] == "nccl" and kwargs["device_id"] == torch.device("cuda", 1)


# item 2: the real cause of a failed collective


def test_key_lines_keep_the_backends_reason_without_paths_or_boilerplate():
    assert key_line(dist.DistBackendError(SOCKET_INTERFACE)) == (
        "NCCL unhandled system error: Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=eth9)"
    )
    assert key_line(dist.DistBackendError(DUPLICATE_GPU)) == (
        "NCCL invalid usage: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"
    )
    assert key_line(RuntimeError(GLOO_CLOSED)) == "Connection closed by peer [127.0.0.1]:47490"
    assert collective_name(dist.DistBackendError(WATCHDOG)) == "allreduce"


def test_a_collective_failure_is_told_by_type_or_by_facetrains_tag_never_by_its_text():
    backend_errors = (SOCKET_INTERFACE, DUPLICATE_GPU, REMOTE_EXITED, WATCHDOG)
    assert all(is_collective_failure(dist.DistBackendError(m)) for m in backend_errors)
    assert is_collective_failure(dist.DistNetworkError("Connection reset by peer"))
    assert is_collective_failure(dist.DistStoreError("Socket Timeout"))
    assert not is_collective_failure(RuntimeError(GLOO_CLOSED))  # gloo's text alone decides nothing
    with pytest.raises(RuntimeError) as raised, collectives.naming("all_reduce"):
        raise RuntimeError(GLOO_CLOSED)  # as gloo raises it inside a facetrain collective
    assert is_collective_failure(raised.value) and collective_name(raised.value) == "all_reduce"


def ddp_forward_worker(rank: int, world_size: int) -> str | None:
    """Rank 1 never runs the forward, so rank 0's buffer broadcast before it fails (a 3 s timeout, or the
    connection closing when rank 1 leaves the group first), as it does when a peer dies mid-run."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=3))
    model = wrap_data_parallel(torch.nn.BatchNorm1d(4), torch.device("cpu"), group)
    failed = None
    if rank == 0:
        try:
            model(torch.randn(3, 4))
        except RuntimeError as error:
            failed = collective_name(error) if is_collective_failure(error) else f"untagged: {error}"
    collectives.barrier()  # on the default group, which stayed whole
    dist.destroy_process_group(group)
    return failed


def test_ddps_buffer_broadcast_before_the_forward_fails_as_a_collective():
    """gloo fails DDP's broadcast as a plain RuntimeError; a peer killed just then was once reported
    as an unexpected error with a traceback instead of as lost."""
    assert run_distributed(ddp_forward_worker, 2) == ["broadcast", None]


def _fresh_check_in(store: dist.Store, name: str) -> None:
    """A check-in of its own for each failure the worker plays (a process fails once; the pool's ranks
    serve many tests)."""
    prefix = [f"{name}/{time.time_ns()}"]
    dist.broadcast_object_list(prefix, src=0)
    failures.keep_check_in_store(dist.PrefixStore(prefix[0], store))


def failure_report_worker(rank: int, world_size: int) -> dict:
    """First rank 1 is silent while rank 0's gloo collective fails; then rank 1's NCCL all-reduce fails
    on its own (its interface) and rank 0 sees the peer go away after it, as a peer's failure follows its
    cause."""
    reports = {}
    store = failures._check_in_store[0]
    _fresh_check_in(store, "silent_peer")
    if rank == 0:
        lost = collective_failure_error(RuntimeError(GLOO_CLOSED), 0, 2, step=3, wait_s=1.0)
        reports["silent_peer"] = (type(lost).__name__, str(lost))
    collectives.barrier()
    _fresh_check_in(store, "own_failure")
    if rank == 1:
        real = dist.all_reduce

        def interface_down(*args, **kwargs):
            raise dist.DistBackendError(SOCKET_INTERFACE)

        dist.all_reduce = interface_down
        try:
            collectives.all_reduce_(torch.ones(2))
        except dist.DistBackendError as error:
            failed = error
        finally:
            dist.all_reduce = real
    else:
        failures._check_in_store[0].wait([failures.FIRST_FAILURE_KEY])  # rank 1 failed first
        failed = dist.DistBackendError(REMOTE_EXITED)
    report = collective_failure_error(failed, rank, 2, step=7)
    reports["own_failure"] = (type(report).__name__, str(report))
    failures.keep_check_in_store(store)
    return reports


def test_an_nccl_error_is_reported_with_its_key_line_and_a_silent_peer_as_lost():
    rank_0, rank_1 = run_distributed(failure_report_worker, 2)
    assert rank_0["silent_peer"] == (
        "PeerLost",
        "lost rank 1 at step 3: it died or stopped answering (Connection closed by peer [127.0.0.1]:47490); "
        "its own output says why if it could still print; once fixed, resume with --resume auto",
    )
    cause = "all_reduce failed at step 7: NCCL unhandled system error: Bootstrap : no socket interface found "
    assert rank_1["own_failure"] == (
        "CollectiveError",
        f"rank 1 of 2: {cause}(NCCL_SOCKET_IFNAME=eth9); NCCL_DEBUG=INFO prints NCCL's own account "
        "(docs/training.md, NCCL errors); once fixed, resume with --resume auto",
    )
    assert rank_0["own_failure"] == (
        "PeerLost",
        f"rank 1 failed, and this rank stopped with it: {cause}(NCCL_SOCKET_IFNAME=eth9)",
    )
    for _, message in (rank_1["own_failure"], rank_0["own_failure"]):
        assert "lost" not in message and "\n" not in message and ".cpp" not in message


def two_survivors_worker(rank: int, world_size: int) -> tuple[str, str] | None:
    """Rank 2 is gone; ranks 0 and 1 both see their collective fail. Whichever claims the failure
    first, neither is blamed: both name the rank that never checked in."""
    store = failures._check_in_store[0]
    _fresh_check_in(store, "two_survivors")
    report = None
    if rank < 2:
        error = collective_failure_error(RuntimeError(GLOO_CLOSED), rank, 3, step=5, wait_s=2.0)
        report = (type(error).__name__, str(error))
    collectives.barrier()
    failures.keep_check_in_store(store)
    return report


def test_every_survivor_names_the_lost_rank_whichever_claimed_the_failure_first():
    rank_0, rank_1, _ = run_distributed(two_survivors_worker, 3)
    for report in (rank_0, rank_1):
        assert report[0] == "PeerLost" and report[1].startswith("lost rank 2 at step 5: it died or stopped")


def test_an_unexpected_error_in_a_rank_leaves_its_traceback_in_the_error_file(tmp_path, monkeypatch):
    import facetrain.train.trainer as trainer
    from facetrain.train.rank import train_rank

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr(trainer, "init_parallel", broken)
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}  # the rank's own, for its life
    try:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            train_rank(load_config(tiny_config(tmp_path)), None, print)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["message"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "in broken" in recorded["extraInfo"]["py_callstack"]


# item 3: a GPU per nccl rank


@pytest.mark.parametrize(
    "backend, ranks, gpus, resolved",
    [("auto", 2, 2, "nccl"), ("auto", 4, 0, "gloo"), ("gloo", 4, 1, "gloo"), ("nccl", 1, 8, "nccl")],
)
def test_a_backend_that_fits_the_gpus_resolves(backend, ranks, gpus, resolved):
    assert dims.check_backend(backend, ranks, gpus) == resolved


@pytest.mark.parametrize(
    "backend, ranks, gpus, message",
    [
        (
            "auto",
            4,
            2,
            "4 ranks on this node but 2 visible GPU(s): nccl needs a GPU per rank; start at most 2",
        ),
        ("nccl", 3, 1, "3 ranks on this node but 1 visible GPU(s)"),
        ("nccl", 1, 0, "parallel.backend=nccl needs CUDA devices"),
        ("mpi", 1, 0, "parallel.backend must be auto, gloo or nccl, got 'mpi'"),
    ],
)
def test_more_nccl_ranks_than_gpus_are_refused_in_one_line(backend, ranks, gpus, message):
    with pytest.raises(EveryRankError) as raised:
        dims.check_backend(backend, ranks, gpus)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_the_launcher_refuses_before_any_rank_starts(monkeypatch):
    started = []
    monkeypatch.setattr(launch, "visible_gpus", lambda: 2)
    monkeypatch.setattr(launch, "elastic_launch", lambda *args, **kwargs: started.append(args))
    with pytest.raises(EveryRankError, match="4 ranks on this node but 2 visible GPU"):
        launch.launch_local(4, print, "never", backend="auto")
    assert started == []


def test_init_refuses_more_local_ranks_than_gpus_before_touching_a_gpu(monkeypatch):
    recorder = _fake_gpus(monkeypatch, 2)
    _rank_env(monkeypatch, rank=0, world=8, local_world=4)
    with pytest.raises(EveryRankError, match="4 ranks on this node but 2 visible GPU"):
        dims.init_parallel(backend="auto")
    assert recorder.events == []


def test_the_launcher_shows_a_ranks_own_collective_failure_as_the_cause(tmp_path, monkeypatch):
    """A CollectiveError is its rank's cause; the bystander's PeerLost is printed only without one."""
    from facetrain.cli.user_errors import report_user_error

    monkeypatch.setenv(launch.LAUNCHED_ENV, "1")
    for rank, error in ((0, PeerLost("rank 1 failed, and this rank stopped with it: ...")),
                        (1, CollectiveError("rank 1 of 2: all_reduce failed at step 7: NCCL ..."))):  # fmt: skip
        error_file = tmp_path / "run_x" / "attempt_0" / str(rank) / "error.json"  # where torch puts it
        error_file.parent.mkdir(parents=True)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
        monkeypatch.setenv("RANK", str(rank))
        assert report_user_error(error) == 2
    lines, code = launch.explain_failures({}, launch._read_reports(tmp_path), 2)
    assert code == 2 and lines == [
        "error: rank 1 of 2 failed; stopped ranks [0]",
        "[rank 1] error: rank 1 of 2: all_reduce failed at step 7: NCCL ...",
    ]
