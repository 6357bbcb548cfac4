"""Verify-attention figures from a synthetic long-format CSV."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kdtree.viz.kernels import (
    load_verify_rows,
    make_floor_fraction_fig,
    make_verify_speedup_table,
    make_verify_time_fig,
)


def _rows():
    rows = []
    for provider, mode, scale in (
        ("ours", "eager", 1.0),
        ("ours_graph", "graph", 0.9),
        ("fi_mask", "eager", 4.0),
    ):
        for length in (1024, 16384, 131072):
            cfg = {
                "layout": "gqa_32q8kv_d128",
                "batch": 1,
                "L": length,
                "T": 17,
                "floor_ms": length * 1e-6,
            }
            ms = scale * (0.01 + length * 2e-6)
            for metric, value in (("time", ms), ("frac_of_floor", cfg["floor_ms"] / ms)):
                rows.append(
                    {
                        "suite": "verify_attention",
                        "name": f"p/L{length}",
                        "provider": provider,
                        "mode": mode,
                        "metric": metric,
                        "unit": "",
                        "p50": value,
                        "p20": value * 0.95,
                        "p80": value * 1.05,
                        "config_json": json.dumps(cfg),
                    }
                )
    return pd.DataFrame(rows)


def test_time_and_fraction_figures():
    df = load_verify_rows(_rows())
    fig = make_verify_time_fig(df, "gqa_32q8kv_d128", 1, 17)
    names = [tr.name for tr in fig.data]
    assert names == ["ours", "ours_graph (graph)", "fi_mask", "floor"]
    assert list(fig.data[0].x) == [1024, 16384, 131072]
    frac = make_floor_fraction_fig(df, "gqa_32q8kv_d128", 1, providers=("ours",))
    assert len(frac.data) == 1 and max(frac.data[0].y) < 1


def test_speedup_table():
    table = make_verify_speedup_table(load_verify_rows(_rows()))
    assert (table["best_peer"] == "fi_mask").all()
    assert table["speedup"].round(6).eq(4.0).all()


def test_missing_selection_raises():
    with pytest.raises(ValueError, match="no time rows"):
        make_verify_time_fig(load_verify_rows(_rows()), "mla_h8", 1, 17)


def test_cta_timeline_fig():
    from kdtree.viz.notebook_figs import make_cta_timeline_fig

    bars = pd.DataFrame(
        [(0, 3, "split", "prologue", 0.0, 1.0), (0, 3, "split", "stream", 1.0, 5.0),
         (1, 9, "merge", "merge", 6.0, 7.5)],
        columns=["lane", "smid", "kind", "phase", "start", "end"],
    )  # fmt: skip
    fig = make_cta_timeline_fig(bars, "t")
    assert [tr.name for tr in fig.data] == ["prologue", "stream", "merge"]
    assert list(fig.data[1].base) == [1.0] and list(fig.data[1].x) == [4.0]
    with pytest.raises(ValueError):
        make_cta_timeline_fig(bars.drop(columns=["smid"]), "t")


def test_grid_heatmap_fig():
    from kdtree.viz.notebook_figs import make_grid_heatmap_fig

    grid = pd.DataFrame(
        [(lay, b, t, length, 1.0 + 0.1 * t / 65 - 0.01 * b)
         for lay in ("gqa_a", "gqa_b") for b in (1, 8) for t in (1, 65)
         for length in (1024, 65536)],
        columns=["layout", "B", "T", "L", "speedup_vs_peer"],
    )  # fmt: skip
    fig = make_grid_heatmap_fig(grid, "speedup_vs_peer", "t", 1.0)
    assert len(fig.data) == 4  # a panel per (layout, batch)
    assert [a.text for a in fig.layout.annotations] == [
        "gqa_a, batch 1",
        "gqa_a, batch 8",
        "gqa_b, batch 1",
        "gqa_b, batch 8",
    ]
    first = fig.data[0]
    assert list(first.x) == ["1k", "64k"] and list(first.y) == ["T=1", "T=65"]
    assert first.z[1][0] == pytest.approx(1.09) and first.zmid == 1.0
    with pytest.raises(ValueError):
        make_grid_heatmap_fig(grid.iloc[:0], "speedup_vs_peer", "t", 1.0)
    with pytest.raises(ValueError):
        make_grid_heatmap_fig(grid.drop(columns=["T"]), "speedup_vs_peer", "t", 1.0)
