"""Run a function on a gloo group of ``world`` local processes (tests, CPU demos).

``run_spawned(fn, world, *args)`` spawns ``world`` processes (``torch.multiprocessing``, spawn
context), initialises gloo on a free 127.0.0.1 port, calls ``fn(tp, *args)`` with the world
:class:`~kdtree.tp.dist.TPGroup` in each and returns the results in rank order. ``fn`` must be a
module-level function and its result picklable. A failure in any rank raises with that rank's
traceback; processes still running at the timeout are terminated.
"""

from __future__ import annotations

import io
import os
import queue as queue_mod
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kdtree.tp.dist import TPGroup, free_port

__all__ = ["SpawnError", "run_spawned"]


class SpawnError(RuntimeError):
    """A rank of :func:`run_spawned` failed (its traceback is in the message)."""


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, results) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        try:
            out = fn(TPGroup.world(), *args)
        finally:
            dist.destroy_process_group()
        buf = io.BytesIO()  # plain bytes: tensors through a queue would share fds that die
        torch.save(out, buf)  # with this process
        results.put((rank, True, buf.getvalue()))
    except BaseException:  # report everything, including KeyboardInterrupt in the child
        results.put((rank, False, traceback.format_exc()))


def run_spawned(fn: Callable[..., Any], world: int, *args, timeout: float = 180.0) -> list:
    """``[fn(tp, *args) on rank 0, ..., on rank world - 1]`` over a local gloo group."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world={world!r}: expected a positive int")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world, port, fn, args, results), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            try:
                rank, ok, out = results.get(timeout=timeout)
            except queue_mod.Empty:
                raise SpawnError(
                    f"run_spawned: no result from ranks {sorted(set(range(world)) - set(got))} "
                    f"within {timeout} s"
                ) from None
            if ok:
                got[rank] = torch.load(io.BytesIO(out), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{out}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    if errors:
        raise SpawnError("\n".join(errors))
    return [got[r] for r in range(world)]
