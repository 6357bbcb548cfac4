"""kdtree.nb_shipped: tidy views of shipped GPU rows and phase traces (synthetic inputs)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kdtree import nb_shipped as ns


def _row(name, provider, metric, p50, **cfg):
    return {"name": name, "provider": provider, "metric": metric, "p50": p50,
            "config_json": json.dumps(cfg)}  # fmt: skip


def test_parse_case_and_bad_name():
    assert ns.parse_case("mla_h16/B1/L131072/T65") == {
        "layout": "mla_h16", "B": 1, "L": 131072, "T": 65,
    }  # fmt: skip
    with pytest.raises(ValueError, match="LAYOUT/B"):
        ns.parse_case("ceilings")


def test_verify_rows_and_ours_vs_peers():
    case = "gqa/B1/L65536/T17"
    df = pd.DataFrame([
        _row("ceilings", "device", "copy_bandwidth", 4.2),
        _row(case, "ours", "time", 0.2, floor_ms=0.1),
        _row(case, "ours", "frac_of_floor", 0.5, floor_ms=0.1),
        _row(case, "ours_graph", "time", 0.125, floor_ms=0.1),
        _row(case, "ours_graph", "frac_of_floor", 0.8, floor_ms=0.1),
        _row(case, "sdpa_dense", "time", 1.0, floor_ms=0.1),
        _row(case, "sdpa_dense", "frac_of_floor", 0.1, floor_ms=0.1),
        _row(case, "flex", "error", np.nan, reason="skipped: compiles per shape"),
    ])  # fmt: skip
    tidy = ns.verify_rows(df)
    assert set(tidy["provider"]) == {"ours", "ours_graph", "sdpa_dense", "flex"}
    assert tidy.set_index("provider").loc["flex", "status"].startswith("skipped")
    v = ns.ours_vs_peers(tidy).iloc[0]
    assert v["ours"] == "ours_graph" and v["best_peer"] == "sdpa_dense"
    assert v["speedup_vs_peer"] == pytest.approx(8.0)
    assert v["meets_target"] and v["target_applies"]
    lines = ns.verify_findings(ns.ours_vs_peers(tidy))
    assert any("80 % of the floor" in line for line in lines), lines
    assert any("Target (≥ 60 % for L ≥ 32k)" in line for line in lines), lines
    assert any("8.00–8.00× (faster in every case)" in line for line in lines), lines


def test_verify_rows_a_timed_run_outranks_an_older_skip():
    case = "gqa/B1/L131072/T17"
    df = pd.DataFrame([
        _row(case, "ours_graph", "error", np.nan, reason="skipped: point time box (30 s) spent"),
        _row(case, "ours_graph", "time", 0.05, floor_ms=0.016),
        _row(case, "flex", "error", np.nan, reason="skipped: compile failed"),
        _row(case, "fi_mask", "time", 0.2, floor_ms=0.016),
        _row(case, "fi_mask", "error", np.nan, error="RuntimeError: a later run failed"),
    ])  # fmt: skip
    df = pd.concat([df, pd.DataFrame([
        _row(case, "sdpa_dense", "error", np.nan, error="OOM in an older run"),
        _row(case, "sdpa_dense", "time", 4.0, floor_ms=0.016),
    ])], ignore_index=True)  # fmt: skip
    t = ns.verify_rows(df).set_index("provider")
    assert t.loc["ours_graph", "status"] == "ok" and t.loc["ours_graph", "time_ms"] == 0.05
    assert t.loc["ours_graph", "floor_ms"] == 0.016  # from the later row, not the skip
    assert t.loc["sdpa_dense", "status"] == "ok"  # a later timing outranks an older error
    assert t.loc["flex", "status"].startswith("skipped")  # never timed
    assert t.loc["fi_mask", "status"].startswith("RuntimeError")  # a real error stays


def test_ncu_kernel_table_reads_the_shipped_reports():
    from kdtree import nb

    logs = sorted(nb.data_path("bench", "logs", "ncu_session6").glob("*.log"))
    assert len(logs) >= 2
    t = ns.ncu_kernel_table(logs)
    assert set(t["kernel"]) == {"_gqa_split_kernel", "_merge_kernel"}
    before = t[(t["report"] == "call_a_gqa8q1kv_128k_T17")].set_index("kernel")
    after = t[(t["report"] == "call_b_gqa8q1kv_128k_T17")].set_index("kernel")
    assert before.loc["_merge_kernel", "grid"] == "9x2x1" and before["splits"].iloc[0] == 43
    assert after.loc["_merge_kernel", "duration_us"] < before.loc["_merge_kernel", "duration_us"]
    assert (t["duration_us"] > 0).all() and t["registers"].notna().any()
    lines = ns.ncu_findings(t)
    assert any("merge" in line and "43 splits" in line for line in lines), lines


def test_ncu_kernel_table_converts_duration_units(tmp_path):
    p = tmp_path / "r.log"
    p.write_text(
        "  _mla_split_kernel (5, 15, 1)x(256, 1, 1), Context 1\n"
        "    Duration                         ms         1.42\n"
        "  _merge_kernel (260, 4, 1)x(128, 1, 1), Context 1\n"
        "    Duration                         ns       980.00\n"
    )
    t = ns.ncu_kernel_table([p]).set_index("kernel")
    assert t.loc["_mla_split_kernel", "duration_us"] == pytest.approx(1420.0)
    assert t.loc["_merge_kernel", "duration_us"] == pytest.approx(0.98)
    assert t["splits"].isna().all()  # no point line: no launch choice, no crash
    assert ns.ncu_findings(ns.ncu_kernel_table([p]))[0].startswith("`r`: split kernel 1.42e+03")


def test_ncu_kernel_table_refuses_a_report_without_kernels(tmp_path):
    p = tmp_path / "empty.log"
    p.write_text("==PROF== Disconnected\n")
    with pytest.raises(ValueError, match="no Nsight Compute"):
        ns.ncu_kernel_table([p])


def _x(name, ts, dur, step, gpu=None):
    args = {"step": step} | ({"gpu_ms": gpu} if gpu is not None else {})
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "args": args}


def test_phase_idle_eager_attribution(tmp_path):
    # two 10 ms steps 1 ms apart; verify 6 ms host / 5 ms GPU, accept 2 ms host / 0.5 ms GPU,
    # 2 ms of each step uncovered -> idle per step 1 + 1.5 + 2 (+ 1 between the two steps)
    ev = []
    for i, t0 in enumerate((0.0, 11_000.0)):
        ev += [_x("step", t0, 10_000, i), _x("verify", t0, 6_000, i, 5.0),
               _x("accept", t0 + 6_000, 2_000, i, 0.5)]  # fmt: skip
    path = tmp_path / "phases.chrome.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    res = ns.phase_idle(ns.load_phase_events(path))
    a = res["attribution"].set_index("phase")["idle_ms"]
    assert res["unit"] == "step" and res["steps"] == 2
    assert a["verify"] == pytest.approx(2.0) and a["accept"] == pytest.approx(3.0)
    assert a["(untimed, inside step)"] == pytest.approx(4.0)
    assert a["(between steps)"] == pytest.approx(1.0)
    assert res["idle_fraction"] == pytest.approx(10.0 / 21.0)
    assert res["attribution"]["share"].sum() == pytest.approx(1.0)


def test_phase_idle_graph_unit(tmp_path):
    ev = [_x("graph_step", 0, 2_000, 0, 2.0), _x("step", 0, 2_100, 0),
          _x("graph_step", 2_500, 2_000, 1, 1.5)]  # fmt: skip
    path = tmp_path / "phases.chrome.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    res = ns.phase_idle(ns.load_phase_events(path))
    a = res["attribution"].set_index("phase")["idle_ms"]
    assert res["unit"] == "graph_step"
    assert a["(between steps)"] == pytest.approx(0.5) and a["graph_step"] == pytest.approx(0.5)


def test_decode_and_tree_build_tables():
    import json

    rows = []
    # the same point names at two temperatures (as the sweep writes them): separate rows, and
    # each speed-up is against ar / chain of its own temperature
    for temp, scale in ((0.0, 1.0), (1.0, 0.5)):
        for mode, name, tps, tau in (("ar", "ar_graph", 50.0, 1.0),
                                     ("chain", "chain_graph", 75.0, 1.8),
                                     ("tree", "tree_B64_graph", 150.0 * scale, 3.0)):  # fmt: skip
            cfg = json.dumps({"ctx": 1024, "temperature": temp, "budget": 64})
            for metric, v in (("decode_tok_s", tps), ("tau", tau), ("phase_verify_ms", 4.0)):
                rows.append({"suite": "decode", "name": name, "mode": mode, "metric": metric,
                             "x_name": "ctx", "x_value": 1024, "p50": v, "p20": v, "p80": v,
                             "config_json": cfg})  # fmt: skip
    dec = ns.decode_table(pd.DataFrame(rows)).set_index(["mode", "temperature"])
    assert len(dec) == 6
    assert dec.loc[("tree", 0.0), "speedup_vs_ar"] == pytest.approx(3.0)
    assert dec.loc[("tree", 1.0), "speedup_vs_ar"] == pytest.approx(1.5)
    assert dec.loc[("tree", 0.0), "speedup_vs_chain"] == pytest.approx(2.0)
    assert dec.loc[("tree", 0.0), "verify"] == 4.0
    lines = ns.decode_findings(dec.reset_index())
    assert any("3.00× ar" in line and "2.00× chain" in line for line in lines)
    tb = pd.DataFrame([
        {"name": "tree_build_b1", "provider": p, "metric": "time", "x_value": 16, "p50": v}
        for p, v in (("heap", 1.0), ("device_torch", 4.0), ("device_triton", 0.25))
    ])  # fmt: skip
    t = ns.tree_build_table(tb).iloc[0]
    assert t["fastest_device"] == "device_triton" and t["speedup_vs_heap"] == pytest.approx(4.0)
    # ten builds a graph timed per build is shown but not counted as the fastest step
    tb10 = pd.concat([tb, pd.DataFrame([{"name": "tree_build_b1", "provider":
        "device_cuda_graph_x10", "metric": "time", "x_value": 16, "p50": 0.05}])])  # fmt: skip
    t10 = ns.tree_build_table(tb10).iloc[0]
    assert t10["fastest_device"] == "device_triton" and t10["device_cuda_graph_x10"] == 0.05
    assert any("slower than the heap" in line for line in ns.tree_build_findings(
        ns.tree_build_table(tb)))  # fmt: skip


def test_decode_table_compares_points_within_their_run():
    """Two runs measure ar and tree at the same context: each speed-up uses its own run's ar
    (pooled rate when recorded), and the context line reads the run with the most contexts."""
    rows = []
    for cmd, pts in (
        ("sweep modes", [(1024, "ar", "ar_graph", 100.0), (1024, "tree", "tree_B64_graph", 250.0)]),
        ("sweep contexts", [(c, m, n, v) for c in (1024, 65536)
                            for m, n, v in (("ar", "ar_graph", 80.0 if c == 1024 else 50.0),
                                            ("tree", "tree_B64_graph", 160.0))]),
    ):  # fmt: skip
        for ctx, mode, name, tps in pts:
            cfg = json.dumps({"ctx": ctx, "temperature": 0.0, "budget": 64})
            for metric, v in (("decode_tok_s", tps / 2), ("decode_tok_s_pooled", tps),
                              ("tau", 2.0)):  # fmt: skip
                rows.append({"suite": "decode", "name": name, "mode": mode, "metric": metric,
                             "x_name": "ctx", "x_value": ctx, "p50": v, "p20": v, "p80": v,
                             "config_json": cfg, "command": cmd})  # fmt: skip
    dec = ns.decode_table(pd.DataFrame(rows))
    tree = dec[dec["mode"] == "tree"].set_index(["run", "context"])["speedup_vs_ar"]
    assert tree[("sweep modes", 1024)] == pytest.approx(2.5)
    assert tree[("sweep contexts", 1024)] == pytest.approx(2.0)
    assert tree[("sweep contexts", 65536)] == pytest.approx(3.2)
    lines = ns.decode_findings(dec)
    assert any("2.50× ar" in line for line in lines)  # the first run at 1k: the modes run
    assert any("2.00× at 1,024, 3.20× at 65,536" in line and "160%" in line for line in lines)
    assert sum(line.startswith("Against context") for line in lines) == 1  # one run spans two


def _ab_rows(cmd, tree_tps, counts):
    """One decode run: ar and tree B=64 at 1k, the tree's accepted-length histogram."""
    cfg = json.dumps({"ctx": 1024, "temperature": 0.0, "budget": 64, "n_prompts": 164})
    base = {"suite": "decode", "x_name": "ctx", "config_json": cfg, "command": cmd}
    rows = [
        {
            **base,
            "name": n,
            "mode": m,
            "metric": "decode_tok_s_pooled",
            "x_value": 1024,
            "p50": v,
            "p20": v,
            "p80": v,
        }
        for n, m, v in (("ar_graph", "ar", 800.0), ("tree_B64_graph", "tree", tree_tps))
    ]
    rows += [{**base, "name": "tree_B64_graph", "mode": "tree", "metric": "tau_count",
              "x_name": "tau", "x_value": t, "p50": c, "p20": c, "p80": c}
             for t, c in counts.items()]  # fmt: skip
    return pd.DataFrame(rows)


