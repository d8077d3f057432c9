"""Processes of a run: one, or the ranks `torchrun` (or `accelerate launch`) started.

corelens never starts processes itself. Under `torchrun --nproc-per-node N -m corelens ...` every rank reads
WORLD_SIZE / RANK / LOCAL_RANK from the environment, joins one gloo process group (plain TCP, so the same
code runs on CPUs, GPUs and across nodes through torchrun's c10d rendezvous) and uses it only for barriers;
the small Python objects the ranks exchange (prompt lengths before the loop, per-rank statistics at the end)
pass through the launch's key-value store around a barrier. No tensor ever crosses either, so NCCL is not
needed even on GPUs.

Examples:
    >>> from corelens.runs.dist import Dist, current
    >>> current()  # a plain process: rank 0 of 1
    Dist(rank=0, world=1, local_rank=0, local_world=1)
    >>> Dist().gather("x")
    ['x']
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
from dataclasses import dataclass
from datetime import timedelta

# How long a rank waits for the others at one collective before it reports the ones that did not answer
# (seconds; docs/running.md, torchrun). Every rank reaches the closing barrier only after its share, so the limit also
# bounds how unequal two shares may take: prompt-length balancing keeps that well under it. A frozen rank is
# thus reported after 10 minutes, not after hours.
TIMEOUT_ENV = "CORELENS_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600


@dataclass(frozen=True)
class Dist:
    """This process's place among the ranks of a run (rank 0 of 1 outside torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        """Return True on rank 0, the process that writes the run's tables, figures and manifest."""
        return self.rank == 0

    @property
    def label(self) -> str:
        """Return "rank R of W" (empty for a single process), for error messages."""
        return f"rank {self.rank} of {self.world}" if self.world > 1 else ""

    def barrier(self) -> None:
        """Wait until every rank gets here (no-op for one process)."""
        if self.world > 1:
            _barrier(self)

    def gather(self, obj: object) -> list:
        """Return every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        # Each rank leaves its object in the launch's key-value store before the barrier and reads the others'
        # after it: the barrier is the only collective, so a rank that stops answering is named there.
        return _barrier(self, pickle.dumps(obj))


_BARRIERS = itertools.count()  # every rank passes the same barriers in the same order


def _barrier(me: Dist, payload: bytes | None = None) -> list:
    """Wait for every rank; after the timeout, raise naming the ranks that never arrived or never left.

    A plain gloo barrier, not `monitored_barrier`: gloo's barrier fails at once when a peer's process ends
    ("Connection closed by peer"), while the monitored one waits out the whole timeout. Each rank notes its
    arrival (with its `payload`, if any) and its departure in the launch's key-value store, so that a rank
    that froze (alive, silent) is named by the ranks that waited for it, wherever it froze. Returns every
    rank's payload, in rank order (empty without one).
    """
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    n, store = next(_BARRIERS), _get_default_store()
    key = f"corelens/barrier/{n}"
    if payload is not None:
        store.set(f"{key}/payload/{me.rank}", payload)
    store.set(f"{key}/{me.rank}", "1")
    try:
        dist.barrier()
    except RuntimeError as err:
        if not _timed_out(str(err)):
            raise  # a peer's process ended: its connection closed (cli.py says so)
        raise RuntimeError(f"{err}\n{_absent(me, store, key)}") from None
    store.set(f"{key}/left/{me.rank}", "1")
    # Every payload was stored before its rank arrived: reading them waits for no rank.
    return [] if payload is None else [pickle.loads(store.get(f"{key}/payload/{r}")) for r in range(me.world)]


def _absent(me: Dist, store, key: str) -> str:
    """Return which ranks a timed-out barrier waited for: those that never arrived, else those inside it.

    A rank that arrived and froze inside the barrier never leaves it; the others that did not leave either
    are waiting as this rank is, and cannot be told from it, so it is named only when it is the one.
    """
    missing = [r for r in range(me.world) if not store.check([f"{key}/{r}"])]
    if missing:
        return f"ranks {', '.join(map(str, missing))} failed to reach the barrier"
    inside = [r for r in range(me.world) if r != me.rank and not store.check([f"{key}/left/{r}"])]
    if len(inside) == 1:
        return f"ranks {inside[0]} froze inside the barrier"
    return "every rank reached the barrier"  # several wait inside it: which one froze is not known here


def _timed_out(text: str) -> bool:
    """Return True for gloo's error of a collective that waited out its timeout."""
    return "Timed out" in text or "timed out" in text


def timeout() -> timedelta:
    """Return how long a collective waits for the other ranks (CORELENS_DIST_TIMEOUT seconds, default 600)."""
    return timedelta(seconds=_env_int(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def launched() -> bool:
    """Return True when this process is one of several ranks started by torchrun / accelerate launch."""
    return _env_int("WORLD_SIZE", 1) > 1


def current() -> Dist:
    """Return this process's `Dist`, joining the gloo process group on first use under torchrun."""
    if not launched():
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timeout())
        # Leave the group before the interpreter exits: a gloo group torn down with its threads still
        # running aborts the process ("terminate called without an active exception").
        atexit.register(close)
    return Dist(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        local_rank=_env_int("LOCAL_RANK", 0),
        local_world=_env_int("LOCAL_WORLD_SIZE", 1),
    )


def close() -> None:
    """Leave the process group (all ranks together), if this process joined one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def balance(costs: list[float], world: int) -> list[list[int]]:
    """Return, per rank, the indices of the items it takes: longest first to the least-loaded rank.

    Deterministic (ties go to the lower index and the lower rank), so every rank computes the same split.
    Each rank's indices come back in increasing order.

    Examples:
        >>> balance([10, 1, 1, 9, 2], 2)
        [[0, 1, 2], [3, 4]]
    """
    loads = [0.0] * world
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        shares[r].append(i)
        loads[r] += costs[i]
    return [sorted(s) for s in shares]
