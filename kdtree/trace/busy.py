"""Kernel intervals -> a GPU-busy percentage series, and annotation names -> interval kinds."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kdtree.trace.schema import empty_series, make_series

BUSY_METRIC = "gpu_busy_pct"
_STEP_RE = re.compile(r"^(ProfilerStep#\d+|(decode_)?step([\s#:_-]*\d+)?)$", re.IGNORECASE)


def annotation_kind(name: str, default: str = "phase") -> str:
    """``'step'`` for step marks (``ProfilerStep#3``, ``step``, ``step 7``), else ``default``."""
    return "step" if _STEP_RE.match(name.strip()) else default


def kernel_busy_series(
    intervals: pd.DataFrame, bin_ns: int, source: str, kinds=("kernel",)
) -> pd.DataFrame:
    """Percent of each ``bin_ns`` bin covered by the union of kernel intervals."""
    if bin_ns <= 0:
        raise ValueError(f"bin_ns={bin_ns}: expected > 0")
    k = intervals[intervals["kind"].isin(kinds)]
    if k.empty:
        return empty_series()
    s = k["start_ns"].to_numpy(np.int64)
    e = k["end_ns"].to_numpy(np.int64)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    # union of overlapping kernels (several streams)
    us, ue = [int(s[0])], [int(e[0])]
    for a, b in zip(s[1:], e[1:], strict=True):
        if a <= ue[-1]:
            ue[-1] = max(ue[-1], int(b))
        else:
            us.append(int(a))
            ue.append(int(b))
    t0 = us[0] - us[0] % bin_ns
    nbins = int((ue[-1] - t0) // bin_ns) + 1
    edges = t0 + np.arange(nbins + 1, dtype=np.int64) * bin_ns
    covered = np.zeros(nbins, dtype=np.float64)
    for a, b in zip(us, ue, strict=True):
        i0, i1 = int((a - t0) // bin_ns), int((b - 1 - t0) // bin_ns)
        for i in range(i0, min(i1, nbins - 1) + 1):
            covered[i] += min(b, edges[i + 1]) - max(a, edges[i])
    return make_series(edges[:-1], BUSY_METRIC, 100.0 * covered / bin_ns, source)
