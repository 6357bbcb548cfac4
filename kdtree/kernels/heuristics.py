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
    "SMALL_LATENT_DK",
    "TileConfig",
    "choose_num_splits",
    "configs_for",
    "gqa_configs",
    "interpreter_config",
    "length_bucket",
    "mla_configs",
    "splits_for",
    "tail_rows",
    "tuning_candidates",
]

#: Largest tree (``T = budget + 1``) the kernels accept; the bitmask is read word by word, so
#: this only bounds workspace sizes.
MAX_TREE_TOKENS = 1024
#: Largest number of KV splits (bounds the fp32 partial workspace).
MAX_SPLITS = 128

#: MLA keys (latent + rope) up to this width take the small-latent tiles (the shipped target:
#: 64 + 16); the 512 + 64 latent of DeepSeek-V3 / Kimi-K2 takes the register-bound ones.
SMALL_LATENT_DK = 192

_SMEM_PER_SM = 228 * 1024  # H100/H200
_SMEM_PER_CTA = 227 * 1024


@dataclass(frozen=True)
class TileConfig:
    """One kernel configuration (all Triton constexprs or launch options)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    #: 1: the prefix loop loads the next tile's page-table entries one iteration ahead, so a
    #: tile's K/V addresses never wait on a page-table load issued in the same iteration
    pt_prefetch: int = 0
    #: 1 (GQA): the rows past the last full M tile go to a small tile of their own
    #: (:func:`tail_rows`) instead of a full padded one -- T = 2^k + 1 tree tokens leave
    #: ``G`` rows (one tree token's query heads) over a power of two
    tail: int = 0

    def smem_bytes(self, dk: int, dv: int, elem: int = 2, shared_kv: bool = False) -> int:
        """Shared-memory estimate that matches what Triton 3.x allocates on Hopper: the Q
        tile, ``num_stages + 1`` K (and V) buffers and the P tile fed to the second dot
        (measured: 128x128 s2 d128 needs 288 KiB, MLA 64x64 s2 248 KiB; both refused)."""
        q = self.block_m * dk * elem
        kv = self.block_n * (dk if shared_kv else dk + dv) * elem
        p = self.block_m * self.block_n * elem
        return q + (max(self.num_stages, 1) + 1) * kv + p

    def fits(self, dk: int, dv: int, shared_kv: bool = False) -> bool:
        """True when :meth:`smem_bytes` fits one CTA's shared memory."""
        return self.smem_bytes(dk, dv, shared_kv=shared_kv) <= _SMEM_PER_CTA

    def ctas_per_sm(self, dk: int, dv: int, shared_kv: bool = False) -> int:
        """Resident CTAs per SM allowed by shared memory and warps (register-bound guess)."""
        # what ncu reported for 64x64 s3 d128 (session 6, call a: 114.9 KiB, two per SM):
        # the Q tile and ``num_stages`` K/V buffers, no P tile -- less than smem_bytes' bound
        kv = self.block_n * (dk if shared_kv else dk + dv) * 2
        smem = self.block_m * dk * 2 + max(self.num_stages, 1) * kv + 2048
        by_smem = max(1, _SMEM_PER_SM // smem)
        by_warps = 2 if self.num_warps <= 4 else 1
        return max(1, min(by_smem, by_warps))


def tail_rows(rows: int, cfg: TileConfig) -> int:
    """Rows of the small last M tile under ``cfg`` (0: none). Taken when ``cfg.tail`` is set
    and the rows past the last full tile fit a tile of at most a quarter of ``block_m``
    (16 rows at least: the smallest tile ``tl.dot`` takes)."""
    rem = rows % cfg.block_m
    if not cfg.tail or rem == 0 or rows < cfg.block_m:
        return 0
    small = _pow2_at_least(rem, 16)
    return small if 4 * small <= cfg.block_m else 0


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
    # the page-table prefetch variant first: on the H200 at 128k it alone made the heuristic's
    # config 1.45x faster at T = 17 (0.277 -> 0.191 ms) and 1.19x at T = 65 (the --tune rows
    # in data/bench/verify_attention.csv)
    ladder = [
        TileConfig(first.block_m, first.block_n, first.num_warps, first.num_stages, 1),
        first,
        TileConfig(first.block_m, first.block_n, first.num_warps, 2),
        TileConfig(first.block_m, 32, first.num_warps, 2),
        TileConfig(min(first.block_m, 64), 32, 4, 1),
    ]
    return _fitting(ladder, head_dim, head_dim, shared_kv=False)


def mla_configs(rows: int, head_dim_k: int = 576) -> list[TileConfig]:
    """Configs to try, best first, for ``rows = h·T`` and keys of ``head_dim_k`` = latent +
    rope. For the 512 + 64 latent the fp32 ``BLOCK_M x 512`` accumulator dominates registers:
    64-row tiles take 8 warps and 32-key tiles (the H200 tune: 64x32 w8 s2 beat 64x64 w8 s1 by
    1.4x at T=17, h=16).

    A small latent (``head_dim_k <= SMALL_LATENT_DK``, like the shipped target's 64 + 16) is
    fastest in 16-row, 128-key tiles on 4 warps, whatever ``rows``: the H200 ``--tune`` runs of the shipped
    target's shape (h=4, session-4 calls N–P) put them first or within 5 % of the first at 1k for
    T = 1 / 17 / 65 (10.7 / 11.8 / 12.5 µs with the merge) and first at 64k, T = 1 (35 µs vs 61
    for the 512-latent choice); 64-row tiles lost at 1k (T=17: 20.3 µs with 128 keys, 13.5 with
    the 512-latent 64x32 w8)."""
    if head_dim_k <= SMALL_LATENT_DK:
        ladder = [TileConfig(16, 128, 4, 2), TileConfig(16, 64, 2, 2), TileConfig(16, 32, 4, 1)]
        return _fitting(ladder, head_dim_k, head_dim_k, shared_kv=True)
    if rows <= 16:
        first = TileConfig(16, 64, 4, 2)
    elif rows <= 32:
        first = TileConfig(32, 64, 4, 2)
    else:
        first = TileConfig(64, 32, 8, 2)
    ladder = [
        first,
        TileConfig(first.block_m, 32, first.num_warps, 2),
        TileConfig(first.block_m, 32, first.num_warps, 1),
        TileConfig(min(first.block_m, 32), 16, 4, 1),
    ]
    return _fitting(ladder, 576, 512, shared_kv=True)


def interpreter_config(rows: int) -> TileConfig:
    """A small config for the CPU interpreter (few, small tiles keep it fast)."""
    return TileConfig(min(_pow2_at_least(rows, 16), 64), 16, 4, 1)


def _fitting(configs: list[TileConfig], dk: int, dv: int, shared_kv: bool) -> list[TileConfig]:
    """``configs`` without duplicates and without those that do not fit shared memory (the
    last one is kept as a fallback whatever the estimate says)."""
    uniq = _unique(configs)
    fit = [c for c in uniq if c.fits(dk, dv, shared_kv=shared_kv)]
    return fit or uniq[-1:]


def _unique(configs: list[TileConfig]) -> list[TileConfig]:
    seen: list[TileConfig] = []
    for c in configs:
        if c not in seen:
            seen.append(c)
    return seen


def length_bucket(max_len: int) -> int:
    """Round a maximum prefix length up to a multiple of 1024 (>= 256) so the split count is
    stable across nearby lengths."""
    max_len = max(int(max_len), 1)
    return 256 if max_len <= 256 else -(-max_len // 1024) * 1024


# H200-class constants of the split cost model (microseconds, bytes, FLOPs). Effective rather
# than peak: what a Triton kernel streaming the cache gets.
_HBM_BYTES_PER_US = 3.8e6
_MMA_FLOPS_PER_US = 4.0e8
_CTA_FIXED_US = 2.0  # per wave: prologue (Q load), epilogue (partial store), tail
#: the merge launch and its round trip: every split of a row block in one load up to
#: ``MERGE_TILE_ELEMS / BLOCK_D`` splits (64 at a 128-wide value head), a second dependent
#: load above that (not charged here: the 80-split choice at GQA 8q/1kv was measured with it)
_MERGE_FIXED_US = 3.0
#: Share of an SM's streaming rate one CTA reaches when it is alone on its SM: ncu on the H200
#: (session 6, call a) saw a lone 4-warp CTA (GQA 8q/1kv, 128k, T=17) issue on 28 % of the
#: cycles with one warp per scheduler, and a lone 8-warp one (T=65) on 35 % with DRAM at 12 %;
#: a second resident CTA hides the latency. Applied to every config: where only one CTA fits an
#: SM it scales the stream against the fixed costs at every split count alike.
_ONE_CTA_SM_SHARE = 0.55


def choose_num_splits(
    *,
    units: int,
    max_len: int,
    block_n: int,
    slots: int,
    num_sms: int,
    token_bytes: float,
    token_flops: float,
    partial_bytes: float,
    max_splits: int = MAX_SPLITS,
) -> int:
    """Number of KV splits minimising a small time model (microseconds).

    ``units``: CTAs per split (batch x kv heads x M tiles); ``max_len``: the static
    prefix-length bound; ``slots``: CTAs the GPU holds at once; ``token_bytes`` /
    ``token_flops``: HBM bytes and MMA FLOPs one unit spends per key; ``partial_bytes``:
    fp32 partial + LSE one CTA writes (and the merge reads back). Time = the stream over the
    SMs that have work (``min(1, CTAs / num_sms)`` of the machine), slowed where an SM holds a
    single CTA (``_ONE_CTA_SM_SHARE`` of its rate), + a fixed cost per wave + the merge (a
    launch and one read of every partial).
    """
    if units < 1 or slots < 1 or block_n < 1 or num_sms < 1:
        raise ValueError(
            f"units={units}, slots={slots}, block_n={block_n}, num_sms={num_sms}: expected >= 1"
        )
    max_len = max(int(max_len), 1)
    limit = max(1, min(max_splits, math.ceil(max_len / block_n)))
    best, best_cost = 1, math.inf
    for s in range(1, limit + 1):
        chunk = math.ceil(math.ceil(max_len / s) / block_n) * block_n
        ctas = units * s
        waves = math.ceil(ctas / slots)
        resident = min(ctas, slots)
        busy = min(1.0, ctas / num_sms)
        share = min(1.0, _ONE_CTA_SM_SHARE * resident / min(resident, num_sms))
        # one CTA alone on an SM gets 1/num_sms of the machine; a wave of min(ctas, slots)
        # CTAs shares the busy SMs
        per_cta = num_sms * max(
            chunk * token_bytes / _HBM_BYTES_PER_US, chunk * token_flops / _MMA_FLOPS_PER_US
        )
        stream = waves * per_cta * (resident / num_sms) / busy / share
        cost = stream + waves * _CTA_FIXED_US
        if s > 1:
            cost += _MERGE_FIXED_US + 2 * ctas * partial_bytes / _HBM_BYTES_PER_US
        if cost < best_cost * 0.97:  # prefer fewer splits unless clearly better
            best, best_cost = s, cost
    return best


def configs_for(kind: str, rows: int, head_dim_k: int, interpret: bool) -> list[TileConfig]:
    """The config ladder for ``kind`` (``"gqa"``/``"mla"``) and ``rows`` packed query rows."""
    if interpret:
        return [interpreter_config(rows)]
    if kind == "gqa":
        return gqa_configs(rows, head_dim_k)
    return mla_configs(rows, head_dim_k)


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
    """Split count for one launch (see :func:`choose_num_splits`): fill the SMs at long
    context without letting the merge and the fp32 partials outweigh what they save."""
    shared = kind == "mla"
    m_tiles = math.ceil(rows / cfg.block_m)
    units = batch * num_kv_heads * m_tiles
    slots = num_sms * cfg.ctas_per_sm(head_dim_k, head_dim_v, shared_kv=shared)
    kv_bytes = (head_dim_k if shared else head_dim_k + head_dim_v) * elem_bytes
    # M tiles of one KV head re-read its tiles from L2: count a quarter of HBM for each extra
    token_bytes = kv_bytes * (1.0 + 0.25 * (m_tiles - 1)) / m_tiles
    token_flops = 2.0 * cfg.block_m * (head_dim_k + head_dim_v)
    partial_bytes = cfg.block_m * (head_dim_v + 1) * 4
    return choose_num_splits(
        units=units,
        max_len=length_bucket(max_len),
        block_n=cfg.block_n,
        slots=slots,
        num_sms=num_sms,
        token_bytes=token_bytes,
        token_flops=token_flops,
        partial_bytes=partial_bytes,
    )


def tuning_candidates(
    kind: str, rows: int, head_dim_k: int, head_dim_v: int | None = None
) -> list[TileConfig]:
    """A handful of plausible Hopper configs around the heuristic choice (for the benchmark's
    ``--tune``): the chosen one first, then the configs that won or came close in the H200
    sweeps (other M tiles, key tiles, warps and stages). For MLA ``head_dim_v`` is the latent
    rank (default 512); a small latent (``head_dim_k <= SMALL_LATENT_DK``, the shipped target's
    64 + 16) leaves room for larger tiles and fewer warps, which the 512 latent's registers rule
    out."""
    if kind == "gqa":
        first = gqa_configs(rows, head_dim_k)[0]
        extra = [
            TileConfig(64, 32, 4, 5),
            TileConfig(64, 64, 4, 4),
            TileConfig(64, 64, 4, 3),
            TileConfig(128, 64, 8, 4),
            TileConfig(64, 128, 4, 2),
            # 8 warps on a 64-row tile (the warpgroups split the key / head-dim columns): half
            # the accumulator registers a thread holds, twice the warps to hide latency with --
            # ncu saw the 4-warp tiles latency-bound at one or two CTAs an SM (session 6)
            TileConfig(64, 64, 8, 3, 1),
            TileConfig(64, 64, 8, 4, 1),
            TileConfig(64, 128, 8, 2, 1),
            TileConfig(128, 64, 8, 2, 1),
        ]
        # the small-tail variants (rows = G * (2^k + 1) leave G rows past the full tiles)
        tails = [
            TileConfig(c.block_m, c.block_n, c.num_warps, c.num_stages, 1, 1)
            for c in (first, TileConfig(64, 64, 4, 3), TileConfig(128, 64, 8, 3),
                      TileConfig(64, 64, 8, 3))
        ]  # fmt: skip
        extra += [c for c in tails if tail_rows(rows, c) > 0]  # only where a tail exists
    elif head_dim_k <= SMALL_LATENT_DK:
        first = mla_configs(rows, head_dim_k)[0]
        extra = [
            TileConfig(64, 128, 4, 2),  # the 64k, T=17 winner of session-4 call N
            TileConfig(64, 64, 4, 2),
            TileConfig(128, 64, 8, 2),
            TileConfig(128, 128, 8, 2),
            TileConfig(32, 128, 4, 2),
            TileConfig(16, 128, 4, 2),
            TileConfig(16, 64, 2, 2),
            TileConfig(64, 32, 8, 2),
        ]
    else:
        first = mla_configs(rows, head_dim_k)[0]
        extra = [
            TileConfig(64, 64, 8, 1),
            TileConfig(64, 32, 8, 2),
            TileConfig(64, 32, 8, 3),
            TileConfig(32, 64, 4, 2),
        ]
    extra = [c for c in extra if c.block_m <= _pow2_at_least(rows, 16)]
    # the page-table prefetch variant of the heuristic's config and of the two strongest others
    extra += [
        TileConfig(c.block_m, c.block_n, c.num_warps, c.num_stages, 1) for c in [first, *extra[:2]]
    ]
    shared = kind == "mla"
    dv = (head_dim_v or 512) if shared else head_dim_k  # (shared KV: smem ignores dv)
    return _fitting([first, *extra], head_dim_k, dv, shared_kv=shared)
