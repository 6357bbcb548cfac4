"""The CTA timeline's analysis (kdtree.profiling.cta_timeline) on synthetic records."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kdtree.profiling import cta_timeline as ctl


def _rec(kind, smid, tiles, bx, by, bz, entry, first_tile=0, issue=0, mma=0, exit_=0, cyc=0):
    meta = kind | smid << 8 | tiles << 32
    block = bx | by << 24 | bz << 44
    return [meta, block, entry, first_tile, issue, mma, exit_, cyc]


def _two_calls():
    """Two calls: 3 split CTAs (one empty) then 2 merge CTAs each, 10 µs apart."""
    recs = []
    for c in range(2):
        t = 1_000_000 + c * 10_000
        recs += [
            _rec(0, 4, 16, 0, 0, 0, t, t + 1000, t + 600, t + 5000, t + 5500, 9000),
            _rec(0, 7, 15, 0, 1, 0, t + 200, t + 1300, t + 900, t + 5200, t + 5600, 9300),
            _rec(0, 9, 0, 0, 2, 0, t + 400, 0, 0, 0, t + 700, 500),
            _rec(1, 1, 3, 0, 0, 0, t + 6600, t + 6900, 0, 0, t + 7600, 1800),
            _rec(1, 2, 3, 1, 0, 0, t + 6700, t + 7000, 0, 0, t + 8100, 2500),
        ]
    rng = np.random.default_rng(0)
    return np.array([recs[i] for i in rng.permutation(len(recs))], dtype=np.uint64)


def test_decode_unpacks_every_field():
    df = ctl.decode(np.array([_rec(1, 131, 7, 300, 5, 9, 10, 11, 12, 13, 14, 15)], np.uint64))
    r = df.iloc[0]
    assert (r.kind, r.smid, r.tiles, r.bx, r.by, r.bz) == ("merge", 131, 7, 300, 5, 9)
    assert [r[c] for c in ctl.STAMPS] == [10, 11, 12, 13, 14] and r.cycles == 15
    with pytest.raises(ValueError, match="kinds"):
        ctl.decode(np.array([_rec(5, 0, 0, 0, 0, 0, 1)], np.uint64))
    with pytest.raises(ValueError, match="records"):
        ctl.decode(np.zeros((2, 3), np.uint64))


def test_calls_and_their_spans():
    df = ctl.assign_calls(ctl.decode(_two_calls()), split_ctas=3, merge_ctas=2)
    assert sorted(df.groupby("call").size()) == [5, 5]
    ph = ctl.call_phases(df)
    first = ph.iloc[0]
    assert first.ramp == pytest.approx(0.4)
    assert first.first_tile == pytest.approx(1.05)  # median of 1.0 and 1.1 (the empty CTA: none)
    assert first.issue == pytest.approx(0.65)
    assert first.stream == pytest.approx(3.95) and first.stream_max == pytest.approx(4.0)
    assert first.epilogue == pytest.approx(0.45)  # 0.5, 0.4; the empty CTA has no MMA end
    assert first.split == pytest.approx(5.6) and first.straggle == pytest.approx(0.1)
    assert first.gap_merge == pytest.approx(1.0) and first.merge == pytest.approx(1.5)
    assert first.gap_next == pytest.approx(1.9) and first.call_us == pytest.approx(10.0)
    assert first.ghz == pytest.approx((9000 / 5500 + 9300 / 5400) / 2)
    assert np.isnan(ph.iloc[1].call_us) and np.isnan(ph.iloc[1].gap_next)
    assert ctl.timer_step_ns(df) == 100


def test_stamps_a_cta_never_took_leave_their_spans_nan():
    """Idle consumers (KDTREE_GQA_ABLATE=16) stamp no first tile and no last MMA: the spans
    those bound are NaN, not the distance from 0 to the entry; the producer's issue stays."""
    recs = _two_calls()
    split = (recs[:, 0] & np.uint64(0xFF)) == 0
    recs[split, 3] = 0  # first tile landed
    recs[split, 5] = 0  # warpgroup 0's last MMA
    ph = ctl.call_phases(ctl.assign_calls(ctl.decode(recs), split_ctas=3, merge_ctas=2))
    first = ph.iloc[0]
    assert np.isnan(first.first_tile) and np.isnan(first.stream) and np.isnan(first.stream_max)
    assert np.isnan(first.epilogue)
    assert first.issue == pytest.approx(0.65) and first.split == pytest.approx(5.6)


def test_assign_calls_refuses_what_stream_order_forbids():
    raw = _two_calls()
    df = ctl.decode(raw)
    with pytest.raises(ValueError, match="whole grids"):
        ctl.assign_calls(df, split_ctas=4, merge_ctas=2)
    with pytest.raises(ValueError, match="merge_ctas = 0"):
        ctl.assign_calls(df, split_ctas=3, merge_ctas=0)
    early = df.copy()
    early.loc[(early.kind == "merge") & (early.entry == 1_006_600), "entry"] = 1_005_000
    with pytest.raises(ValueError, match="before the split grid's last exit"):
        ctl.assign_calls(early, split_ctas=3, merge_ctas=2)
    with pytest.raises(ValueError, match="split grids but"):
        ctl.assign_calls(df[df.entry != 1_016_700], split_ctas=3, merge_ctas=1)
    # no merge (one split): the calls follow each other's split grids
    only = df[df.kind == "split"]
    assert ctl.call_phases(ctl.assign_calls(only, 3, 0)).gap_merge.isna().all()
    # a split grid entering before the previous call's merge has left: refused, unless the
    # split kernel is a programmatic dependent (overlap), and then gap_next is negative
    pdl = df.copy()
    pdl.loc[(pdl.kind == "split") & (pdl.entry == 1_010_000), "entry"] = 1_007_800
    with pytest.raises(ValueError, match="before call 0 ended"):
        ctl.assign_calls(pdl, split_ctas=3, merge_ctas=2)
    ph = ctl.call_phases(ctl.assign_calls(pdl, split_ctas=3, merge_ctas=2, overlap=True))
    assert ph.iloc[0].gap_next == pytest.approx(-0.3) and ph.iloc[0].call_us == pytest.approx(7.8)


def test_gantt_bars():
    df = ctl.assign_calls(ctl.decode(_two_calls()), 3, 2)
    g = ctl.gantt(df, 1)
    assert list(g.columns) == ["lane", "smid", "kind", "phase", "start", "end"]
    assert g.groupby("phase").size().to_dict() == {
        "empty split": 1, "epilogue": 2, "merge": 2, "prologue": 2, "stream": 2,
    }  # fmt: skip
    assert g.start.min() == 0 and g.end.max() == pytest.approx(8.1)
    assert (g.end >= g.start).all() and isinstance(g, pd.DataFrame)
