"""The kernel tuning table: lookup rules, the table the benchmark writes, and errors."""

import json

import pytest
import torch

from kdtree import env
from kdtree.bench.schema import BenchRow
from kdtree.bench.verify_attention import tuned_table
from kdtree.kernels import tuned as tuned_mod
from kdtree.kernels.heuristics import TileConfig, configs_for
from kdtree.kernels.tuned import PACKAGED, best_entries, load_table, tuned_choice

CUDA = torch.device("cuda")


def _table(tmp_path, entries, device="H200"):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"device": device, "entries": entries}))
    load_table.cache_clear()
    return p


def _entry(**kw):
    e = dict(kind="gqa", group=4, T=17, dk=128, batch=1, L=16384, block_m=64, block_n=32,
             num_warps=4, num_stages=5, splits=16)  # fmt: skip
    e.update(kw)
    return e


def test_lookup_matches_shape_and_scales_splits(tmp_path, monkeypatch):
    p = _table(tmp_path, [_entry(), _entry(L=131072, splits=40)])
    monkeypatch.setattr(env, "KERNEL_TUNING", str(p))
    kw = dict(group=4, tree=17, dk=128, batch=1)
    c = tuned_choice("gqa", CUDA, max_len=16384, **kw)
    assert c.config == TileConfig(64, 32, 4, 5) and c.splits == 16 and c.exact
    # nearest L wins; splits scale with the length ratio, marked as scaled
    far = tuned_choice("gqa", CUDA, max_len=24576, **kw)
    assert far.splits == 24 and not far.exact
    assert tuned_choice("gqa", CUDA, max_len=131072 * 2, **kw).splits == 80
    # more than an octave away from every entry, other shapes: no choice
    assert tuned_choice("gqa", CUDA, max_len=4096, **kw) is None
    assert tuned_choice("gqa", CUDA, max_len=16384, group=4, tree=65, dk=128, batch=1) is None
    assert tuned_choice("gqa", CUDA, max_len=16384, group=4, tree=17, dk=128, batch=2) is None
    assert tuned_choice("mla", CUDA, max_len=16384, **kw) is None
    # the small-tail flag comes back from the table
    p = _table(tmp_path, [_entry(pt_prefetch=1, tail=1)])
    monkeypatch.setattr(env, "KERNEL_TUNING", str(p))
    assert tuned_choice("gqa", CUDA, max_len=16384, **kw).config == TileConfig(64, 32, 4, 5, 1, 1)


def test_off_and_cpu_mean_no_table(tmp_path, monkeypatch):
    p = _table(tmp_path, [_entry()])
    monkeypatch.setattr(env, "KERNEL_TUNING", "off")
    assert tuned_choice("gqa", CUDA, group=4, tree=17, dk=128, batch=1, max_len=16384) is None
    monkeypatch.setattr(env, "KERNEL_TUNING", "")
    cpu = torch.device("cpu")  # packaged tables apply only to a matching CUDA device
    assert tuned_choice("gqa", cpu, group=4, tree=17, dk=128, batch=1, max_len=16384) is None
    assert p.exists()


def test_packaged_device_match(monkeypatch):
    monkeypatch.setattr(env, "KERNEL_TUNING", "")
    monkeypatch.setattr(tuned_mod, "_device_name", lambda d: "NVIDIA H200")
    files = sorted(PACKAGED.glob("*.json"))
    assert files, "the H200 table ships with the package"
    table = load_table(str(files[0]))
    e = table["entries"][0]
    c = tuned_choice(
        e["kind"], CUDA, group=e["group"], tree=e["T"], dk=e["dk"], batch=e["batch"],
        max_len=e["L"],
    )  # fmt: skip
    assert c is not None and c.splits == e["splits"]
    monkeypatch.setattr(tuned_mod, "_device_name", lambda d: "NVIDIA A100-SXM4-80GB")
    assert tuned_choice(
        e["kind"], CUDA, group=e["group"], tree=e["T"], dk=e["dk"], batch=e["batch"],
        max_len=e["L"],
    ) is None  # fmt: skip


