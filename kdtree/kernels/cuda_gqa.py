"""CUDA C++ (sm_90) backend for GQA / MHA tree-verify attention, head dim 128.

``tree_attention_gqa_cuda`` has the semantics and argument order of
:func:`kdtree.kernels.tree_attention_triton`: ``q [B, T, Hq, 128]``, ``k_cache`` / ``v_cache``
``[num_pages, page_size, Hkv, 128]``, ``page_table int32 [B, max_pages]``, ``prefix_lens int32
[B]``, ``tree_mask int64 [B, T, W]``; returns ``[B, T, Hq, 128]``. bf16 and fp16 only.

The kernel is ``kernels/gqa_tree_sm90.cu`` (with ``kernels/sm90_common.cuh``): a producer
warpgroup bringing whole prefix tiles by TMA and the rest by zero-filling cp.async, completing
on per-stage mbarriers; two consumer warpgroups over 128-key tiles or three over 64-key tiles
(:func:`launch_plan`), each of 64 packed query rows (all query heads of a KV head times all tree
tokens); ``wgmma`` for S and for P V with P kept in registers, and the softmax of one tile
overlapped with the previous tile's P V. The 1-16 rows past the last whole 64-row block (G rows
at T = 8k + 1) can go to a tail warpgroup that runs the MMAs with swapped operands (the rows as
the N = 16 of ``m64n16k16``) instead of padding them to a 64-row block, where that measured
faster. Partials of several KV splits are merged by the
shared CUDA merge (``kernels/sm90_common.cuh``; ``KDTREE_CUDA_MERGE``,
:func:`kdtree.kernels.cuda_common.merge_mode`, picks another). Built with ``nvcc`` on first use like the MLA
backend (:mod:`kdtree.kernels.cuda_build`); the launch goes on ``torch.cuda.current_stream()``,
the split count depends on static shapes only, so a call can be captured in a CUDA graph (pass
``workspace`` to keep allocations out of the call, sized by :func:`plan_launch`).

The split kernel is launched as a programmatic dependent of the kernel before it (PDL: it starts
on the SMs that kernel frees and streams the prefix while it finishes). The contract: the kernel
launched right before the call does not write the page table, the prefix lengths or the
prefix's keys and values; Q, the tree tokens' keys and values (the model's cache write right
before is fine), the tree mask, the workspace and ``out`` are touched only after it completes.
``KDTREE_CUDA_SPLIT_PDL=0`` (read at every launch; a graph keeps what it captured) launches it
plainly.

Importing this module registers backend ``"cuda"`` for kind ``"gqa"`` in :mod:`kdtree.attention`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import os
import threading

import torch

from kdtree.kernels._common import launch_merge
from kdtree.kernels.cuda_build import BuildResult, CudaSource, find_nvcc
from kdtree.kernels.cuda_common import (
    MERGE_MAX_SPLITS,
    MERGE_PDL,
    aligned16,
    any_sm90,
    is_sm90,
    library_builds,
    merge_for,
    merge_form,
    on_sm90,
    resolve_merge,
    split_pdl,
    split_workspace,
    warn_ablation,
)
from kdtree.kernels.heuristics import MAX_TREE_TOKENS
from kdtree.kernels.tree_attention import _check_lengths, _check_metadata

__all__ = [
    "HEAD_DIM",
    "SHAPES",
    "available",
    "available_on",
    "build",
    "choose_splits",
    "compile_only",
    "consumer_warpgroups",
    "launch_args",
    "launch_layout",
    "launch_plan",
    "GqaLaunch",
    "plan_launch",
    "q_groups",
    "key_tail",
    "split_min_keys",
    "split_pdl",
    "split_trigger",
    "split_tail",
    "row_ctas",
    "phase_clocks",
    "tree_attention_gqa_cuda",
    "workspace_numel",
    "workspace_views",
    "workspace_rows",
]

_SRC = CudaSource(
    "gqa_tree_sm90.cu", "libkdtree_gqa_sm90.so", "CUDA GQA backend", headers=("sm90_common.cuh",)
)
SOURCE = _SRC.path
HEAD_DIM = 128
#: The split kernel's two shapes (kernels/gqa_tree_sm90.cu, ``Wide`` and ``Tall``), by consumer
#: warpgroups: (packed query rows a CTA, keys a tile).
SHAPES = {2: (128, 128), 3: (192, 64)}
#: The most rows past the last whole 64-row block the tail warpgroup takes (``TAIL_N``).
TAIL_ROWS = 16
_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1}
_MAX_WAVES = 4

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None


def build() -> BuildResult:
    """The cached shared object, built on first use (keyed by source, headers, flags, nvcc)."""
    return _SRC.build()


def compile_only(out_dir, defines: tuple[str, ...] = ()) -> BuildResult:
    """Build into ``out_dir`` with the local nvcc (no GPU, no cache); ``log`` holds the
    ``--ptxas-options=-v`` report. ``defines``: a measurement build's macros."""
    return _SRC.compile_only(out_dir, defines)


