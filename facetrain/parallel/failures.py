"""When a collective fails: which rank, in which collective, and the backend's own reason, in one line.

Two kinds of failure look alike in a traceback and call for opposite reports:

- This rank's own: NCCL cannot use the network interface or InfiniBand, two ranks share a GPU, a CUDA
  call inside NCCL failed (`NCCL error in: ..., unhandled system error`, `invalid usage`, ...). The rank
  reports a `CollectiveError` with NCCL's key line (its reason and its `Last error:` line) and leaves
  that line at the rendezvous store, where the other ranks read it.
- A peer's: gloo's "Connection reset/closed by peer" or receive timeout, NCCL's "remote process exited",
  the watchdog's timeout. None of them names the rank. The rank checks in at the store and waits a few
  seconds: a rank that left its reason there is named with it, ranks that never check in are the lost
  ones. The store (the one `dims.init_parallel` joined through) is independent of the failed process
  group, so it still answers. torch's agent cannot do this: ranks may run without one, and it names
  the first rank to exit, often a bystander, not the peer a live rank lost.

A failure of neither kind is also checked in, so a lost rank is still named; when every rank answered,
it is reported as this rank's own, with its key line. NCCL's watchdog may instead abort the process after
`parallel.timeout_s` before Python sees an exception; torchrun's agent then names the rank, and NCCL's
flight recorder (docs/training.md, "NCCL errors") says which collective each rank was in.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import torch.distributed as dist

from facetrain.errors import CollectiveError, FacetrainError, PeerLost
from facetrain.heads.collectives import named_collective

# what a backend says when the other side of a collective is gone or silent
_PEER_GONE_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "pair closure",
    "Timed out waiting",
    "remote process exited",
    "ncclRemoteError",
    "Watchdog caught collective operation timeout",
)
_COLLECTIVE_FAILURE_MARKERS = (*_PEER_GONE_MARKERS, "gloo", "NCCL")
CHECK_IN_SECONDS = 5.0
_FAILED = "failed:"
_HINT = "NCCL_DEBUG=INFO prints NCCL's own account (docs/training.md, NCCL errors)"


def is_collective_failure(error: BaseException) -> bool:
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _COLLECTIVE_FAILURE_MARKERS)


def collective_name(error: BaseException) -> str | None:
    """The collective that failed: facetrain's own name for it, else the OpType NCCL's watchdog gives."""
    named = named_collective(error)
    if named is not None:
        return named
    found = re.search(r"OpType=(\w+)", str(error))
    return found.group(1).lower() if found else None


def _clean(line: str) -> str:
    line = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", line)  # gloo's source locations
    line = re.sub(r"^Got the following error when running the callback: \w+: ", "", line)
    line = re.sub(r"NCCL error in: \S+:\d+, ", "NCCL ", line)  # NCCL's source location
    line = re.sub(r" \(run with NCCL_DEBUG=\w+ for details\)", "", line)
    line = re.sub(r", NCCL version \S+$", "", line)
    return line.split(". This is typically")[0].strip()


def key_line(error: BaseException) -> str:
    """The backend's reason in one line: its first line without source paths and boilerplate, and NCCL's
    `Last error:` line, which names the interface, device or peer at fault."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    head, detail = _clean(lines[0]), None
    for index, line in enumerate(lines):
        if line.startswith("Last error:"):
            detail = line.removeprefix("Last error:").strip() or next(iter(lines[index + 1 :]), None)
    if detail and detail != "Unknown NCCL Error" and detail not in head:
        return f"{head}: {_clean(detail)}"
    return head


def is_own_failure(error: BaseException) -> bool:
    """NCCL failed on this rank for a reason of its own, not because a peer went away."""
    text = str(error)
    return "NCCL error" in text and not any(m in text for m in _PEER_GONE_MARKERS)


_check_in_store: list[dist.Store] = []  # the rendezvous store this process joined through


def keep_check_in_store(store: dist.Store) -> None:
    _check_in_store[:] = [store]


def _key(of_rank: int) -> str:  # the store is this attempt's (attempt_store.py)
    return f"facetrain/after_failure/{of_rank}"


def _check_in(rank: int, world_size: int, status: str, wait_s: float) -> dict[int, str | None] | None:
    """Leave `status` at the store and wait up to `wait_s` (0: not at all) for the other ranks' statuses;
    rank -> its status, None for a rank that did not check in; None when the store is gone too."""
    try:
        store = _check_in_store[0]
        store.set_timeout(timedelta(seconds=max(wait_s, 1.0)))
        store.set(_key(rank), status)
        missing = set(range(world_size)) - {rank}
        deadline = time.monotonic() + wait_s
        while missing and time.monotonic() < deadline:
            missing = {r for r in missing if not store.check([_key(r)])}
            if missing:
                time.sleep(0.1)
        return {
            r: None if r in missing else store.get(_key(r)).decode() for r in range(world_size) if r != rank
        }
    except (RuntimeError, ValueError, IndexError):  # no store, or its host (rank 0 without an agent) is gone
        return None


def collective_failure_error(
    error: BaseException, rank: int, world_size: int, step: int | None, wait_s: float = CHECK_IN_SECONDS
) -> FacetrainError:
    """The one-line error this rank reports after `error`, a failed collective."""
    where = f" at step {step}" if step is not None else ""
    collective = collective_name(error)
    what = f"{collective} failed" if collective else "a collective failed"
    reason = key_line(error)
    hint = f"; {_HINT}" if "NCCL" in str(error) else ""
    own = CollectiveError(
        f"rank {rank} of {world_size}: {what}{where}: {reason}{hint}; once fixed, resume with --resume auto"
    )
    if is_own_failure(error):
        _check_in(rank, world_size, f"{_FAILED}{what}{where}: {reason}", wait_s=0)
        return own
    statuses = _check_in(rank, world_size, "alive", wait_s)
    if statuses is None:
        return PeerLost(
            f"lost the rank hosting the rendezvous store (rank 0 without torchrun's agent){where}: it died "
            f"or stopped answering ({reason}); once fixed, resume with --resume auto"
        )
    failed = {r: s.removeprefix(_FAILED) for r, s in statuses.items() if s and s.startswith(_FAILED)}
    lost = [r for r, status in sorted(statuses.items()) if status is None]
    if failed:
        first = min(failed)
        return PeerLost(f"rank {first} failed, and this rank stopped with it: {failed[first]}")
    if lost:
        ranks = ", ".join(str(r) for r in lost)
        return PeerLost(
            f"lost rank {ranks}{where}{f' in {collective}' if collective else ''}: it died or stopped "
            f"answering ({reason}); its own output says why if it could still print; once fixed, "
            "resume with --resume auto"
        )
    return own


def join_failure_error(error: BaseException, rank: int, world_size: int, backend: str) -> CollectiveError:
    """Joining the group failed: with `device_id` NCCL builds its communicator here, so its set-up errors
    (interface, InfiniBand, a GPU two ranks share) surface here, with their key line."""
    hint = f"; {_HINT}" if backend == "nccl" else ""
    return CollectiveError(
        f"rank {rank} of {world_size}: joining the {backend} process group failed: {key_line(error)}{hint}"
    )