def test_drafter_ab_table_and_figure_pool_tau_per_run():
    from kdtree.viz.decode import make_drafter_ab_fig

    runs = {"old": _ab_rows("old run", 1600.0, {1: 10, 3: 10}),  # pooled τ 2.0
            "new": _ab_rows("new run", 2000.0, {2: 5, 5: 15})}  # (10 + 75) / 20 = 4.25  # fmt: skip
    ab = ns.drafter_ab_table(runs).set_index(["drafter", "name"])
    assert ab.loc[("old", "tree_B64_graph"), "tau_pooled"] == pytest.approx(2.0)
    assert ab.loc[("new", "tree_B64_graph"), "tau_pooled"] == pytest.approx(4.25)
    assert ab.loc[("new", "tree_B64_graph"), "speedup_vs_ar"] == pytest.approx(2.5)
    assert np.isnan(ab.loc[("old", "ar_graph"), "tau_pooled"])  # no histogram rows for ar
    fig = make_drafter_ab_fig(runs)
    assert [t.name for t in fig.data] == ["old (τ̄ = 2.00)", "new (τ̄ = 4.25)"]
    assert list(fig.data[1].y) == pytest.approx([0.25, 0.75])
    two = pd.concat([runs["old"], runs["new"]])
    with pytest.raises(ValueError, match="2 runs"):
        ns.drafter_ab_table({"mixed": two})
    with pytest.raises(ValueError, match="2 runs"):
        make_drafter_ab_fig({"mixed": two})


def test_tree_phase_table_splits_the_threshold_build_into_phases():
    from kdtree.viz.tree import make_tree_phase_fig

    rows = []
    for call, scale in (("X", 2.0), ("Y", 1.0)):
        for phase, us in (("seed", 10.0), ("seed+expand", 14.0), ("full", 20.0), ("full_w8", 16.0),
                          ("heap", 40.0)):  # fmt: skip
            rows.append(
                {"call": call, "K": 8, "budget": 256, "phase": phase, "p50_us": us * scale}
            )
    df = pd.DataFrame(rows)
    t = ns.tree_phase_table(df).iloc[0]  # the last call listed: Y
    assert (t["seed"], t["expand"], t["order"], t["full"]) == (10.0, 4.0, 6.0, 20.0)
    assert t["best"] == 16.0 and t["best_of"] == "full_w8" and t["heap_over_best"] == 2.5
    assert ns.tree_phase_table(df, call="X").iloc[0]["seed"] == 20.0
    lines = ns.tree_phase_findings(ns.tree_phase_table(df))
    assert "**faster**" in lines[0] and "`seed`" in lines[0]
    assert len(make_tree_phase_fig(ns.tree_phase_table(df)).data) == 4
    with pytest.raises(ValueError, match="call"):
        ns.tree_phase_table(df, call="Q")
    with pytest.raises(ValueError, match="heap"):
        ns.tree_phase_table(df[df["phase"] != "heap"])