def _load() -> ctypes.CDLL:
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        lib = ctypes.CDLL(str(build().path))
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        lib.kdtree_gqa_tree_launch.restype = i32
        lib.kdtree_gqa_tree_launch.argtypes = (
            [i32]  # dtype
            + [ptr] * 9  # q k v page_table prefix_lens tree_mask out part lse
            + [i64] * 13  # strides: q 3, k 2, v 2, page table row, mask 2, out 3
            + [i32] * 8  # B T Hq Hkv head_dim page_size max_pages num_splits
            + [
                ctypes.c_float,
                i64,
                i32,
                i32,
                i32,
                i32,
                i32,
                ctypes.c_size_t,
            ]  # sm_scale num_slots wgs tail_blocks split_tail q_groups merge stream
        )
        lib.kdtree_gqa_error_string.restype = ctypes.c_char_p
        lib.kdtree_gqa_error_string.argtypes = [i32]
        for name in ("kdtree_gqa_smem_bytes", "kdtree_gqa_block_m", "kdtree_gqa_block_n"):
            getattr(lib, name).restype = i32
            getattr(lib, name).argtypes = [i32]
        lib.kdtree_gqa_clocks.restype = i32
        lib.kdtree_gqa_clocks.argtypes = [ptr]
        lib.kdtree_gqa_timeline.restype = i32
        lib.kdtree_gqa_timeline.argtypes = [ptr, i32]
        lib.kdtree_gqa_timeline_words.restype = i32
        lib.kdtree_gqa_timeline_words.argtypes = []
        _LIB = lib
        return lib


@functools.cache
def _library_ok() -> bool:  # the GQA library builds and loads (checked once a process)
    return library_builds(find_nvcc, _load, "GQA")


def available_on(device: torch.device) -> bool:
    """What ``"auto"`` checks before it picks this backend: an sm_90 ``device`` and a library
    that builds."""
    return on_sm90(device, _library_ok)


def available() -> bool:  # nvcc and an sm_90 device
    return any_sm90(find_nvcc)


# ----------------------------------------------------------------------------- launch planning


def _env_int(name: str, allowed: tuple[int, ...]) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) not in allowed:
        raise ValueError(f"{name}={raw!r}: expected one of {list(allowed)}")
    return int(raw)


#: Tall tiles (64 keys) a split streams from which :func:`launch_plan` takes the tail warpgroup
#: for the 1-8 rows (:data:`TAIL_LONG_ROWS`) past two whole blocks (session 33, calls b-c).
TAIL_MIN_TILES = 32
#: The most rows past two whole blocks that rule takes (its m64n8 MMAs; 16 rows' m64n16 were
#: 11-17 % slower than the padded block, session 33 call c).
TAIL_LONG_ROWS = 8


def launch_plan(rows: int, split_tiles: int | None = None) -> tuple[int, int]:
    """The split kernel's row layout for ``rows = G * T`` packed query rows: ``(wgs,
    tail_blocks)``. ``wgs`` consumer warpgroups a CTA: 2 (128 rows, 128-key tiles) for fewer
    than three 64-row blocks, or when the rows fill whole 128-row CTAs but not whole 192-row ones;
    else 3 (192 rows, 64-key tiles), so fewer CTAs read each KV tile. (Session 16,
    ``tools/gpu/gqa_layouts.py``: at 256, 512 and 1024 rows the two-warpgroup layout was 5-26 %
    faster at every measured length, e.g. 32q/8kv, T=64, 128k 266 against 361 us, two 64-row
    blocks a CTA on 128-key tiles against [3] [1]; multiples of 192 split evenly into
    three-warpgroup CTAs.) ``tail_blocks`` 0: each CTA takes ``wgs`` consecutive 64-row blocks,
    the last one padded. ``k >= 1``: each CTA takes ``k`` whole blocks and the 1-16 rows left
    past them (:data:`TAIL_ROWS`) go to a tail warpgroup of swapped-operand MMAs (8 or 16 columns
    of MMA work instead of a padded 64-row block), in the last CTA's first free warpgroup
    (:func:`split_tail` may share it between the last two CTAs).

    The default takes the tail where it was measured faster (session 13, call e,
    ``tools/gpu/gqa_layouts.py --ab --repeat 5``): three-warpgroup CTAs of three whole blocks
    and a last one that would hold a single whole block and the padded one (32q/8kv, T=65:
    ``[3 blocks] [1 block + tail]``, 5-9 % faster from 64k keys; more whole blocks, e.g. T=257,
    have the same last CTA but were not measured); elsewhere the padded block was as fast or
    faster (the tail warpgroup's own chain of barriers per tile then sets the CTA's pace).
    Also taken: two whole blocks and 1-8 rows in one three-warpgroup CTA (``[2 blocks + tail]``
    instead of ``[2 blocks + a padded one]``, e.g. 8q/1kv, T=17, 136 rows; 32q/8kv, T=33, 132)
    where each split streams at least :data:`TAIL_MIN_TILES` tiles (``split_tiles``, the prefix
    tiles a split from the static prefix bound; None: not known, padded). Session 33, call b
    (``bash tools/gpu/ab_envs.sh OUT 3 KDTREE_GQA_TAIL= KDTREE_GQA_TAIL=1 -- --layouts
    gqa_8q1kv_d128 --trees 17 --batches 1,8 ...``): the tail 3.3-5.7 % faster at batch 8 from
    64k keys (64-256 tiles a split), 1.3-1.4 % at 32-33 tiles (batch 8, 32k; batch 1, 256k), 0.3-2.1 %
    slower at 5-16 (batch 1, 16k-128k; batch 8, 16k): the padded block's MMAs (192 rows for 136)
    outpace the KV stream at batch 8 (~264 against ~256 us at 256k), the tail's own chain of
    barriers weighs on short splits. Call c (this rule against ``KDTREE_GQA_TAIL=0``): 8q/1kv,
    T=17 1.7-8.7 % less time where it applies (batch 32 at 256k the most), 32q/8kv, T=33 2.8-7.4 %;
    but 16 rows (8q/1kv, T=18: m64n16 MMAs) 11-17 % more, hence :data:`TAIL_LONG_ROWS`. With two
    warpgroups (one whole block and a tail: 8q/1kv, T=9; 32q/8kv, T=17) the tail was 1.2-1.4x
    slower and is not taken.

    Measurement knobs: ``KDTREE_GQA_WARPGROUPS=2|3`` forces the shape, ``KDTREE_GQA_TAIL=0|1``
    turns the tail off or on (on: three blocks a CTA unless ``KDTREE_GQA_BLOCKS=1|2|3``)."""
    n_full, rest = divmod(rows, 64)
    forced_wgs = _env_int("KDTREE_GQA_WARPGROUPS", (2, 3))
    forced_tail = _env_int("KDTREE_GQA_TAIL", (0, 1))
    forced_k = _env_int("KDTREE_GQA_BLOCKS", (1, 2, 3))
    whole_wide = rows % 128 == 0 and rows % 192 != 0  # (three-warpgroup CTAs: a lighter last one)
    wgs = forced_wgs or (3 if math.ceil(rows / 64) >= 3 and not whole_wide else 2)
    fits = n_full >= 1 and 1 <= rest <= TAIL_ROWS
    measured = wgs == 3 and n_full >= 4 and n_full % 3 == 1
    long_splits = split_tiles is not None and split_tiles >= TAIL_MIN_TILES
    measured = measured or (wgs == 3 and n_full == 2 and rest <= TAIL_LONG_ROWS and long_splits)
    if not fits or forced_tail == 0 or (forced_tail is None and not measured):
        return wgs, 0
    return wgs, min(forced_k or 3, wgs)


