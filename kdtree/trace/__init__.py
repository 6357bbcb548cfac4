"""DRAM traces: capture (CUPTI PM sampling), loaders for foreign formats, bursts/gaps, attribution.

    from kdtree.trace import load_trace, analyze
    tr = load_trace("data/traces/eager_4k/dram.trace.json")
    ph = load_trace("data/traces/eager_4k/phases.json")       # kdtree.profiler Chrome trace
    s = analyze(tr, ph)                                        # TraceSummary
    s.to_json()["idle_by_phase"]

Capture on a GPU: ``with dram_sampler(interval_us=100) as s: ...`` then ``s.trace``.
"""

from kdtree.trace.analysis import (
    TraceSummary,
    analyze,
    attribute_gaps,
    choose_thresholds,
    detect_bursts,
    estimate_period_ns,
    gap_histogram,
    per_step_idle,
)
from kdtree.trace.cupti import (
    CaptureError,
    CounterPermissionError,
    CuptiUnavailableError,
    DramSampler,
    MetricConfigError,
    NoGpuError,
    dram_sampler,
)
from kdtree.trace.loaders import detect_format, load_trace
from kdtree.trace.schema import DRAM_METRIC, INTERVAL_KINDS, Trace, TraceFormatError
from kdtree.trace.store import load_native, save_trace

__all__ = [
    "DRAM_METRIC", "INTERVAL_KINDS", "CaptureError", "CounterPermissionError",
    "CuptiUnavailableError", "DramSampler", "MetricConfigError", "NoGpuError", "Trace",
    "TraceFormatError", "TraceSummary", "analyze", "attribute_gaps", "choose_thresholds",
    "detect_bursts", "detect_format", "dram_sampler", "estimate_period_ns", "gap_histogram",
    "load_native", "load_trace", "per_step_idle", "save_trace",
]  # fmt: skip
