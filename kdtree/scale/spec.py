"""One TP8 rank of a Kimi-K2-class model: shapes, how TP8 shards them, bytes, and the memory check.

Sharding (what SGLang and vLLM do for DeepSeek-V3 / Kimi-K2 at TP8 *without* expert
parallelism), per rank:

* attention: ``q_a_proj`` and ``kv_a_proj_with_mqa`` replicated (every rank computes the
  latents), ``q_b_proj`` and ``kv_b_proj`` column-parallel (64 heads / 8 = 8 heads per rank),
  ``o_proj`` row-parallel → one all-reduce of ``[T, hidden]`` per layer;
* MoE: the router replicated; **every rank holds all 384 routed experts with each expert's
  width split by 8** (gate/up ``[384, 2048/8 = 256, 7168]``, down ``[384, 7168, 256]``), the
  shared expert split the same way; routed + shared partial sums → one all-reduce per layer;
* dense MLP (layer 0): intermediate 18432 / 8 = 2304 per rank, then the layer's all-reduce;
* embedding and LM head vocab-parallel: 163840 / 8 = 20480 rows per rank.

So every rank reads ``distinct experts touched × 3 × 256 × 7168`` expert weights per MoE layer,
which is what makes the verify cost of a tree grow with the number of experts its tokens touch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

__all__ = [
    "K2_REFERENCE",
    "K2RankSpec",
    "ShapeDoesNotFitError",
    "check_fits",
    "free_device_bytes",
]

GiB = 2**30


class ShapeDoesNotFitError(MemoryError):
    """A requested shape needs more device memory than is free; carries both numbers."""

    def __init__(self, what: str, needed: int, free: int, device: str) -> None:
        self.what, self.needed, self.free, self.device = what, needed, free, device
        super().__init__(
            f"{what} does not fit on {device}: it needs {needed / GiB:.2f} GiB "
            f"({needed:,} bytes), {free / GiB:.2f} GiB ({free:,} bytes) are free. "
            "Use fewer layers (--layers), shorter contexts (--contexts) or smaller trees (--trees)."
        )


@dataclass(frozen=True)
class K2RankSpec:
    """Per-rank shapes of a Kimi-K2-class model under TP ``tp`` (full-model numbers as
    published; per-rank numbers are properties). ``reduced(f)`` makes a small CPU stand-in."""

    hidden: int = 7168
    n_layers: int = 61
    heads_total: int = 64
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128
    n_experts: int = 384
    top_k: int = 8
    n_shared: int = 1
    expert_width: int = 2048
    dense_width: int = 18432
    first_dense: int = 1
    vocab: int = 163840
    tp: int = 8
    label: str = "Kimi-K2 TP8 rank (full size)"

    def __post_init__(self) -> None:
        for name in ("heads_total", "expert_width", "dense_width", "vocab"):
            if getattr(self, name) % self.tp:
                raise ValueError(f"{name}={getattr(self, name)} is not divisible by tp={self.tp}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k}: expected 1 <= top_k <= {self.n_experts}")
        if not 0 <= self.first_dense <= self.n_layers:
            raise ValueError(f"first_dense={self.first_dense}: expected 0..{self.n_layers}")

    # ------------------------------------------------------------------ per-rank shapes

    @property
    def heads(self) -> int:
        return self.heads_total // self.tp

    @property
    def expert_width_rank(self) -> int:
        return self.expert_width // self.tp

    @property
    def dense_width_rank(self) -> int:
        return self.dense_width // self.tp

    @property
    def vocab_rank(self) -> int:
        return self.vocab // self.tp

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.first_dense

    def reduced(self, factor: int) -> K2RankSpec:
        """Widths divided by ``factor`` (latent and rope dims kept powers of two ≥ 16 so the
        Triton kernel accepts them); expert count, top-k, heads and TP kept."""
        if not isinstance(factor, int) or factor < 1:
            raise ValueError(f"factor={factor!r}: expected an int >= 1")
        if factor == 1:
            return self

        def pow2(x: int, lo: int) -> int:
            return max(lo, 2 ** round(math.log2(max(x, 1))))

        def mult(x: int, m: int) -> int:
            return max(m, (x // factor) // m * m)

        return dataclasses.replace(
            self,
            hidden=mult(self.hidden, 16),
            q_lora_rank=mult(self.q_lora_rank, 16),
            kv_lora_rank=pow2(self.kv_lora_rank // factor, 16),
            qk_nope=max(8, self.qk_nope // factor),
            qk_rope=pow2(self.qk_rope // factor, 16),
            v_head=max(8, self.v_head // factor),
            expert_width=mult(self.expert_width, 8 * self.tp),
            dense_width=mult(self.dense_width, 8 * self.tp),
            vocab=mult(self.vocab, 8 * self.tp),
            label=f"Kimi-K2 TP8 rank, widths / {factor} (CPU stand-in, not K2 size)",
        )

    @property
    def is_full_size(self) -> bool:
        return (
            self.hidden == K2_REFERENCE.hidden and self.expert_width == K2_REFERENCE.expert_width
        )

    def config(self, n_layers: int):
        """The per-rank slice as a kdtree ``MLAConfig`` with ``n_layers`` layers (the first
        ``min(first_dense, n_layers)`` dense): what ``MLAMoEForCausalLM`` builds for one rank."""
        from kdtree.models import get_config

        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"n_layers={n_layers!r}: expected an int >= 1")
        return get_config("kimi-k2-tp8").replace(
            hidden_size=self.hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            q_lora_rank=self.q_lora_rank,
            kv_lora_rank=self.kv_lora_rank,
            qk_nope_head_dim=self.qk_nope,
            qk_rope_head_dim=self.qk_rope,
            v_head_dim=self.v_head,
            n_routed_experts=self.n_experts,
            num_experts_per_tok=self.top_k,
            n_shared_experts=self.n_shared,
            moe_intermediate_size=self.expert_width_rank,
            intermediate_size=self.dense_width_rank,
            first_k_dense_replace=min(self.first_dense, n_layers),
            vocab_size=self.vocab_rank,
            tie_word_embeddings=False,
        )

    # ------------------------------------------------------------------ bytes (per rank)

    def expert_params(self) -> int:
        """Parameters of one routed expert on one rank (gate + up + down)."""
        return 3 * self.expert_width_rank * self.hidden

    def expert_bytes(self, elem_bytes: float = 2.0) -> float:
        return self.expert_params() * elem_bytes

    def attn_params(self) -> int:
        d, h = self.hidden, self.heads
        qk = self.qk_nope + self.qk_rope
        q = d * self.q_lora_rank + self.q_lora_rank * h * qk if self.q_lora_rank else d * h * qk
        kv_a = d * (self.kv_lora_rank + self.qk_rope)
        kv_b = self.kv_lora_rank * h * (self.qk_nope + self.v_head)
        o = h * self.v_head * d
        return q + kv_a + kv_b + o

    def dense_mlp_params(self) -> int:
        return 3 * self.dense_width_rank * self.hidden

    def moe_params(self) -> int:
        """Routed experts + shared expert (the fp32 router counted separately)."""
        return (self.n_experts + self.n_shared) * self.expert_params()

    def router_bytes(self) -> int:
        return self.n_experts * self.hidden * 4

    def layer_weight_bytes(self, layer: int, elem_bytes: int = 2) -> int:
        norms = 2 * self.hidden + self.kv_lora_rank + (self.q_lora_rank or 0)
        base = (self.attn_params() + norms) * elem_bytes
        if layer < self.first_dense:
            return base + self.dense_mlp_params() * elem_bytes
        return base + self.moe_params() * elem_bytes + self.router_bytes()

    def embed_bytes(self, elem_bytes: int = 2) -> int:
        """Embedding + LM head shards (vocab-parallel) + final norm."""
        return (2 * self.vocab_rank * self.hidden + self.hidden) * elem_bytes

    def kv_token_bytes(self, elem_bytes: int = 2) -> int:
        """Latent cache bytes per token per layer (``kv_lora_rank + rope``)."""
        return (self.kv_lora_rank + self.qk_rope) * elem_bytes

    def slice_bytes(
        self,
        n_layers: int,
        context: int,
        tree: int,
        *,
        elem_bytes: int = 2,
        page_size: int = 64,
        eager_attention: bool = True,
    ) -> dict[str, int]:
        """Device bytes a slice of ``n_layers`` layers needs to verify ``tree`` tokens at
        ``context``: weights, the latent cache, and the largest transient (eager attention
        scores in fp32 ×3, the grouped-MoE activations), by part, plus ``total``."""
        weights = self.embed_bytes(elem_bytes) + sum(
            self.layer_weight_bytes(i, elem_bytes) for i in range(n_layers)
        )
        tokens = -(-(context + tree) // page_size) * page_size
        kv = n_layers * tokens * self.kv_token_bytes(elem_bytes)
        scores = self.heads * tree * (context + tree) * 4 * 3 if eager_attention else 0
        moe_act = tree * self.top_k * (2 * self.hidden + 3 * self.expert_width_rank) * 4
        workspace = max(scores, moe_act) + 256 * 2**20  # plus allocator slack, L2 flush buffer
        return {
            "weights": weights,
            "kv_cache": kv,
            "workspace": workspace,
            "total": weights + kv + workspace,
        }


K2_REFERENCE = K2RankSpec()


def free_device_bytes(device: torch.device | str) -> int:
    """Free bytes on a CUDA device (``mem_get_info``); on the CPU the available RAM."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**62


def check_fits(
    what: str, needed: int, device: torch.device | str, *, free: int | None = None
) -> None:
    """Raise :class:`ShapeDoesNotFitError` (a ``MemoryError``) when ``needed`` bytes exceed the
    device's free memory (``free`` overrides the measurement, for tests and planning)."""
    if needed < 0:
        raise ValueError(f"needed={needed}: expected a non-negative byte count")
    avail = free_device_bytes(device) if free is None else int(free)
    if needed > avail:
        raise ShapeDoesNotFitError(what, int(needed), avail, str(device))
