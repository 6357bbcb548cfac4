# %% [markdown]
# # 01 · DRAM traces: where does the step time go idle?
# **Question:** does memory traffic during decode come in short bursts separated by idle gaps,
# how much of each step is idle, and which engine phase is running while the GPU waits?
#
# Headless: `kdtree notebooks run 01`. On a GPU it captures DRAM throughput live (CUPTI PM
# sampling) around a decode; elsewhere it opens a trace shipped in `data/traces/`.

# %%
import ipywidgets as widgets

from kdtree import nb, nb_live
from kdtree.trace import analyze
from kdtree.viz import trace as vt

# %% tags=["parameters"]
DEVICE: str = "auto"  # "auto", "cpu" or "cuda[:N]"
SEED: int = 0  # seed for every RNG
INTERACTIVE: bool = True  # show widgets (headless runs set False)
OUT_DIR: str = "runs/01_dram_traces"  # summary.json and figures go here
TRACE: str = ""  # a trace file or a path under data/traces (empty: live on GPU, else shipped)
CONTEXT: int = 512  # prefix length of the live decode (tokens)
STEPS: int = 4  # decode steps recorded live
HIGH: float = -1.0  # burst threshold in metric units (-1: chosen from the data)
LOW: float = -1.0  # hysteresis: a burst ends below this (-1: chosen from the data)
MIN_GAP_US: float = 0.0  # gaps shorter than this are merged into the burst (µs)

# %%
ctx = nb.setup(device=DEVICE, seed=SEED, out_dir=OUT_DIR)
tr, phases, source, note, stand_in_th = nb_live.open_trace(
    ctx, TRACE, context=CONTEXT, steps=STEPS
)
if note:
    nb.note(note)
high, low = (HIGH if HIGH >= 0 else None), (LOW if LOW >= 0 else None)
if stand_in_th and high is None:
    high, low = stand_in_th
s = analyze(tr, phases, high=high, low=low, min_gap_ns=int(MIN_GAP_US * 1e3))
res = s.to_json()
print(
    f"source: {source}; metric {s.metric}: {s.n_samples} samples every "
    f"{s.interval_ns / 1e3:.0f} µs over {s.span_ns / 1e6:.1f} ms"
)

# %% [markdown]
# ## 1. The series, with the engine's phases shaded
# The dashed lines are the hysteresis thresholds: a burst starts above the high one and ends
# below the low one. Shaded bands are the profiler phases recorded on the same clock.

# %%
nb.show(vt.make_dram_phase_fig(tr, phases, summary=s), "series_with_phases")

# %% [markdown]
# ## 2. Bursts and gaps
# Duty cycle is the busy share between the first and the last burst; the histogram shows
# whether the idle time is many short gaps or a few long ones.

# %%
print(
    f"{res['bursts']} bursts, {res['gaps']} gaps; duty cycle {res['duty_cycle']:.1%}; "
    f"mean burst level {res['mean_burst_level']}; median gap {res['gap_ms_median']} ms"
)
nb.show(vt.make_gap_histogram_fig(s), "gap_histogram")

# %% [markdown]
# ## 3. Idle time per step
# Steps come from the profiler's step marks when the trace has them, else from the
# periodicity of the bursts.

# %%
nb.show(vt.make_step_idle_fig(s), "idle_per_step")
s.steps.head(10)

# %% [markdown]
# ## 4. Attribution: which phase runs while the device is idle
# Each gap is split across the phases that overlap it (an interval join).

# %%
nb.show(vt.make_idle_by_phase_fig(s), "idle_by_phase")
s.attribution

# %% [markdown]
# ## 5. Explore the thresholds and the window (interactive only)

# %%
if INTERACTIVE:
    top = float(tr.metric(s.metric)["value"].max())
    span_ms = s.span_ns / 1e6

    def render(high, low, window):
        si = analyze(tr, phases, high=high, low=min(low, high))
        return vt.make_dram_phase_fig(tr, phases, summary=si, window_ms=window)

    nb.interact(
        render,
        high=widgets.FloatSlider(value=s.thresholds.high, min=0, max=top, description="high"),
        low=widgets.FloatSlider(value=s.thresholds.low, min=0, max=top, description="low"),
        window=widgets.FloatRangeSlider(
            value=(0, span_ms), min=0, max=span_ms, description="window ms"
        ),
    )

# %% [markdown]
# ## Conclusions

# %%
idle_total = res["gap_ms_total"] or 0.0
idle_fraction = idle_total / (s.span_ns / 1e6) if s.span_ns else 0.0
top_phase = s.attribution.sort_values("idle_ms").iloc[-1] if len(s.attribution) else None
nb.markdown(
    f"- Source: **{source}**, metric `{s.metric}`.\n"
    f"- {res['bursts']} bursts at a mean level of {res['mean_burst_level']} and {res['gaps']} "
    f"gaps: the signal is busy **{res['duty_cycle']:.1%}** of the active window and idle "
    f"**{idle_fraction:.1%}** of the whole trace ({idle_total:.2f} ms).\n"
    f"- Per step ({res['n_steps']} steps, from {res['step_source']}): "
    f"{res['step_idle_ms_mean']} ms idle on average.\n"
    + (
        f"- The largest share of the idle time falls in **{top_phase.phase}** "
        f"({top_phase.idle_ms:.2f} ms, {top_phase.share:.0%})."
        if top_phase is not None
        else "- No phases were recorded, so the gaps cannot be attributed."
    )
)

# %%
nb.write_summary(
    {
        "source": source,
        "gpu_data_shipped": bool(ctx.shipped["traces"]),
        "stand_in": bool(note),
        "metric": s.metric,
        "n_samples": s.n_samples,
        "n_bursts": res["bursts"],
        "n_gaps": res["gaps"],
        "duty_cycle": res["duty_cycle"],
        "idle_fraction": idle_fraction,
        "idle_ms_total": idle_total,
        "step_idle_ms_mean": res["step_idle_ms_mean"],
        "attribution": res["idle_by_phase"],
    }
)
nb.check(s.n_samples > 0, "the trace has samples")
nb.check(0.0 <= res["duty_cycle"] <= 1.0, "duty cycle is a fraction")
nb.check(0.0 <= idle_fraction <= 1.0 + 1e-9, "idle time fits inside the trace")
if len(s.attribution):
    nb.check(abs(s.attribution["share"].sum() - 1.0) < 1e-6, "attribution shares add up to 1")
