"""Process groups for tensor parallelism: one process per device, NCCL on GPUs, gloo on CPU.

``TPGroup`` wraps a ``torch.distributed`` group with the few collectives TP needs (sum
all-reduce, max all-reduce, all-gather along a dim, gather to the first rank, broadcast from it)
and an optional :class:`CommTimer` that times every collective on the compute stream. A group of
size 1 needs no process group at all and its collectives are no-ops.

NVLink multicast (NVLS) stays off in every process: :func:`disable_nvlink_multicast` sets
``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1``
with ``os.environ.setdefault`` (an explicit setting in the environment wins); it must run before
``init_process_group``, which :func:`init_from_env` guarantees.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = [
    "NVLS_OFF_ENV",
    "CommTimer",
    "TPGroup",
    "disable_nvlink_multicast",
    "free_port",
    "init_from_env",
    "new_tp_group",
]

#: Environment that keeps NVLink multicast (NVLS) off in NCCL, torch symmetric memory, NVSHMEM.
NVLS_OFF_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def disable_nvlink_multicast() -> dict[str, str]:
    """``os.environ.setdefault`` every ``NVLS_OFF_ENV`` entry; returns the effective values.
    Call before ``torch.distributed.init_process_group`` (NCCL reads them at communicator
    creation)."""
    for key, value in NVLS_OFF_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in NVLS_OFF_ENV}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for single-host test groups)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CommTimer:
    """Accumulates the time of collectives by name. On CUDA: an event pair on the current
    stream around each collective (so the time includes waiting for the slowest peer, which is
    what the step pays); on CPU: host wall time. While ``phase`` is set (the TP engine sets it to
    the engine phase), names are recorded as ``"{phase}/{name}"``. ``collect()`` synchronises
    and returns ``{name: ms}`` and ``{name: count}`` since the last collect."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.phase: str | None = None
        self._events: list[tuple[str, object, object]] = []
        self._host: dict[str, float] = defaultdict(float)
        self._count: dict[str, int] = defaultdict(int)

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        if self.phase:
            name = f"{self.phase}/{name}"
        self._count[name] += 1
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._host[name] += (time.perf_counter() - t0) * 1e3

    def collect(self) -> tuple[dict[str, float], dict[str, int]]:
        totals = defaultdict(float, self._host)
        if self._events:
            torch.cuda.synchronize(self.device)
            for name, start, end in self._events:
                totals[name] += start.elapsed_time(end)
        counts = dict(self._count)
        self._events.clear()
        self._host.clear()
        self._count.clear()
        return dict(totals), counts


@dataclass
class TPGroup:
    """One tensor-parallel group: this process's ``rank`` in it, its ``size``, the global
    ``ranks`` of its members (``ranks[0]`` decides sampling) and the ``torch.distributed``
    ``group`` (``None``: the default group, or no group at all when ``size == 1``)."""

    rank: int = 0
    size: int = 1
    ranks: tuple[int, ...] = (0,)
    group: object | None = None
    timer: CommTimer | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"rank={self.rank}, size={self.size}: expected 0 <= rank < size")
        if len(self.ranks) != self.size:
            raise ValueError(f"ranks={self.ranks}: expected {self.size} global ranks")
        if self.size > 1 and not dist.is_initialized():
            raise RuntimeError(
                f"TPGroup(size={self.size}): torch.distributed is not initialised; call "
                "kdtree.tp.init_from_env() under torchrun (or init_process_group) first"
            )

    @classmethod
    def single(cls) -> TPGroup:
        """A group of one process (no communication)."""
        return cls()

    @classmethod
    def world(cls) -> TPGroup:
        """Every process of the initialised default group."""
        if not dist.is_initialized():
            raise RuntimeError("TPGroup.world: torch.distributed is not initialised")
        n = dist.get_world_size()
        return cls(rank=dist.get_rank(), size=n, ranks=tuple(range(n)))

    @property
    def is_first(self) -> bool:
        """This process is the group's rank 0 (the one that decides sampled tokens)."""
        return self.rank == 0

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        if self.timer is None:
            yield
        else:
            with self.timer.region(name):
                yield

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce (``op``: ``sum`` | ``max``); returns ``x``."""
        if self.size == 1:
            return x
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}.get(op)
        if red is None:
            raise ValueError(f"op={op!r}: expected 'sum' or 'max'")
        with self._timed(f"all_reduce_{op}"):
            dist.all_reduce(x, op=red, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's ``x`` (same shape everywhere) along ``dim``, rank order."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        with self._timed("all_gather"):
            dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)

    def stack_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` stacked on a new leading dim: ``[size, *x.shape]``."""
        if self.size == 1:
            return x[None]
        return self.all_gather(x[None], dim=0)

    def gather_to_first(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor | None:
        """Rank 0 gets every rank's ``x`` concatenated along ``dim``; the others ``None``."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.is_first else None
        with self._timed("gather"):
            dist.gather(x, parts, dst=self.ranks[0], group=self.group)
        return torch.cat(parts, dim=dim) if self.is_first else None

    def broadcast_from_first(self, x: torch.Tensor) -> torch.Tensor:
        """In-place broadcast of rank 0's ``x`` to the group; returns ``x``."""
        if self.size == 1:
            return x
        with self._timed("broadcast"):
            dist.broadcast(x, src=self.ranks[0], group=self.group)
        return x

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.group)


def init_from_env(backend: str = "auto") -> TPGroup:
    """Initialise the default process group from torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and return the world
    group. ``backend="auto"``: ``nccl`` (one GPU per process, ``cuda:LOCAL_RANK``) when CUDA is
    available, else ``gloo``. NVLink multicast is turned off first."""
    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f"init_from_env: {', '.join(missing)} not set; launch with torchrun "
            "(e.g. torchrun --nproc-per-node 2 -m kdtree bench tp ...)"
        )
    disable_nvlink_multicast()
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend={backend!r}: expected 'auto', 'nccl' or 'gloo'")
    if backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("backend='nccl': CUDA is not available in this process")
    if not dist.is_initialized():
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if local >= torch.cuda.device_count():
                raise RuntimeError(
                    f"LOCAL_RANK={local}: only {torch.cuda.device_count()} CUDA devices visible"
                )
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        else:
            dist.init_process_group("gloo")
    return TPGroup.world()


def new_tp_group(ranks: Sequence[int], backend: str | None = None) -> TPGroup | None:
    """A TP group over the global ``ranks`` (collective: every process of the world must call
    it with the same list). Returns ``None`` in processes that are not members."""
    if not dist.is_initialized():
        if list(ranks) == [0]:
            return TPGroup.single()
        raise RuntimeError("new_tp_group: torch.distributed is not initialised")
    ranks = tuple(int(r) for r in ranks)
    world = dist.get_world_size()
    if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0 or max(ranks) >= world:
        raise ValueError(f"ranks={ranks}: expected distinct ranks in [0, {world})")
    group = dist.new_group(list(ranks), backend=backend) if len(ranks) < world else None
    me = dist.get_rank()
    if me not in ranks:
        return None
    if len(ranks) == 1:
        return TPGroup.single()
    return TPGroup(rank=ranks.index(me), size=len(ranks), ranks=ranks, group=group)
