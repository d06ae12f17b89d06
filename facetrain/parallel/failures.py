"""When a collective fails: which rank, in which collective, and the backend's own reason, in one line.

A failed collective looks alike on every rank that was in it, and nothing in it says whether this rank
is the cause or a bystander: gloo raises a plain `RuntimeError` ("Connection closed by peer", a receive
timeout), NCCL a `DistBackendError` for its own faults (interface, InfiniBand, a GPU two ranks share)
and for a peer's exit alike, the watchdog a timeout naming no rank. Its text is not read to decide.
What counts as a collective failure is told by type: torch's `DistError`s, and any error facetrain's
own collectives (`heads.collectives.naming`), DDP's broadcasts before a forward (`data_parallel.py`) or
the training step's gradient all-reduce tagged on its way out. Whose failure it is, the ranks settle
among themselves at the rendezvous store (the one `dims.init_parallel` joined through, independent of
the failed process group, so it still answers):

- Each failing rank leaves its reason at the store and claims the first failure there (an atomic
  compare-and-set). A peer's failure follows its cause, so the claim goes to the rank whose own call
  failed, or to a survivor when the cause died or hung.
- Each then waits a few seconds for the others to check in. Ranks that never do are the lost ones,
  named as lost. When every rank answered, the claimant reports the failure as its own, with its key
  line, and every other rank names the claimant with the reason it left.

torch's agent cannot do this: ranks may run without one, and it names the first rank to exit, often a
bystander, not the peer a live rank lost. A rank whose own call fails while its peers still wait for it
inside a collective cannot tell them from hung ranks within the check-in; it names them as not
answering, with its own reason in the same line. NCCL's watchdog may instead abort the process after
`parallel.timeout_s` before Python sees an exception; torchrun's agent then names the rank, and NCCL's
flight recorder (docs/training.md, "NCCL errors") says which collective each rank was in.

Reading the message is left to formatting alone: `key_line` cuts the backend's reason to one line
(NCCL's `Last error:` line names the interface, device or peer at fault) and `collective_name` takes the
OpType the watchdog names when no facetrain collective did.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import torch.distributed as dist

from facetrain.errors import CollectiveError, FacetrainError, PeerLost
from facetrain.heads.collectives import named_collective

CHECK_IN_SECONDS = 5.0
FIRST_FAILURE_KEY = "facetrain/after_failure/first"  # the rank that claimed the failure first
_HINT = "NCCL_DEBUG=INFO prints NCCL's own account (docs/training.md, NCCL errors)"


def is_collective_failure(error: BaseException) -> bool:
    """torch's distributed errors, and any error a facetrain collective tagged (gloo raises RuntimeError)."""
    return isinstance(error, dist.DistError) or named_collective(error) is not None


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


_check_in_store: list[dist.Store] = []  # the rendezvous store this process joined through


def keep_check_in_store(store: dist.Store) -> None:
    _check_in_store[:] = [store]


def _key(of_rank: int) -> str:  # the store is this attempt's (attempt_store.py)
    return f"facetrain/after_failure/{of_rank}"


def _check_in(
    rank: int, world_size: int, reason: str, wait_s: float
) -> tuple[int, dict[int, str | None]] | None:
    """Leave `reason` at the store, claim the first failure unless another rank did, and wait up to
    `wait_s` for the other ranks' reasons. Returns the first failure's rank and rank -> its reason (None
    for a rank that did not check in); None when the store is gone too."""
    try:
        store = _check_in_store[0]
        store.set_timeout(timedelta(seconds=max(wait_s, 1.0)))
        store.set(_key(rank), reason)
        first = int(store.compare_set(FIRST_FAILURE_KEY, "", str(rank)).decode())
        missing = set(range(world_size)) - {rank}
        deadline = time.monotonic() + wait_s
        while missing and time.monotonic() < deadline:
            missing = {r for r in missing if not store.check([_key(r)])}
            if missing:
                time.sleep(0.1)
        reasons = {r: None if r in missing else store.get(_key(r)).decode() for r in range(world_size)}
        return first, reasons
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
    hint = f"; {_HINT}" if "NCCL" in str(error) else ""  # the advice only: NCCL's own log explains it
    checked_in = _check_in(rank, world_size, f"{what}{where}: {reason}", wait_s)
    if checked_in is None:
        return PeerLost(
            f"lost the rank hosting the rendezvous store (rank 0 without torchrun's agent){where}: it died "
            f"or stopped answering ({reason}); once fixed, resume with --resume auto"
        )
    first, reasons = checked_in
    lost = [r for r, left in sorted(reasons.items()) if left is None]
    if lost:
        ranks = ", ".join(str(r) for r in lost)
        return PeerLost(
            f"lost rank {ranks}{where}{f' in {collective}' if collective else ''}: it died or stopped "
            f"answering ({reason}); its own output says why if it could still print; once fixed, "
            "resume with --resume auto"
        )
    if first != rank:
        return PeerLost(f"rank {first} failed, and this rank stopped with it: {reasons[first]}")
    return CollectiveError(
        f"rank {rank} of {world_size}: {what}{where}: {reason}{hint}; once fixed, resume with --resume auto"
    )


def join_failure_error(error: BaseException, rank: int, world_size: int, backend: str) -> CollectiveError:
    """Joining the group failed: with `device_id` NCCL builds its communicator here, so its set-up errors
    (interface, InfiniBand, a GPU two ranks share) surface here, with their key line."""
    hint = f"; {_HINT}" if backend == "nccl" else ""
    return CollectiveError(
        f"rank {rank} of {world_size}: joining the {backend} process group failed: {key_line(error)}{hint}"
    )
