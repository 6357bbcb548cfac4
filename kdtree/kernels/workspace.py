"""Preallocated workspace for the split-KV tree-verify kernels (CUDA-graph friendly).

A :class:`TreeAttentionPlan` owns the fp32 partial outputs and base-2 log-sum-exps of the KV
splits, sized once for every batch ``<= max_batch`` and tree ``<= max_tree`` under a prefix
bound ``max_prefix_len``. Calls take contiguous views of the same storage, so nothing is
allocated per call and the addresses never change (a captured graph stays valid). The split
count of a call is a pure function of static shapes (:func:`kdtree.kernels.heuristics.splits_for`).
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from kdtree.kernels.heuristics import MAX_TREE_TOKENS, configs_for, splits_for
from kdtree.kernels.tuned import tuned_choice

__all__ = ["TreeAttentionPlan", "device_sm_count", "interpreting"]


def interpreting() -> bool:
    """True when Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@lru_cache(maxsize=16)
def _sm_count(device_type: str, index: int | None) -> int:
    if device_type == "cuda":
        return torch.cuda.get_device_properties(index or 0).multi_processor_count
    return 4  # the interpreter: a few "SMs" so small tests still split the KV


def device_sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (4 for the CPU interpreter)."""
    device = torch.device(device)
    index = (
        device.index
        if device.index is not None
        else (torch.cuda.current_device() if device.type == "cuda" else None)
    )
    return _sm_count(device.type, index)


class TreeAttentionPlan:
    """Workspace for one attention kind and head layout.

    ``kind``: ``"gqa"`` or ``"mla"``; ``num_kv_heads``: KV heads (1 for MLA); ``group``: query
    heads per KV head (``H`` for MLA); ``head_dim_k``/``head_dim_v``: key width (``D``, or
    ``kv_lora_rank + rope_dim``) and output width (``D``, or ``kv_lora_rank``);
    ``max_prefix_len``: the prefix-length bound the split count is chosen from.
    """

    def __init__(
        self,
        kind: str,
        *,
        max_batch: int,
        max_tree: int,
        num_kv_heads: int,
        group: int,
        head_dim_k: int,
        head_dim_v: int,
        max_prefix_len: int,
        device: torch.device | str,
        min_capacity_rows: int = 0,
    ) -> None:
        if kind not in ("gqa", "mla"):
            raise ValueError(f"kind={kind!r}: expected 'gqa' or 'mla'")
        for name, value in (
            ("max_batch", max_batch),
            ("max_tree", max_tree),
            ("num_kv_heads", num_kv_heads),
            ("group", group),
            ("head_dim_k", head_dim_k),
            ("head_dim_v", head_dim_v),
            ("max_prefix_len", max_prefix_len),
        ):
            if int(value) < 1:
                raise ValueError(f"{name}={value}: expected >= 1")
        if max_tree > MAX_TREE_TOKENS:
            raise ValueError(f"max_tree={max_tree}: above the compiled maximum {MAX_TREE_TOKENS}")
        if kind == "mla" and num_kv_heads != 1:
            raise ValueError(f"num_kv_heads={num_kv_heads}: MLA has one latent head")
        self.kind = kind
        self.max_batch, self.max_tree = int(max_batch), int(max_tree)
        self.num_kv_heads, self.group = int(num_kv_heads), int(group)
        self.head_dim_k, self.head_dim_v = int(head_dim_k), int(head_dim_v)
        self.max_prefix_len = int(max_prefix_len)
        self.device = torch.device(device)
        self.capacity_rows = max(self._capacity(), int(min_capacity_rows))
        self.part = torch.empty(
            self.capacity_rows * self.head_dim_v, dtype=torch.float32, device=self.device
        )
        self.lse = torch.empty(self.capacity_rows, dtype=torch.float32, device=self.device)

    @classmethod
    def for_gqa(
        cls,
        *,
        max_batch: int,
        max_tree: int,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        max_prefix_len: int,
        device,
    ) -> TreeAttentionPlan:
        """Workspace for :func:`kdtree.kernels.tree_attention_triton`."""
        if num_kv_heads < 1 or num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_q_heads={num_q_heads}: expected a multiple of num_kv_heads={num_kv_heads}"
            )
        return cls(
            "gqa",
            max_batch=max_batch,
            max_tree=max_tree,
            num_kv_heads=num_kv_heads,
            group=num_q_heads // num_kv_heads,
            head_dim_k=head_dim,
            head_dim_v=head_dim,
            max_prefix_len=max_prefix_len,
            device=device,
        )

    @classmethod
    def for_mla(
        cls,
        *,
        max_batch: int,
        max_tree: int,
        num_heads: int,
        kv_lora_rank: int,
        rope_dim: int,
        max_prefix_len: int,
        device,
    ) -> TreeAttentionPlan:
        """Workspace for :func:`kdtree.kernels.tree_attention_mla_triton`."""
        return cls(
            "mla",
            max_batch=max_batch,
            max_tree=max_tree,
            num_kv_heads=1,
            group=num_heads,
            head_dim_k=kv_lora_rank + rope_dim,
            head_dim_v=kv_lora_rank,
            max_prefix_len=max_prefix_len,
            device=device,
        )

    def __repr__(self) -> str:
        return (
            f"TreeAttentionPlan({self.kind}, max_batch={self.max_batch}, "
            f"max_tree={self.max_tree}, kv_heads={self.num_kv_heads}, group={self.group}, "
            f"max_prefix_len={self.max_prefix_len}, {self.nbytes / 2**20:.1f} MiB)"
        )

    @property
    def nbytes(self) -> int:
        return (self.part.numel() + self.lse.numel()) * 4

    def padded_rows(self, tree: int) -> int:
        """Rows per split in the workspace: ``G·T`` rounded up to 16, so every stride stays a
        multiple of 16 elements (aligned, vectorised access; one compiled kernel for all T)."""
        return -(-tree * self.group // 16) * 16

    def num_splits(self, cfg, batch: int, tree: int) -> int:
        """The split count of a call with ``batch`` requests and ``tree`` tokens under
        config ``cfg`` (bounded by this workspace)."""
        rows = tree * self.group
        s = splits_for(
            self.kind,
            cfg,
            batch=batch,
            rows=rows,
            num_kv_heads=self.num_kv_heads,
            head_dim_k=self.head_dim_k,
            head_dim_v=self.head_dim_v,
            max_len=self.max_prefix_len,
            num_sms=device_sm_count(self.device),
        )
        tuned = self.tuned(batch, tree)
        if tuned is not None and tuned.config == cfg:
            # a count scaled from another length never undercuts the model's for this one
            s = tuned.splits if tuned.exact else max(s, tuned.splits)
        fit = self.capacity_rows // (batch * self.num_kv_heads * self.padded_rows(tree))
        return max(1, min(s, fit))

    def tuned(self, batch: int, tree: int):
        """The measured launch choice for ``(batch, tree)`` under this plan's length bound
        (:mod:`kdtree.kernels.tuned`), or None."""
        if interpreting():
            return None
        return tuned_choice(
            self.kind,
            self.device,
            group=self.group,
            tree=tree,
            dk=self.head_dim_k,
            batch=batch,
            max_len=self.max_prefix_len,
        )

    def _capacity(self) -> int:
        trees = sorted({self.max_tree, *(1 << k for k in range(11) if (1 << k) < self.max_tree)})
        best = 0
        for t in trees:
            rows = t * self.group
            first = configs_for(self.kind, rows, self.head_dim_k, interpreting())[0]
            for b in range(1, self.max_batch + 1):
                tuned = self.tuned(b, t)
                # the config num_splits will size: the tuned one where the table has an entry
                cfg = tuned.config if tuned is not None else first
                s = splits_for(
                    self.kind,
                    cfg,
                    batch=b,
                    rows=rows,
                    num_kv_heads=self.num_kv_heads,
                    head_dim_k=self.head_dim_k,
                    head_dim_v=self.head_dim_v,
                    max_len=self.max_prefix_len,
                    num_sms=device_sm_count(self.device),
                )
                if tuned is not None:
                    s = max(s, tuned.splits)
                best = max(best, b * self.num_kv_heads * s * self.padded_rows(t))
        return best

    def views(self, batch: int, tree: int, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``part [B, Hkv, S, R, Dv]`` and ``lse [B, Hkv, S, R]`` over the same storage
        (``R = padded_rows(tree)``; rows past ``G·T`` are never written or read)."""
        if batch > self.max_batch:
            raise ValueError(f"batch={batch}: above the plan's max_batch={self.max_batch}")
        if tree > self.max_tree:
            raise ValueError(f"T={tree}: above the plan's max_tree={self.max_tree}")
        rows = self.padded_rows(tree)
        n = batch * self.num_kv_heads * num_splits * rows
        if n > self.capacity_rows:
            raise ValueError(
                f"num_splits={num_splits}: the workspace holds {self.capacity_rows}"
                f" rows, the call needs {n}"
            )
        shape = (batch, self.num_kv_heads, num_splits, rows)
        return self.part[: n * self.head_dim_v].view(*shape, self.head_dim_v), self.lse[:n].view(
            *shape
        )