def test_tree_cuda_phase_table_scales_cycles_to_the_replay_time():
    from kdtree.viz.tree import make_tree_cuda_phase_fig

    base = dict(vocab=8192, K=8, budget=256, path=1, cycles_total=1000)
    phases = dict(load=100, prologue=100, seed=400, expand=200, order=100, rowmap=50, emit=50)
    df = pd.DataFrame(
        [
            {"call": "f", **base, "p50_us": 30.0, **phases},
            {"call": "g", **base, "p50_us": 20.0, **phases},
        ]
    )
    t = ns.tree_cuda_phase_table(df).iloc[0]  # the last call: g
    assert t["p50_us"] == 20.0 and t["seed"] == pytest.approx(8.0) and t["emit"] == 1.0
    assert ns.tree_cuda_phase_table(df, call="f").iloc[0]["seed"] == pytest.approx(12.0)
    hist = ns.tree_cuda_history(df)
    assert list(hist.columns) == ["f", "g"] and hist.iloc[0]["f"] == 30.0
    (line,) = ns.tree_cuda_findings(ns.tree_cuda_phase_table(df))
    assert "**within** 20 µs" in line and "`seed`" in line
    (over,) = ns.tree_cuda_findings(ns.tree_cuda_phase_table(df, call="f"))
    assert "**over**" in over
    assert len(make_tree_cuda_phase_fig(ns.tree_cuda_phase_table(df)).data) == 7
    with pytest.raises(ValueError, match="call"):
        ns.tree_cuda_phase_table(df, call="Q")
    with pytest.raises(ValueError, match="seed"):
        ns.tree_cuda_phase_table(df.drop(columns=["seed"]))
    with pytest.raises(ValueError, match="session 8"):
        ns.tree_cuda_counters(df)  # session 7's columns: no counters


def test_tree_cuda_counters_pick_one_call():
    extra = dict(tstar=60, dp_steps=3, n_union=290, depths=4, capped=1, radix_passes=2,
                 sort_size=512, order_keys=900, order_runs=1500, order_merge=6000,
                 select_cycles=5000)  # fmt: skip
    df = pd.DataFrame(
        [
            {"call": "e", "vocab": 8192, "K": 32, "budget": 256, **extra, "dp_steps": 8},
            {"call": "f", "vocab": 8192, "K": 32, "budget": 256, **extra},
        ]
    )
    t = ns.tree_cuda_counters(df)
    assert len(t) == 1 and t.iloc[0]["dp_steps"] == 3 and t.iloc[0]["sort_size"] == 512
    assert ns.tree_cuda_counters(df, call="e").iloc[0]["dp_steps"] == 8
    hist = ns.tree_cuda_history(df.assign(p50_us=[20.0, 18.0]))
    assert list(hist.columns) == ["e", "f"]


def test_mla_wgmma_history_and_phases():
    base = dict(point="h16:131072:65", cycles_per_tile=5000.0, ms_ablate0=0.8, ms_ablate1=0.6,
                ms_ablate2=0.6, ms_ablate4=0.65, ms_ablate7=0.2)  # fmt: skip
    df = pd.DataFrame(
        [
            {"call": "c", **base, "s_mma": 1900.0},
            {
                "call": "i",
                **base,
                "ms_ablate0": 0.75,
                "wg0.s_mma": 2800.0,
                "wg0.wait_tile": 300.0,
                "wg1.p_ready": 3300.0,
                "wg0.p_ready": 200.0,
                "wg1.wait_p": 50.0,
            },
            {"call": "i", **base, "point": "h8:131072:65"},
        ]
    )
    h = ns.mla_wgmma_history(df)
    assert list(h.index) == ["c", "i"] and h.loc["i", "us"] == pytest.approx(750.0)
    assert h.loc["c", "copies_us"] == pytest.approx(200.0)
    assert h.loc["c", "pv_mma_us"] == pytest.approx(150.0) and h.loc["i", "rest_us"] == 200.0
    assert "producer" not in h.loc["c", "version"] and h.loc["i", "version"]
    t = ns.mla_wgmma_phases(df, call="i")
    # the kernel's phase order, not the CSV's; a warpgroup without a phase reads 0
    assert list(t.columns) == ["wait_tile", "s_mma", "p_ready", "wait_p"]
    assert t.loc["wg1", "p_ready"] == 3300.0 and t.loc["wg1", "s_mma"] == 0.0
    assert t.loc["wg1", "wait_p"] == 50.0 and t.loc["wg0", "wait_p"] == 0.0  # warpgroup 1 only
    with pytest.raises(ValueError, match="per-warpgroup"):
        ns.mla_wgmma_phases(df, call="c")
    with pytest.raises(ValueError, match="no rows"):
        ns.mla_wgmma_history(df, point="h16:1:1")
    with pytest.raises(ValueError, match="missing"):
        ns.mla_wgmma_history(df.drop(columns=["ms_ablate7"]))


def test_mla_seesaw_history():
    base = dict(point="h16:131072:65", ms_ablate0=0.70, ms_ablate1=0.50, ms_ablate2=0.55,
                ms_ablate3=0.30)  # fmt: skip
    df = pd.DataFrame(
        [
            {
                "call": "a",
                "version": "first",
                **base,
                "wg0.s_mma": 2500.0,
                "wg0.pv_b": 1000.0,
                "wg1.s_mma": 2400.0,
                "wg1.wait_m_a": 300.0,
            },  # fmt: skip
            {
                "call": "g",
                "version": "final",
                **base,
                "ms_ablate0": 0.62,
                "wg0.s_mma": 1500.0,
                "wg0.pv_b": 1200.0,
                "wg1.s_mma": 2350.0,
                "wg1.wait_p_a": 10.0,
            },  # fmt: skip
            {"call": "g", "version": "final", **base, "point": "h8:131072:65"},
        ]
    )
    h = ns.mla_seesaw_history(df)
    assert list(h["call"]) == ["a", "g"] and list(h["version"]) == ["first", "final"]
    assert h["us"].tolist() == pytest.approx([700.0, 620.0])
    # the slower warpgroup's cycles a tile (a: 3500 vs 2700; g: 2700 vs 2360)
    assert h["cycles_per_tile"].tolist() == pytest.approx([3500.0, 2700.0])
    assert h.loc[0, "copies_us"] == pytest.approx(200.0)
    assert h.loc[1, "s_mma_us"] == pytest.approx(70.0) and h.loc[1, "rest_us"] == 300.0
    t = ns.mla_wgmma_phases(df, call="g")
    assert list(t.columns) == ["s_mma", "wait_p_a", "pv_b"]
    with pytest.raises(ValueError, match="missing"):
        ns.mla_seesaw_history(df.drop(columns=["ms_ablate3"]))
    with pytest.raises(ValueError, match="no rows"):
        ns.mla_seesaw_history(df, point="h16:1:1")


def test_gqa_cuda_history_and_phases():
    base = dict(point="gqa_8q1kv_d128:131072:65", turns=1, ms_ablate1=0.078, ms_ablate16=0.073)
    df = pd.DataFrame(
        [
            {"call": "b", "version": "cp.async", **base, "ms_ablate0": 0.102,
             "wg0.wait_tile": 1200.0, "wg0.softmax": 1800.0, "wg1.issue": 1900.0,
             "wg1.softmax": 1300.0, "prod.wait_empty": 270.0, "prod.copies": 3640.0},
            {"call": "c", "version": "TMA", **base, "ms_ablate0": 0.098,
             "wg0.wait_tile": 1500.0, "wg0.softmax": 1400.0, "wg1.issue": 1700.0,
             "wg1.softmax": 1100.0, "prod.wait_empty": 900.0, "prod.copies": 2840.0},
            {"call": "c", "version": "TMA", **base, "turns": 0, "ms_ablate0": 0.097},
        ]
    )  # fmt: skip
    h = ns.gqa_cuda_history(df)
    assert list(h["call"]) == ["b", "c"]
    assert h["us"].tolist() == pytest.approx([102.0, 98.0])
    # the slower consumer warpgroup: b 3200 (wg1) vs 3000; c 2900 (wg0) vs 2800
    assert h["consumer_cycles"].tolist() == pytest.approx([3200.0, 2900.0])
    assert h["producer_cycles"].tolist() == pytest.approx([3910.0, 3740.0])
    assert h["compute_alone_us"].tolist() == pytest.approx([78.0, 78.0])
    assert ns.gqa_cuda_history(df, turns=0)["us"].tolist() == pytest.approx([97.0])
    t = ns.gqa_cuda_phases(df, call="c")
    assert list(t.index) == ["wg0", "wg1", "prod"]
    assert list(t.columns) == ["wait_tile", "issue", "softmax", "wait_empty", "copies"]
    assert t.loc["prod", "copies"] == 2840.0 and t.loc["wg0", "issue"] == 0.0
    with pytest.raises(ValueError, match="missing"):
        ns.gqa_cuda_history(df.drop(columns=["ms_ablate16"]))
    with pytest.raises(ValueError, match="no rows"):
        ns.gqa_cuda_phases(df, call="z")


