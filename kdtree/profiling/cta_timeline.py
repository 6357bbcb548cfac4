"""Where a verify call's fixed cost goes, CTA by CTA: the records of the CUDA kernels'
timeline build (``KDTREE_CUDA_DEFINES=KDTREE_TIMELINE``, ``kernels/sm90_common.cuh``), read by
:func:`kdtree.kernels.cuda_gqa.timeline_records` and taken apart here.

Every CTA of the split kernel and of the merge appends one record when its last warpgroup
leaves: ``%globaltimer`` stamps (ns, one clock for all SMs) at entry, when its first KV tile has
landed, when its producer issued the first tile, when warpgroup 0's last MMA retired, at exit,
and its SM's cycles from entry to exit. A CUDA-graph replay of ``n`` calls gives ``n`` split
grids and ``n`` merge grids in stream order, so sorting each kind by entry and cutting it into
grid-sized runs recovers the calls (:func:`assign_calls` checks the order it relies on).

:func:`call_phases` turns a call into the spans a performance engineer asks about: how long
the CTAs take to start (``ramp``), how long a CTA waits for its first tile (``first_tile``),
how long it streams, its epilogue, how far the last CTA trails the median one (``straggle``),
the gaps between the kernels, and the merge. Pure pandas: the tests feed it synthetic records.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: The words of a record (``TL_WORDS`` in ``kernels/sm90_common.cuh``).
WORDS = ("meta", "block", "entry", "first_tile", "first_issue", "mma_end", "exit", "cycles")
KINDS = {0: "split", 1: "merge"}
#: The stamp columns (ns), 0 where a CTA has none (a merge CTA has no tiles).
STAMPS = ("entry", "first_tile", "first_issue", "mma_end", "exit")


def decode(raw: np.ndarray) -> pd.DataFrame:
    """``(n, 8)`` uint64 records -> one row a CTA: ``kind`` (split, merge), ``smid``, ``tiles``
    (the split's KV tiles; the merge's partials a row), ``bx``, ``by``, ``bz`` (its blockIdx),
    the stamps in ns (int64) and ``cycles``."""
    raw = np.asarray(raw, dtype=np.uint64)
    if raw.ndim != 2 or raw.shape[1] != len(WORDS):
        raise ValueError(f"expected (n, {len(WORDS)}) records, got {raw.shape}")
    meta, block = raw[:, 0], raw[:, 1]
    kind = (meta & np.uint64(0xFF)).astype(np.int64)
    bad = ~np.isin(kind, list(KINDS))
    if bad.any():
        raise ValueError(f"unknown record kinds {sorted(set(kind[bad].tolist()))}")
    df = pd.DataFrame(
        {
            "kind": pd.Categorical([KINDS[k] for k in kind], categories=list(KINDS.values())),
            "smid": ((meta >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.int64),
            "tiles": (meta >> np.uint64(32)).astype(np.int64),
            "bx": (block & np.uint64((1 << 24) - 1)).astype(np.int64),
            "by": ((block >> np.uint64(24)) & np.uint64((1 << 20) - 1)).astype(np.int64),
            "bz": (block >> np.uint64(44)).astype(np.int64),
        }
    )
    for i, name in enumerate(WORDS[2:], start=2):
        df[name] = raw[:, i].astype(np.int64)
    return df


def assign_calls(
    df: pd.DataFrame, split_ctas: int, merge_ctas: int, overlap: bool = False
) -> pd.DataFrame:
    """Number the calls of one replay (``call`` 0, 1, ...): each kind sorted by entry and cut
    into runs of its grid size (``merge_ctas`` 0: no merge). Raises when the counts do not divide
    or the runs overlap where stream order forbids it (a merge CTA entering before its split
    grid's last exit, or a split grid entering before the previous call's last exit; ``overlap``
    allows the latter: a split kernel launched as a programmatic dependent starts while the
    previous call's merge runs, and its ``gap_next`` is then negative)."""
    if split_ctas < 1 or merge_ctas < 0:
        raise ValueError("split_ctas >= 1 and merge_ctas >= 0")
    out = []
    calls = None
    for kind, size in (("split", split_ctas), ("merge", merge_ctas)):
        part = df[df["kind"] == kind].sort_values("entry", kind="stable")
        if size == 0:
            if len(part):
                raise ValueError(f"{len(part)} merge records but merge_ctas = 0")
            continue
        if len(part) % size:
            raise ValueError(f"{len(part)} {kind} records are not whole grids of {size}")
        n = len(part) // size
        if calls is not None and n != calls:
            raise ValueError(f"{calls} split grids but {n} merge grids")
        calls = n
        out.append(part.assign(call=np.repeat(np.arange(n), size)))
    res = pd.concat(out, ignore_index=True)
    spans = res.groupby(["call", "kind"], observed=True).agg(
        first=("entry", "min"), last=("exit", "max")
    )
    for c in range(calls or 0):
        split = spans.loc[(c, "split")]
        if merge_ctas and spans.loc[(c, "merge"), "first"] < split["last"]:
            raise ValueError(f"call {c}: a merge CTA entered before the split grid's last exit")
        if c > 0 and not overlap:
            prev = spans.loc[(c - 1, "merge" if merge_ctas else "split"), "last"]
            if split["first"] < prev:
                raise ValueError(f"call {c}: a split CTA entered before call {c - 1} ended")
    return res


def call_phases(df: pd.DataFrame) -> pd.DataFrame:
    """One row a call (``df`` from :func:`assign_calls`, one replay), spans in µs:

    * ``ramp``: the split grid's last entry minus its first (CTAs still being launched);
    * ``first_tile``: the median CTA's entry to its first KV tile landed (barriers, Q, page
      table, the first copy's round trip); ``issue``: entry to the producer's first issue;
    * ``stream``: the median CTA's first tile to warpgroup 0's last MMA; ``stream_max`` the
      longest; ``epilogue``: the median CTA's last MMA to exit (partials and LSE stored);
      a stamp of 0 is one the CTA never took (idle consumers, ``KDTREE_GQA_ABLATE=16``, stamp
      no tile and no MMA): the spans it bounds are NaN then;
    * ``straggle``: the last split exit minus the median one; ``split``: the split grid's span;
    * ``gap_merge``: the split's last exit to the merge's first entry; ``merge``: its span;
    * ``gap_next``: the call's last exit to the next call's first entry (NaN for the last);
    * ``call``: first split entry to the next call's (NaN for the last), the period a
      graph of back-to-back calls runs at; ``ghz``: the SM clock, cycles over ns of the CTAs
      that ran >= 5 µs."""
    rows = []
    calls = sorted(df["call"].unique())
    firsts = {c: df.loc[(df["call"] == c) & (df["kind"] == "split"), "entry"].min() for c in calls}
    for c in calls:
        s = df[(df["call"] == c) & (df["kind"] == "split")]
        m = df[(df["call"] == c) & (df["kind"] == "merge")]
        t0 = s["entry"].min()
        end = m["exit"].max() if len(m) else s["exit"].max()
        tiled = s[s["tiles"] > 0]
        landed = tiled["first_tile"].where(tiled["first_tile"] > 0)  # (0: never stamped)
        issued = tiled["first_issue"].where(tiled["first_issue"] > 0)
        mma_end = tiled["mma_end"].where(tiled["mma_end"] > 0)
        nxt = firsts.get(c + 1)
        long = df[(df["call"] == c) & (df["exit"] - df["entry"] >= 5000)]
        us = 1e-3
        rows.append(
            {
                "call": c,
                "split_ctas": len(s),
                "merge_ctas": len(m),
                "ramp": (s["entry"].max() - t0) * us,
                "first_tile": (landed - tiled["entry"]).median() * us,
                "issue": (issued - tiled["entry"]).median() * us,
                "stream": (mma_end - landed).median() * us,
                "stream_max": (mma_end - landed).max() * us,
                "epilogue": (s["exit"] - s["mma_end"].where(s["mma_end"] > 0)).median() * us,
                "straggle": (s["exit"].max() - s["exit"].median()) * us,
                "split": (s["exit"].max() - t0) * us,
                "gap_merge": (m["entry"].min() - s["exit"].max()) * us if len(m) else np.nan,
                "merge": (m["exit"].max() - m["entry"].min()) * us if len(m) else np.nan,
                "gap_next": (nxt - end) * us if nxt is not None else np.nan,
                "call_us": (nxt - t0) * us if nxt is not None else np.nan,
                "ghz": float((long["cycles"] / (long["exit"] - long["entry"])).median())
                if len(long)
                else np.nan,
            }
        )
    return pd.DataFrame(rows)


def timer_step_ns(df: pd.DataFrame) -> int:
    """The smallest nonzero difference between any two distinct stamps: how finely
    ``%globaltimer`` ticked in these records (0 with fewer than two distinct stamps)."""
    vals = np.unique(df[list(STAMPS)].to_numpy().ravel())
    vals = vals[vals > 0]
    return int(np.diff(vals).min()) if len(vals) > 1 else 0


def gantt(df: pd.DataFrame, call: int, us_per_unit: float = 1e-3) -> pd.DataFrame:
    """Bars for a timeline figure of one call (µs from its first split entry): a split CTA's
    ``prologue`` (entry to first tile), ``stream`` (to warpgroup 0's last MMA) and ``epilogue``
    (to exit); a merge CTA's ``merge``. Columns ``lane`` (split CTAs by entry, then merge CTAs),
    ``smid``, ``phase``, ``start``, ``end``. ``us_per_unit``: the stamps' unit in µs (1e-3 for
    the kernels' ns; 1 for the µs of ``tools/gpu/gqa_timeline.py``'s CTA file)."""
    d = df[df["call"] == call]
    d = d.assign(_merge=d["kind"].astype(str) == "merge").sort_values(["_merge", "entry"])
    t0 = d.loc[d["kind"] == "split", "entry"].min()
    bars = []
    for lane, r in enumerate(d.itertuples()):
        if r.kind == "split" and r.tiles > 0:
            cuts = [("prologue", r.entry, r.first_tile), ("stream", r.first_tile, r.mma_end)]
            cuts.append(("epilogue", r.mma_end, r.exit))
        else:
            cuts = [("merge" if r.kind == "merge" else "empty split", r.entry, r.exit)]
        for phase, a, b in cuts:
            bars.append(
                (lane, r.smid, r.kind, phase, (a - t0) * us_per_unit, (b - t0) * us_per_unit)
            )
    return pd.DataFrame(bars, columns=["lane", "smid", "kind", "phase", "start", "end"])