def test_bad_tables_name_the_file(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    load_table.cache_clear()
    with pytest.raises(ValueError, match="bad.json"):
        load_table(str(bad))
    bad.write_text(json.dumps({"entries": [{"kind": "gqa"}]}))
    load_table.cache_clear()
    with pytest.raises(ValueError, match="entry 0 lacks"):
        load_table(str(bad))
    with pytest.raises(FileNotFoundError, match="no tuning table"):
        load_table(str(tmp_path / "missing.json"))


def test_best_entries_keeps_only_real_wins():
    h, w = TileConfig(128, 64, 8, 3), TileConfig(64, 32, 4, 5)
    shape = dict(kind="gqa", group=4, T=17, dk=128, batch=1, L=16384)
    rows = [
        dict(shape, tile=h, splits=8, p50=0.10, heuristic=True),
        dict(shape, tile=w, splits=16, p50=0.08, heuristic=False),
    ]
    (e,) = best_entries(rows)
    assert (e["block_m"], e["splits"], e["p50_ms"], e["heuristic_ms"]) == (64, 16, 0.08, 0.1)
    rows[1]["p50"] = 0.099  # within 3 %: not worth a table entry
    assert best_entries(rows) == []
    rows[0]["p50"] = 0.2
    rows[0]["heuristic"] = False  # no heuristic row measured: nothing to compare against
    assert best_entries(rows) == []


def test_tuned_table_from_bench_rows():
    first = configs_for("gqa", 4 * 17, 128, False)[0]
    other = TileConfig(64, 32, 4, 5)

    def row(tc, s, p50):
        cfg = dict(kind="gqa", hq=32, hkv=8, d=128, rope=0, batch=1, L=16384, T=17,
                   tile=str(tc), splits=s, heuristic_splits=8)  # fmt: skip
        return BenchRow("verify_attention", "n", f"ours_tune[{s}]", "time", "ms", p50,
                        mode="graph", config=cfg)  # fmt: skip

    t = tuned_table([row(first, 8, 0.2), row(other, 16, 0.1), row(other, 8, 0.15)], "H200")
    assert t["device"] == "H200"
    (e,) = t["entries"]
    assert (e["block_m"], e["block_n"], e["splits"], e["group"], e["dk"]) == (64, 32, 16, 4, 128)
    # a small-tail winner keeps its flag through the table and back
    tail = TileConfig(64, 64, 4, 3, 1, 1)
    (e,) = tuned_table([row(first, 8, 0.2), row(tail, 8, 0.1)], "H200")["entries"]
    assert (e["pt_prefetch"], e["tail"]) == (1, 1)


def test_scaled_split_count_never_undercuts_the_model(tmp_path, monkeypatch):
    """An entry measured at 128k, applied at 64k, keeps its tile but not a split count below
    the model's (a scaled-down count had left SMs idle); at its own length it is used as is."""
    from kdtree.kernels import TreeAttentionPlan

    cfg = TileConfig(128, 64, 8, 3, 1)
    import kdtree.kernels.workspace as ws_mod

    monkeypatch.setattr(ws_mod, "device_sm_count", lambda d: 132)
    plan = TreeAttentionPlan.for_gqa(
        num_q_heads=32, num_kv_heads=8, head_dim=128, max_batch=1, max_tree=17,
        max_prefix_len=65536, device="cpu",
    )  # fmt: skip
    model = plan.num_splits(cfg, 1, 17)
    p = _table(tmp_path, [_entry(L=131072, splits=2, block_m=128, block_n=64, num_warps=8,
                                 num_stages=3, pt_prefetch=1)])  # fmt: skip
    monkeypatch.setattr(env, "KERNEL_TUNING", str(p))
    monkeypatch.setattr(type(plan), "tuned", lambda self, b, t: tuned_choice(
        "gqa", CUDA, group=4, tree=t, dk=128, batch=b, max_len=self.max_prefix_len))  # fmt: skip
    assert plan.tuned(1, 17).splits == 1 and not plan.tuned(1, 17).exact
    assert plan.num_splits(cfg, 1, 17) == model > 1
    exact = _table(tmp_path, [_entry(L=65536, splits=2, block_m=128, block_n=64, num_warps=8,
                                     num_stages=3, pt_prefetch=1)])  # fmt: skip
    monkeypatch.setattr(env, "KERNEL_TUNING", str(exact))
    assert plan.num_splits(cfg, 1, 17) == 2