def test_gqa_ablation_table_and_merge_cost_table():
    pt = "gqa_8q1kv_d128:131072:65"
    abl = {"ms_ablate0": 0.09, "ms_ablate1": 0.074, "ms_ablate8": 0.079, "ms_ablate9": 0.063,
           "ms_ablate16": 0.062}  # fmt: skip
    df = pd.DataFrame(
        [
            {"call": "f", "layout_version": "two boxes", "point": pt, "turns": 1, **abl},
            {"call": "g", "layout_version": "two boxes", "point": pt, "turns": 1, "page_size": 64,
             **abl, "ms_ablate0": 0.077, "ms_ablate16": 0.043},
            {"call": "g", "layout_version": "two boxes", "point": pt, "turns": 1, "tma": 0, **abl},
            {"call": "f", "layout_version": "two boxes", "point": pt, "turns": 0, **abl},
            {"call": "f", "layout_version": "two boxes", "point": "other:1:1", "turns": 1, **abl},
        ]
    )  # fmt: skip
    t = ns.gqa_ablation_table(df)
    assert len(t) == 3  # the turns-off row and the other point are left out
    assert t.loc[1, "label"] == "g: two boxes, page 64"
    assert t.loc[2, "label"].endswith("page 16, cp.async")
    assert t.loc[1, "whole"] == pytest.approx(77.0) and t.loc[1, "copies alone"] == pytest.approx(
        43.0
    )
    assert list(t.columns) == ["label", *ns.GQA_ABLATIONS.values()]
    with pytest.raises(ValueError, match="missing"):
        ns.gqa_ablation_table(df.drop(columns=["ms_ablate9"]))
    # page size, TMA and version columns are optional (defaults: 16, TMA on, no version)
    bare = ns.gqa_ablation_table(df.drop(columns=["page_size", "tma", "layout_version"]))
    assert bare.loc[0, "label"] == "f: , page 16"
    with pytest.raises(ValueError, match="no rows"):
        ns.gqa_ablation_table(df, point="x:1:1")

    mc = pd.DataFrame(
        [
            {"call": "e", "part": "modes", "point": pt, "mode": m, "us": us}
            for m, us in (("plain", 90.7), ("pdl", 90.6), ("triton", 91.1), ("split", 86.5))
        ]
        + [{"call": "b", "part": "modes", "point": pt, "mode": "plain", "us": 1.0},
           {"call": "e", "part": "sweep", "point": pt, "mode": "split", "us": 2.0}]
    )  # fmt: skip
    m = ns.merge_cost_table(mc)
    assert list(m["point"]) == [pt]
    assert m.loc[0, "merge_us"] == pytest.approx(4.2)
    assert m.loc[0, "triton"] == pytest.approx(91.1)
    with pytest.raises(ValueError, match="no merge-cost rows"):
        ns.merge_cost_table(mc, call="z")


def test_gqa_layout_ab_table_and_ab_commits_table():
    pt = "gqa_32q8kv_d128:131072:65"
    rows = [
        {"call": "e", "point": pt, "variant": v, "ms": ms}
        for v, ms in (("TAIL=0", 0.401), ("TAIL=1 BLOCKS=3", 0.365),
                      ("TAIL=1 WARPGROUPS=2 BLOCKS=2", 0.441))
    ] + [{"call": "e", "point": pt, "variant": "default", "ms": 9.0},
         {"call": "d", "point": pt, "variant": "TAIL=0", "ms": 1.0}]  # fmt: skip
    t = ns.gqa_layout_ab_table(pd.DataFrame(rows))
    assert list(t.columns) == ["point", *ns.GQA_LAYOUTS.values(), "tail_vs_padded"]
    assert t.loc[0, "padded"] == pytest.approx(401.0)
    assert t.loc[0, "tail_vs_padded"] == pytest.approx(0.365 / 0.401)
    with pytest.raises(ValueError, match="no A/B layout rows"):
        ns.gqa_layout_ab_table(pd.DataFrame(rows), call="z")
    with pytest.raises(ValueError, match="missing"):
        ns.gqa_layout_ab_table(pd.DataFrame(rows).drop(columns=["ms"]))

    n = "gqa_8q1kv_d128/B1/L16384/T17"
    ab = pd.DataFrame(
        [{"call": "f", "side": side, "round": r, "name": n, "provider": "ours_gqa_graph",
          "metric": "time", "p50": p50}
         for side, r, p50 in (("old", 1, 0.0195), ("new", 1, 0.0214), ("old", 2, 0.0195),
                              ("new", 2, 0.0214))]
        + [{"call": "f", "side": "old", "round": 1, "name": "ceilings", "provider": "device",
            "metric": "time", "p50": 4.2}]
    )  # fmt: skip
    c = ns.ab_commits_table(ab)
    assert list(c["name"]) == [n]
    assert c.loc[0, "old"] == pytest.approx(19.5) and c.loc[0, "new_vs_old"] == pytest.approx(
        21.4 / 19.5
    )
    with pytest.raises(ValueError, match="old and a new"):
        ns.ab_commits_table(ab[ab["side"] == "old"])
    with pytest.raises(ValueError, match="no A/B timing rows"):
        ns.ab_commits_table(ab, call="z")
    # tools/gpu/ab_defines.sh: variants v0, v1, ... in the order run
    v = ab.replace({"side": {"old": "v1", "new": "v0"}})
    c = ns.ab_commits_table(v)
    assert list(c.columns) == ["name", "v1", "v0", "v0_vs_v1"]
    assert c.loc[0, "v0_vs_v1"] == pytest.approx(21.4 / 19.5)
    # a session's calls for a notebook cell, titled in the order given
    both = pd.concat([ab, v.assign(call="g")])
    tables = ns.ab_call_tables(both, {"g": "defines", "f": "commits"})
    assert list(tables) == ["call g: defines", "call f: commits"]
    assert list(tables["call f: commits"].columns) == ["name", "old", "new", "new_vs_old"]
    assert tables["call g: defines"].loc[0, "v0_vs_v1"] == pytest.approx(21.4 / 19.5)
    with pytest.raises(ValueError, match="no A/B timing rows"):
        ns.ab_call_tables(both, {"z": "none"})


def test_ab_file_tables(tmp_path):
    """The packed rows of a file, or nothing where the file is not shipped."""
    n = "gqa_8q1kv_d128/B1/L16384/T65"
    rows = pd.DataFrame(
        [{"call": "a", "side": s, "round": r, "name": n, "provider": "ours_gqa_graph",
          "metric": "time", "p50": p50}
         for s, r, p50 in (("v0", 1, 0.016), ("v0", 2, 0.018), ("v1", 1, 0.020), ("v1", 2, 0.022))]
    )  # fmt: skip
    rows.to_csv(tmp_path / "ab.csv.gz", index=False)
    tables = ns.ab_file_tables(tmp_path / "ab.csv.gz", {"a": "multicast"})
    assert list(tables) == ["call a: multicast"]
    assert tables["call a: multicast"].loc[0, "v1_vs_v0"] == pytest.approx(21.0 / 17.0)
    assert ns.ab_file_tables(tmp_path / "missing.csv.gz", {"a": "multicast"}) == {}


def test_atomic_merge_probe_table():
    rows = pd.DataFrame(
        [{"shape": sh, "mode": m, "spin_cycles": sp, "jitter_cycles": 2000, "cost_us": c}
         for sh, sp, m, c in (("t17", 0, "none", 0.0), ("t17", 0, "atomic", 11.0),
                              ("t17", 0, "partials+merge", 6.0), ("t65", 0, "none", 0.0),
                              ("t65", 0, "atomic", 10.0), ("t65", 0, "partials+merge", 5.8),
                              ("t17", 0, "merge_only", float("nan")),
                              ("t65", 0, "merge_only", float("nan")))]
    ).assign(us=lambda d: d["cost_us"].fillna(3.0) + 2.0)  # fmt: skip
    t = ns.atomic_merge_probe_table(rows)
    assert list(t.index) == ["none", "atomic", "partials+merge"]
    assert list(t.columns) == ["t17, spin 0, jitter 2000", "t65, spin 0, jitter 2000"]
    assert t.loc["atomic", "t65, spin 0, jitter 2000"] == pytest.approx(10.0)
    us = ns.atomic_merge_probe_table(rows, value="us")
    assert list(us.index) == ["none", "atomic", "partials+merge", "merge_only"]
    assert us.loc["merge_only", "t17, spin 0, jitter 2000"] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="no atomic merge probe rows"):
        ns.atomic_merge_probe_table(rows.iloc[:0])
    with pytest.raises(ValueError, match="missing"):
        ns.atomic_merge_probe_table(rows.drop(columns=["cost_us"]))


