"""When a collective fails: which rank was lost, said in one line instead of a backend traceback.

Gloo reports a dead peer as "Connection reset by peer [address]" and a hung one as a receive timeout
after `parallel.timeout_s`, neither naming the rank. After such a failure each surviving rank checks in
at the rendezvous store (hosted by torchrun's agent, or by rank 0 without one) and waits a few seconds
for the others; the ranks that never check in are the lost ones. The store is independent of the
failed process group, so it still answers.

NCCL is different: its watchdog aborts the process after `parallel.timeout_s`, before Python sees an
exception, and torchrun's agent then reports the rank that failed.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import torch.distributed as dist

from facetrain.errors import PeerLost

# what gloo and nccl put in the errors of a collective whose peer is gone or silent
_COLLECTIVE_FAILURE_MARKERS = (
    "gloo",
    "Connection reset by peer",
    "Connection closed by peer",
    "pair closure",
    "Timed out waiting",
    "NCCL",
)
CHECK_IN_SECONDS = 5.0


def is_collective_failure(error: BaseException) -> bool:
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _COLLECTIVE_FAILURE_MARKERS)


def _short_reason(error: BaseException) -> str:
    """Gloo's message without its source location and its boilerplate advice."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)  # source locations
    text = re.sub(r"^Got the following error when running the callback: \w+: ", "", text)
    return text.split(". This is typically")[0]


def lost_ranks(rank: int, world_size: int, wait_s: float = CHECK_IN_SECONDS) -> list[int] | None:
    """The ranks that did not check in at the store within `wait_s`; None when the store is gone too."""

    def key(of_rank: int) -> str:  # the store is this attempt's (dims._attempt_store)
        return f"facetrain/after_failure/{of_rank}"

    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=wait_s))
        store.set(key(rank), "alive")
        missing = set(range(world_size)) - {rank}
        deadline = time.monotonic() + wait_s
        while missing and time.monotonic() < deadline:
            missing = {r for r in missing if not store.check([key(r)])}
            if missing:
                time.sleep(0.1)
        return sorted(missing)
    except (RuntimeError, ValueError):  # the store's host is gone (rank 0 hosts it without an agent)
        return None


def peer_lost_error(error: BaseException, rank: int, world_size: int, step: int | None) -> PeerLost:
    """The one-line error a surviving rank reports after `error`, a failed collective."""
    where = f" at step {step}" if step is not None else ""
    lost = lost_ranks(rank, world_size)
    if lost is None:
        who = "the rank hosting the rendezvous store (rank 0 without torchrun's agent)"
    elif lost:
        who = "rank " + ", ".join(str(r) for r in lost)
    else:
        who = "another rank (every rank answered afterwards: one of them failed on its own)"
    return PeerLost(
        f"lost {who}{where}: it died or stopped answering ({_short_reason(error)}); its own output "
        "says why if it could still print; once fixed, resume with --resume auto"
    )
