"""The modelled 61-layer step: all-reduce arithmetic, part sums, tables from rows, what-if."""

from __future__ import annotations

import pandas as pd
import pytest

from kdtree.bench.schema import BenchRow, run_env
from kdtree.scale.extrapolate import (
    H200_NVLINK,
    RTX_PRO_6000_INT4,
    LinkModel,
    StepModel,
    allreduce_ms,
    what_if,
)
from kdtree.scale.spec import K2_REFERENCE
from kdtree.scale.tables import layer_time_fn, pick_providers, step_model_from_rows

LINK = LinkModel("test", bus_GBps=100.0, latency_us=10.0)


def test_allreduce_ring_model():
    assert allreduce_ms(1e6, 1, LINK) == 0.0
    assert allreduce_ms(0, 8, LINK) == pytest.approx(0.010)
    assert allreduce_ms(8e6, 8, LINK) == pytest.approx(0.010 + 2 * 7 / 8 * 8e6 / 100e9 * 1e3)
    with pytest.raises(ValueError):
        allreduce_ms(-1, 8, LINK)


def _layers(kind, t, context):
    if kind == "dense":
        return {"attn_kernel": 0.001 * context / 1000, "dense_mlp": 0.5}
    return {"attn_in": 0.1, "attn_kernel": 0.002 * t, "experts": 0.01 * t, "router": 0.05}


def test_step_parts_sum_to_61_layers_plus_allreduces():
    m = StepModel(K2_REFERENCE, _layers, lambda t: 0.3, link=LINK)
    p = m.parts(9, 4000)
    assert p["dense_layers"] == pytest.approx(0.004 + 0.5)
    assert p["moe_attention"] == pytest.approx(60 * (0.1 + 0.018))
    assert p["moe_experts"] == pytest.approx(60 * 0.09)
    assert p["moe_other"] == pytest.approx(60 * 0.05)
    assert p["allreduce"] == pytest.approx(2 * 61 * allreduce_ms(9 * 7168 * 2, 8, LINK))
    assert p["total"] == pytest.approx(sum(v for k, v in p.items() if k != "total"))
    assert m.tokens_per_s(9, 4000, tau=3.0) == pytest.approx(3e3 / p["total"])


def test_what_if_rescales_each_part():
    m = StepModel(K2_REFERENCE, _layers, lambda t: 0.3, link=H200_NVLINK)
    p = m.parts(17, 4000)
    w = what_if(p, RTX_PRO_6000_INT4, m, 17)
    bw = 4.8 / RTX_PRO_6000_INT4.bandwidth_TBps
    assert w["moe_experts"] == pytest.approx(p["moe_experts"] * bw * 4.25 / 16)
    assert w["moe_attention"] == pytest.approx(p["moe_attention"] * bw)
    assert w["allreduce"] > p["allreduce"]  # PCIe is slower than NVLink


def _rows():
    rows = []
    for t in (1, 9):
        for name in ("attn_in", "attn_out", "mlp_norm", "router", "shared_expert"):
            rows.append(BenchRow("k2_layer", name, "model", "time", "ms", 0.1, x_name="T",
                                 x_value=t, config={"layer": "moe", "context": None}))  # fmt: skip
        for name in ("attn_in", "attn_out", "mlp_norm", "dense_mlp"):
            rows.append(BenchRow("k2_layer", name, "model", "time", "ms", 0.2, x_name="T",
                                 x_value=t, config={"layer": "dense", "context": None}))  # fmt: skip
        rows.append(BenchRow("k2_layer", "experts", "loop", "time", "ms", 1.0 * t, x_name="T",
                             x_value=t, config={"layer": "moe", "context": None}))  # fmt: skip
        rows.append(BenchRow("k2_layer", "lm_head", "model", "time", "ms", 0.5, x_name="T",
                             x_value=t, config={"layer": "head", "context": None}))  # fmt: skip
        for c in (1000, 3000):
            for layer in ("moe",):
                rows.append(BenchRow("k2_layer", "attn_kernel", "eager", "time", "ms",
                                     t * c / 1e4, x_name="T", x_value=t,
                                     config={"layer": layer, "context": c}))  # fmt: skip
    env = run_env("test")
    return pd.DataFrame([r.to_record(env) for r in rows])


def test_tables_interpolate_measured_rows():
    df = _rows()
    assert pick_providers(df) == ("eager", "loop")
    fn = layer_time_fn(df, attn_provider="eager")
    moe = fn("moe", 5, 2000)
    assert moe["experts"] == pytest.approx(5.0)  # halfway between T=1 (1 ms) and T=9 (9 ms)
    assert moe["attn_kernel"] == pytest.approx(5 * 2000 / 1e4)
    assert fn("moe", 17, 1000)["experts"] == pytest.approx(17.0)  # linear extrapolation
    model = step_model_from_rows(df, K2_REFERENCE, attn_provider="eager", link=LINK)
    p = model.parts(9, 1000)
    assert p["moe_experts"] == pytest.approx(60 * 9.0)
    assert p["lm_head"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="provider 'triton'"):
        layer_time_fn(df, attn_provider="triton")


def test_without_expert_load_holds_experts_at_t1():
    from kdtree.scale.live import without_expert_load

    m = StepModel(K2_REFERENCE, _layers, lambda t: 0.3, link=LINK)
    flat = without_expert_load(m)
    assert flat.parts(33, 4000)["moe_experts"] == pytest.approx(60 * 0.01)
    assert flat.parts(33, 4000)["moe_attention"] == pytest.approx(
        m.parts(33, 4000)["moe_attention"]
    )
    assert flat.step_ms(33, 4000) < m.step_ms(33, 4000)
