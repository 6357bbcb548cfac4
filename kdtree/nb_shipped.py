"""Tidy views of the GPU measurements shipped in ``data/`` for the notebooks.

Pure pandas over the long-format bench CSVs (``kdtree/bench/schema.py``) and the profiler's
Chrome traces: nothing is measured here and nothing is invented; every function says which
rows it reads. Used by notebooks 01-05 to show the H200 rows next to their live CPU runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from kdtree import env

#: Published or measured-in-notes anchors the verify kernel is compared with (DESIGN.md,
#: "Physics of the hot spots"): FlashInfer's MLA wrapper (FA3, causal=False) over the prefix at
#: L=128k with h=8 heads per rank, as measured on the H200 in the research notes.
FLASHINFER_MLA_NOTES = {
    17: {"ms": 0.13, "frac_of_floor": None, "heads": 8, "L": 131072},
    65: {"ms": 0.34, "frac_of_floor": 0.65, "heads": 8, "L": 131072},
}
#: The GQA target of issue 4: ≥ 60 % of the floor for L ≥ 32k at T ∈ {17, 65}, batch 1.
FLOOR_TARGET = 0.60
#: providers that are our kernels (the Triton ones eager and graphed, the CUDA C++ MLA one)
OURS = (
    "ours",
    "ours_graph",
    "ours_cuda_graph",
    "ours_wgmma_graph",
    "ours_seesaw_graph",
    "ours_gqa_graph",
)
FLOOR_TARGET_MIN_L = 32_768

_CASE = re.compile(r"^(?P<layout>[^/]+)/B(?P<B>\d+)/L(?P<L>\d+)/T(?P<T>\d+)$")


# ---------------------------------------------------------------------------------------------
# verify attention (notebook 03)
# ---------------------------------------------------------------------------------------------


def require_columns(df: pd.DataFrame, need: set[str], what: str) -> None:
    """Raise ``ValueError("<what>: missing columns [...]")`` unless ``df`` has every column of
    ``need`` (the shipped-row readers here and the figure builders of
    :mod:`kdtree.viz.notebook_figs`)."""
    if missing := need - set(df.columns):
        raise ValueError(f"{what}: missing columns {sorted(missing)}")


def parse_case(name: str) -> dict:
    """``gqa_32q8kv_d128/B1/L131072/T17`` → layout, B, L, T."""
    m = _CASE.match(str(name))
    if m is None:
        raise ValueError(f"case name {name!r}: expected 'LAYOUT/B<int>/L<int>/T<int>'")
    d = m.groupdict()
    return {"layout": d["layout"], "B": int(d["B"]), "L": int(d["L"]), "T": int(d["T"])}


def verify_rows(df: pd.DataFrame, include_tune: bool = False) -> pd.DataFrame:
    """One row per (layout, B, L, T, provider) of ``verify_attention.csv``: ``time_ms``,
    ``frac_of_floor``, ``floor_ms`` and ``status`` (``ok``, else the recorded skip/error reason;
    a case one run skipped and another timed is ``ok``). Later rows of a case win.
    ``include_tune`` keeps the ``ours_tune[...]`` candidate rows of the tuning sweep."""
    require_columns(
        df, {"name", "provider", "metric", "p50", "config_json"}, "verify_attention rows"
    )
    rows = df[df["name"].astype(str).str.match(_CASE)]
    if not include_tune:  # the --tune sweep's candidate configs of our own kernel
        rows = rows[~rows["provider"].astype(str).str.startswith("ours_tune[")]
    out: dict[tuple, dict] = {}
    for r in rows.itertuples(index=False):
        case = parse_case(r.name)
        key = (case["layout"], case["B"], case["L"], case["T"], r.provider)
        cfg = json.loads(r.config_json) if isinstance(r.config_json, str) else {}
        rec = out.setdefault(key, {**case, "provider": r.provider, "time_ms": np.nan,
                                   "frac_of_floor": np.nan, "floor_ms": None,
                                   "status": "ok"})  # fmt: skip
        if cfg.get("floor_ms") is not None:
            rec["floor_ms"] = cfg["floor_ms"]
        if r.metric == "time":
            rec["time_ms"] = float(r.p50)
            rec["status"] = "ok"  # a later timing outranks an earlier run's skip or error
        elif r.metric == "frac_of_floor":
            rec["frac_of_floor"] = float(r.p50)
        elif r.metric == "error":
            rec["status"] = str(cfg.get("reason") or cfg.get("error") or "error")
    for rec in out.values():  # a run that timed the case outranks another run's skip of it
        if rec["status"].startswith("skipped") and not np.isnan(rec["time_ms"]):
            rec["status"] = "ok"
    tidy = pd.DataFrame(list(out.values()))
    return tidy.sort_values(["layout", "L", "T", "provider"]).reset_index(drop=True)


def _best_ours_and_peer(g: pd.DataFrame):
    """Of one point's timed rows: our fastest row, the fastest complete peer's row (None if no
    peer ran) and every peer row; None if none of ours ran. Peers are complete alternatives only:
    not our reference, not a peer's prefix-only part."""
    ours = g[g["provider"].isin(OURS)]
    if ours.empty:
        return None
    peers = g[
        ~g["provider"].isin([*OURS, "ref"]) & ~g["provider"].astype(str).str.endswith("_prefix")
    ]
    peer = peers.loc[peers["time_ms"].idxmin()] if len(peers) else None
    return ours.loc[ours["time_ms"].idxmin()], peer, peers


def ours_vs_peers(tidy: pd.DataFrame) -> pd.DataFrame:
    """Per case: our best time (``ours``, ``ours_graph``, ``ours_cuda_graph``, ``ours_wgmma_graph`` or ``ours_seesaw_graph``), its fraction of the floor, the
    fastest measured peer and the speed-up over it, and whether the floor target is met."""
    ok = tidy[tidy["status"] == "ok"].dropna(subset=["time_ms"])
    rows = []
    for (layout, L, T), g in ok.groupby(["layout", "L", "T"]):
        picked = _best_ours_and_peer(g)
        if picked is None:
            continue
        best, peer, peers = picked
        rows.append({
            "layout": layout, "L": int(L), "T": int(T), "ours": best["provider"],
            "ours_ms": best["time_ms"], "ours_frac": best["frac_of_floor"],
            "floor_ms": best["floor_ms"],
            "best_peer": None if peer is None else peer["provider"],
            "peer_ms": np.nan if peer is None else peer["time_ms"],
            "peer_frac": np.nan if peer is None else peer["frac_of_floor"],
            "speedup_vs_peer": np.nan if peer is None else peer["time_ms"] / best["time_ms"],
            "peers": ", ".join(sorted(peers["provider"])),
            "target_applies": int(L) >= FLOOR_TARGET_MIN_L,
            "meets_target": bool(best["frac_of_floor"] >= FLOOR_TARGET),
        })  # fmt: skip
    return pd.DataFrame(rows)


def grid_vs_peers(tidy: pd.DataFrame) -> pd.DataFrame:
    """Per point (layout, batch ``B``, ``T``, ``L``) of a whole-grid run (``verify_rows`` of
    ``data/bench/verify_grid.csv.gz``): our fastest provider and its time and fraction of the
    floor, the fastest complete peer (not ``ref``, not a peer's ``*_prefix`` part) and our
    speed-up over it (``speedup_vs_peer`` < 1: the peer was faster), and the Triton kernel's
    time over the CUDA one's (``triton_over_cuda``, where both ran)."""
    require_columns(tidy, {"layout", "B", "L", "T", "provider", "time_ms", "status"}, "tidy")
    ok = tidy[tidy["status"] == "ok"].dropna(subset=["time_ms"])
    rows = []
    for (layout, b, t, length), g in ok.groupby(["layout", "B", "T", "L"]):
        picked = _best_ours_and_peer(g)
        if picked is None:
            continue
        best, peer, _ = picked
        by = dict(zip(g["provider"], g["time_ms"], strict=True))
        cuda = by.get("ours_gqa_graph", by.get("ours_seesaw_graph"))
        rows.append({
            "layout": layout, "B": int(b), "T": int(t), "L": int(length),
            "ours": best["provider"], "ours_ms": best["time_ms"],
            "ours_frac": best["frac_of_floor"],
            "best_peer": None if peer is None else peer["provider"],
            "peer_ms": np.nan if peer is None else peer["time_ms"],
            "speedup_vs_peer": np.nan if peer is None else peer["time_ms"] / best["time_ms"],
            "triton_over_cuda": (
                by["ours_graph"] / cuda if "ours_graph" in by and cuda is not None else np.nan
            ),
        })  # fmt: skip
    return pd.DataFrame(rows)


#: Issue 4's batch-1 targets: GQA ≥ 35 % of the floor at 16k and ≥ 60 % from 32k (T 17 / 65),
#: ≥ 3x the best GQA peer at 128k; MLA ≥ 1.2x FlashInfer's MLA path (prefix + tree + merge)
#: from 32k.
GQA_FRAC_TARGET_16K = 0.35
MLA_PATH_TARGET = 1.2
GQA_PEER_TARGET_128K = 3.0


def issue_targets(tidy: pd.DataFrame, extra: pd.DataFrame | None = None) -> pd.DataFrame:
    """Issue 4's targets point by point at batch 1, T 17 / 65, L ≥ 16k, from verify rows
    (:func:`verify_rows` of the whole grid; ``extra``: more points in the same form, e.g. the
    32k rows the grid lacks). Per point: our fastest provider's time and fraction of the floor,
    the fastest complete peer and our speed-up over it, what the issue asks there
    (``target``) and whether it is met (``met``). GQA: the floor fraction (35 % below 32k, 60 %
    from it) and, at 128k, 3x the fastest peer as well; MLA: 1.2x FlashInfer's MLA path
    (``fi_mla``) from 32k, nothing asked below. Points without our row are left out."""
    require_columns(tidy, {"layout", "B", "L", "T", "provider", "time_ms", "status"}, "tidy")
    rows = tidy if extra is None else pd.concat([tidy, extra], ignore_index=True)
    ok = rows[(rows["status"] == "ok") & (rows["B"] == 1) & rows["T"].isin([17, 65])]
    ok = ok[ok["L"] >= 16384].dropna(subset=["time_ms"])
    base = ours_vs_peers(ok)
    if base.empty:
        return base
    path = ok[ok["provider"] == "fi_mla"].groupby(["layout", "L", "T"])["time_ms"].min()
    cols = ["layout", "L", "T", "ours", "ours_ms", "ours_frac", "best_peer", "speedup_vs_peer"]
    out = []
    for r in base[cols].to_dict("records"):
        length = r["L"]
        if str(r["layout"]).startswith("mla"):
            key = (r["layout"], length, r["T"])
            vs = path[key] / r["ours_ms"] if key in path.index else np.nan
            r["vs_fi_mla"] = vs
            if length >= FLOOR_TARGET_MIN_L:
                r["target"] = f"≥ {MLA_PATH_TARGET:g}x fi_mla"
                r["met"] = bool(vs >= MLA_PATH_TARGET) if not np.isnan(vs) else None
            else:
                r["target"], r["met"] = "", None
        else:
            frac = FLOOR_TARGET if length >= FLOOR_TARGET_MIN_L else GQA_FRAC_TARGET_16K
            met = bool(r["ours_frac"] >= frac)
            r["target"] = f"≥ {_pct(frac)} of the floor"
            if length == 131072:
                r["target"] += f", ≥ {GQA_PEER_TARGET_128K:g}x the best peer"
                met = met and bool(r["speedup_vs_peer"] >= GQA_PEER_TARGET_128K)
            r["met"] = met
        out.append(r)
    return pd.DataFrame(out)


def target_findings(targets: pd.DataFrame) -> list[str]:
    """What an :func:`issue_targets` table says: how many of the targets are met and every
    point that misses its target, with our number there."""
    require_columns(targets, {"layout", "L", "T", "ours_frac", "target", "met"}, "targets")
    asked = targets[targets["target"] != ""]
    met = asked["met"].fillna(False).astype(bool)
    out = [f"Issue 4's batch-1 targets: met at {int(met.sum())} of {len(asked)} points."]
    for r in asked[~met].itertuples(index=False):
        have = (
            f"{r.vs_fi_mla:.2f}x fi_mla" if str(r.layout).startswith("mla")
            else f"{_pct(r.ours_frac)} of the floor"
        )  # fmt: skip
        out.append(f"Not met: {r.layout}, T={r.T}, L={r.L // 1024}k: {have} ({r.target}).")
    return out


def grid_findings(grid: pd.DataFrame) -> list[str]:
    """What a whole-grid table (:func:`grid_vs_peers`) says: the points, the speed-up over the
    fastest peer per layout, and every point where a peer was faster, with by how much."""
    require_columns(grid, {"layout", "B", "T", "L", "speedup_vs_peer", "best_peer"}, "grid")
    vs = grid.dropna(subset=["speedup_vs_peer"])
    out = [
        f"{len(grid)} points, {len(vs)} with a complete peer: ours faster at "
        f"{int((vs['speedup_vs_peer'] >= 1).sum())}."
    ]
    for layout, g in vs.groupby("layout"):
        out.append(
            f"{layout}: {g['speedup_vs_peer'].min():.2f}-{g['speedup_vs_peer'].max():.2f}x the "
            f"fastest peer (median {g['speedup_vs_peer'].median():.2f}x)."
        )
    lost = vs[vs["speedup_vs_peer"] < 1].sort_values("speedup_vs_peer")
    for r in lost.itertuples(index=False):
        out.append(
            f"Peer faster: {r.layout}, batch {r.B}, T={r.T}, L={r.L // 1024}k: {r.best_peer} "
            f"({r.speedup_vs_peer:.3f}x)."
        )
    return out