def _split_tail_rows(rows: int) -> bool:
    """The row condition of :func:`split_tail` (whatever the split count)."""
    forced = _env_int("KDTREE_GQA_SPLIT_TAIL", (0, 1))
    if forced == 0:
        return False
    n_full, rest = divmod(rows, 64)
    fits = n_full >= 4 and n_full % 2 == 0 and 1 <= rest <= TAIL_ROWS
    if forced == 1:
        return fits and _env_int("KDTREE_GQA_WARPGROUPS", (2, 3)) != 2
    return fits and n_full == 4 and launch_plan(rows) == (3, 3)


#: The most rows past the last whole 64-row block the tail warpgroup takes (``KEY_TAIL_ROWS`` in
#: the kernel: the other four rows of its Q^T atoms hold the stage barriers; named for sessions
#: 19-20's "key tail", the same rows in the producer's or the block warpgroups' own steps).
KEY_TAIL_ROWS = 4


def _key_tail_rows(rows: int) -> bool:
    """The row condition of :func:`key_tail` (whatever the split count)."""
    forced = _env_int("KDTREE_GQA_KEY_TAIL", (0, 1))
    if forced == 0 or _env_int("KDTREE_GQA_WARPGROUPS", (2, 3)) == 3:
        return False
    n_full, rest = divmod(rows, 64)
    fits = n_full == 4 and 1 <= rest <= KEY_TAIL_ROWS
    return fits and (forced == 1 or launch_plan(rows) == (3, 3))


def key_tail(rows: int, num_splits: int, merge: int | None = None) -> bool:
    """Whether the launch runs the two-warpgroup shape (two CTAs of two whole blocks a KV head,
    128-key tiles) with the 1-4 rows past them in a tail warpgroup of each CTA
    (``kernels/gqa_tree_sm90.cu``, ``WideTail``: CTA c's takes the tiles of parity c, by
    swapped-operand wgmma), e.g. 32q/8kv at T=65 (260 rows). The default where the row layout
    is not forced (session 21: 6-15 % less time than :func:`split_tail` at 32q/8kv, T=65);
    ``KDTREE_GQA_KEY_TAIL=0`` never, ``=1`` whatever the layout knobs say (not with three
    warpgroups forced). The CTA timeline's build runs it too since session 37 (its record in
    the tail warpgroup's unused Q^T rows; before, its static shared memory left no room and the
    split tail ran there). CTA 1's partials go to :data:`TAIL_ROWS` shadow rows a split, added
    by the CUDA merge, so it needs ``num_splits > 1`` and the CUDA merge (at most 1024 splits)."""
    if not _key_tail_rows(rows):
        return False
    merge = merge_for(num_splits) if merge is None else merge
    return 1 < num_splits <= MERGE_MAX_SPLITS // 2 and merge != 0


def split_tail(rows: int, num_splits: int, merge: int | None = None) -> bool:
    """Whether the launch splits the tail by tile parity between two CTAs of two whole blocks
    (``[2 blocks + the tail's even tiles] [2 blocks + its odd tiles]``). By default where
    :func:`launch_plan` gives ``[3 blocks] [1 block + tail]`` (four whole 64-row blocks and 1-16
    rows past them, e.g. 32q/8kv, T=65: measured 7-13 % faster, session 16) and :func:`key_tail`
    does not take them (5-16 rows, or one split);
    ``KDTREE_GQA_SPLIT_TAIL=1`` also for any even number of whole blocks >= 4 (two-block CTAs),
    ``=0`` never. The odd half's partials go to :data:`TAIL_ROWS` shadow rows a split, added by
    the CUDA merge: it needs ``num_splits > 1`` and ``merge`` not the Triton merge (at most 1024
    splits)."""
    if not _split_tail_rows(rows):
        return False
    merge = merge_for(num_splits) if merge is None else merge
    return 1 < num_splits <= MERGE_MAX_SPLITS // 2 and merge != 0