def test_prologue_table():
    rows = pd.DataFrame(
        [{"point": "p", "kind": "split", "entry": e, "past_barrier": e + 0.2,
          "slot_ready": e + 0.2 + r, "first_issue": e + 0.2 + r + 0.4, "first_tile": e + 3.0,
          "slot_ready_window_us": 0.5}
         for e, r in ((0.0, 0.6), (1.0, 0.7), (2.0, 0.8))]
        + [{"point": "p", "kind": "merge", "entry": 0.0, "past_barrier": 9.0, "slot_ready": 9.0,
            "first_issue": 9.0, "first_tile": 9.0, "slot_ready_window_us": 0.5}]
    )  # fmt: skip
    t = ns.prologue_table(rows).set_index("point")
    assert t.loc["p", "barrier"] == pytest.approx(0.2)
    assert t.loc["p", "entry_read"] == pytest.approx(0.7)  # the median of 0.6, 0.7, 0.8
    assert t.loc["p", "issue"] == pytest.approx(0.4)
    assert t.loc["p", "landed"] == pytest.approx(3.0 - 1.3)
    assert t.loc["p", "entry_to_first_tile"] == pytest.approx(3.0)
    top = ns.prologue_table(rows, q=1.0).set_index("point")
    assert top.loc["p", "entry_read"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="no split CTA rows"):
        ns.prologue_table(rows[rows["kind"] == "merge"])


def test_layout_variants_table():
    rows = [
        {"call": "b", "point": p, "variant": v, "ms": ms}
        for p, v, ms in (("a:1:65", "TAIL=0 PAIR=0", 0.36), ("a:1:65", "PAIR=1", 0.54),
                         ("a:2:65", "TAIL=0 PAIR=0", 0.70), ("a:2:65", "PAIR=1", 1.05))
    ] + [{"call": "x", "point": "a:1:65", "variant": "PAIR=1", "ms": 9.0}]  # fmt: skip
    t = ns.layout_variants_table(pd.DataFrame(rows), "b")
    assert list(t.columns) == ["point", "TAIL=0 PAIR=0", "PAIR=1", "PAIR=1_vs_first"]
    assert list(t["point"]) == ["a:1:65", "a:2:65"]
    assert t.loc[0, "PAIR=1"] == pytest.approx(540.0)
    assert t.loc[1, "PAIR=1_vs_first"] == pytest.approx(1.05 / 0.70)
    with pytest.raises(ValueError, match="no layout rows"):
        ns.layout_variants_table(pd.DataFrame(rows), "z")
    with pytest.raises(ValueError, match="missing"):
        ns.layout_variants_table(pd.DataFrame(rows).drop(columns=["variant"]), "b")


def test_wgmma_rate_table():
    text = """one CTA a SM (132), 256 rounds of 8 k-steps a warpgroup
m64n8  k16             warpgroups 1  chains 4      18.1 cycles a MMA (SM)     453 MAC a cycle   22.1 % of peak
m64n128k16             warpgroups 3  chains 1      64.1 cycles a MMA (SM)    2046 MAC a cycle   99.9 % of peak
m64n16 k16 A MN-major  warpgroups 2  chains 4      20.0 cycles a MMA (SM)     817 MAC a cycle   39.9 % of peak
"""
    t = ns.wgmma_rate_table(text)
    assert list(t["mma"]) == ["m64n8k16", "m64n128k16", "m64n16k16"]
    assert list(t["a"]) == ["K-major", "K-major", "MN-major"]
    assert list(t["warpgroups"]) == [1, 3, 2] and list(t["chains"]) == [4, 1, 4]
    assert t.loc[1, "cycles"] == pytest.approx(64.1) and t.loc[2, "mac_per_cycle"] == 817
    assert t.loc[0, "pct_of_peak"] == pytest.approx(22.1)
    with pytest.raises(ValueError, match="no wgmma_rate_probe lines"):
        ns.wgmma_rate_table("nothing here")


def test_wgmma_mix_table():
    text = """one CTA a SM (132), 128 rounds; cycles a round of each warpgroup (clock64)
1 WG | wg0: rows                               | others: -                      | wg0  1135.3 cycles a round | tensor work   1024
2 WG | wg0: rows + S^T + O^T                   | others: rows                   | wg0  2388.1 wg1  1681.3 cycles a round | tensor work   2336
"""
    t = ns.wgmma_mix_table(text)
    assert list(t["warpgroups"]) == [1, 2]
    assert list(t["wg0"]) == ["rows", "rows + S^T + O^T"] and list(t["others"]) == ["-", "rows"]
    assert t.loc[0, "wg0_cycles"] == pytest.approx(1135.3) and pd.isna(t.loc[0, "wg1_cycles"])
    assert t.loc[1, "wg1_cycles"] == pytest.approx(1681.3) and t.loc[1, "tensor_work"] == 2336
    assert t.loc[1, "busiest_vs_work"] == pytest.approx(2388.1 / 2336)
    with pytest.raises(ValueError, match="no wgmma_mix_probe lines"):
        ns.wgmma_mix_table("nothing here")


def test_timeline_spans_table():
    spans = dict(first_tile=2.5, stream=10.0, epilogue=1.5, straggle=0.5, gap_merge=1.5,
                 merge=3.0, gap_next=2.0)  # fmt: skip
    rows = [
        {"call": "e", "variant": "default", "point": "p:64k", "splits": 129, "p50_us": 24.0,
         "call_us": 22.0 + k, **{s: v + k for s, v in spans.items()}}
        for k in (0, 1, 2)
    ] + [
        {"call": "e", "variant": "default", "point": "q:32k", "splits": 8, "p50_us": 90.0,
         "call_us": float("nan"), **spans},
        {"call": "e", "variant": "pdl", "point": "p:64k", "splits": 129, "p50_us": 1.0,
         "call_us": 1.0, **spans},
        {"call": "d", "variant": "default", "point": "p:64k", "splits": 129, "p50_us": 1.0,
         "call_us": 1.0, **spans},
    ]  # fmt: skip
    t = ns.timeline_spans_table(pd.DataFrame(rows), "e").set_index("point")
    assert list(t.index) == ["p:64k", "q:32k"]
    assert t.loc["p:64k", "stream"] == pytest.approx(11.0)  # the median of 10, 11, 12
    assert t.loc["p:64k", "rest"] == pytest.approx(23.0 - (21.0 + 7))
    assert pd.isna(t.loc["q:32k", "rest"]) and t.loc["q:32k", "p50_us"] == 90.0
    with pytest.raises(ValueError, match="no default timeline rows"):
        ns.timeline_spans_table(pd.DataFrame(rows), "z")
    pdl = ns.timeline_spans_table(pd.DataFrame(rows), "e", variant="pdl").set_index("point")
    assert list(pdl.index) == ["p:64k"] and pdl.loc["p:64k", "p50_us"] == 1.0
    with pytest.raises(ValueError, match="missing"):
        ns.timeline_spans_table(pd.DataFrame(rows).drop(columns=["merge"]), "e")


