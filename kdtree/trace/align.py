"""Put PM-sampling timestamps (GPU clock) on the host's Unix-epoch clock, robustly.

The raw timestamps are not trusted blindly: samples with a zero, out-of-order or foreign start
(the first PM sample of a session can carry ``start_timestamp == 0``) are re-placed by index
from their nearest good neighbour; a spacing that disagrees with the configured interval (wrong
unit) falls back to a synthetic timeline; a mapping that leaves most samples outside the host
window is replaced by one anchored at the host start. Nothing is dropped silently: every
fallback is named in ``alignment["warnings"]`` and ``alignment["approximate"]`` says whether the
placement was measured (clock or calibration bursts) or guessed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FIT_FRACTION = 0.9  # a mapping "fits" when this share of samples lands in the host window
MIN_IN_WINDOW = 0.5  # below this share in the host window, no mapping is trusted


@dataclass(frozen=True)
class ClockPair:
    epoch_ns: int  # host Unix-epoch ns at the middle of the bracket
    other_ns: int  # the other clock's reading
    width_ns: int  # bracket width: the pairing's uncertainty is half of it


def clock_pair(read: Callable[[], int], tries: int = 7) -> ClockPair:
    """Pair ``read()`` with ``time.time_ns()``; keeps the tightest of ``tries`` brackets."""
    best = None
    for _ in range(tries):
        a = time.time_ns()
        c = int(read())
        b = time.time_ns()
        if best is None or b - a < best.width_ns:
            best = ClockPair((a + b) // 2, c, b - a)
    assert best is not None
    return best


def _in_window(t: np.ndarray, lo: int, hi: int) -> float:
    return float(np.mean((t >= lo) & (t <= hi))) if t.size else 0.0


def choose_mapping(
    starts: np.ndarray,
    host_start_ns: int,
    host_stop_ns: int,
    pairs: Sequence[ClockPair],
    tol_ns: int,
) -> tuple[str, int]:
    """Return ``(name, offset)`` so that ``starts + offset`` lies in the host window:
    ``identity``, else ``cupti`` (clock pairs), else ``anchor`` (first sample = host start).
    A mapping fits when :data:`FIT_FRACTION` of the samples land in the window (one stray
    sample does not disqualify it)."""
    lo, hi = host_start_ns - tol_ns, host_stop_ns + tol_ns

    def fits(off: int) -> bool:
        return _in_window(starts + off, lo, hi) >= FIT_FRACTION

    if fits(0):
        return "identity", 0
    if pairs:
        off = int(round(np.mean([p.epoch_ns - p.other_ns for p in pairs])))
        if fits(off):
            return "cupti", off
    first = int(starts[0]) if starts.size else 0
    return "anchor", host_start_ns - first


def find_edges(
    t: np.ndarray, t_end: np.ndarray, v: np.ndarray, t0: int, t1: int, margin_ns: int
) -> tuple[int, int] | None:
    """Rise and fall time of the burst that a marker issued in ``[t0, t1]`` left in the series."""
    m = (t >= t0 - margin_ns) & (t <= t1 + margin_ns)
    if not m.any():
        return None
    idx = np.flatnonzero(m)
    w = v[idx]
    peak = float(w.max())
    base = float(np.percentile(w, 10))
    if peak <= 0 or peak - base < 0.2 * peak:
        return None
    hot = w >= base + 0.5 * (peak - base)
    # runs of hot samples; the marker's burst is the run starting nearest to its launch
    edges = np.diff(np.concatenate([[0], hot.astype(np.int8), [0]]))
    run_s, run_e = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    k = int(np.argmin(np.abs(t[idx[run_s]] - t0)))
    return int(t[idx[run_s[k]]]), int(t_end[idx[run_e[k]]])


def raw_diagnostics(
    starts: np.ndarray, ends: np.ndarray, host_start_ns: int, pairs: Sequence[ClockPair]
) -> dict[str, Any]:
    """What the collector returned, before any repair (for ``meta['raw_timestamps']``)."""
    n = int(starts.size)
    doc: dict[str, Any] = {"n": n, "clock_pairs": [asdict(p) for p in pairs]}
    if n == 0:
        return doc
    d = np.diff(starts)
    nz = starts[starts > 0]
    doc.update(
        first_start=int(starts[0]), first_end=int(ends[0]),
        last_start=int(starts[-1]), last_end=int(ends[-1]),
        head=[[int(a), int(b)] for a, b in zip(starts[:3], ends[:3], strict=True)],
        tail=[[int(a), int(b)] for a, b in zip(starts[-2:], ends[-2:], strict=True)],
        delta_ns={"median": int(np.median(d)), "min": int(d.min()), "max": int(d.max())}
        if d.size else None,
        width_ns_median=int(np.median(ends - starts)),
        n_zero_start=int((starts == 0).sum()),
        n_nonincreasing=int((d <= 0).sum()),
        first_nonzero_start_minus_host_start_ns=int(nz[0]) - host_start_ns if nz.size else None,
    )  # fmt: skip
    return doc


def repair_timestamps(
    starts: np.ndarray, ends: np.ndarray, interval_ns: int, max_jump_ns: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Keep the dominant clock segment; re-place the other samples by index.

    A sample is *good* when its start is non-zero, increasing, and within ``max_jump_ns`` of
    where the median clock puts a sample of its index (``start - i * spacing``). Every other sample gets
    ``start = start[j] + (i - j) * step`` from its nearest good sample ``j`` (``step``: the
    median spacing of adjacent good samples). Ends that are missing or implausible become
    ``start + step``. Returns ``(starts, ends, n_repaired)``; with no good sample at all the
    timeline is ``i * interval_ns``.
    """
    n = starts.size
    s, e = starts.astype(np.int64).copy(), ends.astype(np.int64).copy()
    if n == 0:
        return s, e, 0
    idx = np.flatnonzero(s > 0)
    good = np.zeros(n, dtype=bool)
    if idx.size:
        d = np.diff(s[idx])
        pos = d[d > 0]
        est = int(np.median(pos)) if pos.size else interval_ns
        # the dominant clock: samples whose start is where their index says, up to the
        # holes a real recording can have (at most the host span)
        r = s[idx] - idx * est
        good[idx[np.abs(r - np.median(r)) <= max_jump_ns]] = True
        gi = np.flatnonzero(good)
        good[gi[1:][np.diff(s[gi]) <= 0]] = False  # a repeated or backwards start
    gi = np.flatnonzero(good)
    if gi.size == 0:
        s = np.arange(n, dtype=np.int64) * interval_ns
        return s, s + interval_ns, n
    adjacent = np.diff(gi) == 1
    step = int(np.median(np.diff(s[gi])[adjacent])) if adjacent.any() else interval_ns
    bad = np.flatnonzero(~good)
    if bad.size:
        pos = np.searchsorted(gi, bad)
        left = gi[np.clip(pos - 1, 0, gi.size - 1)]
        right = gi[np.clip(pos, 0, gi.size - 1)]
        j = np.where(np.abs(bad - left) <= np.abs(right - bad), left, right)
        s[bad] = s[j] + (bad - j) * step
    w = e - s
    odd = ~good | (w <= 0) | (w > 100 * max(step, interval_ns))
    e[odd] = s[odd] + step
    return s, e, int(bad.size)