def launch_layout(
    rows: int, num_splits: int, merge: int | None = None, max_len: int | None = None
) -> tuple[int, int, int]:
    """What a launch of ``num_splits`` splits over a page table of ``max_len`` keys (None: not
    known) runs: ``(wgs, tail_blocks, split)``, the :func:`launch_plan` layout (``split`` 0),
    ``(3, 2, 1)`` with :func:`split_tail` or ``(2, 2, 2)`` with :func:`key_tail` (the C
    launcher's ``split_tail`` argument)."""
    if key_tail(rows, num_splits, merge):
        return 2, 2, 2
    if split_tail(rows, num_splits, merge):
        return 3, 2, 1
    tiles = None
    if max_len is not None:  # (the Tall shape's tiles: only its layout reads them)
        tiles = math.ceil(math.ceil(max_len / SHAPES[3][1]) / max(num_splits, 1))
    return (*launch_plan(rows, tiles), 0)


#: The most launch heads :func:`q_groups` makes of one KV head's query heads.
MAX_Q_GROUPS = 4


def q_groups(group: int, t: int) -> int:
    """How many launch heads the ``group`` query heads of one KV head become at ``t`` tree
    tokens (R, dividing ``group``; the kernel's ``q_groups``): 1 where ``group * t`` rows take
    :func:`key_tail`'s layout or no head group of at most :data:`MAX_Q_GROUPS` does; else the
    smallest R whose ``group / R * t`` rows do. 8q/1kv at T=65 (520 rows: eight whole blocks and
    8 rows, which the tail warpgroup's 4 cannot take) runs as two launch heads of 260 rows, each
    WideTail's two CTAs of two whole blocks with 4 rows in their tail warpgroups, reading the
    same cache head. ``KDTREE_GQA_QGROUPS=1`` keeps one launch head a KV head (a measurement
    knob). (Session 23, call b, ``tools/gpu/gqa_layouts.py``, head groups against none: 8q/1kv,
    T=65 1.7-7.3 % less time at 16k-128k; 32q/8kv, T=257 (four of 257 rows) 9.4 % at 16k, 2.5 %
    at 64k; 8q/1kv, T=257 (eight) 5.8 % more at 64k, hence the bound.)"""
    if _env_int("KDTREE_GQA_QGROUPS", (1,)) == 1 or _key_tail_rows(group * t):
        return 1
    for r in range(2, min(group, MAX_Q_GROUPS) + 1):
        if group % r == 0 and _key_tail_rows(group // r * t):
            return r
    return 1


@dataclasses.dataclass(frozen=True)
class GqaLaunch:
    """What one call launches (:func:`plan_launch`): ``heads`` launch heads (``num_kv_heads *
    q_groups``) of ``rows = group / q_groups * t`` packed rows each, ``num_splits`` KV splits,
    the row layout ``(wgs, tail_blocks, split)`` of :func:`launch_layout` and the CUDA merge
    mode; ``workspace_numel`` float32 elements of split workspace; ``trigger`` when a split CTA
    lets a dependent merge be scheduled (:func:`split_trigger`)."""

    q_groups: int
    heads: int
    rows: int
    num_splits: int
    wgs: int
    tail_blocks: int
    split: int
    merge: int
    workspace_numel: int
    trigger: int


def split_trigger(merge: int, grid_x: int, num_splits: int, form: str) -> int:
    """When a split CTA lets the dependent merge be scheduled (``griddepcontrol.launch_dependents``;
    ``split_trigger_of`` in ``kernels/gqa_tree_sm90.cu``, which this mirrors): 0, at its exit,
    where the merge is a programmatic dependent (``merge``) of a grid of one CTA a split
    (``grid_x`` 1, more than one split) in a ``form`` (:func:`~kdtree.kernels.cuda_common.
    merge_form`) that nothing but its threads holds to an SM (``"cta"``, ``"warp"``); else 1, at
    its start. ``KDTREE_GQA_TRIGGER=0|1|2|3`` forces it (a measurement knob; 2: once its producer
    has issued its last copy, 3: once a consumer warpgroup has stored its rows). Session 41, call
    a (``data/bench/logs/trigger_ab_session41.csv.gz``): at 8q/1kv, batch 1, T=17, 16k-256k the
    dependent row-a-CTA merge at the exit trigger 0.975-0.989x the stream-order merge (at the
    start trigger it was 1.07-1.19x, session 39); the sliced merge at T 5-13 1.02-1.07x slower
    at the exit trigger from 16k to 64k than at the start; 2 level with 1 everywhere."""
    env = os.environ.get("KDTREE_GQA_TRIGGER", "").strip()
    if env:
        return int(env)
    if merge != MERGE_PDL or grid_x != 1 or num_splits == 1:
        return 1
    return 0 if form in ("cta", "warp") else 1


def plan_launch(
    batch: int, t: int, num_q_heads: int, num_kv_heads: int, max_len: int, num_sms: int,
    num_splits: int | None = None,
) -> GqaLaunch:  # fmt: skip
    """The launch of a call with ``batch`` requests of ``t`` tree tokens, ``num_q_heads`` query
    heads over ``num_kv_heads`` KV heads and a page table of ``max_len`` keys (static shapes
    only): :func:`q_groups`, then :func:`choose_splits` (unless ``num_splits`` is given) and
    :func:`launch_layout` for the launch heads. Head groups are only taken where the layout
    they are for (:func:`key_tail`) runs at the split count. ``merge`` is the launcher's
    (``KDTREE_CUDA_MERGE=auto``, the default, resolved by
    :func:`~kdtree.kernels.cuda_common.resolve_merge` from the split grid's CTAs)."""
    group = num_q_heads // num_kv_heads
    wanted = q_groups(group, t)
    # the head groups from choose_splits' own count, whatever count is asked for: so a call
    # given the count of its own plan gets that plan (and the workspace it was sized for)
    r = 1
    for cand in (wanted, 1) if wanted > 1 else (1,):
        heads, rows = num_kv_heads * cand, group // cand * t
        auto = choose_splits(batch, heads, rows, max_len, num_sms)
        # (head groups where their split grid is at most two waves: 32q/8kv, T=257 at batch 8
        # and 32 ran 1024-4096 CTAs of four launch heads 2-7 % slower than one, session 26)
        fits = batch * heads * 2 * auto <= 2 * num_sms
        if cand == 1 or (key_tail(rows, auto, merge_for(auto)) and fits):
            r = cand
            break
    heads, rows = num_kv_heads * r, group // r * t
    s = num_splits or auto
    merge = merge_for(s)
    if r > 1 and not key_tail(rows, s, merge):  # a forced count the head groups' layout lacks
        r, heads, rows = 1, num_kv_heads, group * t
    wgs, tail_blocks, split = launch_layout(rows, s, merge, max_len)
    # the merge's launch (KDTREE_CUDA_MERGE=auto): from the split grid's CTAs
    grid_x = 2 if split == 2 else row_ctas(rows, wgs, tail_blocks)
    merge = resolve_merge(merge, batch * heads * grid_x * s, num_sms, one_cta_a_split=grid_x == 1)
    # (one CTA a split: no shared row block, a split's partial an entry)
    form = merge_form(rows, batch * heads, s, num_sms=num_sms, pdl=merge == MERGE_PDL)
    return GqaLaunch(
        r, heads, rows, s, wgs, tail_blocks, split, merge, workspace_numel(batch, heads, rows, s),
        split_trigger(merge, grid_x, s, form),
    )  # fmt: skip


def consumer_warpgroups(rows: int) -> int:
    """The consumer warpgroups a CTA of the split kernel for ``rows`` packed query rows (see
    :func:`launch_plan`)."""
    return launch_plan(rows)[0]


def row_ctas(rows: int, wgs: int, tail_blocks: int) -> int:
    """CTAs along the rows (grid.x) of :func:`launch_plan`'s layout: what
    ``kdtree_gqa_tree_launch`` computes."""
    if tail_blocks == 0:
        return math.ceil(rows / (64 * wgs))
    n_full = rows // 64
    ctas = math.ceil(n_full / tail_blocks)
    last = n_full - (ctas - 1) * tail_blocks if ctas else wgs
    return ctas if last < wgs else ctas + 1


def _busiest_blocks(rows: int, wgs: int, tail_blocks: int, split: int) -> float:
    """64-row blocks of query rows in the busiest CTA of a layout (:func:`launch_layout`), a
    tail warpgroup's rows as 1/8 of a block (session 25: 3.8-4.5 % of a T=65 call)."""
    if split:  # two-block CTAs, the tail's tiles shared by two of them
        return 2.125
    if tail_blocks:
        return float(min(tail_blocks, wgs))
    return float(min(wgs, math.ceil(rows / 64)))


#: From this many keys of page table the split count is costed in each count's own layout
#: (:func:`choose_splits`); below it one split of three-block CTAs stayed faster at batch 8 / 32
#: (session 26, call d: 32q/8kv, T=65 at 1k / 4k, 0.66-0.96x with two splits of the tail layout).
LAYOUT_AWARE_MIN_LEN = 16384


def split_min_keys(rows: int) -> int:
    """The fewest prefix keys :func:`choose_splits` leaves a split for ``rows`` packed query rows:
    one 128-key tile where a split's rows fit one two-warpgroup CTA (at most 128 rows, e.g.
    8q/1kv at T 1 / 9 / 16, 32q/8kv at T <= 32), else 256. Session 35, call c
    (``tools/gpu/mla_splits.py``, two passes, µs): at 8q/1kv, batch 1, 16k the 256-key bound
    held T=1 to 43 splits (10.8) and T=9 to 43 (12.9) where 129 splits, one tile each, took 9.5
    and 10.6; at 32k, T=9 129 splits 14.2 against the bound's 86 at 14.8, T=1 within 1 %. The
    three-warpgroup shape keeps 256 keys (8q/1kv, T=17, 32k: 129 splits 15.4 against 103 at
    14.8). ``KDTREE_GQA_SPLIT_MIN_KEYS=128|256`` forces it (a measurement knob)."""
    forced = _env_int("KDTREE_GQA_SPLIT_MIN_KEYS", (128, 256))
    if forced is not None:
        return forced
    return 128 if rows <= 128 and launch_plan(rows) == (2, 0) else 256


def choose_splits(batch: int, num_kv_heads: int, rows: int, max_len: int, num_sms: int) -> int:
    """KV splits for ``batch`` requests of ``num_kv_heads`` KV heads with ``rows = G * T``
    packed query rows and a prefix bound ``max_len`` (static shapes only). One CTA fits an SM
    (~210-225 KB of shared memory). Modelled time of a split count ``s``: waves ``ceil(ctas * s
    / num_sms)`` times the keys a CTA streams (``ceil(max_len / s)`` in whole tiles) plus 256
    keys of fixed cost (Q load, pipeline fill, epilogue); the smallest ``s`` within 3 % of the
    best, at most ``_MAX_WAVES`` waves and at least :func:`split_min_keys` keys a split (256, or
    one 128-key tile where a split's rows fit one two-warpgroup CTA).

    From :data:`LAYOUT_AWARE_MIN_LEN` keys each ``s`` is costed in the layout it gets
    (:func:`launch_layout`: the two-CTA tail layouts need a merge, so one split of 260 rows runs
    three-block CTAs), times the 64-row blocks of its busiest CTA, and two splits are always
    tried. Before session 26 every ``s`` was costed in the two-CTA layout, as below that length
    still: 32q/8kv, T=65 at batch 8 / 32 took one split, 1.17-1.38x the time of two from 16k
    (calls c, d)."""
    if _key_tail_rows(rows):  # two-block CTAs, no CTA of the tail's own
        wgs1, per_head = 2, rows // 128
    else:
        wgs1, tail_blocks = (3, 2) if _split_tail_rows(rows) else launch_plan(rows)
        per_head = row_ctas(rows, wgs1, tail_blocks)
    ctas1 = batch * num_kv_heads * per_head
    min_keys = split_min_keys(rows)
    by_keys = max_len // 256 if min_keys == 256 else math.ceil(max_len / min_keys)
    cap = max(1, min(by_keys, (_MAX_WAVES * num_sms) // max(ctas1, 1)))
    aware = max_len >= LAYOUT_AWARE_MIN_LEN
    if aware:  # (two splits at least: the two-CTA tail layouts need them)
        cap = max(cap, min(2, max_len // 256))

    def terms(s: int) -> tuple[int, int, int, float]:
        """(tile, tiles, CTAs, busiest blocks) of the layout ``s`` splits get."""
        if aware:
            wgs, tail_blocks, split = launch_layout(rows, s)
            ctas = batch * num_kv_heads * (2 if split == 2 else row_ctas(rows, wgs, tail_blocks))
            blocks = _busiest_blocks(rows, wgs, tail_blocks, split)
        else:
            wgs, ctas, blocks = wgs1, ctas1, 1.0
        tile = SHAPES[wgs][1]
        return tile, max(1, math.ceil(max_len / tile)), ctas, blocks

    # a count's layout depends on it only through whether the two-CTA tail layouts may run
    # (1 < s <= MERGE_MAX_SPLITS // 2: key_tail / split_tail), so one launch_layout a range of
    # counts, not one a count (each reads the layout knobs)
    half = MERGE_MAX_SPLITS // 2
    costs = {}
    for lo, hi in ((1, 1), (2, min(cap, half)), (half + 1, cap)):
        if lo > hi:
            continue
        tile, tiles, ctas, blocks = terms(lo)
        for s in range(lo, hi + 1):
            costs[s] = math.ceil(ctas * s / num_sms) * (math.ceil(tiles / s) * tile + 256) * blocks
    best = min(costs.values())
    return min(s for s, c in costs.items() if c <= best * 1.03)


def workspace_rows(rows: int, num_splits: int) -> int:
    """Rows a split of the workspace: ``rows``, or ``rows +`` :data:`TAIL_ROWS` with
    :func:`split_tail`'s shadow rows or those of a :func:`key_tail` over two CTAs."""
    if key_tail(rows, num_splits) or split_tail(rows, num_splits):
        return rows + TAIL_ROWS
    return rows


def workspace_numel(batch: int, num_kv_heads: int, rows: int, num_splits: int) -> int:
    """fp32 elements of the split workspace: the partials ``[B, Hkv, S, R, 128]`` in the
    input dtype (16-bit: two to an fp32 element) and the fp32 LSE ``[B, Hkv, S, R]``,
    R = :func:`workspace_rows`; 0 with one split. (Partials in the input dtype since session
    22: half the bytes of fp32 to write and to merge; the merges add them in fp32.)"""
    if num_splits <= 1:
        return 0
    n = batch * num_kv_heads * num_splits * workspace_rows(rows, num_splits)
    return n * (HEAD_DIM // 2) + n


def workspace_views(
    workspace: torch.Tensor, batch: int, num_kv_heads: int, rows: int, num_splits: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The split workspace (a float32 tensor of at least :func:`workspace_numel` elements) as
    the kernel reads it: the partials ``[B, Hkv, S, R, 128]`` in ``dtype`` (the input's, bf16 or
    fp16: two to an fp32 element) and after them the fp32 LSE ``[B, Hkv, S, R]``,
    R = :func:`workspace_rows`."""
    ws_rows = workspace_rows(rows, num_splits)
    n = batch * num_kv_heads * num_splits * ws_rows
    half = n * (HEAD_DIM // 2)
    part = workspace[:half].view(dtype).view(batch, num_kv_heads, num_splits, ws_rows, HEAD_DIM)
    lse = workspace[half : half + n].view(batch, num_kv_heads, num_splits, ws_rows)
    return part, lse


# ----------------------------------------------------------------------------- entry point


_ABLATE_WARNED = False


def _warn_if_ablating() -> None:
    """``KDTREE_GQA_ABLATE`` makes the CUDA GQA kernels skip work: say so once a process."""
    global _ABLATE_WARNED
    _ABLATE_WARNED = warn_ablation(
        "KDTREE_GQA_ABLATE", _ABLATE_WARNED, "CUDA GQA kernels", "tools/gpu/gqa_phases.py"
    )


def _check(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, out) -> None:
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, Hq, {HEAD_DIM}], got {tuple(q.shape)}")
    b, t, hq, d = q.shape
    if q.dtype not in _DTYPE_CODES:
        raise TypeError(f"q: dtype {q.dtype}; the CUDA GQA backend supports {list(_DTYPE_CODES)}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, expected q's device {q.device}")
    if d != HEAD_DIM:
        raise ValueError(f"q: head dim {d}; the CUDA GQA kernel is compiled for {HEAD_DIM}")
    if b < 1 or t < 1 or hq < 1:
        raise ValueError(f"q: expected B, T, Hq >= 1, got {tuple(q.shape)}")
    if t > MAX_TREE_TOKENS:
        raise ValueError(f"q: T={t} tree tokens is above the maximum {MAX_TREE_TOKENS}")
    if q.device.type != "cuda":
        raise RuntimeError(f"q: on {q.device}; the CUDA GQA backend needs CUDA tensors")
    if not is_sm90(q.device):
        cap = torch.cuda.get_device_capability(q.device)
        raise RuntimeError(
            f"{q.device} has compute capability {cap}; the CUDA GQA kernel is built for sm_90a "
            "(H100/H200) only"
        )
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[3] != d:
        raise ValueError(
            f"k_cache, v_cache: expected equal [num_pages, page_size, Hkv, {d}], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    if hq % hkv:
        raise ValueError(f"q: {hq} query heads are not a multiple of {hkv} kv heads")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1 or x.stride(0) != page_size * x.stride(1):
            raise ValueError(
                f"{name}: expected pages laid out contiguously (slot = page * page_size + "
                f"offset) with a contiguous last dim; strides {tuple(x.stride())}"
            )
        if x.data_ptr() % 16 or x.stride(1) % 8 or x.stride(2) % 8:
            raise ValueError(f"{name}: expected a 16-byte aligned base and slot / head strides")
    if q.stride(-1) != 1:
        raise ValueError("q: expected a contiguous last dim")
    _check_metadata(b, t, page_size, page_table, prefix_lens, tree_mask, q.device)
    if page_table.shape[1] < 1:
        raise ValueError("page_table: expected >= 1 page")
    if out is not None:
        if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype:
            raise ValueError(
                f"out: expected {q.dtype} {tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}"
            )
        if out.device != q.device:
            raise ValueError(f"out: on {out.device}, expected {q.device}")
        if out.stride(-1) != 1 or out.data_ptr() % 4 or any(s % 2 for s in out.stride()[:-1]):
            raise ValueError("out: expected a contiguous last dim, 4-byte aligned, even strides")


def launch_args(
    q, k_cache, v_cache, page_table, prefix_lens, tree_mask, out, part_ptr, lse_ptr,
    num_splits: int, sm_scale: float, stream: int, wgs: int = 2, merge: int = 1,
    tail_blocks: int = 0, split: int = 0, q_groups: int = 1,
) -> tuple:  # fmt: skip
    """The argument tuple of ``kdtree_gqa_tree_launch`` (one entry per C parameter, in the order
    of the signature in ``kernels/gqa_tree_sm90.cu``)."""
    b, t, hq, d = q.shape
    return (
        _DTYPE_CODES.get(q.dtype, -1),
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        page_table.data_ptr(),
        prefix_lens.data_ptr(),
        tree_mask.data_ptr(),
        out.data_ptr(),
        part_ptr,
        lse_ptr,
        *q.stride()[:3],
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(1),
        v_cache.stride(2),
        page_table.stride(0),
        tree_mask.stride(0),
        tree_mask.stride(1),
        *out.stride()[:3],
        b,
        t,
        hq,
        k_cache.shape[2],
        d,
        k_cache.shape[1],
        page_table.shape[1],
        int(num_splits),
        float(sm_scale),
        k_cache.shape[0] * k_cache.shape[1],  # num_slots (the TMA maps)
        int(wgs),
        int(tail_blocks),
        int(split),
        int(q_groups),
        int(merge),
        stream,
    )


def tree_attention_gqa_cuda(
    q,
    k_cache,
    v_cache,
    page_table,
    prefix_lens,
    tree_mask,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    workspace: torch.Tensor | None = None,
    check_values: bool = False,
    dense_mask=None,
) -> torch.Tensor:
    """GQA tree-verify attention on sm_90, head dim 128 (see
    :func:`kdtree.attention.tree_attention`); returns ``[B, T, Hq, 128]`` in ``q``'s dtype.
    ``num_splits`` forces the KV split count (default: :func:`plan_launch`'s, from the page
    table's capacity). ``workspace``: a contiguous float32 CUDA tensor of at least
    ``plan_launch(...).workspace_numel`` elements (else one is allocated per call when
    splitting).
    ``check_values`` checks ``prefix_lens + T`` against the page table on the host (a sync);
    the kernel never reads past the page table either way. ``dense_mask`` is ignored."""
    del dense_mask
    _warn_if_ablating()
    _check(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, out)
    b, t, hq, d = q.shape
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    max_pages = page_table.shape[1]
    if check_values:
        _check_lengths(prefix_lens, t, page_table, page_size)
    device = q.device
    if num_splits is not None and int(num_splits) < 1:
        raise ValueError(f"num_splits={num_splits}: expected >= 1")
    from kdtree.kernels.workspace import device_sm_count

    plan = plan_launch(
        b, t, hq, hkv, max_pages * page_size, device_sm_count(device),
        None if num_splits is None else int(num_splits),
    )  # fmt: skip
    heads, rows, num_splits, merge = plan.heads, plan.rows, plan.num_splits, plan.merge
    if not aligned16(q):
        q = q.clone(memory_format=torch.contiguous_format)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    part = lse = None
    if plan.workspace_numel:
        workspace = split_workspace(workspace, plan.workspace_numel, device)
        part, lse = workspace_views(workspace, b, heads, rows, num_splits, q.dtype)
    lib = _load()
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        args = launch_args(
            q, k_cache, v_cache, page_table, prefix_lens, tree_mask, out,
            None if part is None else part.data_ptr(), None if lse is None else lse.data_ptr(),
            num_splits, sm_scale, stream, plan.wgs, merge, plan.tail_blocks, plan.split,
            plan.q_groups,
        )  # fmt: skip
        rc = lib.kdtree_gqa_tree_launch(*args)
        if rc != 0:
            msg = lib.kdtree_gqa_error_string(rc).decode()
            raise RuntimeError(f"CUDA GQA tree attention launch failed ({rc}): {msg}")
        if num_splits > 1 and merge == 0:
            launch_merge(part, lse, out, heads, hq // heads, rows, num_splits)
    return out


#: Phases of the consumer warpgroups' clocks (``KDTREE_GQA_CLOCKS=1``; tiles j >= 1; the
#: first "wait_tile" of a CTA also holds its tile-0 prologue): wait for the tile, issue S_j and
#: P_{j-1} V_{j-1}, wait for S_j, softmax, wait for P_{j-1} V_{j-1}, release + rescale. Each
#: shape has them in a measurement build only: the two-warpgroup one in registers
#: (``KDTREE_CUDA_DEFINES=KDTREE_GQA_WIDE_CLOCKS``, since session 25: their ten registers kept
#: its consumers off the max-free path), the three-warpgroup one in shared memory
#: (``KDTREE_GQA_TALL_CLOCKS``: compiled in, they cost the default kernel 2-7 % at T=65; its
#: producer keeps none: at 32 registers they spill). The tail warpgroup's layout has none.
CONSUMER_PHASES = ("wait_tile", "issue", "wait_s", "softmax", "wait_pv", "rescale")
#: Phases of the producer's clocks: wait for a free stage, issue the tile's copies.
PRODUCER_PHASES = ("wait_empty", "copies")


def phase_clocks() -> dict[str, float]:
    """Phase clocks accumulated since the last read (launches made with ``KDTREE_GQA_CLOCKS=1``),
    then reset: mean cycles per tile of each phase of thread 0 of each consumer warpgroup
    (``wg0.<phase>``, ``wg1.<phase>``, ``wg2.<phase>`` in the three-warpgroup shape) and of the
    producer (``prod.<phase>``, the two-warpgroup shape), with ``tiles`` and ``ctas``
    (consumer warpgroup 0's). A warpgroup with no rows (or the tail warpgroup) stamps nothing."""
    buf = (ctypes.c_ulonglong * 40)()
    rc = _load().kdtree_gqa_clocks(ctypes.cast(buf, ctypes.c_void_p))
    if rc != 0:
        raise RuntimeError(f"reading the GQA clocks failed ({rc})")
    if buf[9] == 0:
        raise RuntimeError(
            "no GQA clocks were recorded: launch with KDTREE_GQA_CLOCKS=1 in a measurement "
            "build that keeps them (KDTREE_CUDA_DEFINES=KDTREE_GQA_WIDE_CLOCKS for the "
            "two-warpgroup shape, KDTREE_GQA_TALL_CLOCKS for the three-warpgroup one; "
            "tools/gpu/gqa_phases.py)"
        )
    out: dict[str, float] = {}
    for w in range(4):
        if buf[10 * w + 9] == 0:  # no CTA stamped this row
            continue
        names = PRODUCER_PHASES if w == 3 else CONSUMER_PHASES
        tiles = max(int(buf[10 * w + 8]), 1)
        key = "prod" if w == 3 else f"wg{w}"
        for i, name in enumerate(names):
            out[f"{key}.{name}"] = buf[10 * w + i] / tiles
    out.update(tiles=int(buf[8]), ctas=int(buf[9]))
    return out


#: Records the CTA timeline's ring holds (``TL_CAP`` in ``kernels/sm90_common.cuh``).
TIMELINE_CAP = 1 << 16


def timeline_records(discard: bool = False):
    """The CTA timeline's records since the last read, then reset (launches of a
    ``KDTREE_CUDA_DEFINES=KDTREE_TIMELINE`` build; ``tools/gpu/gqa_timeline.py``): a
    ``(n, 8)`` uint64 array, one row a CTA of the split and merge kernels, decoded by
    :func:`kdtree.profiling.cta_timeline.decode`. Raises when the library is not a timeline
    build, a copy fails, or the ring overflowed (records were dropped) unless ``discard`` (a
    read that only empties the ring)."""
    import numpy as np

    lib = _load()
    words = lib.kdtree_gqa_timeline_words()
    buf = np.zeros((TIMELINE_CAP, words), dtype=np.uint64)
    n = lib.kdtree_gqa_timeline(buf.ctypes.data_as(ctypes.c_void_p), TIMELINE_CAP)
    if n == -1:
        raise RuntimeError(
            "the CUDA GQA library is not a timeline build: set KDTREE_CUDA_DEFINES=KDTREE_TIMELINE "
            "before it loads (tools/gpu/gqa_timeline.py does)"
        )
    if n < 0:
        raise RuntimeError(f"reading the CTA timeline failed (cudaError {-n - 1000})")
    if n > TIMELINE_CAP and not discard:
        raise RuntimeError(f"the CTA timeline ring overflowed: {n} records, {TIMELINE_CAP} kept")
    return buf[:n].copy()


def _register() -> None:
    from kdtree.attention import register_backend

    register_backend("gqa", "cuda", tree_attention_gqa_cuda)


_register()