def test_read_floor_table():
    import json

    read = pd.DataFrame([
        {"layout": "empty", "L": 0, "bytes": 0, "read_us": 1.0, "floor_us": 0.0},
        {"layout": "gqa_8q1kv", "L": 32768, "bytes": 16e6, "read_us": 6.0, "floor_us": 4.0},
        {"layout": "gqa_8q1kv", "L": 65536, "bytes": 32e6, "read_us": 10.0, "floor_us": 8.0},
    ])  # fmt: skip

    def row(name, us, floor_us, provider="ours_gqa_graph", metric="time"):
        return {"name": name, "provider": provider, "metric": metric, "p50": us * 1e-3,
                "config_json": json.dumps({"floor_ms": floor_us * 1e-3})}  # fmt: skip

    bench = pd.DataFrame([
        row("gqa_8q1kv_d128/B1/L32768/T17", 20.0, 4.0),
        row("gqa_8q1kv_d128/B1/L32768/T65", 30.0, 12.0),  # FLOPs set this floor
        row("gqa_8q1kv_d128/B1/L65536/T17", 25.0, 8.0),
        row("gqa_8q1kv_d128/B1/L65536/T17", 1.0, 8.0, provider="fi_mask"),
        row("gqa_8q1kv_d128/B8/L65536/T17", 1.0, 8.0),  # batch 8: no read-floor size
        row("gqa_8q1kv_d128/B1/L131072/T17", 40.0, 16.0),  # no read row at 128k
    ])  # fmt: skip
    t = ns.read_floor_table(read, bench).set_index(["L", "T"])
    assert sorted(t.index) == [(32768, 17), (32768, 65), (65536, 17)]
    assert t.loc[(32768, 17), "read_frac"] == pytest.approx(4 / 6)
    assert t.loc[(32768, 17), "ours_frac"] == pytest.approx(4 / 20)
    assert t.loc[(32768, 17), "ours_vs_read"] == pytest.approx(6 / 20)
    assert t.loc[(32768, 17), "bound"] == "bytes" and t.loc[(32768, 65), "bound"] == "FLOPs"
    assert t.loc[(32768, 65), "ours_frac"] == pytest.approx(12 / 30)
    with pytest.raises(ValueError, match="missing"):
        ns.read_floor_table(read.drop(columns=["read_us"]), bench)
    # a file of two device calls: the last listed unless one is named
    two = pd.concat([read.assign(call="c"), read.assign(call="g", read_us=read["read_us"] * 2)])
    assert ns.read_floor_table(two, bench).set_index(["L", "T"]).loc[
        (32768, 17), "read_us"] == 12.0  # fmt: skip
    assert ns.read_floor_table(two, bench, call="c")["read_us"].iloc[0] == 6.0
    with pytest.raises(ValueError, match="no ours_gqa_graph"):
        ns.read_floor_table(read, bench[bench["provider"] == "fi_mask"])


def test_show_tables_prints_each_title_and_its_rounded_table(capsys):
    from kdtree import nb

    nb.show_tables({"call a: x": pd.DataFrame({"v": [1.23456]}), "call b: y": pd.DataFrame()}, 2)
    out = capsys.readouterr().out
    assert out.index("call a: x") < out.index("1.23") < out.index("call b: y")
    assert "1.2346" not in out


def _grid_rows():
    rows = []
    for b in (1, 8):
        for t in (1, 65):
            case = f"gqa_x/B{b}/L65536/T{t}"
            ours = 0.1 * b * (2 if t == 65 else 1)
            rows += [
                _row(case, "ours_gqa_graph", "time", ours, floor_ms=0.05, splits=2, q_groups=1),
                _row(case, "ours_gqa_graph", "frac_of_floor", 0.05 / ours, floor_ms=0.05),
                _row(case, "ours_graph", "time", 1.25 * ours, floor_ms=0.05),
                _row(case, "ref", "time", ours / 4, floor_ms=0.05),  # not a peer
                _row(case, "fi_cascade_prefix", "time", ours / 2, floor_ms=0.05),  # a part only
                # the peer wins at batch 8, T=1 only
                _row(case, "fi_mask", "time", ours * (0.9 if (b, t) == (8, 1) else 3.0)),
            ]
    return pd.DataFrame(rows)


def test_grid_vs_peers_and_findings():
    grid = ns.grid_vs_peers(ns.verify_rows(_grid_rows()))
    assert len(grid) == 4 and set(grid["B"]) == {1, 8} and set(grid["T"]) == {1, 65}
    assert (grid["ours"] == "ours_gqa_graph").all() and (grid["best_peer"] == "fi_mask").all()
    g = grid.set_index(["B", "T"])
    assert g.loc[(8, 1), "speedup_vs_peer"] == pytest.approx(0.9)  # the peer was faster
    assert g.loc[(1, 65), "speedup_vs_peer"] == pytest.approx(3.0)
    assert g["triton_over_cuda"].to_numpy() == pytest.approx([1.25] * 4)
    lines = ns.grid_findings(grid)
    assert lines[0] == "4 points, 4 with a complete peer: ours faster at 3."
    assert lines[1] == "gqa_x: 0.90-3.00x the fastest peer (median 3.00x)."
    assert lines[2:] == ["Peer faster: gqa_x, batch 8, T=1, L=64k: fi_mask (0.900x)."]


def test_grid_change_table_counts_faster_and_slower_points():
    old = ns.grid_vs_peers(ns.verify_rows(_grid_rows()))
    new = old.copy()
    new.loc[new["T"] == 65, "ours_ms"] *= 0.9  # faster at T=65
    new.loc[(new["B"] == 8) & (new["T"] == 1), "ours_ms"] *= 1.05  # slower at batch 8, T=1
    out = ns.grid_change_table(old, new).set_index("B")
    assert out.loc[1, "points"] == 2 and out.loc[1, "faster"] == 1
    assert out.loc[1, "slower_2pct"] == 0 and out.loc[8, "slower_2pct"] == 1
    assert out.loc[8, "ratio_min"] == pytest.approx(0.9)
    assert out.loc[8, "ratio_max"] == pytest.approx(1.05)
    with pytest.raises(ValueError, match="share no point"):
        ns.grid_change_table(old, new.assign(L=1))
    peers = ns.grid_change_table(old, new.assign(peer_ms=new["peer_ms"] * 2), column="peer_ms")
    assert peers["ratio_median"].to_numpy() == pytest.approx([2.0, 2.0])
    assert (peers["slower_2pct"] == 2).all() and (peers["faster"] == 0).all()


