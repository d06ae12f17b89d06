"""The store a torchrun attempt joins its process group through, with keys no earlier attempt wrote.

Kept because torch's env:// rendezvous does not cover it: torchrun's agent hands every attempt of a job
the same store (`TORCHELASTIC_USE_AGENT_STORE`, which torch's env:// connects to without a prefix), and
it still holds the keys of earlier attempts: gloo's addresses, the join barrier's counters. An attempt that
read them would connect to dead workers or pass the barrier early, so each attempt keeps its keys
under a prefix of its own. Nothing in the workers' environment names the attempt the same on every
node: TORCHELASTIC_RESTART_COUNT is each agent's own count, and a node that joins a running job (it
grows back) starts at 0 while the others have restarted. So the ranks agree on a fresh prefix in the
store itself: rank 0 draws one and publishes it; every other rank first deletes what the key held (it
may be an earlier attempt's), then takes the value that appears, and acknowledges it; rank 0 keeps
publishing until every rank has acknowledged its value. Workers of earlier attempts are gone by then
(the agent stops them before a new rendezvous), so whatever appears after the delete is this attempt's.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import torch.distributed as dist

ATTEMPT_KEY = "facetrain/attempt"
POLL_S = 0.05


def attempt_store(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The agent's `store` for this attempt, under the prefix its ranks agreed on."""
    prefix = agree_on_prefix(store, rank, world_size, time.monotonic() + timeout.total_seconds())
    return dist.PrefixStore(f"facetrain/attempt_{prefix}", store)


def agree_on_prefix(store: dist.Store, rank: int, world_size: int, deadline: float) -> str:
    """Rank 0's freshly drawn prefix, known to every rank when this returns on every rank."""
    if rank == 0:
        prefix = uuid.uuid4().hex
        waiting = set(range(1, world_size))
        while waiting:
            store.set(ATTEMPT_KEY, prefix)  # again and again: a rank that arrives later deletes it
            waiting = {other for other in waiting if _read(store, f"{ATTEMPT_KEY}/ack/{other}") != prefix}
            _wait(deadline, f"ranks {sorted(waiting)} did not take this attempt's store prefix")
        return prefix
    store.delete_key(ATTEMPT_KEY)
    while (prefix := _read(store, ATTEMPT_KEY)) is None:
        _wait(deadline, "rank 0 did not publish this attempt's store prefix")
    store.set(f"{ATTEMPT_KEY}/ack/{rank}", prefix)
    return prefix


def _read(store: dist.Store, key: str) -> str | None:
    if not store.check([key]):
        return None
    try:
        return store.get(key).decode()
    except dist.DistError:  # deleted between the check and the read
        return None


def _wait(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise dist.DistStoreError(f"{what} within parallel.timeout_s")
    time.sleep(POLL_S)
