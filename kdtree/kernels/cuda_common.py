"""Host-side pieces the sm_90 CUDA C++ backends share (:mod:`kdtree.kernels.cuda_mla`,
:mod:`kdtree.kernels.cuda_gqa`): the device and build checks ``backend="auto"`` makes, the
measurement-knob warning, operand alignment, the split workspace and who merges the splits."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

__all__ = [
    "aligned16",
    "any_sm90",
    "is_sm90",
    "library_builds",
    "merge_for",
    "merge_cols",
    "merge_ctas",
    "merge_form",
    "merge_mode",
    "on_sm90",
    "resolve_merge",
    "split_pdl",
    "split_workspace",
    "warn_ablation",
]

#: ``KDTREE_CUDA_MERGE`` values -> the launchers' ``merge`` argument (kernels/sm90_common.cuh
#: MERGE_BY_CALLER / MERGE_PLAIN / MERGE_PDL); ``auto`` (:data:`MERGE_AUTO`) is resolved to
#: ``plain`` or ``pdl`` on the host before a launch (:func:`resolve_merge`).
MERGE_MODES = {"triton": 0, "plain": 1, "pdl": 2, "auto": 3}
MERGE_PLAIN, MERGE_PDL, MERGE_AUTO = 1, 2, 3
#: The CUDA merge's split bound (kernels/sm90_common.cuh MERGE_MAX_SPLITS: the two-pass merge of
#: fp32 partials keeps its weights in shared memory; the one-pass merge takes the same bound);
#: above it the backends use the Triton merge.
MERGE_MAX_SPLITS = 2048
#: The CUDA merge takes a row a warp up to this many entries a row (kernels/sm90_common.cuh
#: MERGE_WARP_ENTRIES: a split's partial, or two with the split tail's shadow rows), head dim 128.
MERGE_WARP_ENTRIES = 16
#: The GQA merge's rows over several CTAs of a column slice each (kernels/sm90_common.cuh
#: merge_splits_cols_kernel, sessions 39-40), for rows of more than MERGE_COLS_MIN_ENTRIES
#: entries: MERGE_COLS_DEFAULT CTAs a row where the merge has at most MERGE_COLS_MAX_ROW_CTAS row
#: CTAs (8q/1kv, T=1, batch 1), MERGE_COLS_PDL as a programmatic dependent where it has at most
#: one an SM (8q/1kv, T 3-16, batch 1); MERGE_COLS_ENTRIES: the most entries a row at each count.
MERGE_COLS_MAX_ROW_CTAS, MERGE_COLS_DEFAULT, MERGE_COLS_MIN_ENTRIES = 16, 8, 64
MERGE_COLS_PDL = 4
MERGE_COLS_ENTRIES = {2: 144, 4: 160, 8: 192, 16: 256}
#: The wide merge's bounds (merge_splits_wide_kernel, session 38): at most this many entries a
#: row, on merge grids of at least three CTAs an SM (16-bit partials, head dim 128).
MERGE_WIDE_ENTRIES = 72


def is_sm90(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


def aligned16(x: torch.Tensor) -> bool:
    """``x``'s base and every stride but the last allow 16-byte copies of its rows."""
    return x.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in x.stride()[:-1])


def library_builds(find_nvcc: Callable, load: Callable, what: str) -> bool:
    """nvcc is found and ``load()`` builds and loads the library; a build failure (an nvcc
    without sm_90a, a broken toolchain) warns that ``"auto"`` uses Triton for ``what``."""
    if find_nvcc() is None:
        return False
    try:
        load()
    except Exception as exc:
        warnings.warn(
            f"the CUDA {what} kernel did not build ({exc}); backend 'auto' uses Triton for {what}",
            RuntimeWarning,
            stacklevel=5,
        )
        return False
    return True