def grid_change_table(
    old: pd.DataFrame, new: pd.DataFrame, column: str = "ours_ms"
) -> pd.DataFrame:
    """Two whole-grid runs (:func:`grid_vs_peers` tables, e.g. before and after a kernel change)
    per layout and batch: the points both have, how many of them the time fell at, and its
    ratio new / old (min, median, max; < 1: faster now), with the points whose ratio rose above
    1.02 counted. ``column``: whose time, ours (``ours_ms``) or the fastest peer's
    (``peer_ms``)."""
    need = {"layout", "B", "T", "L", column}
    require_columns(old, need, "old grid")
    require_columns(new, need, "new grid")
    m = new.merge(old, on=["layout", "B", "T", "L"], suffixes=("", "_old"))
    if m.empty:
        raise ValueError("the two grids share no point")
    m["ratio"] = m[column] / m[f"{column}_old"]
    out = m.groupby(["layout", "B"]).agg(
        points=("ratio", "size"),
        faster=("ratio", lambda r: int((r < 1).sum())),
        slower_2pct=("ratio", lambda r: int((r > 1.02).sum())),
        ratio_min=("ratio", "min"),
        ratio_median=("ratio", "median"),
        ratio_max=("ratio", "max"),
    )
    return out.reset_index()


def grid_point_changes(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """The points whose time of ours differs between two :func:`grid_vs_peers` tables (e.g. the
    grid before and after some of its rows were replaced): ours old and new, new / old, the
    fastest peer and our speed-up over it now."""
    need = {"layout", "B", "T", "L", "ours_ms", "best_peer", "peer_ms", "speedup_vs_peer"}
    require_columns(old, need, "old grid")
    require_columns(new, need, "new grid")
    m = new.merge(old, on=["layout", "B", "T", "L"], suffixes=("", "_old"))
    m = m[m["ours_ms"] != m["ours_ms_old"]].assign(us_old=lambda d: d["ours_ms_old"] * 1e3,
                                                   us=lambda d: d["ours_ms"] * 1e3)  # fmt: skip
    m["new_over_old"] = m["us"] / m["us_old"]
    cols = ["layout", "B", "T", "L", "us_old", "us", "new_over_old", "best_peer", "peer_ms",
            "speedup_vs_peer"]  # fmt: skip
    return m[cols].sort_values(["layout", "B", "T", "L"]).reset_index(drop=True)


def page_size_table(df: pd.DataFrame) -> pd.DataFrame:
    """Bench rows of one grid at several page sizes (a ``page_size`` column, rounds in
    ``round``): per point and provider the median µs at each page size and, with two sizes,
    the larger's time over the smaller's."""
    require_columns(df, {"name", "provider", "metric", "p50", "page_size"}, "page-size rows")
    t = df[(df["metric"] == "time") & (df["provider"] != "device")]
    if t.empty:
        raise ValueError("no timing rows")
    w = (t.assign(us=t["p50"].astype(float) * 1e3)
         .pivot_table(index=["name", "provider"], columns="page_size", values="us",
                      aggfunc="median"))  # fmt: skip
    sizes = sorted(w.columns)
    w.columns = [f"us_p{c}" for c in sizes]
    if len(sizes) == 2:
        w[f"p{sizes[1]}_over_p{sizes[0]}"] = w[f"us_p{sizes[1]}"] / w[f"us_p{sizes[0]}"]
    return w.reset_index()


def grid_history_tables(
    grid: pd.DataFrame,
    callab26: pd.DataFrame | None = None,
    calle26: pd.DataFrame | None = None,
    sweep26: pd.DataFrame | None = None,
    mla27: pd.DataFrame | None = None,
    mla28: pd.DataFrame | None = None,
) -> dict[str, pd.DataFrame]:
    """The whole grid's history for notebook 03, from the runs that are present: session 26's
    launch changes (its calls a-b against e: raw bench rows) and split sweep (call c), today's
    MLA rows against session 28's (``mla28``: raw rows of session 28's MLA run, call d), session
    28's MLA rows against session 27's (``mla27``: session 27's MLA run; session 28's are today's
    where ``mla28`` is not given), and session 27's grid (today's GQA rows with session 27's MLA
    rows) against session 26's call e. ``grid``: today's :func:`grid_vs_peers` table."""
    out: dict[str, pd.DataFrame] = {}
    if callab26 is not None and calle26 is not None:
        out["Launches changed by the split rules (session 26, calls a-b against e)"] = (
            launch_changes(callab26, calle26)
        )
    if sweep26 is not None:
        out["Split counts at batch 8 / 32 (session 26, call c)"] = split_sweep_table(sweep26)
    is_mla = grid["layout"].str.startswith("mla")
    mla_28 = grid[is_mla]
    if mla28 is not None:
        mla_28 = grid_vs_peers(verify_rows(mla28))
        out["Session 29's MLA rows against session 28's call d (ours, new / old)"] = (
            grid_change_table(mla_28, grid[is_mla])
        )
    grid27 = grid
    if mla27 is not None:
        old_mla = grid_vs_peers(verify_rows(mla27))
        grid27 = pd.concat([grid[~is_mla], old_mla], ignore_index=True)
        out["Session 28's MLA rows against session 27's call e (ours, new / old)"] = (
            grid_change_table(old_mla, mla_28)
        )
    if calle26 is not None:
        out["Session 27's grid against session 26's call e (ours, new / old)"] = grid_change_table(
            grid_vs_peers(verify_rows(calle26)), grid27
        )
    return out


def extra_token_table(tidy: pd.DataFrame) -> pd.DataFrame:
    """What one more query token costs where it opens a row block: :func:`verify_rows` of one
    provider at tree sizes T and T + 1 (e.g. 8 / 9 and 16 / 17 at h = 8, where T + 1 adds an
    8-row block) -> µs at each T by layout, batch and L, and ``T{t+1}_over_T{t}`` for every
    such pair present."""
    require_columns(tidy, {"layout", "B", "L", "T", "time_ms"}, "verify rows")
    if tidy.empty:
        raise ValueError("no rows")
    w = (tidy.assign(us=tidy["time_ms"] * 1e3)
         .pivot_table(index=["layout", "B", "L"], columns="T", values="us", aggfunc="median"))  # fmt: skip
    ts = sorted(int(t) for t in w.columns)
    w.columns = [f"T{int(t)}" for t in w.columns]
    pairs = [(t, t + 1) for t in ts if t + 1 in ts]
    if not pairs:
        raise ValueError(f"no tree sizes T and T + 1 among {ts}")
    for a, b in pairs:
        w[f"T{b}_over_T{a}"] = w[f"T{b}"] / w[f"T{a}"]
    return w.reset_index()


def tail_sweep_table(df: pd.DataFrame, call: str, base: str) -> pd.DataFrame:
    """Session 29's MLA tail-CTA sweeps (``data/bench/logs/mla_tail_splits_session29.csv.gz``,
    rows of ``tools/gpu/mla_splits.py`` with ``call``, ``variant`` and ``round`` added): one call's
    median µs by point and split count (``S``, or ``S/St`` where the tail CTAs took ``St`` splits
    of their own) for each variant, and ``<variant>_over_default``: that time over the point's
    default (the ``base`` variant's row at ``choose_splits``' count, ``chosen``)."""
    require_columns(df, {"call", "variant", "point", "splits", "tail_splits", "chosen", "ms"},
                    "tail sweep rows")  # fmt: skip
    d = df[df["call"] == call].copy()
    if d.empty:
        raise ValueError(f"no rows for call {call!r}")
    if base not in set(d["variant"]):
        raise ValueError(f"no {base!r} rows in call {call!r}")
    st = pd.to_numeric(d["tail_splits"], errors="coerce")
    d["item"] = [
        f"{s}/{int(t)}" if t == t else str(s) for s, t in zip(d["splits"], st, strict=True)
    ]
    d["us"] = d["ms"] * 1e3
    w = d.pivot_table(index=["point", "item"], columns="variant", values="us", aggfunc="median")
    is_chosen = d["chosen"].astype(str) == "True"
    chosen = d[(d["variant"] == base) & is_chosen].groupby("point")["us"].median()
    ref = w.index.get_level_values("point").map(chosen).to_numpy(dtype=float)
    for v in list(w.columns):
        w[f"{v}_over_default"] = w[v].to_numpy() / ref
    return w.reset_index()


def launch_changes(
    old: pd.DataFrame, new: pd.DataFrame, providers=("ours_gqa_graph", "ours_seesaw_graph")
) -> pd.DataFrame:
    """Points whose CUDA launch (split count, head groups) differs between two bench runs of the
    same grid (raw ``verify_attention`` rows, e.g. before and after a split rule): the counts,
    both times and the speed-up (old time / new time)."""
    need = {"name", "provider", "metric", "p50", "config_json"}
    require_columns(old, need, "old rows")
    require_columns(new, need, "new rows")

    def launches(df: pd.DataFrame) -> pd.DataFrame:
        t = df[(df["metric"] == "time") & df["provider"].isin(providers)]
        cfg = t["config_json"].map(json.loads)
        return pd.DataFrame({
            "name": t["name"].to_numpy(), "provider": t["provider"].to_numpy(),
            "splits": cfg.map(lambda c: c.get("splits")).to_numpy(),
            "q_groups": cfg.map(lambda c: c.get("q_groups", 1)).to_numpy(),
            "us": t["p50"].astype(float).to_numpy() * 1e3,
        }).drop_duplicates(["name", "provider"], keep="last")  # fmt: skip

    m = launches(old).merge(launches(new), on=["name", "provider"], suffixes=("_old", "_new"))
    changed = (m["splits_old"] != m["splits_new"]) | (m["q_groups_old"] != m["q_groups_new"])
    m = m[changed].copy()
    m["speedup"] = m["us_old"] / m["us_new"]
    case = pd.DataFrame([parse_case(n) for n in m["name"]], index=m.index)
    return (
        pd.concat([case, m.drop(columns=["name"])], axis=1)
        .sort_values(["layout", "B", "T", "L"])
        .reset_index(drop=True)
    )


def split_sweep_table(df: pd.DataFrame) -> pd.DataFrame:
    """A split-count sweep (``tools/gpu/mla_splits.py`` rows): per point the count the rule of
    the sweep's run chose (``chosen``) and its time, the fastest count, and the count today's
    rule picks (``cuda_mla.choose_splits`` / ``cuda_gqa.plan_launch`` for 132 SMs and the
    bench's page table of L + 257 keys) with its time where the sweep measured that launch (for
    GQA the same head groups too)."""
    from kdtree.kernels import cuda_gqa, cuda_mla

    require_columns(df, {"point", "layout", "L", "T", "batch", "splits", "chosen", "ms"}, "sweep")
    d = df.copy()
    d["us"] = d["ms"].astype(float) * 1e3
    d["chosen"] = d["chosen"].astype(str) == "True"
    rows = []
    for _point, g in d.dropna(subset=["us"]).groupby("point", sort=False):
        r0 = g.iloc[0]
        layout, length, t, b = str(r0["layout"]), int(r0["L"]), int(r0["T"]), int(r0["batch"])
        cap = -(-(length + 257) // 16) * 16  # the bench's page table (16-token pages)
        same = g
        if layout.startswith("mla"):
            now = cuda_mla.choose_splits(b, int(layout.split("_h")[1]) * t, cap, 132)
        else:  # (a GQA launch is its split count and its head groups)
            hq, hkv = (32, 8) if "32q8kv" in layout else (8, 1)
            plan = cuda_gqa.plan_launch(b, t, hq, hkv, cap, 132)
            now = plan.num_splits
            if "q_groups" in g:
                same = g[g["q_groups"].astype(float).astype(int) == plan.q_groups]
        by = dict(zip(same["splits"].astype(int), same["us"], strict=True))
        was = g[g["chosen"]].iloc[0]
        best = g.loc[g["us"].idxmin()]
        rows.append({
            "layout": layout, "B": b, "T": t, "L": length,
            "old_splits": int(was["splits"]), "old_us": was["us"],
            "best_splits": int(best["splits"]), "best_us": best["us"],
            "new_splits": now, "new_us": by.get(now, np.nan),
            "old_over_best": was["us"] / best["us"],
        })  # fmt: skip
    return pd.DataFrame(rows)


_NCU_KERNEL = re.compile(r"^\s{2}(?P<kernel>\w+) \((?P<grid>[\d, ]+)\)x\((?P<block>[\d, ]+)\)")
_NCU_POINT = re.compile(
    r"^point (?P<layout>\S+) L=(?P<L>\d+) T=(?P<T>\d+) batch=\d+: cfg=(?P<cfg>.+?) splits=(?P<splits>\d+)"
)
_NCU_TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                   "msecond": 1e3, "s": 1e6, "second": 1e6}  # fmt: skip
_NCU_METRICS = {
    "Duration": "duration_us",
    "DRAM Throughput": "dram_pct",
    "Compute (SM) Throughput": "sm_pct",
    "Registers Per Thread": "registers",
    "Achieved Active Warps Per SM": "warps_per_sm",
    "Warp Cycles Per Issued Instruction": "cycles_per_issue",
}


def ncu_kernel_table(paths) -> pd.DataFrame:
    """One row per profiled kernel of Nsight Compute's text reports
    (``data/bench/logs/ncu_session6/*.log``, written by ``ncu ... tools/gpu/ncu_verify.py``):
    the report file, the verify point and launch choice it profiled, the kernel, its grid, and
    the section metrics it printed (duration in µs, DRAM and SM throughput in % of peak,
    registers, achieved warps per SM, cycles per issued instruction; NaN where a report did
    not collect a section). Durations are ncu's, with caches flushed between kernels, so they
    sit above the graph-replayed times of the benchmark."""
    rows = []
    for path in sorted(Path(p) for p in paths):
        point: dict = {}
        cur = None
        for line in path.read_text(errors="replace").splitlines():
            if m := _NCU_POINT.match(line):
                point = {"layout": m["layout"], "L": int(m["L"]), "T": int(m["T"]),
                         "config": m["cfg"], "splits": int(m["splits"])}  # fmt: skip
            elif m := _NCU_KERNEL.match(line):
                cur = {"report": path.stem, **point, "kernel": m["kernel"],
                       "grid": "x".join(x.strip() for x in m["grid"].split(","))}  # fmt: skip
                cur.update({v: np.nan for v in _NCU_METRICS.values()})
                rows.append(cur)
            elif cur is not None:
                parts = line.split()
                for label, col in _NCU_METRICS.items():
                    if line.strip().startswith(label + " ") and parts:
                        value = float(parts[-1].replace(",", ""))
                        if col == "duration_us":  # ncu picks ns / us / ms by magnitude
                            unit = parts[-2] if len(parts) >= 2 else "us"
                            if unit not in _NCU_TIME_UNITS:
                                raise ValueError(f"{path.name}: unknown duration unit {unit!r}")
                            value *= _NCU_TIME_UNITS[unit]
                        cur[col] = value
    if not rows:
        raise ValueError("no Nsight Compute kernel sections in the given reports")
    out = pd.DataFrame(rows)
    for col in ("layout", "config"):  # reports without a point line
        if col not in out.columns:
            out[col] = None
    for col in ("L", "T", "splits"):
        out[col] = out[col].astype("Int64") if col in out.columns else pd.NA
    return out


def ncu_findings(table: pd.DataFrame) -> list[str]:
    """Bullets from :func:`ncu_kernel_table`: per report, the first split kernel and the
    first merge it profiled (one verify call), the merge's share of the two, and the split
    kernel's occupancy."""
    out = []
    for rep, g in table.groupby("report", sort=True):
        split = g[g["kernel"].str.contains("split")]
        merge = g[g["kernel"].str.contains("merge")]
        if split.empty:
            continue
        s = split.iloc[0]
        line = (
            f"`{rep}`: split kernel {s.duration_us:.3g} µs on grid {s.grid}"
            + (f" ({s.splits} splits)" if not pd.isna(s.splits) else "")
            + f", DRAM {s.dram_pct:.0f} % of peak"
        )
        if not np.isnan(s.warps_per_sm):
            line += f", {s.warps_per_sm:.2g} warps an SM"
        if not merge.empty:
            m = merge.iloc[0]
            share = m.duration_us / (m.duration_us + s.duration_us)
            line += f"; merge {m.duration_us:.3g} µs ({share:.0%} of the two)"
        out.append(line + ".")
    return out


def time_table(tidy: pd.DataFrame, L: int) -> pd.DataFrame:
    """Milliseconds per provider (columns) for every (layout, T) at prefix length ``L``."""
    g = tidy[(tidy["L"] == L) & (tidy["status"] == "ok")]
    if g.empty:
        raise ValueError(
            f"L={L}: no verify rows at that prefix length (have {sorted(set(tidy.L))})"
        )
    return g.pivot_table(index=["layout", "T"], columns="provider", values="time_ms")


# ---------------------------------------------------------------------------------------------
# profiler phase traces (notebook 01)
# ---------------------------------------------------------------------------------------------


#: Shipped trace sets, newest first: ``h200_decode`` (session 2: the trained pair, DRAM series
#: + phases) supersedes ``h200_phases`` (session 1: tiny-llama, phases only).
TRACE_SETS = ("h200_decode", "h200_phases")


def phase_trace_dirs(root: Path | None = None) -> list[Path]:
    """Folders holding a profiler ``phases.chrome.json`` in the newest shipped trace set under
    ``data/traces`` (``TRACE_SETS`` order; any other layout: every such folder), sorted."""
    root = Path(root or Path(env.DATA_DIR) / "traces")
    if not root.is_dir():
        return []
    found = sorted(p.parent for p in root.rglob("phases.chrome.json"))
    for name in TRACE_SETS:
        picked = [d for d in found if d.parent.name == name]
        if picked:
            return picked
    return found


def dram_trace_table(root: Path | None = None) -> pd.DataFrame:
    """Burst/gap analysis of every shipped DRAM trace (``*/dram.trace.json`` with its phases):
    one row per trace — mode, context, samples, ms per step, duty cycle, mean burst level,
    idle ms per step and the phase holding most of the idle time."""
    from kdtree.nb_live import load_trace_pair
    from kdtree.trace import analyze

    root = Path(root or Path(env.DATA_DIR) / "traces")
    rows = []
    for path in sorted(root.rglob("dram.trace.json")) if root.is_dir() else []:
        tr, ph = load_trace_pair(path)
        res = analyze(tr, ph).to_json()
        mode, _, context = path.parent.name.rpartition("_")
        meta = tr.meta if isinstance(tr.meta, dict) else {}
        by_phase = res.get("idle_by_phase") or {}
        top = max(by_phase, key=by_phase.get) if by_phase else None
        rows.append({"set": path.parent.parent.name, "trace": path.parent.name, "mode": mode,
                     "context": int(context) if context.isdigit() else None,
                     "samples": res["n_samples"], "steps": res["n_steps"],
                     "ms_per_step": (meta.get("ms_per_step") if meta else None),
                     "duty_cycle": res["duty_cycle"], "mean_burst_pct": res["mean_burst_level"],
                     "gap_ms_median": res["gap_ms_median"],
                     "idle_ms_per_step": res["step_idle_ms_mean"],
                     "top_idle_phase": top})  # fmt: skip
    return pd.DataFrame(rows)


def load_phase_events(path: Path) -> pd.DataFrame:
    """The complete (``ph == "X"``) events of a kdtree profiler Chrome trace: ``name``,
    ``step``, ``start_ms``/``end_ms`` (host, from the trace's first event) and ``gpu_ms`` (the
    CUDA-event time of the phase when it was recorded, else NaN)."""
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    rows = [
        {"name": e["name"], "step": (e.get("args") or {}).get("step"),
         "start_us": float(e["ts"]), "dur_us": float(e.get("dur", 0.0)),
         "gpu_ms": (e.get("args") or {}).get("gpu_ms", np.nan)}
        for e in events if e.get("ph") == "X"
    ]  # fmt: skip
    if not rows:
        raise ValueError(f"{path}: no complete ('X') events in this Chrome trace")
    df = pd.DataFrame(rows)
    t0 = df["start_us"].min()
    df["start_ms"] = (df["start_us"] - t0) / 1e3
    df["end_ms"] = df["start_ms"] + df["dur_us"] / 1e3
    df["host_ms"] = df["dur_us"] / 1e3
    df["gpu_ms"] = pd.to_numeric(df["gpu_ms"], errors="coerce")
    return df.drop(columns=["start_us", "dur_us"]).sort_values("start_ms").reset_index(drop=True)


def step_units(events: pd.DataFrame) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """The unit a decode step is timed by and the phases inside it: ``graph_step`` (one CUDA
    graph replay, no inner phases) when the trace has it, else ``step`` with its phases."""
    if (events["name"] == "graph_step").any():
        unit = "graph_step"
        return unit, events[events["name"] == unit], events[events["name"] == unit]
    units = events[events["name"] == "step"]
    if units.empty:
        raise ValueError("phase trace: neither 'step' nor 'graph_step' events")
    return "step", units, events[events["name"] != "step"]


def phase_idle(events: pd.DataFrame) -> dict:
    """Idle time of the device read from phase intervals and their CUDA-event times.

    Inside a phase the device is counted idle for ``host_ms - gpu_ms`` (clipped at 0: where the
    event time exceeds the host interval the phase is fully busy); time inside a step that no
    phase covers and time between steps carried no profiled GPU work and count as idle. Returns
    ``per_step`` (one row per unit), ``attribution`` (idle ms per phase / gap, shares sum to 1)
    and totals. It is derived from phase intervals, not from DRAM samples.
    """
    unit, units, phases = step_units(events)
    units = units.sort_values("start_ms").reset_index(drop=True)
    per, attr = [], {}
    for i, u in units.iterrows():
        inner = phases[(phases["start_ms"] >= u["start_ms"] - 1e-6)
                       & (phases["end_ms"] <= u["end_ms"] + 1e-6)]  # fmt: skip
        if unit == "graph_step":
            inner = inner[inner.index == inner.index[0]] if len(inner) else inner
        gpu = inner["gpu_ms"].fillna(0.0)
        busy = np.minimum(gpu, inner["host_ms"])
        for name, idle in zip(inner["name"], inner["host_ms"] - busy, strict=True):
            attr[name] = attr.get(name, 0.0) + float(idle)
        uncovered = max(0.0, float(u["host_ms"] - inner["host_ms"].sum()))
        nxt = units["start_ms"].iloc[i + 1] if i + 1 < len(units) else None
        between = max(0.0, float(nxt - u["end_ms"])) if nxt is not None else 0.0
        attr["(untimed, inside step)"] = attr.get("(untimed, inside step)", 0.0) + uncovered
        attr["(between steps)"] = attr.get("(between steps)", 0.0) + between
        idle = float((inner["host_ms"] - busy).sum()) + uncovered + between
        per.append({"step": i, "start_ms": u["start_ms"], "wall_ms": u["host_ms"],
                    "gpu_ms": float(busy.sum()), "gap_after_ms": between, "idle_ms": idle,
                    "idle_fraction": idle / max(u["host_ms"] + between, 1e-12)})  # fmt: skip
    per_step = pd.DataFrame(per)
    span = float(units["end_ms"].max() - units["start_ms"].min())
    total = float(sum(attr.values()))
    a = pd.DataFrame({"phase": list(attr), "idle_ms": list(attr.values())})
    a = a[a["idle_ms"] > 0].sort_values("idle_ms", ascending=False).reset_index(drop=True)
    a["share"] = a["idle_ms"] / total if total > 0 else 0.0
    return {"unit": unit, "per_step": per_step, "attribution": a, "span_ms": span,
            "idle_ms": total, "idle_fraction": total / span if span > 0 else 0.0,
            "steps": len(units), "step_ms_mean": float(units["host_ms"].mean())}  # fmt: skip


def phase_trace_summary(root: Path | None = None) -> tuple[pd.DataFrame, dict]:
    """``phase_idle`` for every shipped phase trace: a table (one row per trace) and the full
    results keyed by the trace's folder name (e.g. ``graph_46000``)."""
    rows, full = [], {}
    for d in phase_trace_dirs(root):
        res = phase_idle(load_phase_events(d / "phases.chrome.json"))
        full[d.name] = res
        top = res["attribution"].iloc[0] if len(res["attribution"]) else None
        mode, _, context = d.name.rpartition("_")
        rows.append({"trace": d.name, "mode": mode, "context": int(context) if context.isdigit()
                     else None, "unit": res["unit"], "steps": res["steps"],
                     "step_ms_mean": res["step_ms_mean"], "idle_fraction": res["idle_fraction"],
                     "idle_ms_per_step": res["idle_ms"] / max(res["steps"], 1),
                     "top_idle_phase": None if top is None else top["phase"],
                     "top_idle_share": None if top is None else top["share"]})  # fmt: skip
    return pd.DataFrame(rows), full


# ---------------------------------------------------------------------------------------------
# hypotheses (02), tree build (04), decode and step (05)
# ---------------------------------------------------------------------------------------------


def host_vs_gpu(steps: pd.DataFrame) -> pd.DataFrame:
    """Median host and CUDA-event ms per (context, phase) of ``hypothesis_cuda_steps.csv``,
    with the host-only share ``1 - gpu/host`` (NaN where no event time was recorded)."""
    require_columns(steps, {"context", "phase", "host_ms", "gpu_ms"}, "hypothesis steps")
    m = steps.groupby(["context", "phase"])[["host_ms", "gpu_ms"]].median().reset_index()
    m["host_only_share"] = (1.0 - m["gpu_ms"] / m["host_ms"]).clip(lower=0.0)
    return m


def metric_table(df: pd.DataFrame, metric: str, index: str = "x_value") -> pd.DataFrame:
    """p50 of one metric as a table: ``index`` rows × provider columns (one name per suite)."""
    g = df[df["metric"] == metric]
    if g.empty:
        raise ValueError(f"metric {metric!r}: not in these rows (have {sorted(set(df.metric))})")
    g = g.assign(**{index: pd.to_numeric(g[index], errors="coerce")})
    return g.pivot_table(index=["name", index], columns="provider", values="p50")


def decode_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per decode point of ``decode.csv`` — (name, temperature, context): tok/s (p50,
    p20, p80), TTFT, τ, forwards per token, the mean ms per step of each recorded phase, and
    the speed-ups over ``ar`` and ``chain`` of the same temperature, context and path (graph
    rows against graph rows)."""
    from kdtree.viz.decode import decode_frame

    f = decode_frame(df)
    rows = []
    for (run, name, temp, ctx), g in f.groupby(["run", "name", "temperature", "ctx"], sort=False):
        v = g.drop_duplicates("metric", keep="last").set_index("metric")
        cfg = json.loads(g["config_json"].iloc[0])
        rec = {"run": run, "n_prompts": int(cfg.get("n_prompts", 0)), "gen": int(cfg.get("gen", 0)),
               "mode": str(v["mode"].iloc[0]), "name": name, "temperature": temp,
               "context": int(ctx), "budget": int(v["budget"].iloc[0]),
               "graphs": name.endswith("_graph"), "dense_mask": bool(v["dense_mask"].iloc[0])}  # fmt: skip
        for m in ("decode_tok_s", "decode_tok_s_pooled", "ttft_s", "tau", "fwd_per_tok",
                  "prefill_tok_s"):  # fmt: skip
            rec[m] = float(v.loc[m, "p50"]) if m in v.index else np.nan
        if "decode_tok_s" in v.index:
            rec["decode_tok_s_p20"] = float(v.loc["decode_tok_s", "p20"])
            rec["decode_tok_s_p80"] = float(v.loc["decode_tok_s", "p80"])
        for m in v.index[v.index.str.startswith("phase_")]:
            rec[m.removeprefix("phase_").removesuffix("_ms")] = float(v.loc[m, "p50"])
        rows.append(rec)
    out = pd.DataFrame(rows)
    # speed-ups within a run, on the pooled rate (all tokens / all decode time) when recorded
    rate = out["decode_tok_s_pooled"].fillna(out["decode_tok_s"])
    for ref in ("ar", "chain"):
        base = out.assign(rate=rate)[out["mode"] == ref].set_index(
            ["run", "temperature", "context", "graphs"]
        )["rate"]
        key = list(zip(out["run"], out["temperature"], out["context"], out["graphs"], strict=True))
        out[f"speedup_vs_{ref}"] = [
            r / base[k] if k in base.index else np.nan for r, k in zip(rate, key, strict=True)
        ]
    out["label"] = out["name"] + " · T=" + out["temperature"].map("{:g}".format)
    return out


def drafter_ab_table(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Decode runs made with different drafters side by side (``runs``: label → the rows of one
    run): per label and point, pooled tok/s, pooled τ (all accepted tokens over all steps) and
    the speed-ups over that run's own ``ar`` and ``chain``."""
    from kdtree.viz.decode import decode_frame, tau_histogram

    out = []
    for label, df in runs.items():
        table = decode_table(df)
        if table["run"].nunique() != 1:
            raise ValueError(f"{label}: {table['run'].nunique()} runs; pass the rows of one run")
        counts = decode_frame(df)
        counts = counts[counts["metric"] == "tau_count"]
        for r in table.itertuples():
            g = counts[(counts["name"] == r.name) & (counts["temperature"] == r.temperature)]
            out.append({"drafter": label, "name": r.name, "n_prompts": r.n_prompts,
                        "decode_tok_s_pooled": r.decode_tok_s_pooled,
                        "tau_pooled": tau_histogram(g)[2] if len(g) else np.nan,
                        "speedup_vs_ar": r.speedup_vs_ar,
                        "speedup_vs_chain": r.speedup_vs_chain})  # fmt: skip
    return pd.DataFrame(out)


def step_phase_table(df: pd.DataFrame) -> pd.DataFrame:
    """``decode_step`` rows of ``step.csv`` per (provider, context): whole-step ms, GPU idle
    fraction, kernels per step and ms of every recorded phase."""
    s = df[df["name"] == "decode_step"].copy()
    s["context"] = pd.to_numeric(s["x_value"], errors="coerce")
    w = s.pivot_table(index=["provider", "context"], columns="metric", values="p50")
    w.columns = [c.removeprefix("phase_") for c in w.columns]
    return w.rename(columns={"time": "step_ms"}).reset_index()


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def verify_findings(versus: pd.DataFrame) -> list[str]:
    """Conclusion bullets formatted from ``ours_vs_peers``: the floor fraction at the longest
    prefix, the target check, the speed-up against peers, losses, and the MLA anchor."""
    if versus is None or versus.empty:
        return []
    out = []
    for layout, g in versus.groupby("layout"):
        top = g[g["L"] == g["L"].max()].sort_values("T")
        out.append(
            f"`{layout}` at L = {int(top['L'].iloc[0]):,}: "
            + ", ".join(
                f"T={r.T} **{r.ours_ms:.3g} ms = {_pct(r.ours_frac)} of the floor**"
                for r in top.itertuples()
            )  # fmt: skip
            + "."
        )
    tgt = versus[versus["target_applies"]]
    if len(tgt):
        best = tgt.loc[tgt["ours_frac"].idxmax()]
        out.append(
            f"Target (≥ {_pct(FLOOR_TARGET)} of the floor for L ≥ {FLOOR_TARGET_MIN_L // 1024}k): "
            f"**met in {int(tgt['meets_target'].sum())} of {len(tgt)} cases**; the best is "
            f"{_pct(best.ours_frac)} (`{best.layout}`, L={best.L:,}, T={best['T']}) and the "
            f"worst {_pct(tgt['ours_frac'].min())}: the kernel misses the target everywhere it "
            "applies." if not tgt["meets_target"].any() else
            f"Target (≥ {_pct(FLOOR_TARGET)} for L ≥ 32k) met in "
            f"{int(tgt['meets_target'].sum())} of {len(tgt)} cases."
        )  # fmt: skip
    short = versus[versus["L"] == versus["L"].min()].dropna(subset=["speedup_vs_peer"])
    if len(short):
        lose = short[short["speedup_vs_peer"] < 1]
        out.append(
            f"At L = {int(short['L'].iloc[0]):,} against the fastest of all peers: "
            f"{short['speedup_vs_peer'].min():.2f}–{short['speedup_vs_peer'].max():.2f}× "
            + ("(faster in every case)." if lose.empty else "(speed-up of ours); slower in "
               + ", ".join(f"`{r.layout}` T={r.T} ({r.best_peer} {r.peer_ms:.3g} ms vs ours "
                           f"{r.ours_ms:.3g} ms)" for r in lose.itertuples()) + ".")
        )  # fmt: skip
    long = versus[versus["L"] > versus["L"].min()].dropna(subset=["speedup_vs_peer"])
    for peer, g in long.groupby("best_peer"):
        out.append(
            f"At L ≥ {int(g['L'].min()) // 1024}k against `{peer}` (the only peer measured "
            f"there): {g['speedup_vs_peer'].min():.1f}–{g['speedup_vs_peer'].max():.1f}× faster."
        )
    mla = versus[versus["layout"].str.startswith("mla") & (versus["L"] == 131072)]
    for r in mla.itertuples():
        a = FLASHINFER_MLA_NOTES.get(int(r.T))
        if a is None:
            continue
        scale = 16 / a["heads"]  # FLOPs grow with the heads; bytes do not
        if a["frac_of_floor"]:
            gap = f"{a['frac_of_floor'] / r.ours_frac:.1f}× further from the floor than it"
        else:
            gap = f"{r.ours_ms / (a['ms'] * scale):.1f}× slower even against {scale:g}× its time"
        out.append(
            f"MLA T={r.T}, L=128k: ours {r.ours_ms:.3g} ms ({_pct(r.ours_frac)} of the floor, "
            f"h=16) against FlashInfer's MLA wrapper in the research notes ({a['ms']} ms at "
            f"h={a['heads']}" + (f", {_pct(a['frac_of_floor'])} of its floor" if
                                  a["frac_of_floor"] else "") + f"): ours is {gap}."
        )  # fmt: skip
    return out


def idle_by_phase_per_step(full: dict) -> pd.DataFrame:
    """Idle ms per step attributed to each phase / gap (columns), one row per phase trace, from
    the results of ``phase_trace_summary``."""
    return pd.DataFrame(
        {k: v["attribution"].set_index("phase")["idle_ms"] / max(v["steps"], 1)
         for k, v in full.items()}
    ).T.fillna(0.0)  # fmt: skip


#: Phase-trace mode → the ``step.csv`` provider that runs the same path (dense-mask eager
#: steps are the generic path; graph is graph).
TRACE_TO_STEP_PROVIDER = {"eager-dense": "generic", "graph": "graph", "eager": "eager"}


def phase_findings(table: pd.DataFrame, kernel_idle: pd.DataFrame | None = None) -> list[str]:
    """Conclusion bullets formatted from ``phase_trace_summary``'s table (and the kernel-level
    idle fraction of ``step_phase_table`` when given)."""
    out = []
    for r in table.itertuples():
        line = (
            f"`{r.trace}`: {r.steps} {r.unit}s of **{r.step_ms_mean:.3g} ms**; at least "
            f"**{r.idle_fraction:.1%}** of the span has no profiled GPU work "
            f"({r.idle_ms_per_step:.3g} ms per step), most of it in **{r.top_idle_phase}** "
            f"({r.top_idle_share:.0%})"
        )
        prov = TRACE_TO_STEP_PROVIDER.get(r.mode)
        if kernel_idle is not None and prov is not None:
            k = kernel_idle[
                (kernel_idle["provider"] == prov) & (kernel_idle["context"] == r.context)
            ]
            if len(k):
                kid = float(k["gpu_idle_fraction"].iloc[0])
                line += (
                    f"; the kernel-level GPU idle fraction of the `{prov}` step at this context "
                    f"(step.csv, from a kernel trace) is **{kid:.0%}**"
                )
                if kid > 2 * r.idle_fraction:
                    line += (
                        " — so most of the idle time lies between kernels *inside* the phases "
                        "(launch-bound), which phase intervals cannot see"
                    )
        out.append(line + ".")
    for context, g in table.groupby("context"):
        m = g.set_index("mode")["step_ms_mean"]
        if {"eager-dense", "graph"} <= set(m.index):
            out.append(
                f"At {int(context):,} tokens a CUDA-graph step takes {m['graph']:.3g} ms against "
                f"{m['eager-dense']:.3g} ms eager with the dense mask "
                f"(**{m['eager-dense'] / m['graph']:.0f}×**)."
            )
    return out


def hypothesis_findings(hvg: pd.DataFrame, gap_ms: float) -> list[str]:
    """Conclusion bullets from ``host_vs_gpu`` of the shipped CUDA rows: the mask build's
    host and GPU cost against the gap at each context, and the largest phase."""
    out = []
    for context, g in hvg.groupby("context"):
        v = g.set_index("phase")
        phases = v.drop(index="step", errors="ignore")
        line = f"H200 at {int(context):,} tokens: "
        if "prepare_for_verify" in v.index:
            m = v.loc["prepare_for_verify"]
            line += (
                f"the mask build takes **{m.host_ms:.3g} ms host / {m.gpu_ms:.3g} ms GPU** per "
                f"step = {m.gpu_ms / gap_ms:.1%} of the {gap_ms:g} ms gap"
            )
        if len(phases):
            top = phases["host_ms"].idxmax()
            line += f"; the largest phase is `{top}` ({phases.loc[top, 'host_ms']:.3g} ms)"
        if "step" in v.index:
            line += f" of a {v.loc['step', 'host_ms']:.3g} ms step"
        out.append(line + ".")
    return out


#: What each session-9 device call measured of the wgmma MLA split kernel
#: (``data/bench/logs/mla_phases_session9.csv.gz``, ``tools/gpu/stages_s9<call>.txt``).
MLA_WGMMA_VERSIONS = {
    "c": "S split by keys (2 x m64n32); the consumers issue the copies",
    "d": "the copies issued under the S MMAs",
    "e": "a producer warpgroup issues the copies",
    "f": "S in warpgroup 0 (m64n64, Q read once); S_{j+1} before P_j V_j",
    "g": "S as two accumulation chains; S after P V again",
    "h": "softmax trimmed; non-aligned named barriers",
    "i": "one loop for both consumer warpgroups (committed)",
}


# the kernel's order of the phase names the calls used (the CSV's column order is their union's)
_WGMMA_PHASE_ORDER = (
    "prologue", "wait_tile", "rescale_wait_tile", "issue", "s_mma", "wait_m_a", "wait_p_a",
    "softmax", "softmax_next", "pv_a_issue", "p_a_rescale", "wait_p_b", "pv_b",
    "p_free", "hand_over", "p_ready", "wait_p", "rescale", "pv_mma", "pv_wait", "release",
    "release_p_free",
)  # fmt: skip


def mla_wgmma_history(df: pd.DataFrame, point: str = "h16:131072:65") -> pd.DataFrame:
    """One row per session-9 call at ``point`` (``heads:L:T``): the graph-replayed time, warpgroup
    0's cycles per KV tile, and what the measurement-only ablations took out (``KDTREE_MLA_ABLATE``:
    the time without the KV copies, without the S MMAs, without the P V MMAs; ``rest_us`` = with
    none of the three)."""
    need = {"call", "point", "cycles_per_tile", "ms_ablate0", "ms_ablate1", "ms_ablate2",
            "ms_ablate4", "ms_ablate7"}  # fmt: skip
    require_columns(df, need, "MLA phase rows")
    d = df[df["point"] == point]
    if d.empty:
        raise ValueError(f"no rows for point {point!r}; have {sorted(df['point'].unique())}")
    out = pd.DataFrame({
        "call": d["call"].to_numpy(),
        "version": [MLA_WGMMA_VERSIONS.get(c, "") for c in d["call"]],
        "us": d["ms_ablate0"].to_numpy() * 1e3,
        "cycles_per_tile": d["cycles_per_tile"].to_numpy(),
        "copies_us": (d["ms_ablate0"] - d["ms_ablate1"]).to_numpy() * 1e3,
        "s_mma_us": (d["ms_ablate0"] - d["ms_ablate2"]).to_numpy() * 1e3,
        "pv_mma_us": (d["ms_ablate0"] - d["ms_ablate4"]).to_numpy() * 1e3,
        "rest_us": d["ms_ablate7"].to_numpy() * 1e3,
    })  # fmt: skip
    return out.set_index("call")


def mla_wgmma_phases(
    df: pd.DataFrame, call: str = "i", point: str = "h16:131072:65"
) -> pd.DataFrame:
    """Cycles per KV tile by phase (columns: the union of both warpgroups' phases, in the kernel's
    order) for each consumer warpgroup (rows ``wg0``, ``wg1``; 0 where a warpgroup has no such
    phase) of one call (calls f-i stamp both warpgroups; columns ``wg<k>.<phase>``)."""
    d = df[(df["call"] == call) & (df["point"] == point)]
    if d.empty:
        raise ValueError(f"no rows for call {call!r} at {point!r}")
    row = d.iloc[-1]
    cols = [c for c in df.columns if c[:4] in ("wg0.", "wg1.") and pd.notna(row[c])]
    if not cols:
        raise ValueError(f"call {call!r} has no per-warpgroup phase columns (calls f-i do)")
    phases = sorted({c[4:] for c in cols}, key=lambda ph: (_WGMMA_PHASE_ORDER.index(ph)
                    if ph in _WGMMA_PHASE_ORDER else len(_WGMMA_PHASE_ORDER), ph))  # fmt: skip
    table = pd.DataFrame(
        [[row.get(f"wg{k}.{ph}", np.nan) for ph in phases] for k in (0, 1)],
        index=["wg0", "wg1"],
        columns=phases,
    )
    return table.fillna(0.0)


def mla_seesaw_history(df: pd.DataFrame, point: str = "h16:131072:65") -> pd.DataFrame:
    """One row per session-10 version of the seesaw MLA kernel at ``point`` (``heads:L:T``;
    ``mla_phases_session10.csv.gz``): call, version, the graph-replayed time, the slower warpgroup's
    cycles per KV tile, and what the ablations took out (the time without the KV copies past
    tile 1, without the S MMAs; ``rest_us`` = with neither)."""
    need = {"call", "version", "point", "ms_ablate0", "ms_ablate1", "ms_ablate2", "ms_ablate3"}
    require_columns(df, need, "seesaw phase rows")
    d = df[df["point"] == point]
    if d.empty:
        raise ValueError(f"no rows for point {point!r}; have {sorted(df['point'].unique())}")
    per_wg = [d[[c for c in df.columns if c.startswith(f"wg{k}.")]].sum(axis=1) for k in (0, 1)]
    return pd.DataFrame({
        "call": d["call"].to_numpy(),
        "version": d["version"].to_numpy(),
        "us": d["ms_ablate0"].to_numpy() * 1e3,
        "cycles_per_tile": np.maximum(per_wg[0], per_wg[1]).to_numpy(),
        "copies_us": (d["ms_ablate0"] - d["ms_ablate1"]).to_numpy() * 1e3,
        "s_mma_us": (d["ms_ablate0"] - d["ms_ablate2"]).to_numpy() * 1e3,
        "rest_us": d["ms_ablate3"].to_numpy() * 1e3,
    })  # fmt: skip


#: What each session-11 device call measured of the CUDA GQA kernel
#: (``data/bench/logs/gqa_phases_session11.csv.gz``, ``tools/gpu/stages_s11<call>.txt``).
GQA_PHASE_ORDER = (
    "wait_tile", "issue", "wait_s", "softmax", "wait_pv", "rescale", "wait_empty", "copies",
)  # fmt: skip


def gqa_cuda_history(
    df: pd.DataFrame, point: str = "gqa_8q1kv_d128:131072:65", turns: int = 1
) -> pd.DataFrame:
    """One row per session-11 version of the CUDA GQA kernel at ``point`` (``layout:L:T``) with
    warpgroup turns on or off: call, version, the graph-replayed time, the slower consumer
    warpgroup's and the producer's cycles per KV tile, and the ablations (``KDTREE_GQA_ABLATE``):
    the time of the compute alone (1: no KV loads past the first stages) and of the copies alone
    (16: the consumers only wait and release)."""
    need = {"call", "version", "point", "turns", "ms_ablate0", "ms_ablate1", "ms_ablate16"}
    require_columns(df, need, "GQA phase rows")
    d = df[(df["point"] == point) & (df["turns"] == turns)]
    if d.empty:
        raise ValueError(f"no rows for point {point!r}; have {sorted(df['point'].unique())}")
    per = {k: d[[c for c in df.columns if c.startswith(f"{k}.")]].sum(axis=1)
           for k in ("wg0", "wg1", "prod")}  # fmt: skip
    return pd.DataFrame({
        "call": d["call"].to_numpy(),
        "version": d["version"].to_numpy(),
        "us": d["ms_ablate0"].to_numpy() * 1e3,
        "consumer_cycles": np.maximum(per["wg0"], per["wg1"]).to_numpy(),
        "producer_cycles": per["prod"].to_numpy(),
        "compute_alone_us": d["ms_ablate1"].to_numpy() * 1e3,
        "copies_alone_us": d["ms_ablate16"].to_numpy() * 1e3,
    })  # fmt: skip


def gqa_cuda_phases(
    df: pd.DataFrame, call: str = "c", point: str = "gqa_8q1kv_d128:131072:65", turns: int = 1
) -> pd.DataFrame:
    """Cycles per KV tile by phase for the two consumer warpgroups and the producer (rows
    ``wg0``, ``wg1``, ``prod``; 0 where a role has no such phase) of one call."""
    d = df[(df["call"] == call) & (df["point"] == point) & (df["turns"] == turns)]
    if d.empty:
        raise ValueError(f"no rows for call {call!r} at {point!r}")
    row = d.iloc[-1]
    roles = ("wg0", "wg1", "prod")
    phases = [ph for ph in GQA_PHASE_ORDER if any(f"{r}.{ph}" in df.columns for r in roles)]
    table = pd.DataFrame(
        [[row.get(f"{r}.{ph}", np.nan) for ph in phases] for r in roles],
        index=list(roles),
        columns=phases,
    )
    return table.astype(float).fillna(0.0)


#: ``KDTREE_GQA_ABLATE`` settings of ``tools/gpu/gqa_phases.py`` and what each leaves running.
GQA_ABLATIONS = {
    "ms_ablate0": "whole",
    "ms_ablate1": "compute alone",
    "ms_ablate8": "no softmax",
    "ms_ablate9": "MMAs only",
    "ms_ablate16": "copies alone",
}


def gqa_ablation_table(df: pd.DataFrame, point: str = "gqa_8q1kv_d128:131072:65") -> pd.DataFrame:
    """Session 12's ablations of the three-warpgroup CUDA GQA shape at ``point``
    (``data/bench/logs/gqa_ablations_session12.csv.gz``): one row per run with turns (``turns`` ≠
    0), labelled by call, layout version, page size and TMA, and the graph-replayed µs of each
    :data:`GQA_ABLATIONS` setting."""
    need = {"call", "point", "turns", *GQA_ABLATIONS}
    require_columns(df, need, "GQA ablation rows")
    d = df[(df["point"] == point) & (df["turns"] != 0)].copy()
    if d.empty:
        raise ValueError(f"no rows for point {point!r}; have {sorted(df['point'].unique())}")

    def col(name: str, default) -> pd.Series:
        return d[name].fillna(default) if name in d else pd.Series(default, index=d.index)

    page = col("page_size", 16).astype(int)
    tma = col("tma", 1).astype(int).astype(str)
    version = col("layout_version", "")
    d["label"] = (d["call"] + ": " + version + ", page " + page.astype(str)
                  + np.where(tma == "0", ", cp.async", ""))  # fmt: skip
    out = d[["label", *GQA_ABLATIONS]].rename(columns=GQA_ABLATIONS)
    cols = list(GQA_ABLATIONS.values())
    out[cols] = out[cols] * 1e3
    return out.reset_index(drop=True)


def merge_cost_table(df: pd.DataFrame, call: str = "e") -> pd.DataFrame:
    """µs a call by point and merge setting (``tools/gpu/merge_cost.py``, ``part`` = ``modes``)
    of one call, with the merge's share (the CUDA merge in stream order less the split alone)."""
    need = {"call", "part", "point", "mode", "us"}
    require_columns(df, need, "merge cost rows")
    d = df[(df["call"] == call) & (df["part"] == "modes")]
    if d.empty:
        raise ValueError(f"no merge-cost rows for call {call!r}")
    w = d.pivot_table(index="point", columns="mode", values="us", sort=False)
    if {"plain", "split"} <= set(w.columns):
        w["merge_us"] = w["plain"] - w["split"]
    return w.reset_index()


#: The row layouts of ``tools/gpu/gqa_layouts.py --ab`` by their knob settings.
GQA_LAYOUTS = {
    "TAIL=0": "padded",
    "TAIL=1 BLOCKS=3": "tail, 3 blocks a CTA",
    "TAIL=1 WARPGROUPS=2 BLOCKS=2": "tail, 2 warpgroups x 2 blocks",
}


def gqa_layout_ab_table(df: pd.DataFrame, call: str = "e") -> pd.DataFrame:
    """µs a call by point (rows) and row layout (columns) of one ``gqa_layouts.py --ab`` call
    (medians of its interleaved rounds), with the tail's time over the padded layout's
    (``tail_vs_padded`` < 1: the tail is faster)."""
    need = {"call", "point", "variant", "ms"}
    require_columns(df, need, "layout rows")
    d = df[(df["call"] == call) & df["variant"].isin(GQA_LAYOUTS)]
    if d.empty:
        raise ValueError(f"no A/B layout rows for call {call!r}")
    w = d.assign(layout=d["variant"].map(GQA_LAYOUTS), us=d["ms"] * 1e3).pivot_table(
        index="point", columns="layout", values="us", sort=False
    )
    w = w[[c for c in GQA_LAYOUTS.values() if c in w.columns]]
    if {"padded", "tail, 3 blocks a CTA"} <= set(w.columns):
        w["tail_vs_padded"] = w["tail, 3 blocks a CTA"] / w["padded"]
    return w.reset_index()


def layout_variants_table(df: pd.DataFrame, call: str) -> pd.DataFrame:
    """µs a call by point (rows) and variant (columns, in the order first run) of one
    ``gqa_layouts.py --variants`` call, with each variant's time over the first one's
    (``<variant>_vs_first``)."""
    need = {"call", "point", "variant", "ms"}
    require_columns(df, need, "layout rows")
    d = df[df["call"] == call]
    if d.empty:
        raise ValueError(f"no layout rows for call {call!r}")
    order = list(dict.fromkeys(d["variant"]))
    w = d.assign(us=d["ms"] * 1e3).pivot_table(
        index="point", columns="variant", values="us", sort=False
    )[order]
    for v in order[1:]:
        w[f"{v}_vs_first"] = w[v] / w[order[0]]
    return w.reset_index()


def ab_commits_table(df: pd.DataFrame, call: str = "f") -> pd.DataFrame:
    """``tools/gpu/ab_commits.sh`` rows of one call: µs of each side (the mean of its rounds)
    by bench point, and new / old. Rows of ``tools/gpu/ab_defines.sh`` (sides ``v0``, ``v1``,
    ...: no old / new) give each side in the order first run and ``<side>_vs_<first>``."""
    need = {"call", "side", "round", "name", "provider", "metric", "p50"}
    require_columns(df, need, "A/B rows")
    d = df[(df["call"] == call) & (df["metric"] == "time") & (df["provider"] != "device")]
    if d.empty:
        raise ValueError(f"no A/B timing rows for call {call!r}")
    w = (d.assign(us=d["p50"] * 1e3)
         .pivot_table(index="name", columns="side", values="us", aggfunc="mean", sort=False))  # fmt: skip
    if not {"old", "new"} & set(w.columns):  # ab_defines.sh: v0, v1, ...
        order = list(dict.fromkeys(d["side"]))
        w = w[order]
        for v in order[1:]:
            w[f"{v}_vs_{order[0]}"] = w[v] / w[order[0]]
        return w.reset_index()
    if not {"old", "new"} <= set(w.columns):
        raise ValueError(f"call {call!r}: expected an old and a new side")
    w = w[["old", "new"]]
    w["new_vs_old"] = w["new"] / w["old"]
    return w.reset_index()


def calls_table(df: pd.DataFrame, calls: list[str]) -> pd.DataFrame:
    """µs by bench point (``name``) and call for single runs packed by
    ``tools/gpu/pack_ab.py`` (e.g. one run each under other bench settings), the mean over a
    call's rounds and sides, with each call over the first."""
    require_columns(df, {"call", "name", "provider", "metric", "p50"}, "packed rows")
    d = df[df["call"].isin(calls) & (df["metric"] == "time") & (df["provider"] != "device")]
    if d.empty:
        raise ValueError(f"no timing rows for calls {calls}")
    w = d.assign(us=pd.to_numeric(d["p50"]) * 1e3).pivot_table(
        index="name", columns="call", values="us", aggfunc="mean"
    )[[c for c in calls if c in set(d["call"])]]
    for c in w.columns[1:]:
        w[f"{c}_vs_{w.columns[0]}"] = w[c] / w[w.columns[0]]
    return w.reset_index()


def ab_call_tables(df: pd.DataFrame, calls: dict[str, str]) -> dict[str, pd.DataFrame]:
    """:func:`ab_commits_table` of each call of ``calls`` (call -> what its sides are), keyed
    ``"call <call>: <what>"`` in the order given: a session's A/B calls for a notebook cell."""
    return {
        f"call {call}: {what}": ab_commits_table(df, call=call) for call, what in calls.items()
    }


def ab_file_tables(path, calls: dict[str, str]) -> dict[str, pd.DataFrame]:
    """:func:`ab_call_tables` of the packed rows at ``path`` (``tools/gpu/pack_ab.py``'s CSV);
    an empty dict where that file is not shipped, so a notebook cell notes it instead."""
    from pathlib import Path

    if not Path(path).exists():
        return {}
    return ab_call_tables(pd.read_csv(path), calls)


def atomic_merge_probe_table(df: pd.DataFrame, value: str = "cost_us") -> pd.DataFrame:
    """Rows of ``tools/gpu/atomic_merge_probe.py`` (session 38): what each way of ending a split
    grid costs over the bare grid (``cost_us``, µs a call; or ``value="us"``, the time a call),
    by mode (rows) and shape, stream spin and end jitter (columns), in the probe's order of
    modes; modes with no value anywhere (the no-split-grid modes' ``cost_us``) are left out."""
    need = {"shape", "mode", "spin_cycles", "jitter_cycles", value}
    require_columns(df, need, "atomic merge probe rows")
    if df.empty:
        raise ValueError("no atomic merge probe rows")
    d = df.assign(
        grid=df["shape"] + ", spin " + df["spin_cycles"].astype(str)
        + ", jitter " + df["jitter_cycles"].astype(str)
    )  # fmt: skip
    order = list(dict.fromkeys(d["mode"]))
    t = d.pivot_table(index="mode", columns="grid", values=value, aggfunc="median", sort=False)
    return t.reindex([m for m in order if m in t.index])


#: The steps of a split CTA's start in the prologue build (session 38, call c), in order: entry
#: to the CTA barrier after the mbarriers' init, to the producer's first page-table entry, to
#: its first copy issued, to the first tile landed.
PROLOGUE_STEPS = ("barrier", "entry_read", "issue", "landed")


def prologue_table(df: pd.DataFrame, q: float = 0.5) -> pd.DataFrame:
    """CTA rows of the prologue build (``data/bench/logs/gqa_prologue_session38.csv.gz``): by
    point, the ``q`` quantile over the split CTAs of each step of their start (µs,
    :data:`PROLOGUE_STEPS`), the whole start (entry to first tile) and how far the page-table
    entry's stamp can be off (``slot_ready_window_us``: it was aligned to the others within that
    window, so ``entry_read`` and ``issue`` trade up to it; their sum is exact)."""
    need = {"point", "kind", "entry", "past_barrier", "slot_ready", "first_issue", "first_tile",
            "slot_ready_window_us"}  # fmt: skip
    require_columns(df, need, "prologue rows")
    d = df[df["kind"] == "split"]
    if d.empty:
        raise ValueError("no split CTA rows")
    steps = pd.DataFrame({
        "point": d["point"],
        "barrier": d["past_barrier"] - d["entry"],
        "entry_read": d["slot_ready"] - d["past_barrier"],
        "issue": d["first_issue"] - d["slot_ready"],
        "landed": d["first_tile"] - d["first_issue"],
        "entry_to_first_tile": d["first_tile"] - d["entry"],
        "slot_ready_window_us": d["slot_ready_window_us"],
    })  # fmt: skip
    return steps.groupby("point", sort=False).quantile(q).reset_index()


#: The spans of a verify call in the CTA timeline (kdtree.profiling.cta_timeline.call_phases),
#: in the order they follow each other.
TIMELINE_SPANS = ("first_tile", "stream", "epilogue", "straggle", "gap_merge", "merge", "gap_next")


def timeline_spans_table(
    df: pd.DataFrame, call: str = "e", variant: str = "default"
) -> pd.DataFrame:
    """Rows of ``tools/gpu/gqa_timeline.py`` (``data/bench/logs/gqa_timeline_session17.csv.gz``) of
    one device call and one variant: each point's median span (µs) over its calls, the median
    period of back-to-back calls (``call_us``, NaN where a replay holds one call) and the
    stamping build's graph-replayed p50. ``rest`` is the period the spans leave unexplained (the
    launch ramp, and the differences between medians)."""
    need = {"call", "variant", "point", "splits", "p50_us", "call_us", *TIMELINE_SPANS}
    require_columns(df, need, "timeline rows")
    d = df[(df["call"] == call) & (df["variant"] == variant)]
    if d.empty:
        raise ValueError(f"no {variant} timeline rows for call {call!r}")
    t = d.groupby("point", sort=False)[[*TIMELINE_SPANS, "call_us", "p50_us", "splits"]].median()
    t["rest"] = t["call_us"] - t[list(TIMELINE_SPANS)].sum(axis=1)
    return t.reset_index()


def wgmma_rate_table(text: str) -> pd.DataFrame:
    """The output of ``tools/gpu/wgmma_rate_probe.cu`` (what one ``wgmma`` costs the tensor
    cores by its N) as a table: ``mma`` (e.g. ``m64n8k16``), ``a`` (``K-major`` or ``MN-major``
    shared memory), ``warpgroups``, ``chains`` (accumulators in turn), ``cycles`` (SM cycles a MMA
    of the busiest SM), ``mac_per_cycle`` and ``pct_of_peak`` (of 2048 dense bf16 MACs a cycle
    an SM). Raises ``ValueError`` when no line parses."""
    pat = (r"^(m64n\d+\s*k16)\s*(A MN-major)?\s+warpgroups (\d+)\s+chains (\d+)\s+([\d.]+) cycles"
           r" a MMA \(SM\)\s+(\d+) MAC a cycle\s+([\d.]+) %")  # fmt: skip

    def row(m) -> dict:
        return {"mma": m.group(1).replace(" ", ""),
                "a": "MN-major" if m.group(2) else "K-major",
                "warpgroups": int(m.group(3)), "chains": int(m.group(4)),
                "cycles": float(m.group(5)), "mac_per_cycle": int(m.group(6)),
                "pct_of_peak": float(m.group(7))}  # fmt: skip

    return _probe_table(text, pat, row, "wgmma_rate_probe")


def _probe_table(text: str, pattern: str, row, what: str) -> pd.DataFrame:
    """The lines of a probe's output that match ``pattern`` (stripped), each made a dict by
    ``row(match)``, as a table; ``ValueError`` naming ``what`` when none does."""
    import re

    pat = re.compile(pattern)
    rows = [row(m) for m in (pat.match(line.strip()) for line in text.splitlines()) if m]
    if not rows:
        raise ValueError(f"no {what} lines in the text")
    return pd.DataFrame(rows)


def wgmma_mix_table(text: str) -> pd.DataFrame:
    """The output of ``tools/gpu/wgmma_mix_probe.cu`` (small ``wgmma`` among the rows' big ones)
    as a table: ``warpgroups`` (1 or 2 a CTA), ``wg0`` (warpgroup 0's pattern), ``others`` (the
    other warpgroup's, ``-`` with one), ``wg0_cycles`` / ``wg1_cycles`` (cycles a round, NaN
    without a second warpgroup), ``tensor_work`` (the cycles the homogeneous rates predict for
    the CTA's round) and ``busiest_vs_work`` (the busier warpgroup's cycles over it). Raises
    ``ValueError`` when no line parses."""
    pat = (r"^(\d) WG \| wg0: (.+?)\s*\| others: (.+?)\s*\| wg0\s+([\d.]+)(?: wg1\s+([\d.]+))?"
           r" cycles a round \| tensor work\s+(\d+)")  # fmt: skip

    def row(m) -> dict:
        return {"warpgroups": int(m.group(1)), "wg0": m.group(2), "others": m.group(3),
                "wg0_cycles": float(m.group(4)),
                "wg1_cycles": float(m.group(5)) if m.group(5) else float("nan"),
                "tensor_work": int(m.group(6))}  # fmt: skip

    t = _probe_table(text, pat, row, "wgmma_mix_probe")
    t["busiest_vs_work"] = t[["wg0_cycles", "wg1_cycles"]].max(axis=1) / t["tensor_work"]
    return t


def read_floor_table(
    read: pd.DataFrame, bench: pd.DataFrame, call: str | None = None
) -> pd.DataFrame:
    """The read floor (``tools/gpu/read_floor.py`` rows, ``data/bench/logs/read_floor_*.csv``:
    one kernel that only streams the bench's bytes, µs a call under a CUDA graph; ``call`` picks
    one device call of the file, default the last listed) beside the
    verify bench's CUDA GQA rows (provider ``ours_gqa_graph``, batch 1) at the same layout and L:
    ``read_frac`` the floor bytes / copy bandwidth over the read's µs (what any kernel reading
    those bytes reaches at that size), ``ours_frac`` the bench's fraction of its floor (max of
    bytes and FLOPs, from the row's ``config_json``), ``bound`` which of the two sets that floor,
    and ``ours_vs_read`` the read's µs over ours (the fraction of the reachable that the kernel
    reaches; meaningful where ``bound`` is bytes)."""
    import json

    require_columns(read, {"layout", "L", "bytes", "read_us", "floor_us"}, "read floor rows")
    require_columns(bench, {"name", "provider", "metric", "p50", "config_json"}, "bench rows")
    b = bench[(bench["provider"] == "ours_gqa_graph") & (bench["metric"] == "time")]
    parts = b["name"].str.extract(r"^(gqa_\w+?)_d128/B1/L(\d+)/T(\d+)$")
    b = b.assign(layout=parts[0], L=pd.to_numeric(parts[1]), T=pd.to_numeric(parts[2]),
                 ours_us=b["p50"] * 1e3).dropna(subset=["layout"])  # fmt: skip
    if b.empty:
        raise ValueError("bench rows: no ours_gqa_graph batch-1 time rows")
    b = b.assign(bench_floor_us=[json.loads(c)["floor_ms"] * 1e3 for c in b["config_json"]])
    read = _one_call(read, call)
    r = read[read["bytes"] > 0][["layout", "L", "bytes", "read_us", "floor_us"]]
    t = b[["layout", "L", "T", "ours_us", "bench_floor_us"]].merge(r, on=["layout", "L"])
    if t.empty:
        raise ValueError("no bench point matches a read-floor size")
    t["read_frac"] = t["floor_us"] / t["read_us"]
    t["ours_frac"] = t["bench_floor_us"] / t["ours_us"]
    t["bound"] = np.where(t["floor_us"] >= 0.99 * t["bench_floor_us"], "bytes", "FLOPs")
    t["ours_vs_read"] = t["read_us"] / t["ours_us"]
    return t.sort_values(["layout", "T", "L"]).reset_index(drop=True)


def t1_stream_table(rows: pd.DataFrame, read: pd.DataFrame) -> pd.DataFrame:
    """The T=1 points where SDPA's contiguous gather beats ours, against what any reader of the
    same bytes reaches (session 32, call a; ``data/bench/logs/gqa_t1_session32.csv.gz`` and
    ``read_floor_decode_session32.csv.gz``): ``ours_us`` the shipped kernel (the median of the
    ``a_t1forms`` rounds of side ``v0``), ``sdpa_us`` SDPA on its contiguous K / V (the
    ``a_order`` run with shuffled pages), ``read_<order>_us`` the read floor of the same bytes
    (``tools/gpu/read_floor.py``: a load-only kernel, contiguous and through a shuffled page
    table), ``ours_vs_read`` the paged read's µs over ours, ``sdpa_vs_read`` the contiguous
    read's over SDPA's, ``ours_vs_sdpa`` SDPA's µs over ours (< 1: SDPA faster)."""
    require_columns(rows, {"call", "side", "name", "provider", "metric", "p50"}, "T=1 rows")
    require_columns(read, {"layout", "B", "L", "order", "read_us"}, "read floor rows")
    t = rows[(rows["metric"] == "time") & rows["name"].astype(str).str.endswith("/T1")]
    us = t.assign(us=t["p50"].astype(float) * 1e3)
    ours = us[(us["call"] == "a_t1forms") & (us["side"] == "v0")]
    sdpa = us[(us["call"] == "a_order") & (us["provider"] == "sdpa_dense")]
    sdpa = sdpa[sdpa["page_order"] == "random"] if "page_order" in sdpa else sdpa
    if ours.empty or sdpa.empty:
        raise ValueError("T=1 rows: need call a_t1forms side v0 and a_order's sdpa_dense rows")
    out = pd.DataFrame({"ours_us": ours.groupby("name")["us"].median(),
                        "sdpa_us": sdpa.groupby("name")["us"].median()}).dropna()  # fmt: skip
    parts = out.index.to_series().str.extract(r"^(gqa_\w+?)_d128/B(\d+)/L(\d+)/T1$")
    out = out.assign(layout=parts[0].to_numpy(), B=pd.to_numeric(parts[1]).to_numpy(),
                     L=pd.to_numeric(parts[2]).to_numpy())  # fmt: skip
    r = read.pivot_table(index=["layout", "B", "L"], columns="order", values="read_us")
    r.columns = [f"read_{c}_us" for c in r.columns]
    t = out.merge(r.reset_index(), on=["layout", "B", "L"])
    if t.empty or not {"read_random_us", "read_contiguous_us"} <= set(t.columns):
        raise ValueError("no T=1 point matches a read-floor size with random and contiguous reads")
    t["ours_vs_read"] = t["read_random_us"] / t["ours_us"]
    t["sdpa_vs_read"] = t["read_contiguous_us"] / t["sdpa_us"]
    t["ours_vs_sdpa"] = t["sdpa_us"] / t["ours_us"]
    cols = ["layout", "B", "L", "ours_us", "sdpa_us", *r.columns, "ours_vs_read",
            "sdpa_vs_read", "ours_vs_sdpa"]  # fmt: skip
    return t[cols].sort_values(["layout", "B", "L"]).reset_index(drop=True)


def run_spread_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The same bench points run in several processes (rows with a ``run`` column, e.g.
    session 32's calls d and e): per call and point the runs, the fastest, median and slowest
    run's µs and slowest over fastest; ``within_run`` the widest p80 / p20 of any one run (how
    tight each run is by itself)."""
    require_columns(rows, {"call", "run", "name", "metric", "p50", "p20", "p80"}, "spread rows")
    t = rows[(rows["metric"] == "time") & (rows["run"].astype(str) != "")]
    if t.empty:
        raise ValueError("no timing rows with a run")
    t = t.assign(us=t["p50"].astype(float) * 1e3,
                 spread=t["p80"].astype(float) / t["p20"].astype(float))  # fmt: skip
    g = t.groupby(["call", "name"], sort=False)
    out = pd.DataFrame({"runs": g["us"].size(), "min_us": g["us"].min(),
                        "median_us": g["us"].median(), "max_us": g["us"].max(),
                        "within_run": g["spread"].max()})  # fmt: skip
    out.insert(4, "max_over_min", out["max_us"] / out["min_us"])
    return out.reset_index()


def limits_table(ab: pd.DataFrame, read: pd.DataFrame, merge: pd.DataFrame) -> pd.DataFrame:
    """Where the time of issue 4's 8q/1kv batch-1 points goes, from one run (session 35; rows in
    ``data/bench/logs/limits_ab_session35.csv.gz``, ``read_floor_session35.csv.gz``,
    ``merge_cost_session35.csv.gz``). Per point (L, T): the bench's floor and the time the
    issue's target allows there (``target_us``: the floor over 35 % below 32k, 60 % from it);
    ``read_us`` one kernel that only streams the bench's bytes at T=17 (contiguous, call a) and
    ``read_paged_us`` the same KV through a page table of shuffled 16-token pages (call b, where
    it ran); ``no_compute_us`` our call with the consumers only waiting and releasing
    (``KDTREE_GQA_ABLATE=16``: the ring, the page table, the split grid and the merge, no Q, no
    MMA, no epilogue) and ``ours_us`` the real call, alternating (call a, ``a_ablate``, the
    mean of two rounds); ``split_us`` the split kernel alone and ``merge_us`` what the merge in
    stream order adds to it (``tools/gpu/merge_cost.py``, call a: its own timing, not the
    bench's); ``structure_over_target`` = no-compute time / target time: above 1 our launch
    structure misses the target with no arithmetic at all."""
    need_ab = {"call", "side", "round", "name", "provider", "metric", "p50", "config_json"}
    require_columns(ab, need_ab, "A/B rows")
    require_columns(read, {"call", "layout", "L", "order", "read_us"}, "read floor rows")
    require_columns(merge, {"call", "part", "point", "mode", "us"}, "merge cost rows")
    d = ab[(ab["call"] == "a_ablate") & (ab["metric"] == "time") & (ab["provider"] != "device")]
    if d.empty:
        raise ValueError("no a_ablate timing rows")
    parts = d["name"].str.extract(r"^(gqa_\w+?)_d128/B1/L(\d+)/T(\d+)$")
    d = d.assign(layout=parts[0], L=pd.to_numeric(parts[1]), T=pd.to_numeric(parts[2]),
                 us=pd.to_numeric(d["p50"]) * 1e3,
                 floor_us=[json.loads(c)["floor_ms"] * 1e3 for c in d["config_json"]])  # fmt: skip
    w = d.pivot_table(index=["layout", "L", "T"], columns="side", values="us", aggfunc="mean")
    floor = d.groupby(["layout", "L", "T"])["floor_us"].first()
    t = pd.DataFrame(
        {"floor_us": floor, "ours_us": w["v0"], "no_compute_us": w["v1"]}
    ).reset_index()
    t["target_frac"] = np.where(t["L"] >= FLOOR_TARGET_MIN_L, FLOOR_TARGET, GQA_FRAC_TARGET_16K)
    t["target_us"] = t["floor_us"] / t["target_frac"]
    r = read.assign(L=pd.to_numeric(read["L"]), read_us=pd.to_numeric(read["read_us"]))
    r = r.assign(layout=r["layout"].astype(str).str.replace("_d128", "", regex=False))
    lay = t["layout"].str.replace("_d128", "", regex=False)
    contiguous = r[(r["call"] == "a")].set_index(["layout", "L"])["read_us"]
    paged = r[(r["call"] == "b") & (r["order"] == "random")].set_index(["layout", "L"])["read_us"]
    keys = list(zip(lay, t["L"], strict=True))
    t["read_us"] = [contiguous.get(k, np.nan) for k in keys]
    t["read_paged_us"] = [paged.get(k, np.nan) for k in keys]
    m = merge[(merge["call"] == "a") & (merge["part"] == "modes")]
    by = m.assign(us=pd.to_numeric(m["us"])).set_index(["point", "mode"])["us"]
    pts = [f"{a}_d128:{b}:{c}" for a, b, c in zip(t["layout"], t["L"], t["T"], strict=True)]
    t["split_us"] = [by.get((p, "split"), np.nan) for p in pts]
    t["merge_us"] = [by.get((p, "plain"), np.nan) - by.get((p, "split"), np.nan) for p in pts]
    t["ours_frac"] = t["floor_us"] / t["ours_us"]
    t["structure_over_target"] = t["no_compute_us"] / t["target_us"]
    t["ours_over_target"] = t["ours_us"] / t["target_us"]
    cols = ["layout", "T", "L", "floor_us", "target_frac", "target_us", "read_us",
            "read_paged_us", "no_compute_us", "split_us", "merge_us", "ours_us", "ours_frac",
            "structure_over_target", "ours_over_target"]  # fmt: skip
    return t[cols].sort_values(["layout", "T", "L"]).reset_index(drop=True)


def stream_pace_table(merge: pd.DataFrame) -> pd.DataFrame:
    """The KV stream's pace from ``tools/gpu/merge_cost.py --sweep`` rows (the split kernel
    alone at a fixed split count over several lengths; ``data/bench/logs/merge_cost*.csv.gz``):
    per call, point (layout and T), split count and environment (``env``, e.g. the
    consumers idle), the least-squares line of µs against tiles a CTA streams (``us_a_tile``,
    ``fixed_us``), what a CTA pulls (``GBps_a_cta``: a tile's K and V bytes, 8q/1kv: 512 bytes a
    key, over ``us_a_tile``) and the grid together (``TBps``). Only points of one CTA a split
    (8q/1kv up to T=24: 192 rows); others are left out."""
    from kdtree.kernels import cuda_gqa

    require_columns(merge, {"call", "part", "point", "splits", "tiles_per_cta", "us"}, "sweep")
    d = merge[merge["part"] == "sweep"].copy()
    if d.empty:
        raise ValueError("no sweep rows")
    d["env"] = d["env"].fillna("") if "env" in d else ""
    parts = d["point"].str.split(":", expand=True)
    d = d.assign(layout=parts[0], T=parts[2].astype(int), splits=d["splits"].astype(int),
                 tiles=d["tiles_per_cta"].astype(float), us=d["us"].astype(float))  # fmt: skip
    out = []
    for (call, env_, layout, t, splits), g in d.groupby(["call", "env", "layout", "T", "splits"]):
        if "8q1kv" not in layout:
            raise ValueError(f"{layout}: only 8q/1kv's key bytes are known here")
        if 8 * t > 192:  # (more than one CTA a split: T=65 runs four)
            continue
        keys = cuda_gqa.SHAPES[cuda_gqa.launch_plan(8 * t)[0]][1]
        slope, icpt = np.polyfit(g["tiles"], g["us"], 1)
        gbps = keys * 512 / (slope * 1e-6) / 1e9
        out.append({"call": call, "env": env_, "layout": layout, "T": t, "splits": splits,
                    "tile_keys": keys, "us_a_tile": slope, "fixed_us": icpt,
                    "GBps_a_cta": gbps, "TBps": gbps * splits / 1e3})  # fmt: skip
    return pd.DataFrame(out)


def limits_findings(table: pd.DataFrame) -> list[str]:
    """What a :func:`limits_table` says point by point: which targets our launch structure
    misses with no compute at all, and how far the others are."""
    require_columns(table, {"T", "L", "target_us", "no_compute_us", "ours_us"}, "limits")
    out = []
    for r in table.itertuples(index=False):
        where = f"T={r.T}, {r.L // 1024}k"
        if r.ours_us <= r.target_us:
            out.append(f"{where}: met ({r.ours_us:.1f} µs against {r.target_us:.1f}).")
        elif r.no_compute_us > r.target_us:
            out.append(
                f"{where}: the target allows {r.target_us:.1f} µs; our structure with no "
                f"compute takes {r.no_compute_us:.1f}, the call {r.ours_us:.1f}."
            )
        else:
            out.append(
                f"{where}: {r.ours_us:.1f} µs against {r.target_us:.1f} "
                f"({(r.ours_us / r.target_us - 1) * 100:.0f} % over); with no compute "
                f"{r.no_compute_us:.1f}: the compute's exposed part is "
                f"{r.ours_us - r.no_compute_us:.1f} µs."
            )
    return out


def session35_tables(logs: Path) -> dict[str, pd.DataFrame]:
    """Session 35's tables for notebook 03, from its rows under ``logs``
    (``data/bench/logs/*session35*``): the unmet points' limits (:func:`limits_table`), what one
    more tree token costs (:func:`extra_token_table`), the KV stream's pace
    (:func:`stream_pace_table`), the ring-depth, evict-policy and split-rule A/Bs
    (:func:`ab_call_tables`), the page-setting runs (:func:`calls_table`), the split-count
    sweep (:func:`split_sweep_table`, the mean of its two passes) and call e's merge launches
    (:func:`merge_mode_table`)."""
    ab = pd.read_csv(logs / "limits_ab_session35.csv.gz")
    merge = pd.read_csv(logs / "merge_cost_session35.csv.gz")
    rule = pd.read_csv(logs / "split_rule_ab_session35.csv.gz")
    sweep = pd.read_csv(logs / "splits_session35_callc.csv.gz")
    keys = [c for c in sweep.columns if c not in ("ms", "pass", "timestamp", "command", "error")]
    sweep = sweep.groupby(keys, dropna=False, as_index=False)["ms"].mean()
    out = {
        "the unmet points' limits (µs; call a, b's paged read)": limits_table(
            ab, pd.read_csv(logs / "read_floor_session35.csv.gz"), merge
        ),
        "what one more tree token costs (call a, µs)": extra_token_table(
            verify_rows(ab[ab["call"] == "a_extra"])
        ),
        "the KV stream's pace: the split kernel alone (calls a, b)": stream_pace_table(merge),
        **ab_call_tables(
            ab,
            {
                "b_stages_nc": "the ring's depth, consumers idle: v0 default, v1 / v2 Tall 4 / 3 "
                "stages, v3 Wide 2",
                "b_stages": "the same, real calls",
                "c_evict_nc": "evict-first (v0) against evict-normal (v1), consumers idle",
                "c_evict": "the same, real calls",
            },
        ),
        "pages in order against 64-token pages, consumers idle (call b)": calls_table(
            ab, ["b_pages_ncseq", "b_pages_nc64"]
        ),
        "the same, real calls": calls_table(ab, ["b_pages_seq", "b_pages_64"]),
        "split counts (call c; new_splits for the grid's page tables of L + 257)": (
            split_sweep_table(sweep)
        ),
        **ab_call_tables(
            rule,
            {
                "d_ab1": "the split rule at batch 1: v0 the 256-key bound, v1 one tile a split",
                "d_ab8": "the same at batch 8",
            },
        ),
    }
    pdl = logs / "merge_pdl_session35_calle.csv.gz"
    if pdl.exists():
        out["the merge at 132 splits: a dependent launch (auto) or stream order (call e, µs)"] = (
            merge_mode_table(pd.read_csv(pdl))
        )
    return out


def merge_mode_table(df: pd.DataFrame) -> pd.DataFrame:
    """``tools/gpu/mla_splits.py`` rows of the same split counts under several
    ``KDTREE_CUDA_MERGE`` settings (column ``mode``; session 35's call e): µs by (T, L, split
    count) and mode (the mean of the passes), the merge each launched under ``auto`` at the
    commit that ran it (``auto_merge``: 1 stream order, 2 a dependent launch) and plain over
    auto."""
    require_columns(df, {"T", "L", "splits", "mode", "ms", "merge"}, "split rows")
    d = df.assign(us=pd.to_numeric(df["ms"]) * 1e3)
    w = d.pivot_table(index=["T", "L", "splits"], columns="mode", values="us", aggfunc="mean")
    w["auto_merge"] = d[d["mode"] == "auto"].groupby(["T", "L", "splits"])["merge"].first()
    if {"auto", "plain"} <= set(w.columns):
        w["plain_over_auto"] = w["plain"] / w["auto"]
    return w.reset_index()


def replace_rows(rows: pd.DataFrame, replacement: pd.DataFrame) -> pd.DataFrame:
    """Bench rows with every (``name``, ``provider``) that ``replacement`` has taken from it
    instead: e.g. a whole grid as it was before some of its points ran again (session 33's
    8q/1kv, T=17 rows of ``verify_grid.csv.gz`` put back to session 27's). Each replaced pair
    must be in ``rows``."""
    need = {"name", "provider"}
    require_columns(rows, need, "rows")
    require_columns(replacement, need, "replacement")
    keys = pd.MultiIndex.from_frame(replacement[["name", "provider"]].drop_duplicates())
    have = pd.MultiIndex.from_frame(rows[["name", "provider"]])
    missing = keys.difference(have.unique())
    if len(missing):
        raise ValueError(f"replacement rows for pairs the rows lack: {list(missing)[:3]}")
    kept = rows[~have.isin(keys)]
    return pd.concat([kept, replacement], ignore_index=True)


def tree_build_table(df: pd.DataFrame) -> pd.DataFrame:
    """Heap vs every device builder of ``tree_build.csv``: ms per step by (batch, budget) and
    provider, plus the fastest device provider and its speed-up over the heap."""
    t = df[df["metric"] == "time"].copy()
    t["batch"] = t["name"].str.extract(r"_b(\d+)$")[0].astype(int)
    t["budget"] = pd.to_numeric(t["x_value"]).astype(int)
    w = t.pivot_table(index=["batch", "budget"], columns="provider", values="p50")
    if "heap" not in w.columns:
        raise ValueError("tree_build rows: no 'heap' provider to compare the device builders with")
    # ``*_prev*`` rows time an earlier version of a builder in the same call (an A/B), not a
    # builder the engine can pick; ``*_graph_x10`` rows are ten builds a graph timed per build
    # (the kernel's own time, without the one-kernel graph's launch that a step's graph pays
    # once): shown, but the speed-up over the heap counts the one-build replay
    drop = [c for c in w.columns if "_prev" in c or "_graph_x" in c]
    dev = w.drop(columns=["heap", *drop])
    w["fastest_device"] = dev.idxmin(axis=1)
    w["fastest_device_ms"] = dev.min(axis=1)
    w["speedup_vs_heap"] = w["heap"] / w["fastest_device_ms"]
    return w.reset_index()


def _one_call(df: pd.DataFrame, call: str | None) -> pd.DataFrame:
    """The rows of one device call (``call``; default: the last listed) where the file has a
    ``call`` column, else all rows."""
    if "call" not in df.columns:
        return df
    call = call if call is not None else str(df["call"].iloc[-1])
    out = df[df["call"].astype(str) == call]
    if out.empty:
        raise ValueError(f"call={call!r}: no rows")
    return out


def tree_phase_table(df: pd.DataFrame, call: str | None = None) -> pd.DataFrame:
    """The threshold builder's phases against the heap replay, µs per build, by (K, budget),
    from ``tools/gpu/bench_tree_phases.py`` rows (``data/bench/logs/tree_phases_session5.csv.gz``):
    ``seed``, ``expand`` (``seed+expand - seed``), ``order`` (``full - seed+expand``), ``full``
    (all three at the warps the builder defaulted to in that call), ``best`` (the fastest whole
    build over the warps tried, ``best_of`` names it: ``full`` or ``full_wN``), ``heap`` and
    ``heap / best``. ``call`` picks one device call of the file (default: the last listed)."""
    need = {"K", "budget", "phase", "p50_us"}
    require_columns(df, need, "tree phase rows")
    df = _one_call(df, call)
    w = df.pivot_table(index=["K", "budget"], columns="phase", values="p50_us")
    for col in ("seed", "seed+expand", "full", "heap"):
        if col not in w.columns:
            raise ValueError(f"tree phase rows: no {col!r} phase")
    whole = w[[c for c in w.columns if c == "full" or c.startswith("full_w")]]
    out = pd.DataFrame(
        {
            "seed": w["seed"],
            "expand": w["seed+expand"] - w["seed"],
            "order": w["full"] - w["seed+expand"],
            "full": w["full"],
            "best": whole.min(axis=1),
            "best_of": whole.idxmin(axis=1),
            "heap": w["heap"],
        }
    )
    out["heap_over_best"] = out["heap"] / out["best"]
    return out.reset_index()


def tree_phase_findings(table: pd.DataFrame) -> list[str]:
    """Conclusion bullets from ``tree_phase_table``: where the threshold builder wins and which
    phase dominates."""
    out = []
    for r in table.itertuples():
        biggest = max(("seed", "expand", "order"), key=lambda c: getattr(r, c))
        verdict = "faster" if r.best < r.heap else "slower"
        out.append(
            f"K={r.K}, B={r.budget}: threshold {r.best:.3g} µs (`{r.best_of}`) vs heap replay "
            f"{r.heap:.3g} µs (**{verdict}**, {r.heap_over_best:.2g}×); largest phase "
            f"`{biggest}` ({getattr(r, biggest):.3g} µs of {r.full:.3g})."
        )
    return out


CUDA_TREE_PHASES = ("load", "prologue", "seed", "expand", "order", "rowmap", "emit")


def tree_cuda_phase_table(df: pd.DataFrame, call: str | None = None) -> pd.DataFrame:
    """The CUDA C++ tree builder by phase (``tools/gpu/bench_tree_cuda.py`` rows,
    ``data/bench/logs/tree_cuda_phases_session7.csv.gz``): per (vocab, K, budget) the graph-replay
    ``p50_us`` and each phase's µs, its share of thread 0's ``clock64()`` cycles times
    ``p50_us`` (the stamps cover the kernel; the replay also holds the launch gap, spread here
    in proportion). ``call`` picks one device call (default: the last listed)."""
    need = {"K", "budget", "p50_us", "cycles_total", *CUDA_TREE_PHASES}
    require_columns(df, need, "CUDA tree phase rows")
    df = _one_call(df, call)
    if "vocab" not in df.columns:
        df = df.assign(vocab=0)
    out = df[["vocab", "K", "budget", "p50_us"]].copy()
    cyc = df["cycles_total"].where(df["cycles_total"] > 0)
    for ph in CUDA_TREE_PHASES:
        out[ph] = df[ph] / cyc * df["p50_us"]
    return out.sort_values(["vocab", "K", "budget"]).reset_index(drop=True)


CUDA_TREE_COUNTERS = ("tstar", "dp_steps", "n_union", "depths", "capped", "radix_passes",
                      "sort_size")  # fmt: skip


def tree_cuda_counters(df: pd.DataFrame, call: str | None = None) -> pd.DataFrame:
    """What each CUDA build did (``bench_tree_cuda.py`` rows from session 8 on, the kernel's
    ``clocks`` columns 8-15 and 21): the seed's grid index t* and DP depth steps, the kept
    union's size, depths expanded, depths capped by the radix select and its passes, and the
    sort's size; with the order's parts (``order_keys`` preorder keys, ``order_runs`` runs of
    32, ``order_merge`` the rest) and the radix select's cycles. ``call`` picks one device call
    (default: the last listed)."""
    cols = [*CUDA_TREE_COUNTERS, "order_keys", "order_runs", "order_merge", "select_cycles"]
    require_columns(df, {"K", "budget", *cols}, "CUDA tree rows (session 8's file)")
    df = _one_call(df, call)
    d = df if "vocab" in df.columns else df.assign(vocab=0)
    return (
        d[["vocab", "K", "budget", *cols]]
        .sort_values(["vocab", "K", "budget"])
        .reset_index(drop=True)
    )


def tree_cuda_history(df: pd.DataFrame) -> pd.DataFrame:
    """``p50_us`` of the CUDA tree builder per (vocab, K, budget), one column per device call
    (the versions of sessions 7 and 8: ``tree_cuda_phases_session7.csv.gz`` /
    ``_session8.csv.gz``, calls labelled by the caller, e.g. ``s8f``)."""
    if "call" not in df.columns:
        raise ValueError("CUDA tree phase rows: no 'call' column")
    d = df if "vocab" in df.columns else df.assign(vocab=0)
    return d.pivot_table(index=["vocab", "K", "budget"], columns="call", values="p50_us")


def tree_cuda_findings(table: pd.DataFrame, target_us: float = 20.0) -> list[str]:
    """Conclusion bullets from ``tree_cuda_phase_table``: each point against the issue's
    ``target_us`` at batch 1, and its largest phase."""
    out = []
    for r in table.itertuples():
        if any(pd.isna(getattr(r, c)) for c in CUDA_TREE_PHASES):
            continue  # no cycle stamps (cycles_total 0): no phase to name
        biggest = max(CUDA_TREE_PHASES, key=lambda c: getattr(r, c))
        verdict = "within" if r.p50_us <= target_us else "over"
        out.append(
            f"vocab {r.vocab}, K={r.K}, B={r.budget}: CUDA builder {r.p50_us:.3g} µs "
            f"(**{verdict}** {target_us:g} µs); largest phase `{biggest}` "
            f"({getattr(r, biggest):.3g} µs)."
        )
    return out


def tree_build_findings(table: pd.DataFrame) -> list[str]:
    """Conclusion bullets formatted from ``tree_build_table``."""
    out = []
    for batch, g in table.groupby("batch"):
        line = f"H200, batch {batch}: heap {g['heap'].min():.3g}–{g['heap'].max():.3g} ms; "
        line += ", ".join(
            f"B={r.budget} `{r.fastest_device}` {r.fastest_device_ms:.3g} ms "
            f"(**{r.speedup_vs_heap:.3g}×**)"
            for r in g.itertuples()
        )
        out.append(line + ".")
    if "device_torch" in table.columns:
        slow = table[table["device_torch"] > table["heap"]]
        if len(slow):
            out.append(
                f"The eager torch builder (`device_torch`, not graph-captured) is slower than "
                f"the heap in {len(slow)} of {len(table)} cases (e.g. batch {slow.iloc[0].batch},"
                f" B={slow.iloc[0].budget}: {slow.iloc[0].device_torch:.3g} ms vs "
                f"{slow.iloc[0].heap:.3g} ms); only graph capture or the Triton kernel make the "
                "device build pay off at small batch."
            )
    return out


def decode_findings(dec: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[str]:
    """Conclusion bullets from ``decode_table`` (and ``step_phase_table``): tok/s, τ (the
    median over prompts of each prompt's τ; ``drafter_ab_table`` pools all steps) and the
    speed-ups of every mode at the shortest context per temperature, the best tree budget,
    the verify share of a tree step, and eager vs graph steps."""
    from kdtree.viz.decode import run_with_most_prompts

    out = []
    ctx = int(dec["context"].min())
    path = "CUDA graphs" if bool(dec["graphs"].any()) else "eager"
    rate = "decode_tok_s_pooled" if dec["decode_tok_s_pooled"].notna().any() else "decode_tok_s"
    for temp, g in dec[dec["context"] == ctx].groupby("temperature"):
        g = run_with_most_prompts(g)
        modes = g[g["mode"] != "tree"].sort_values("mode")
        best = g[(g["mode"] == "tree") & ~g["dense_mask"]].sort_values(rate).tail(1)
        parts = [
            f"`{r.name}` **{getattr(r, rate):.0f} tok/s** (median τ {r.tau:.2f})"
            for r in pd.concat([modes, best]).itertuples()
        ]
        line = (
            f"H200, {path}, T = {temp:g}, {ctx:,} tokens of context, "
            f"{int(g['n_prompts'].iloc[0])} prompts: " + ", ".join(parts)
        )
        if len(best):
            b = best.iloc[0]
            line += (
                f" — the best tree is **{b.speedup_vs_ar:.2f}× ar** and "
                f"**{b.speedup_vs_chain:.2f}× chain**."
            )
        out.append(line)
    # tree over ar against context, from every run that covers two or more contexts
    counts = dec.groupby("run", sort=False)["context"].nunique()
    for run_name in counts[counts > 1].index:
        run = dec[dec["run"] == run_name]
        tree = run[(run["mode"] == "tree") & ~run["dense_mask"]].sort_values("context")
        dense = run[(run["mode"] == "tree") & run["dense_mask"]]
        if not tree["speedup_vs_ar"].notna().any():
            continue
        first = tree["speedup_vs_ar"].iloc[0]
        out.append(
            f"Against context ({int(run['n_prompts'].iloc[0])} prompts, "
            f"{int(run['gen'].iloc[0])} tokens): the tree over ar is "
            + ", ".join(f"{r.speedup_vs_ar:.2f}× at {r.context:,}" for r in tree.itertuples())
            + f" — the longest context keeps **{tree['speedup_vs_ar'].iloc[-1] / first:.0%}**"
            " of the shortest one's speed-up"
            + (
                f"; the dense-mask path decodes {dense[rate].min():.0f}–"
                f"{dense[rate].max():.0f} tok/s."
                if len(dense)
                else "."
            )
        )
    phases = [c for c in ("draft", "tree_build", "prepare_for_verify", "verify", "accept",
                          "commit") if c in dec.columns]  # fmt: skip
    trees = dec[(dec["mode"] == "tree") & (dec["context"] == ctx)]
    trees = trees[trees["temperature"] == trees["temperature"].min()]
    for r in trees.sort_values("decode_tok_s").tail(1).itertuples():
        total = sum(getattr(r, p) for p in phases if pd.notna(getattr(r, p)))
        if total > 0:
            where = "an eager profiled pass of the same point" if r.graphs else "the run"
            out.append(
                f"Phases of a `{r.name}` step ({where}): verify {r.verify:.3g} ms of "
                f"{total:.3g} ms (**{r.verify / total:.0%}**)"
                + (
                    f"; the tree build {r.tree_build:.3g} ms."
                    if pd.notna(getattr(r, "tree_build", np.nan))
                    else "."
                )
            )
    if steps is not None and len(steps):
        top = steps[steps["context"] == steps["context"].max()].set_index("provider")
        if {"eager", "graph"} <= set(top.index):
            e, g = top.loc["eager"], top.loc["graph"]
            out.append(
                f"Step bench at {int(steps['context'].max()):,} tokens (tiny-llama, B=64): "
                f"eager {e.step_ms:.3g} ms with the GPU idle {e.gpu_idle_fraction:.0%}, CUDA "
                f"graph {g.step_ms:.3g} ms with it idle {g.gpu_idle_fraction:.0%} "
                f"(**{e.step_ms / g.step_ms:.1f}×**)"
                + (
                    f"; the generic dense-mask path takes {top.loc['generic'].step_ms:.3g} ms."
                    if "generic" in top.index
                    else "."
                )
            )
    return out
