"""The verify-attention benchmark's plumbing on the CPU (interpreter, tiny shapes)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kdtree.bench import verify_attention as va
from kdtree.bench.roofline import Ceilings, floor_ms, gqa_cost, mla_cost


def test_costs_match_the_design_formulas():
    nbytes, flops = gqa_cost(1, 131072, 0, 32, 8, 128)
    assert nbytes == 131072 * 8 * 128 * 2 * 2
    assert flops == 0
    _, flops = gqa_cost(1, 131072 - 17, 17, 32, 8, 128)
    assert flops == 4 * 17 * 131072 * 128 * 32
    nbytes, flops = mla_cost(1, 131072 - 65, 65, 16)
    assert flops == 2 * 16 * 65 * 131072 * (576 + 512)
    assert nbytes > 131072 * 576 * 2


def test_floor_is_the_max_of_both_ceilings():
    c = Ceilings(copy_TBps=4.0, matmul_TFLOPs=800.0)
    assert math.isclose(floor_ms(4e9, 0, c), 1.0)
    assert math.isclose(floor_ms(0, 8e14, c), 1000.0)


def test_block_mask_layout():
    pytest.importorskip("torch.nn.attention.flex_attention")
    vis = torch.eye(5, dtype=torch.bool)[None].expand(2, 5, 5).contiguous()
    bm = va.build_tree_block_mask(torch.tensor([300, 300], dtype=torch.int32), vis, 300)
    assert bm.full_kv_num_blocks[0, 0, 0] == 2  # keys 0..255 are whole prefix blocks
    assert bm.kv_num_blocks[0, 0, 0] == 1  # 256..304: prefix tail + tree
    assert bm.kv_indices[0, 0, 0, 0] == 2


def test_smoke_run_writes_rows(tmp_path):
    opts = va.Options(
        providers=("ours", "ref", "sdpa_dense", "fi_mask"),
        layouts=("gqa_4q2kv_d32",),
        lengths=(40,),
        trees=(3,),
        batches=(2,),
        dtype=torch.float32,
        smoke=True,
    )
    res = va.run_suite(opts, torch.device("cpu"), log=lambda _m: None)
    by = {(r.provider, r.metric): r for r in res.rows}
    assert by[("ours", "time")].p50 > 0
    assert by[("ours", "bandwidth")].unit == "GB/s"
    diff = by[("ref", "time")].config["max_abs_diff_vs_ours"]
    assert diff < 1e-4
    assert "FlashInfer needs a GPU" in by[("fi_mask", "error")].config["reason"]
    path = tmp_path / "rows.csv"
    from kdtree.bench.schema import append_rows, read_rows

    append_rows(path, res.rows, command="test")
    df = read_rows(path)
    assert set(df.provider) == {"ours", "ref", "sdpa_dense", "fi_mask"}
    assert json.loads(df.config_json.iloc[0])["layout"] == "gqa_4q2kv_d32"


def test_default_grid_runs_the_core_points_first():
    pts = list(va._points(va.Options()))
    first = pts[: 4 * len(va.CORE_L)]
    assert {(b, n, t) for _, b, n, t in first} == {(1, n, va.CORE_T) for n in va.CORE_L}
    assert [n for _, _, n, _ in first[::4]] == list(va.CORE_L)
    later = pts[len(first) :]
    assert [n for _, b, n, t in later[:8:4]] == [4096, 1024]
    assert all(t == (9, 257) for _, _, _, t in pts[-len(pts) // 2 :])
    covered = {(lay.name, b, n, t) for lay, b, n, ts in pts for t in ts}
    assert len(covered) == len(va.LAYOUTS) * len(va.FULL_B) * len(va.FULL_L) * len(va.FULL_T)


def test_named_lengths_run_in_the_order_given():
    opts = va.Options(lengths=(131072, 65536, 16384), trees=(17, 65), batches=(1,),
                      layouts=("gqa_8q1kv_d128", "mla_h16"))  # fmt: skip
    assert [n for _, _, n, _ in va._points(opts)] == [131072] * 2 + [65536] * 2 + [16384] * 2


def test_point_time_box_skips_with_a_reason():
    opts = va.Options(
        providers=("ours", "ref"),
        layouts=("gqa_4q2kv_d32",),
        lengths=(40,),
        trees=(3,),
        batches=(1,),
        dtype=torch.float32,
        smoke=True,
        point_seconds=0.0,
    )
    res = va.run_suite(opts, torch.device("cpu"), log=lambda _m: None)
    reasons = [r.config.get("reason", "") for r in res.rows if r.metric == "error"]
    assert any("point time box" in x for x in reasons)


def test_page_order_lays_requests_out_in_order_or_permuted():
    lay = va.SMOKE_LAYOUTS["gqa_4q2kv_d32"]
    cpu = torch.device("cpu")
    seq = va.Workload(lay, 3, 40, 3, 8, torch.float32, cpu, 0, page_order="sequential")
    rnd = va.Workload(lay, 3, 40, 3, 8, torch.float32, cpu, 0)
    assert rnd.page_order == "random"
    for w in (seq, rnd):  # every rotation's pages are distinct pool pages
        pages = torch.cat([t.flatten() for t in w.tables])
        assert sorted(pages.tolist()) == list(range(w.n_rot * 3 * w.pages_per_req))
    for r, t in enumerate(seq.tables):
        start = r * 3 * seq.pages_per_req
        assert torch.equal(t.flatten(), torch.arange(start, start + t.numel(), dtype=t.dtype))
    assert not torch.equal(torch.cat(rnd.tables), torch.cat(seq.tables))
    # the gathered keys of a request are its pages' slots, in order
    k = seq.gather(seq.k, 0, 16)
    assert torch.equal(k[1], seq.k[seq.pages_per_req : seq.pages_per_req + 2].flatten(0, 1))
    with pytest.raises(ValueError, match="page_order"):
        va.Workload(lay, 1, 40, 3, 8, torch.float32, cpu, 0, page_order="reversed")


def _time_configs(**opts) -> list[dict]:
    """The time rows' configs of our kernel at one tiny point on the CPU under ``opts``."""
    o = va.Options(providers=("ours",), layouts=("gqa_4q2kv_d32",), lengths=(40,), trees=(3,),
                   batches=(1,), dtype=torch.float32, smoke=True, **opts)  # fmt: skip
    res = va.run_suite(o, torch.device("cpu"), log=lambda _m: None)
    return [r.config for r in res.rows if r.metric == "time"]


