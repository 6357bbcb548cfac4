"""Trace figures: built from data, with the shapes and traces the notebook relies on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kdtree.trace import DRAM_METRIC, Trace, analyze
from kdtree.trace.schema import make_intervals, make_series
from kdtree.viz.trace import (
    make_dram_phase_fig,
    make_gap_histogram_fig,
    make_idle_by_phase_fig,
    make_step_idle_fig,
    phase_colors,
)

T0 = 1_764_400_000_000_000_000


@pytest.fixture
def traced():
    t = T0 + np.arange(500, dtype=np.int64) * 100_000
    v = np.where(((t - T0) % 10_000_000) < 3_000_000, 25.0, 1.0)
    s0 = T0 + np.arange(5) * 10_000_000
    ph = pd.concat([
        make_intervals(s0, s0 + 10_000_000, "step", "step", "p"),
        make_intervals(s0 + 3_000_000, s0 + 6_000_000, "tree_build", "phase", "p"),
        make_intervals(s0 + 6_000_000, s0 + 10_000_000, "verify", "phase", "p"),
    ], ignore_index=True)  # fmt: skip
    tr = Trace(make_series(t, DRAM_METRIC, v, "test"))
    return tr, Trace(intervals=ph), analyze(tr, Trace(intervals=ph))


def test_dram_phase_fig_shades_phases_and_thresholds(traced):
    tr, ph, s = traced
    fig = make_dram_phase_fig(tr, ph, summary=s)
    rects = [sh for sh in fig.layout.shapes if sh.type == "rect"]
    assert len(rects) == 10  # 5 steps x (tree_build, verify); step marks are not shaded
    assert len([sh for sh in fig.layout.shapes if sh.type == "line"]) == 2
    assert fig.data[0].x[0] == 0.0 and fig.data[0].x[-1] == pytest.approx(49.9)
    assert {d.name for d in fig.data[1:]} == {"tree_build", "verify"}
    win = make_dram_phase_fig(tr, ph, window_ms=(0.0, 10.0))
    assert len(win.layout.shapes) == 2 and max(win.data[0].x) <= 10.0  # tree_build, verify
    assert len(make_dram_phase_fig(tr, ph, window_ms=(0.0, 10.0), max_shapes=1).layout.shapes) == 1
    with pytest.raises(ValueError, match="window_ms"):
        make_dram_phase_fig(tr, ph, window_ms=(5.0, 1.0))


def test_histogram_step_and_phase_figs(traced):
    _, _, s = traced
    h = make_gap_histogram_fig(s)
    assert sum(h.data[0].y) == len(s.gaps) == 4
    st = make_step_idle_fig(s)
    assert [d.name for d in st.data] == ["DRAM busy", "idle"]
    assert list(st.data[1].y) == pytest.approx(list(s.steps["idle_ms"]))
    ip = make_idle_by_phase_fig(s)
    assert set(ip.data[0].y) == {"tree_build", "verify"}
    assert sum(ip.data[0].x) == pytest.approx(4 * 7.0)
    assert phase_colors(["b", "a", "b"]) == phase_colors(["a", "b"])
