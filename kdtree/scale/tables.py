"""From ``k2_layer`` bench rows (a DataFrame) to layer-time functions and a :class:`StepModel`.

Rows carry ``name`` (the part), ``provider``, ``x_value`` (T) and ``config_json`` with
``context`` (attention parts and whole layers; ``null`` for parts that do not depend on it)
and ``layer`` (``dense`` / ``moe`` / ``head``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kdtree.scale.extrapolate import H200_NVLINK, LinkModel, StepModel
from kdtree.scale.spec import K2RankSpec

__all__ = ["layer_frame", "layer_time_fn", "pick_providers", "step_model_from_rows"]

MOE_PREF = ("grouped", "bmm", "loop")  # the fastest measured expert path first
_FIXED_PARTS = {
    "dense": ("attn_in", "attn_out", "mlp_norm", "dense_mlp"),
    "moe": ("attn_in", "attn_out", "mlp_norm", "router", "shared_expert"),
}


def layer_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Time rows of suite ``k2_layer`` with ``T``, ``context``, ``layer`` columns."""
    need = {"suite", "name", "provider", "metric", "x_value", "p50", "config_json"}
    if missing := need - set(df.columns):
        raise ValueError(f"df: missing columns {sorted(missing)} (expected k2_layer rows)")
    sub = df[(df["suite"] == "k2_layer") & (df["metric"] == "time")].copy()
    if sub.empty:
        raise ValueError("df: no time rows of suite 'k2_layer'")
    cfg = sub["config_json"].map(json.loads)
    sub["T"] = sub["x_value"].astype(int)
    sub["context"] = cfg.map(lambda c: c.get("context"))
    sub["layer"] = cfg.map(lambda c: c.get("layer", ""))
    sub["p50"] = sub["p50"].astype(float)
    return sub


def pick_providers(
    df: pd.DataFrame, attn: Sequence[str] = ("triton", "eager"), moe: Sequence[str] = MOE_PREF
) -> tuple[str, str]:
    """The first attention and expert providers (in preference order) that have rows."""
    sub = layer_frame(df)
    have_a = set(sub.loc[sub["name"] == "attn_kernel", "provider"])
    have_m = set(sub.loc[sub["name"] == "experts", "provider"])
    a = next((p for p in attn if p in have_a), None)
    m = next((p for p in moe if p in have_m), None)
    if a is None or m is None:
        raise ValueError(
            f"no rows for attention {list(attn)} (have {sorted(have_a)}) or experts "
            f"{list(moe)} (have {sorted(have_m)})"
        )
    return a, m


def _attn_rows(sub: pd.DataFrame, provider: str, kind: str) -> pd.DataFrame:
    """Attention rows of ``provider``: the ``kind`` layer's when timed there, else any layer's
    (every layer's attention has the same shapes, so the benchmark times it once)."""
    g = sub[(sub["name"] == "attn_kernel") & (sub["provider"] == provider)]
    if g.empty:
        raise ValueError(f"no k2_layer rows for part 'attn_kernel', provider {provider!r}")
    own = g[g["layer"] == kind]
    return own if len(own) else g


def _interp(ts: np.ndarray, ms: np.ndarray, t: float) -> float:
    order = np.argsort(ts)
    ts, ms = ts[order], ms[order]
    if len(ts) == 1:
        return float(ms[0])
    if t > ts[-1]:
        return float(ms[-1] + (ms[-1] - ms[-2]) / (ts[-1] - ts[-2]) * (t - ts[-1]))
    return float(np.interp(t, ts, ms))


def _interp_tl(sub: pd.DataFrame, t: int, context: int) -> float:
    """Linear in T at each measured context, then linear in context (clamped)."""
    per_l = []
    for c, g in sub.groupby("context"):
        per_l.append((float(c), _interp(g["T"].to_numpy(float), g["p50"].to_numpy(float), t)))
    per_l.sort()
    cs = np.array([c for c, _ in per_l])
    vs = np.array([v for _, v in per_l])
    return float(np.interp(context, cs, vs))


def layer_time_fn(df: pd.DataFrame, *, attn_provider: str = "triton", moe_provider: str = "loop"):
    """``(kind, T, L) -> {part: ms}`` from measured rows (interpolated between measured T and L)."""
    sub = layer_frame(df)

    def pick(name: str, provider: str, layer: str) -> pd.DataFrame:
        g = sub[(sub["name"] == name) & (sub["provider"] == provider) & (sub["layer"] == layer)]
        if g.empty:
            raise ValueError(
                f"no k2_layer rows for part {name!r}, provider {provider!r}, layer {layer!r}"
            )
        return g

    tables: dict[str, dict[str, pd.DataFrame]] = {}
    for kind, fixed in _FIXED_PARTS.items():
        if sub[sub["layer"] == kind].empty:
            continue
        parts = {p: pick(p, "model", kind) for p in fixed}
        parts["attn_kernel"] = _attn_rows(sub, attn_provider, kind)
        if kind == "moe":
            parts["experts"] = pick("experts", moe_provider, kind)
        tables[kind] = parts

    def fn(kind: str, t: int, context: int) -> dict[str, float]:
        if kind not in tables:
            raise ValueError(f"kind={kind!r}: no rows (have {sorted(tables)})")
        out = {}
        for part, g in tables[kind].items():
            if g["context"].isna().all():
                out[part] = _interp(g["T"].to_numpy(float), g["p50"].to_numpy(float), t)
            else:
                out[part] = _interp_tl(g.dropna(subset=["context"]), t, context)
        return out

    return fn


def step_model_from_rows(
    df: pd.DataFrame,
    spec: K2RankSpec,
    *,
    attn_provider: str = "triton",
    moe_provider: str = "loop",
    link: LinkModel = H200_NVLINK,
) -> StepModel:
    """A :class:`StepModel` whose layer and LM-head times come from measured rows."""
    sub = layer_frame(df)
    head = sub[sub["name"] == "lm_head"]
    if head.empty:
        raise ValueError("no k2_layer rows for part 'lm_head'")
    ts, ms = head["T"].to_numpy(float), head["p50"].to_numpy(float)
    return StepModel(
        spec=spec,
        layer_ms=layer_time_fn(df, attn_provider=attn_provider, moe_provider=moe_provider),
        lm_head_ms=lambda t: _interp(ts, ms, t),
        link=link,
    )