def on_sm90(device: torch.device, library_ok: Callable[[], bool]) -> bool:
    """``device`` is an sm_90 (Hopper) GPU and ``library_ok()`` (checked only then)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return is_sm90(torch.device("cuda", device.index or 0)) and library_ok()


def any_sm90(find_nvcc: Callable) -> bool:
    """nvcc is found and an sm_90 device is present."""
    if find_nvcc() is None or not torch.cuda.is_available():
        return False
    return any(is_sm90(torch.device("cuda", i)) for i in range(torch.cuda.device_count()))


def warn_ablation(env_var: str, warned: bool, what: str, tool: str) -> bool:
    """Warn once a process when the measurement knob ``env_var`` is set to anything but 0 (the
    kernel then skips work and its results are wrong by design; the launcher reads it at every
    launch, a CUDA graph keeps the value captured). Returns the new ``warned`` state."""
    value = os.environ.get(env_var, "0").strip()
    if value in ("", "0") or warned:
        return warned
    warnings.warn(
        f"{env_var}={value}: the {what} skip work and their results are wrong (a measurement "
        f"setting of {tool})",
        RuntimeWarning,
        stacklevel=4,
    )
    return True


def split_workspace(
    workspace: torch.Tensor | None, need: int, device: torch.device
) -> torch.Tensor:
    """``workspace`` checked to hold ``need`` float32 elements on ``device`` (contiguous,
    16-byte aligned), or a new one when it is None (an allocation inside the call)."""
    if workspace is None:
        return torch.empty(need, dtype=torch.float32, device=device)
    if (
        workspace.dtype != torch.float32
        or workspace.device != device
        or not workspace.is_contiguous()
        or workspace.numel() < need
        or workspace.data_ptr() % 16
    ):
        raise ValueError(
            f"workspace: expected a contiguous 16-byte aligned float32 tensor on {device} "
            f"with >= {need} elements, got {workspace.dtype} {tuple(workspace.shape)} "
            f"on {workspace.device}"
        )
    return workspace


def split_pdl() -> bool:
    """Whether the CUDA split kernels (GQA; the seesaw MLA kernel since session 28) launch as
    programmatic dependents of the kernel before them (``KDTREE_CUDA_SPLIT_PDL``, anything but
    ``0``; the default), as ``split_pdl`` in ``kernels/sm90_common.cuh`` reads it."""
    return os.environ.get("KDTREE_CUDA_SPLIT_PDL", "1")[:1] != "0"


def merge_mode() -> int:
    """Who merges the split partials of the CUDA backends (``KDTREE_CUDA_MERGE``, read at every
    call; a CUDA graph keeps what it captured): ``auto`` (default) lets the GQA backend pick
    ``plain`` or ``pdl`` for each launch (:func:`resolve_merge`; the MLA backend runs ``plain``,
    not measured otherwise);
    ``plain`` the shared CUDA merge of ``kernels/sm90_common.cuh`` in stream order; ``pdl`` the
    same kernel as a programmatic dependent launch of the split kernel (its CTAs launched once
    every split CTA has started, waiting for the split grid to finish); ``triton`` the Triton
    merge (:func:`kdtree.kernels._common.launch_merge`). All give the same result up to
    summation order."""
    value = os.environ.get("KDTREE_CUDA_MERGE", "auto").strip() or "auto"
    if value not in MERGE_MODES:
        raise ValueError(f"KDTREE_CUDA_MERGE={value!r}: expected one of {sorted(MERGE_MODES)}")
    return MERGE_MODES[value]


def merge_for(num_splits: int) -> int:
    """The launchers' ``merge`` argument for ``num_splits`` splits: :func:`merge_mode`, except the
    Triton merge (0) above :data:`MERGE_MAX_SPLITS` (a forced split count; ``choose_splits``
    stays far below it). :data:`MERGE_AUTO` is still to be resolved (:func:`resolve_merge`)."""
    mode = merge_mode()
    return 0 if num_splits > MERGE_MAX_SPLITS else mode


def resolve_merge(merge: int, split_ctas: int, num_sms: int, one_cta_a_split: bool = False) -> int:
    """The merge launch for ``merge`` (:func:`merge_for`) after a split grid of ``split_ctas``
    CTAs (one an SM): ``merge`` unless it is :data:`MERGE_AUTO`, which takes the programmatic
    dependent launch where every wave of the split grid fills the SMs (``split_ctas`` a
    multiple of ``num_sms``), so no SM is free when its last CTA starts, or where each split is
    one CTA (``one_cta_a_split``: the split kernel then lets a merge that nothing but its
    threads holds to an SM be scheduled at its CTAs' exit, :func:`split_trigger`); else stream
    order.

    Why: a dependent launch puts the merge's CTAs on the SMs as the split grid's last CTAs leave
    them, so they wait there for its end instead of being launched after it. Where SMs are free
    once the last split CTA has started (fewer CTAs than SMs, or a last wave that does not fill
    them), a merge the split CTAs let be scheduled at their start first crowds those SMs while
    the split grid runs (the CTA timeline, session 17: the merge 3.3 -> 5.5-6.3 us). Measured on
    one-wave grids only (batch 1). Alternating rounds against stream order (session 23 call f,
    session 25 call a; ``data/bench/logs/gqa_ab_session2{3,5}.csv.gz``): at 8q/1kv, T=65,
    16k-64k (132 split CTAs) 0.8-2.5 % less time (64k 37.66 -> 37.28 us in call a); with SMs free
    2.3 % more at 8q/1kv, T=17, 16k (64 CTAs, call a), 5.5-12.8 % more at 8q/1kv, T=17,
    32k-128k (103-129 CTAs, call f) and 0.4-8.8 % at 32q/8kv (120-128 CTAs). Session 35, call e
    (``data/bench/logs/merge_pdl_session35_calle.csv.gz``): where each split is one CTA (8q/1kv
    at T <= 17) the dependent row-a-CTA merge, scheduled at the split CTAs' start, 2.5-3.1 µs
    slower at 8q/1kv, batch 1, T 1 / 9 / 17, 16k-64k, even at 132 split CTAs. Two forms pay
    there: the sliced merge, four CTAs an SM (session 40, ``pdl_merge_ab_session40.csv.gz``:
    8q/1kv, batch 1, 8k-256k, T 5-13 0.92-1.02x stream order, T=1 at 8 a row 0.93-1.01x), and
    since session 41 any merge the split CTAs let be scheduled at their exit (call a,
    ``trigger_ab_session41.csv.gz``: the row-a-CTA merge at 8q/1kv, batch 1, T=17, 16k-256k
    0.975-0.989x stream order, three rounds)."""
    if merge != MERGE_AUTO:
        return merge
    if one_cta_a_split:
        return MERGE_PDL
    full = split_ctas > 0 and split_ctas % num_sms == 0
    return MERGE_PDL if full else MERGE_PLAIN


def merge_cols(row_ctas: int, entries: int, pdl: bool = False, num_sms: int | None = None) -> int:
    """CTAs a row of the GQA merge's column-sliced form for a merge of ``row_ctas`` rows (batch x
    KV heads x rows) of ``entries`` partials, launched as a programmatic dependent or not
    (``pdl``), on ``num_sms`` SMs; 0 for none (``merge_cols_of`` in ``launch_merge_splits``, for
    rows neither the row-a-warp nor the wide merge takes). For ``entries`` >
    :data:`MERGE_COLS_MIN_ENTRIES`: :data:`MERGE_COLS_DEFAULT` where ``row_ctas`` <=
    :data:`MERGE_COLS_MAX_ROW_CTAS`, :data:`MERGE_COLS_PDL` where ``pdl`` and ``row_ctas`` <=
    ``num_sms`` (decided only with ``num_sms``). ``KDTREE_CUDA_MERGE_COLS=0|2|4|8|16`` forces
    the count (a measurement knob). Where a row's entries exceed what the count holds
    (:data:`MERGE_COLS_ENTRIES`), 0."""
    env = os.environ.get("KDTREE_CUDA_MERGE_COLS", "")
    if env:
        cs = int(env)
    elif entries <= MERGE_COLS_MIN_ENTRIES:
        cs = 0
    elif row_ctas <= MERGE_COLS_MAX_ROW_CTAS:
        cs = MERGE_COLS_DEFAULT
    else:
        cs = MERGE_COLS_PDL if pdl and num_sms is not None and row_ctas <= num_sms else 0
    return cs if entries <= MERGE_COLS_ENTRIES.get(cs, 0) else 0


def merge_form(
    rows: int,
    heads: int,
    entries: int,
    head_dim: int = 128,
    num_sms: int | None = None,
    pdl: bool = False,
) -> str:
    """Which kernel the CUDA merge over ``heads`` (batch x KV heads) of ``rows`` output rows with
    ``entries`` partials a row takes (``merge_form_of`` in ``kernels/sm90_common.cuh``):
    ``"warp"`` (a row a warp) where the entries fit (:data:`MERGE_WARP_ENTRIES`, head dim 128,
    unless ``KDTREE_CUDA_MERGE_WARP=0``); at head dim 128 (the GQA kernel's 16-bit partials)
    ``"wide"`` (a row a CTA of 128 threads: at most :data:`MERGE_WIDE_ENTRIES` entries and three
    row CTAs an SM, decided only with ``num_sms``, unless ``KDTREE_CUDA_MERGE_WIDE=0``) or
    ``"cols"`` (:func:`merge_cols` CTAs a row, launched as a programmatic dependent or not:
    ``pdl``); else ``"cta"`` (a row a CTA)."""
    if (
        head_dim == 128
        and entries <= MERGE_WARP_ENTRIES
        and os.environ.get("KDTREE_CUDA_MERGE_WARP", "1")[:1] != "0"
    ):
        return "warp"
    if head_dim != 128:
        return "cta"
    if (
        num_sms is not None
        and entries <= MERGE_WIDE_ENTRIES
        and rows * heads >= 3 * num_sms
        and os.environ.get("KDTREE_CUDA_MERGE_WIDE", "1")[:1] != "0"
    ):
        return "wide"
    return "cols" if merge_cols(rows * heads, entries, pdl, num_sms) > 0 else "cta"


def merge_ctas(
    rows: int,
    heads: int,
    entries: int,
    head_dim: int = 128,
    num_sms: int | None = None,
    pdl: bool = False,
) -> int:
    """CTAs of the CUDA merge over ``heads`` (batch x KV heads) of ``rows`` output rows with
    ``entries`` partials a row (``launch_merge_splits``, the form :func:`merge_form` names): a
    row a warp, eight a CTA; :func:`merge_cols` CTAs a row for the sliced form; else a row a CTA.
    The CTA timeline counts its records by it."""
    form = merge_form(rows, heads, entries, head_dim, num_sms, pdl)
    if form == "warp":
        return -(-rows // 8) * heads
    cs = merge_cols(rows * heads, entries, pdl, num_sms) if form == "cols" else 0
    return rows * heads * max(cs, 1)