def test_page_size_table_medians_and_ratio():
    rows = [_row("gqa_x/B1/L65536/T1", "ours_gqa_graph", "time", ms) | {"page_size": ps}
            for ps, ms in ((16, 0.10), (16, 0.12), (16, 0.11), (64, 0.099), (64, 0.121))]  # fmt: skip
    rows.append(_row("ceilings", "device", "copy_bandwidth", 4.2) | {"page_size": 16})
    out = ns.page_size_table(pd.DataFrame(rows)).iloc[0]
    assert out["us_p16"] == pytest.approx(110.0) and out["us_p64"] == pytest.approx(110.0)
    assert out["p64_over_p16"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no timing rows"):
        ns.page_size_table(pd.DataFrame(rows[-1:]))


def test_launch_changes_lists_only_changed_launches():
    old = _grid_rows()
    new = old.copy()
    moved = (new["provider"] == "ours_gqa_graph") & new["name"].str.endswith("B8/L65536/T65")
    timed = moved & (new["metric"] == "time")
    new.loc[timed, "config_json"] = json.dumps({"splits": 3, "q_groups": 2})
    new.loc[timed, "p50"] = 0.8
    out = ns.launch_changes(old, new)
    assert len(out) == 1
    r = out.iloc[0]
    assert (r["B"], r["T"], r["splits_old"], r["splits_new"], r["q_groups_new"]) == (
        8,
        65,
        2,
        3,
        2,
    )
    assert r["speedup"] == pytest.approx(1.6 / 0.8)


def test_split_sweep_table_picks_todays_rule():
    from kdtree.kernels import cuda_mla

    rule = cuda_mla.choose_splits(8, 16 * 65, -(-(65536 + 257) // 16) * 16, 132)
    rows = [{"point": "h16:65536:65:8", "layout": "mla_h16", "L": 65536, "T": 65, "batch": 8,
             "splits": s, "chosen": s == 1, "ms": ms}
            for s, ms in ((1, 3.5), (rule, 2.2), (16, 2.4))]  # fmt: skip
    t = ns.split_sweep_table(pd.DataFrame(rows)).iloc[0]
    assert (t["old_splits"], t["best_splits"], t["new_splits"]) == (1, rule, rule)
    assert t["new_us"] == pytest.approx(2200) and t["old_over_best"] == pytest.approx(3.5 / 2.2)


def test_extra_token_table_pairs_t_and_t_plus_one():
    rows = pd.DataFrame(
        [
            {"layout": "mla_h8", "B": 8, "L": 65536, "T": t, "time_ms": ms}
            for t, ms in [(8, 0.100), (9, 0.150), (16, 0.200), (17, 0.300), (65, 1.0)]
        ]
    )
    out = ns.extra_token_table(rows).iloc[0]
    assert out["T9_over_T8"] == pytest.approx(1.5) and out["T17_over_T16"] == pytest.approx(1.5)
    assert "T66_over_T65" not in out.index and out["T65"] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="T and T"):
        ns.extra_token_table(rows[rows["T"].isin([8, 16])])


def test_tail_sweep_table_against_the_default_count():
    rows = pd.DataFrame(
        [
            {"call": "e", "variant": v, "point": "h8:65536:9", "splits": sp, "tail_splits": ts,
             "chosen": sp == 65, "ms": ms, "round": r}
            for r in (1, 2)
            for v, sp, ts, ms in [("default", 65, "", 0.050), ("default", 80, "", 0.070),
                                  ("pairs", 65, "", 0.065), ("pairs", 80, "", 0.060),
                                  ("default", 80, 40.0, 0.100)]
        ]
        + [{"call": "x", "variant": "default", "point": "p", "splits": 1, "tail_splits": "",
            "chosen": True, "ms": 1.0, "round": 1}]
    )  # fmt: skip
    t = ns.tail_sweep_table(rows, "e", "default").set_index(["point", "item"])
    assert t.loc[("h8:65536:9", "80"), "pairs_over_default"] == pytest.approx(1.2)
    assert t.loc[("h8:65536:9", "65"), "default_over_default"] == pytest.approx(1.0)
    assert t.loc[("h8:65536:9", "80/40"), "default"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="no rows"):
        ns.tail_sweep_table(rows, "z", "default")
    with pytest.raises(ValueError, match="no 'base'"):
        ns.tail_sweep_table(rows, "e", "base")


def test_grid_history_tables_swap_in_the_older_mla_rows():
    rows = _grid_rows()
    mla_rows = rows.assign(name=rows["name"].str.replace("gqa_x", "mla_x"))
    old = ns.grid_vs_peers(ns.verify_rows(pd.concat([rows, mla_rows], ignore_index=True)))
    grid = old.copy()
    grid.loc[grid["layout"] == "mla_x", "ours_ms"] *= 0.8  # today's MLA rows: faster
    assert ns.grid_history_tables(grid) == {}
    out = ns.grid_history_tables(grid, calle26=pd.concat([rows, mla_rows]), mla27=mla_rows)
    now, then = out.values()
    assert list(now["layout"].unique()) == ["mla_x"]  # today's MLA against session 27's
    assert now["ratio_max"].to_numpy() == pytest.approx([0.8, 0.8])
    # session 27's grid is today's GQA rows with session 27's MLA rows: unchanged against itself
    assert then["ratio_min"].to_numpy() == pytest.approx([1.0] * 4)
    assert then["ratio_max"].to_numpy() == pytest.approx([1.0] * 4)
    # with session 28's MLA rows given, today's are compared with them and they with session 27's
    mla28 = mla_rows.copy()
    t = (mla28["metric"] == "time") & mla28["provider"].str.startswith("ours")
    mla28.loc[t, "p50"] = mla28.loc[t, "p50"].astype(float) * 0.9
    out = ns.grid_history_tables(grid, calle26=pd.concat([rows, mla_rows]), mla27=mla_rows,
                                 mla28=mla28)  # fmt: skip
    now, mid, then = out.values()
    assert now["ratio_max"].to_numpy() == pytest.approx([0.8 / 0.9] * 2)
    assert mid["ratio_max"].to_numpy() == pytest.approx([0.9] * 2)
    assert then["ratio_max"].to_numpy() == pytest.approx([1.0] * 4)


def test_t1_stream_table_against_the_read_floor():
    def row(call, name, provider, ms, side="", page_order=""):
        return _row(name, provider, "time", ms) | {"call": call, "side": side,
                                                   "page_order": page_order}  # fmt: skip

    case = "gqa_8q1kv_d128/B8/L65536/T1"
    rows = pd.DataFrame([
        row("a_t1forms", case, "ours_gqa_graph", 0.100, side="v0"),
        row("a_t1forms", case, "ours_gqa_graph", 0.104, side="v0"),
        row("a_t1forms", case, "ours_gqa_graph", 0.050, side="v2"),  # another form: not ours
        row("a_order", case, "sdpa_dense", 0.090, page_order="random"),
        row("a_order", case, "sdpa_dense", 0.500, page_order="sequential"),
        row("a_t1forms", "gqa_8q1kv_d128/B8/L65536/T17", "ours_gqa_graph", 0.3, side="v0"),
    ])  # fmt: skip
    read = pd.DataFrame([
        {"layout": "gqa_8q1kv", "B": 8, "L": 65536, "order": o, "read_us": us}
        for o, us in (("contiguous", 81.0), ("random", 90.0))
    ])  # fmt: skip
    t = ns.t1_stream_table(rows, read).iloc[0]
    assert t["ours_us"] == pytest.approx(102.0) and t["sdpa_us"] == pytest.approx(90.0)
    assert t["ours_vs_read"] == pytest.approx(90 / 102)
    assert t["sdpa_vs_read"] == pytest.approx(81 / 90)
    assert t["ours_vs_sdpa"] == pytest.approx(90 / 102)
    with pytest.raises(ValueError, match="read-floor size"):
        ns.t1_stream_table(rows, read.assign(B=1))
    with pytest.raises(ValueError, match="a_order"):
        ns.t1_stream_table(rows[rows["call"] != "a_order"], read)


def test_run_spread_table():
    def row(run, ms, p20=None, p80=None, name="gqa_x/B8/L65536/T65", metric="time"):
        return {"call": "d", "run": run, "name": name, "metric": metric, "p50": ms,
                "p20": p20 or ms, "p80": p80 or ms}  # fmt: skip

    rows = pd.DataFrame([row("1", 0.2), row("2", 0.25, 0.24, 0.264), row("3", 0.22),
                         row("", 9.9), row("4", 9.9, metric="bandwidth")])  # fmt: skip
    t = ns.run_spread_table(rows).iloc[0]
    assert t["runs"] == 3 and t["min_us"] == pytest.approx(200.0)
    assert t["median_us"] == pytest.approx(220.0) and t["max_over_min"] == pytest.approx(1.25)
    assert t["within_run"] == pytest.approx(1.1)
    with pytest.raises(ValueError, match="no timing rows"):
        ns.run_spread_table(rows[rows["run"] == ""])


def test_replace_rows():
    def row(name, provider, ms):
        return {"name": name, "provider": provider, "metric": "time", "p50": ms}

    rows = pd.DataFrame([row("a", "ours", 1.0), row("a", "peer", 2.0), row("b", "ours", 3.0)])
    old = pd.DataFrame([row("a", "ours", 1.5)])
    got = ns.replace_rows(rows, old)
    assert len(got) == 3
    assert got.set_index(["name", "provider"])["p50"].to_dict() == {
        ("a", "peer"): 2.0, ("b", "ours"): 3.0, ("a", "ours"): 1.5,
    }  # fmt: skip
    with pytest.raises(ValueError, match="lack"):
        ns.replace_rows(rows, pd.DataFrame([row("c", "ours", 1.0)]))


def _target_rows():
    """Batch-1 rows at three GQA points and two MLA points (floors 0.05 ms), plus a batch-8
    and a T=9 row the targets must ignore."""
    rows = []
    for case, ours, peer in (
        ("gqa_x/B1/L16384/T65", 0.125, 0.5),  # 40 % >= 35 %: met
        ("gqa_x/B1/L32768/T65", 0.1, 0.5),  # 50 % < 60 %: not met
        ("gqa_x/B1/L131072/T17", 0.0625, 0.15),  # 80 % but 2.4x < 3x the peer: not met
        ("gqa_x/B8/L32768/T65", 0.06, 0.5),  # batch 8: no target
        ("gqa_x/B1/L32768/T9", 0.06, 0.5),  # T=9: no target
    ):
        rows += [
            _row(case, "ours_gqa_graph", "time", ours, floor_ms=0.05),
            _row(case, "ours_gqa_graph", "frac_of_floor", 0.05 / ours, floor_ms=0.05),
            _row(case, "fi_mask", "time", peer, floor_ms=0.05),
        ]
    for case, ours, path in (
        ("mla_h8/B1/L16384/T17", 0.1, 0.1),  # 16k: nothing asked
        ("mla_h8/B1/L65536/T65", 0.1, 0.11),  # 1.1x < 1.2x: not met
        ("mla_h8/B1/L131072/T65", 0.1, 0.13),  # 1.3x: met
    ):
        rows += [
            _row(case, "ours_seesaw_graph", "time", ours, floor_ms=0.05),
            _row(case, "ours_seesaw_graph", "frac_of_floor", 0.05 / ours, floor_ms=0.05),
            _row(case, "fi_mla", "time", path, floor_ms=0.05),
            _row(case, "fi_mla_prefix", "time", ours / 2, floor_ms=0.05),  # a part only
        ]
    return pd.DataFrame(rows)


def test_issue_targets_point_by_point():
    t = ns.issue_targets(ns.verify_rows(_target_rows())).set_index(["layout", "L", "T"])
    assert len(t) == 6  # batch 8 and T=9 left out
    assert (
        bool(t.loc[("gqa_x", 16384, 65), "met"])
        and "35 %" in t.loc[("gqa_x", 16384, 65), "target"]
    )
    assert not t.loc[("gqa_x", 32768, 65), "met"]
    assert t.loc[("gqa_x", 32768, 65), "ours_frac"] == pytest.approx(0.5)
    assert not t.loc[("gqa_x", 131072, 17), "met"]  # the floor is met, the 3x is not
    assert t.loc[("gqa_x", 131072, 17), "speedup_vs_peer"] == pytest.approx(2.4)
    assert t.loc[("mla_h8", 16384, 17), "target"] == ""
    assert t.loc[("mla_h8", 16384, 17), "met"] is None
    assert not t.loc[("mla_h8", 65536, 65), "met"]
    assert t.loc[("mla_h8", 65536, 65), "vs_fi_mla"] == pytest.approx(1.1)
    assert bool(t.loc[("mla_h8", 131072, 65), "met"])
    lines = ns.target_findings(t.reset_index())
    assert lines[0] == "Issue 4's batch-1 targets: met at 2 of 5 points."
    assert "Not met: gqa_x, T=65, L=32k: 50 % of the floor (≥ 60 % of the floor)." in lines
    assert "Not met: mla_h8, T=65, L=64k: 1.10x fi_mla (≥ 1.2x fi_mla)." in lines
    assert len(lines) == 4


def test_issue_targets_takes_extra_points():
    rows = ns.verify_rows(_target_rows())
    extra = rows[rows["L"] == 32768].assign(L=262144)  # the 32k rows again as another length
    t = ns.issue_targets(rows[rows["L"] != 32768], extra)
    assert set(t["L"]) == {16384, 65536, 131072, 262144}
    with pytest.raises(ValueError, match="tidy"):
        ns.issue_targets(rows.drop(columns=["status"]))


def _limits_inputs():
    """A two-point limits run: 8q/1kv, T=17 at 16k (35 % asked) and 128k (60 %)."""
    ab = []
    for length, floor, real, idle in (
        (16384, 0.002, 0.0125, 0.0073),
        (131072, 0.016, 0.0295, 0.0246),
    ):
        case = f"gqa_8q1kv_d128/B1/L{length}/T17"
        for rnd in (1, 2):
            for side, ms in (("v0", real), ("v1", idle)):
                ab.append(_row(case, "ours_gqa_graph", "time", ms * (1 + 0.01 * (rnd - 1)),
                               floor_ms=floor) | {"call": "a_ablate", "side": side, "round": rnd})  # fmt: skip
    ab.append(
        _row("ceilings", "device", "copy_bandwidth", 4.2)
        | {"call": "a_ablate", "side": "v0", "round": 1}
    )
    read = pd.DataFrame([
        {"call": "a", "layout": "gqa_8q1kv", "L": 16384, "order": "contiguous", "read_us": 4.0},
        {"call": "a", "layout": "gqa_8q1kv", "L": 131072, "order": "contiguous", "read_us": 18.8},
        {"call": "b", "layout": "gqa_8q1kv", "L": 131072, "order": "random", "read_us": 20.6},
    ])  # fmt: skip
    merge = pd.DataFrame([
        {"call": "a", "part": "modes", "point": "gqa_8q1kv_d128:131072:17", "mode": m, "us": us}
        for m, us in (("plain", 31.0), ("split", 26.5))
    ])  # fmt: skip
    return pd.DataFrame(ab), read, merge


def test_limits_table_puts_each_time_beside_the_target():
    ab, read, merge = _limits_inputs()
    t = ns.limits_table(ab, read, merge).set_index("L")
    assert t.loc[16384, "target_us"] == pytest.approx(2.0 / 0.35)
    assert t.loc[131072, "target_us"] == pytest.approx(16.0 / 0.6)
    assert t.loc[131072, "ours_us"] == pytest.approx(29.5 * 1.005)  # the mean of two rounds
    assert t.loc[131072, "read_paged_us"] == pytest.approx(20.6)
    assert np.isnan(t.loc[16384, "read_paged_us"]) and np.isnan(t.loc[16384, "merge_us"])
    assert t.loc[131072, "merge_us"] == pytest.approx(4.5)
    assert t.loc[16384, "structure_over_target"] > 1 > t.loc[131072, "structure_over_target"]
    lines = ns.limits_findings(t.reset_index())
    assert "our structure with no compute takes 7.3" in lines[0]
    assert "11 % over" in lines[1] and "exposed part is 4.9" in lines[1]
    with pytest.raises(ValueError, match="no a_ablate"):
        ns.limits_table(ab.assign(call="x"), read, merge)


def test_stream_pace_table_fits_a_line_and_skips_multi_cta_splits():
    rows = [{"call": "b", "part": "sweep", "point": f"gqa_8q1kv_d128:{n}:17", "splits": 64,
             "tiles_per_cta": tiles, "us": 2.0 + 0.8 * tiles, "env": "KDTREE_GQA_ABLATE=16"}
            for n, tiles in ((16384, 5), (65536, 17), (131072, 33))]  # fmt: skip
    rows.append({"call": "a", "part": "sweep", "point": "gqa_8q1kv_d128:16384:65", "splits": 43,
                 "tiles_per_cta": 6, "us": 13.0, "env": ""})  # fmt: skip
    t = ns.stream_pace_table(pd.DataFrame(rows))
    assert len(t) == 1  # (T=65 runs four CTAs a split: left out)
    r = t.iloc[0]
    assert r["us_a_tile"] == pytest.approx(0.8) and r["fixed_us"] == pytest.approx(2.0)
    assert r["GBps_a_cta"] == pytest.approx(64 * 512 / 0.8e-6 / 1e9)  # three-warpgroup tiles
    assert r["TBps"] == pytest.approx(r["GBps_a_cta"] * 64 / 1e3)
    with pytest.raises(ValueError, match="no sweep"):
        ns.stream_pace_table(pd.DataFrame(rows).assign(part="modes"))


def test_calls_table_and_grid_point_changes():
    rows = [_row("gqa_x/B1/L65536/T1", "ours_gqa_graph", "time", ms) | {"call": c}
            for c, ms in (("seq", 0.02), ("p64", 0.019), ("p64", 0.021))]  # fmt: skip
    t = ns.calls_table(pd.DataFrame(rows), ["seq", "p64"]).iloc[0]
    assert t["seq"] == pytest.approx(20.0) and t["p64_vs_seq"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no timing rows"):
        ns.calls_table(pd.DataFrame(rows), ["other"])
    old = ns.grid_vs_peers(ns.verify_rows(_grid_rows()))
    new = old.copy()
    new.loc[(new["B"] == 1) & (new["T"] == 1), "ours_ms"] *= 0.8
    ch = ns.grid_point_changes(old, new)
    assert len(ch) == 1 and ch.iloc[0]["new_over_old"] == pytest.approx(0.8)


def test_session35_tables_read_the_shipped_rows():
    from kdtree import nb

    logs = nb.data_path("bench", "logs")
    if not (logs / "limits_ab_session35.csv.gz").exists():
        pytest.skip("session 35's rows are not in this checkout")
    tables = ns.session35_tables(logs)
    limits = next(v for k, v in tables.items() if k.startswith("the unmet points"))
    assert len(limits) == 8 and (limits["ours_us"] > limits["no_compute_us"]).all()
    rule = next(v for k, v in tables.items() if "v1 one tile a split" in k)
    at16k = rule.set_index("name").loc["gqa_8q1kv_d128/B1/L16384/T1", "v1_vs_v0"]
    assert at16k < 0.95  # the shipped A/B: one tile a split is faster there
    pdl = next(v for k, v in tables.items() if k.startswith("the merge at 132"))
    one_cta = pdl[(pdl["splits"] == 132) & (pdl["T"] <= 17)]
    assert (one_cta["auto_merge"] == 2).all() and (one_cta["plain_over_auto"] < 0.9).all()