def test_page_order_reaches_the_rows():
    assert {c["page_order"] for c in _time_configs(page_order="sequential")} == {"sequential"}


def test_min_rotations_keeps_more_page_sets():
    assert va.rotations(4 * va.L2_BYTES) == 1  # a KV above 2 x L2: one set by default
    assert va.rotations(4 * va.L2_BYTES, 3) == 3
    assert va.rotations(va.L2_BYTES // 2) == 4 and va.rotations(1, 99) == va.MAX_ROTATIONS
    lay = va.SMOKE_LAYOUTS["gqa_4q2kv_d32"]
    cpu = torch.device("cpu")
    w = va.Workload(lay, 2, 40, 3, 8, torch.float32, cpu, 0, min_rotations=3)
    assert w.n_rot == 3 and len(w.tables) == 3
    pages = torch.cat([t.flatten() for t in w.tables])  # three disjoint sets
    assert sorted(pages.tolist()) == list(range(3 * 2 * w.pages_per_req))
    assert va.Workload(lay, 2, 40, 3, 8, torch.float32, cpu, 0).n_rot == 2
    need = va.Workload.bytes_needed(lay, 2, 40, 3, torch.float32, min_rotations=40)
    assert need == va.MAX_ROTATIONS * w.kv_bytes
    with pytest.raises(ValueError, match="min_rotations"):
        va.Workload(lay, 1, 40, 3, 8, torch.float32, cpu, 0, min_rotations=0)
    assert {c["n_rot"] for c in _time_configs(min_rotations=3)} == {3}


def test_cli_min_rotations(tmp_path):
    from typer.testing import CliRunner

    from kdtree.cli.main import app

    args = ["bench", "verify-attention", "--smoke", "--providers", "ours", "--layouts",
            "gqa_4q2kv_d32", "--lengths", "40", "--trees", "3", "--batches", "1"]  # fmt: skip
    bad = CliRunner().invoke(app, [*args, "--min-rotations", "0", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "--min-rotations" in bad.output
    ok = CliRunner().invoke(app, [*args, "--min-rotations", "3", "--out", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    rows = (tmp_path / "verify_attention.csv").read_text()
    assert '""n_rot"": 3' in rows
