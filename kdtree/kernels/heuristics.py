"""Launch configuration for the tree-verify kernels, chosen from static shapes only.

Nothing here reads device memory, so the choice is the same on every call with the same
shapes (a CUDA graph stays valid). Two decisions:

* the tile config (``BLOCK_M`` rows of packed ``g·T`` query rows, ``BLOCK_N`` keys, warps,
  pipeline stages), tuned for Hopper (H100/H200) with a fallback ladder for when a config does
  not fit in shared memory;
* the number of KV splits, from a small cost model: waves of CTAs times the work per CTA
  (its chunk of keys plus a fixed cost and the fp32 partial it writes and the merge reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "MAX_SPLITS",
    "MAX_TREE_TOKENS",
    "TileConfig",
    "choose_num_splits",
    "configs_for",
    "gqa_configs",
    "interpreter_config",
    "length_bucket",
    "mla_configs",
    "splits_for",
    "tuning_candidates",
]

#: Largest tree (``T = budget + 1``) the kernels accept; the bitmask is read word by word, so
#: this only bounds workspace sizes.
MAX_TREE_TOKENS = 1024
#: Largest number of KV splits (bounds the fp32 partial workspace).
MAX_SPLITS = 128

_SMEM_PER_SM = 228 * 1024  # H100/H200
_SMEM_PER_CTA = 227 * 1024


@dataclass(frozen=True)
class TileConfig:
    """One kernel configuration (all Triton constexprs or launch options)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def smem_bytes(self, dk: int, dv: int, elem: int = 2, shared_kv: bool = False) -> int:
        """Rough shared-memory footprint: the Q tile plus ``num_stages`` K (and V) tiles."""
        q = self.block_m * dk * elem
        kv = self.block_n * (dk if shared_kv else dk + dv) * elem
        return q + max(self.num_stages, 1) * kv

    def ctas_per_sm(self, dk: int, dv: int, shared_kv: bool = False) -> int:
        """Resident CTAs per SM allowed by shared memory and warps (register-bound guess)."""
        smem = self.smem_bytes(dk, dv, shared_kv=shared_kv) + 2048
        by_smem = max(1, _SMEM_PER_SM // smem)
        by_warps = 2 if self.num_warps <= 4 else 1
        return max(1, min(by_smem, by_warps))


def _pow2_at_least(x: int, lo: int) -> int:
    return max(lo, 1 << max(0, math.ceil(math.log2(max(x, 1)))))


def _gqa_block_m(rows: int) -> int:
    """Rows of the M tile: one tile when ``rows`` fits 128, else the size wasting fewer rows."""
    if rows <= 128:
        return _pow2_at_least(rows, 16)
    pad64 = math.ceil(rows / 64) * 64
    pad128 = math.ceil(rows / 128) * 128
    # 64-row tiles re-read the KV tile from L2 twice as often; take them only when they save
    # more than an eighth of the padded rows.
    return 64 if pad64 * 8 < pad128 * 7 else 128


def gqa_configs(rows: int, head_dim: int) -> list[TileConfig]:
    """Configs to try, best first, for ``rows = g·T`` packed rows and head dim 64 or 128."""
    bm = _gqa_block_m(rows)
    if head_dim <= 64:
        first = TileConfig(bm, 128 if bm <= 64 else 64, 4 if bm <= 64 else 8, 3)
    elif bm <= 32:
        first = TileConfig(bm, 64, 4, 4)
    elif bm == 64:
        first = TileConfig(64, 64, 4, 3)
    else:
        first = TileConfig(128, 64, 8, 3)
    ladder = [
        first,
        TileConfig(first.block_m, first.block_n, first.num_warps, 2),
        TileConfig(first.block_m, 32, first.num_warps, 2),
        TileConfig(min(first.block_m, 64), 32, 4, 1),
    ]
    return _unique(ladder)


def mla_configs(rows: int) -> list[TileConfig]:
    """Configs to try, best first, for ``rows = h·T`` and the 512 + 64 latent."""
    if rows <= 16:
        first = TileConfig(16, 64, 4, 2)
    elif rows <= 32:
        first = TileConfig(32, 64, 4, 2)
    else:
        first = TileConfig(64, 64, 8, 2)
    ladder = [
        first,
        TileConfig(first.block_m, 32, first.num_warps, 2),
        TileConfig(first.block_m, 32, first.num_warps, 1),
        TileConfig(min(first.block_m, 32), 16, 4, 1),
    ]
    return _unique(ladder)


def interpreter_config(rows: int) -> TileConfig:
    """A small config for the CPU interpreter (few, small tiles keep it fast)."""
    return TileConfig(min(_pow2_at_least(rows, 16), 64), 16, 4, 1)


def _unique(configs: list[TileConfig]) -> list[TileConfig]:
    seen: list[TileConfig] = []
    for c in configs:
        if c not in seen:
            seen.append(c)
    return seen


def length_bucket(max_len: int) -> int:
    """Round a maximum prefix length up to a power of two (>= 256) so the split count is
    stable across nearby lengths."""
    return _pow2_at_least(max_len, 256)


def choose_num_splits(
    *,
    units: int,
    max_len: int,
    block_n: int,
    slots: int,
    partial_tokens: float,
    fixed_tokens: float = 96.0,
    max_splits: int = MAX_SPLITS,
) -> int:
    """Number of KV splits minimising ``waves × (chunk + fixed + partial)``.

    ``units``: CTAs per split (batch × kv heads × M tiles); ``max_len``: the prefix-length
    bound (a static bucket, not the live lengths); ``slots``: CTAs the GPU runs at once;
    ``partial_tokens``: the fp32 partial a CTA writes and the merge reads back, in
    key-token equivalents of traffic (only paid when splitting).
    """
    if units < 1 or slots < 1 or block_n < 1:
        raise ValueError(f"units={units}, slots={slots}, block_n={block_n}: expected >= 1")
    max_len = max(int(max_len), 1)
    limit = max(1, min(max_splits, math.ceil(max_len / block_n)))
    best, best_cost = 1, math.inf
    for s in range(1, limit + 1):
        chunk = math.ceil(math.ceil(max_len / s) / block_n) * block_n
        waves = math.ceil(units * s / slots)
        cost = waves * (chunk + fixed_tokens + (partial_tokens if s > 1 else 0.0))
        if cost < best_cost * 0.98:  # prefer fewer splits unless clearly better
            best, best_cost = s, cost
    return best


def configs_for(kind: str, rows: int, head_dim_k: int, interpret: bool) -> list[TileConfig]:
    """The config ladder for ``kind`` (``"gqa"``/``"mla"``) and ``rows`` packed query rows."""
    if interpret:
        return [interpreter_config(rows)]
    if kind == "gqa":
        return gqa_configs(rows, head_dim_k)
    return mla_configs(rows)


def splits_for(
    kind: str,
    cfg: TileConfig,
    *,
    batch: int,
    rows: int,
    num_kv_heads: int,
    head_dim_k: int,
    head_dim_v: int,
    max_len: int,
    num_sms: int,
    elem_bytes: int = 2,
) -> int:
    """Split count for one launch: fill ``num_sms`` × resident CTAs without letting the fp32
    partials outweigh the keys they summarise."""
    shared = kind == "mla"
    m_tiles = math.ceil(rows / cfg.block_m)
    units = batch * num_kv_heads * m_tiles
    slots = num_sms * cfg.ctas_per_sm(head_dim_k, head_dim_v, shared_kv=shared)
    token_bytes = (head_dim_k if shared else head_dim_k + head_dim_v) * elem_bytes
    partial_tokens = cfg.block_m * head_dim_v * 4 * 2 / token_bytes  # written, then merged
    return choose_num_splits(
        units=units,
        max_len=length_bucket(max_len),
        block_n=cfg.block_n,
        slots=slots,
        partial_tokens=partial_tokens,
    )


def tuning_candidates(kind: str, rows: int, head_dim_k: int) -> list[TileConfig]:
    """A handful of plausible Hopper configs around the heuristic choice (for the benchmark's
    ``--tune``): the chosen one first, then other M tiles, key tiles, warps and stages."""
    if kind == "gqa":
        first = gqa_configs(rows, head_dim_k)[0]
        extra = [
            TileConfig(64, 64, 4, 3),
            TileConfig(128, 64, 8, 3),
            TileConfig(64, 128, 4, 2),
            TileConfig(128, 128, 8, 2),
            TileConfig(64, 64, 4, 4),
            TileConfig(128, 64, 8, 4),
            TileConfig(32, 64, 4, 4),
            TileConfig(16, 128, 4, 3),
        ]
        extra = [c for c in extra if c.block_m <= _pow2_at_least(rows, 16)]
    else:
        first = mla_configs(rows)[0]
        extra = [
            TileConfig(64, 32, 8, 2),
            TileConfig(64, 64, 8, 1),
            TileConfig(64, 32, 4, 2),
            TileConfig(64, 16, 4, 3),
            TileConfig(32, 64, 4, 2),
            TileConfig(16, 64, 4, 2),
        ]
        extra = [c for c in extra if c.block_m <= _pow2_at_least(rows, 16)]
    return _unique([first, *extra])