@dataclass
class Aligned:
    """Result of :func:`align_samples`: epoch-ns starts/ends, the kept mask and the record."""

    t: np.ndarray
    te: np.ndarray
    keep: np.ndarray
    alignment: dict[str, Any]
    raw: dict[str, Any]
    window_filter: dict[str, Any] = field(default_factory=dict)


def align_samples(
    starts: np.ndarray,
    ends: np.ndarray,
    values: np.ndarray,
    *,
    interval_ns: int,
    host_start_ns: int,
    host_stop_ns: int,
    window_ns: tuple[int, int],
    markers: Sequence[tuple[int, int]] = (),
    pairs: Sequence[ClockPair] = (),
    keep_calibration: bool = False,
) -> Aligned:
    """Map raw PM timestamps to epoch ns, measure the error on the calibration bursts
    (``markers``: host launch/done times; ``values``: the DRAM column) and choose which samples
    to keep (those between the bursts, unless that would drop most of them)."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    raw = raw_diagnostics(starts, ends, host_start_ns, pairs)
    warnings: list[str] = []
    span = max(host_stop_ns - host_start_ns, 1)
    tol = max(20_000_000, 50 * interval_ns)
    lo, hi = host_start_ns - tol, host_stop_ns + tol
    s, e, n_rep = repair_timestamps(starts, ends, interval_ns, max_jump_ns=span + 2 * tol)
    if n_rep:
        warnings.append(
            f"{n_rep} of {starts.size} samples had unusable raw timestamps (zero, out of order "
            "or on another clock) and were placed by index next to their neighbours"
        )
    raw["n_repaired"] = n_rep
    d = np.diff(s)
    step = int(np.median(d)) if d.size else interval_ns
    synthetic = False
    if d.size and not 0.5 <= step / interval_ns <= 2.0:
        warnings.append(
            f"raw sample spacing {step} disagrees with the configured interval {interval_ns} ns "
            "(timestamps not in ns?); samples placed at host start + k * interval"
        )
        synthetic = True
    mapping, offset = "none", 0
    if not starts.size:
        warnings.append("the collector returned no samples")
    if not synthetic and s.size:
        mapping, offset = choose_mapping(s, host_start_ns, host_stop_ns, pairs, tol)
        if _in_window(s + offset, lo, hi) < MIN_IN_WINDOW:
            warnings.append(
                f"mapping {mapping!r} puts most samples outside the host window (raw span "
                f"{int(s[-1] - s[0])} ns vs host {span} ns); samples placed at host start + "
                "k * interval"
            )
            synthetic = True
    if synthetic and s.size:
        s = np.arange(starts.size, dtype=np.int64) * interval_ns
        e = s + interval_ns
        mapping, offset = "synthetic", host_start_ns
    t, te = s + offset, e + offset
    pair_err = max((p.width_ns // 2 for p in pairs), default=None)
    al: dict[str, Any] = {"mapping": mapping, "offset_ns": offset,
                          "clock_pair_half_width_ns": pair_err}  # fmt: skip
    residuals = []
    for k, (m0, m1) in enumerate(markers):
        edges = find_edges(t, te, values, m0, m1, margin_ns=tol) if t.size else None
        rec: dict[str, Any] = {"host_launch_ns": m0, "host_done_ns": m1}
        if edges is not None:
            rec.update(rise_ns=edges[0], fall_ns=edges[1], rise_residual_ns=edges[0] - m0,
                       fall_residual_ns=edges[1] - m1)  # fmt: skip
            residuals.append(edges[0] - m0)
        al[f"marker{k}"] = rec
    guessed = mapping in ("anchor", "synthetic", "none")
    if residuals and (guessed or abs(residuals[0]) > tol):
        shift = -residuals[0]
        t, te = t + shift, te + shift
        al.update(mapping=f"{mapping}+marker", offset_ns=offset + shift)
        residuals = [r + shift for r in residuals]
    if residuals:
        al["error_estimate_ns"] = int(max(abs(r) for r in residuals))
        al["drift_ns"] = int(residuals[-1] - residuals[0]) if len(residuals) > 1 else None
        al["how"] = "max |burst rise - host launch| over the calibration bursts"
    elif guessed:
        al["error_estimate_ns"] = int(tol)
        al["how"] = (
            "not measured: no clock mapping fitted and no calibration burst was found; "
            "bounded by the search tolerance"
        )
    else:
        al["error_estimate_ns"] = int((pair_err or 0) + interval_ns)
        al["how"] = "clock-pair half width + one sampling interval (no bursts found)"
    if markers and len(residuals) < len(markers):
        warnings.append(
            f"{len(markers) - len(residuals)} of {len(markers)} calibration bursts not found "
            "in the series"
        )
    al["approximate"] = bool(guessed and not residuals)
    keep, wf = window_keep(t, te, window_ns, host_start_ns, host_stop_ns,
                           apply=bool(markers) and not keep_calibration)  # fmt: skip
    if wf.get("skipped"):
        warnings.append(wf["skipped"])
    al["warnings"] = warnings
    return Aligned(t, te, keep, al, raw, wf)


def window_keep(
    t: np.ndarray,
    te: np.ndarray,
    window_ns: tuple[int, int],
    host_start_ns: int,
    host_stop_ns: int,
    *,
    apply: bool = True,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Samples inside ``window_ns`` (between the calibration bursts). When that would keep
    less than half of what the window's share of the host span predicts, the filter is judged
    wrong (misaligned clock) and every sample is kept; the returned record says so."""
    n = t.size
    ws, we = window_ns
    if not apply or n == 0:
        return np.ones(n, dtype=bool), {"applied": False, "kept": n}
    keep = (t >= ws) & (te <= we)
    share = max(0.0, min(1.0, (we - ws) / max(host_stop_ns - host_start_ns, 1)))
    expected = share * n
    rec: dict[str, Any] = {"applied": True, "kept": int(keep.sum()), "expected": int(expected)}
    if keep.sum() < 0.5 * expected:
        rec.update(applied=False, would_keep=int(keep.sum()), kept=n)
        rec["skipped"] = (
            f"window filter would keep {int(keep.sum())} of {n} samples (about "
            f"{int(expected)} expected); kept all of them instead"
        )
        keep = np.ones(n, dtype=bool)
    return keep, rec
