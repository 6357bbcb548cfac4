"""DRAM time series on the GPU through CUPTI PM sampling (``cupti-python`` >= 13.4).

    with kdtree.trace.dram_sampler(interval_us=100) as s:
        run_decode_loop()
    trace = s.trace          # series: t_ns (Unix epoch), metric, value, source="cupti"

What it needs: a CUDA GPU, ``cupti-python`` with ``nvidia-cuda-cupti`` of the same minor version
(``libcupti.so``, ``libnvperf_host.so``, ``libnvperf_target.so``; the folder comes from
``KDTREE_CUPTI_LIB_DIR`` or is searched under the installed ``nvidia`` packages and preloaded),
and the right to read performance counters (root, or ``NVreg_RestrictProfilingToAdminUsers=0``).
Each missing piece raises its own :class:`CaptureError` subclass with what to do.

Clock: PM samples carry GPU timestamps. Three mappings to Unix-epoch ns are tried in order and
the first that puts the samples inside the host's start/stop window wins: ``identity`` (the GPU
global timer already counts epoch ns), ``cupti`` (offset from paired ``cuptiGetTimestamp`` /
``time.time_ns`` readings at start and stop), ``anchor`` (first sample = host start). With
``calibrate=True`` a short device-to-device copy burst is issued right after start and right
before stop at known host times; the distance between each burst edge in the series and its host
launch time is the measured alignment error (``meta['alignment']``), and a mapping that is off by
more than the tolerance is re-anchored on the first burst.
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kdtree import env
from kdtree.trace.schema import DRAM_METRIC, Trace, empty_intervals, make_series

DEFAULT_METRICS: tuple[str, ...] = (DRAM_METRIC,)
_INSTALL_HINT = (
    "install the CUPTI wheels (cupti-python 13.4, nvidia-cuda-cupti 13.4, cuda-pathfinder, "
    "pyelftools): `python -m pip install --no-deps --no-index .whl-cupti/*.whl`"
)
_PERM_HINT = (
    "reading GPU performance counters needs root or the driver option "
    "NVreg_RestrictProfilingToAdminUsers=0 (see NVIDIA's ERR_NVGPUCTRPERM page)"
)


class CaptureError(RuntimeError):
    """Base class for everything that stops a DRAM capture."""


class NoGpuError(CaptureError):
    """No CUDA device is visible."""


class CuptiUnavailableError(CaptureError):
    """``cupti-python`` or the CUPTI libraries cannot be loaded."""


class CounterPermissionError(CaptureError, PermissionError):
    """The driver refuses access to the performance counters."""


class MetricConfigError(CaptureError, ValueError):
    """The GPU refused every requested metric (or combination)."""


# ------------------------------------------------------------------ libraries


def find_cupti_lib_dir() -> Path | None:
    """Folder with ``libcupti.so*`` and ``libnvperf_host.so`` (env override first)."""
    cands: list[Path] = []
    if env.CUPTI_LIB_DIR:
        cands.append(Path(env.CUPTI_LIB_DIR))
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        cands += [base / "cu13" / "lib", base / "cuda_cupti" / "lib", base / "cu12" / "lib"]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            cands.append(Path(root) / "extras" / "CUPTI" / "lib64")
    for c in cands:
        if glob.glob(str(c / "libcupti.so*")) and (c / "libnvperf_host.so").exists():
            return c
    if env.CUPTI_LIB_DIR:
        raise CuptiUnavailableError(
            f"KDTREE_CUPTI_LIB_DIR={env.CUPTI_LIB_DIR}: expected a folder holding libcupti.so* "
            "and libnvperf_host.so"
        )
    return None


def loaded_libcupti() -> str | None:
    """Path of the ``libcupti`` this process has mapped, if any (Linux)."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                if "libcupti.so" in line:
                    return line.split()[-1]
    except OSError:
        return None
    return None


def preload_cupti_libs(lib_dir: Path | None = None) -> list[str]:
    """``dlopen`` the nvperf libraries and libcupti with RTLD_GLOBAL so CUPTI finds them."""
    lib_dir = lib_dir or find_cupti_lib_dir()
    if lib_dir is None:
        return []
    loaded = []
    names = ["libnvperf_target.so", "libnvperf_host.so"]
    names += [Path(p).name for p in sorted(glob.glob(str(lib_dir / "libcupti.so.*")))[-1:]]
    for name in names:
        p = lib_dir / name
        if p.exists():
            try:
                ctypes.CDLL(str(p), mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                raise CuptiUnavailableError(f"cannot load {p}: {exc}") from None
            loaded.append(str(p))
    return loaded


def import_pm_sampling():
    """Import ``cupti.pm_sampling`` (after preloading the libraries) or explain what is missing."""
    preload_cupti_libs()
    try:
        return importlib.import_module("cupti.pm_sampling")
    except ImportError as exc:
        raise CuptiUnavailableError(
            f"cannot import cupti.pm_sampling ({exc}); {_INSTALL_HINT}"
        ) from None
    except OSError as exc:
        raise CuptiUnavailableError(
            f"cupti-python is installed but its libraries do not load ({exc}); put the "
            f"nvidia-cuda-cupti lib folder on LD_LIBRARY_PATH or set KDTREE_CUPTI_LIB_DIR"
        ) from None


def require_gpu(device: int) -> str:
    """Return the device name or raise :class:`NoGpuError`."""
    try:
        import torch
    except ImportError:
        raise NoGpuError("DRAM capture needs torch with CUDA to create the context") from None
    if not torch.cuda.is_available():
        raise NoGpuError(
            "DRAM capture needs a CUDA GPU, and torch.cuda.is_available() is False on this "
            "machine; load a recorded trace instead (kdtree.trace.load_trace)"
        )
    if not 0 <= device < torch.cuda.device_count():
        raise NoGpuError(f"device={device}: expected 0..{torch.cuda.device_count() - 1}")
    torch.cuda.set_device(device)
    torch.zeros(1, device=f"cuda:{device}")  # make sure the primary context exists
    return torch.cuda.get_device_name(device)


# ------------------------------------------------------------------ clocks


@dataclass(frozen=True)
class ClockPair:
    epoch_ns: int  # host Unix-epoch ns at the middle of the bracket
    other_ns: int  # the other clock's reading
    width_ns: int  # bracket width: the pairing's uncertainty is half of it


def clock_pair(read: Callable[[], int], tries: int = 7) -> ClockPair:
    """Pair ``read()`` with ``time.time_ns()``; keeps the tightest of ``tries`` brackets."""
    best = None
    for _ in range(tries):
        a = time.time_ns()
        c = int(read())
        b = time.time_ns()
        if best is None or b - a < best.width_ns:
            best = ClockPair((a + b) // 2, c, b - a)
    assert best is not None
    return best


def choose_mapping(
    starts: np.ndarray,
    host_start_ns: int,
    host_stop_ns: int,
    pairs: Sequence[ClockPair],
    tol_ns: int,
) -> tuple[str, int]:
    """Return ``(name, offset)`` so that ``starts + offset`` lies in the host window."""
    lo, hi = host_start_ns - tol_ns, host_stop_ns + tol_ns

    def fits(off: int) -> bool:
        return bool(starts.size) and lo <= starts[0] + off and starts[-1] + off <= hi

    if fits(0):
        return "identity", 0
    if pairs:
        off = int(round(np.mean([p.epoch_ns - p.other_ns for p in pairs])))
        if fits(off):
            return "cupti", off
    first = int(starts[0]) if starts.size else 0
    return "anchor", host_start_ns - first


def find_edges(
    t: np.ndarray, t_end: np.ndarray, v: np.ndarray, t0: int, t1: int, margin_ns: int
) -> tuple[int, int] | None:
    """Rise and fall time of the burst that a marker issued in ``[t0, t1]`` left in the series."""
    m = (t >= t0 - margin_ns) & (t <= t1 + margin_ns)
    if not m.any():
        return None
    idx = np.flatnonzero(m)
    w = v[idx]
    peak = float(w.max())
    base = float(np.percentile(w, 10))
    if peak <= 0 or peak - base < 0.2 * peak:
        return None
    hot = w >= base + 0.5 * (peak - base)
    # runs of hot samples; the marker's burst is the run starting nearest to its launch
    edges = np.diff(np.concatenate([[0], hot.astype(np.int8), [0]]))
    run_s, run_e = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    k = int(np.argmin(np.abs(t[idx[run_s]] - t0)))
    return int(t[idx[run_s[k]]]), int(t_end[idx[run_e[k]]])


# ------------------------------------------------------------------ sampler


class DramSampler:
    """PM-sampling session; use as a context manager, then read :attr:`trace`."""

    def __init__(
        self,
        metrics: Sequence[str] = DEFAULT_METRICS,
        interval_us: float = 100.0,
        *,
        device: int = 0,
        hw_buffer_mb: int = 512,
        calibrate: bool = True,
        marker_ms: float = 2.0,
        marker_mb: int = 256,
        keep_calibration: bool = False,
        collector_factory: Callable[[int], Any] | None = None,
        cupti_clock: Callable[[], int] | None = None,
    ) -> None:
        if not metrics:
            raise ValueError("metrics: expected at least one metric name")
        if not interval_us > 0:
            raise ValueError(f"interval_us={interval_us}: expected > 0")
        if hw_buffer_mb <= 0:
            raise ValueError(f"hw_buffer_mb={hw_buffer_mb}: expected > 0")
        self.metrics = list(dict.fromkeys(metrics))
        self.interval_ns = int(round(interval_us * 1000))
        self.device = device
        self.hw_buffer_bytes = hw_buffer_mb * 1024 * 1024
        self.calibrate = calibrate
        self.marker_ms = marker_ms
        self.marker_mb = marker_mb
        self.keep_calibration = keep_calibration
        self._factory = collector_factory
        self._cupti_clock = cupti_clock
        self._collector = None
        self._markers: list[tuple[int, int]] = []
        self._pairs: list[ClockPair] = []
        self.accepted: list[str] = []
        self.refused: list[dict[str, Any]] = []
        self.trace: Trace | None = None
        self.timings: dict[str, float] = {}
        self._meta: dict[str, Any] = {}

    # -- lifecycle
    def __enter__(self) -> DramSampler:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stop()
        else:
            self._teardown()

    def start(self) -> None:
        t_setup = time.perf_counter()
        if self._factory is None:
            # the nvidia-cuda-cupti libraries go in before torch can map an older libcupti
            self._meta["preloaded"] = preload_cupti_libs()
            self._meta["device_name"] = require_gpu(self.device)
            pm = import_pm_sampling()
            factory = pm.Collector
            self._meta["libcupti"] = loaded_libcupti()
            self._meta["cupti_python"] = _dist_version("cupti-python")
            if self._cupti_clock is None:
                cc = importlib.import_module("cupti.cupti")
                self._cupti_clock = cc.get_timestamp
        else:
            factory = self._factory
        collector = factory(self.device)
        try:
            collector.enable()
        except PermissionError as exc:
            raise CounterPermissionError(f"PM sampling refused: {exc}; {_PERM_HINT}") from None
        except RuntimeError as exc:
            raise CuptiUnavailableError(f"PM sampling could not be enabled: {exc}") from None
        self._collector = collector
        try:
            self.accepted, self.refused = self._configure(collector)
            if self.calibrate:
                self._prepare_marker()
            if self._cupti_clock is not None:
                self._pairs = [clock_pair(self._cupti_clock)]
            self.timings["setup_s"] = time.perf_counter() - t_setup
            self._host_start = time.time_ns()
            collector.start()
            if self.calibrate:
                self._markers.append(self._marker())
            self._window_start = time.time_ns()
        except BaseException:
            self._teardown()
            raise

    def stop(self) -> Trace:
        if self._collector is None:
            raise RuntimeError("DramSampler.stop(): the sampler was not started")
        try:
            self._window_end = time.time_ns()
            if self.calibrate:
                self._markers.append(self._marker())
            self._collector.stop()
            self._host_stop = time.time_ns()
            if self._cupti_clock is not None:
                self._pairs.append(clock_pair(self._cupti_clock))
            t_dec = time.perf_counter()
            raw = self._decode()
            self.timings["decode_s"] = time.perf_counter() - t_dec
        finally:
            self._teardown()
        self.trace = self._build_trace(raw)
        return self.trace

    def _teardown(self) -> None:
        if self._collector is not None:
            try:
                self._collector.disable()
            finally:
                self._collector = None
        self._marker_buf = None

    # -- configuration
    def _configure(self, collector) -> tuple[list[str], list[dict[str, Any]]]:
        def attempt(ms: list[str]) -> str | None:
            try:
                collector.configure(metrics=ms, hardware_buffer_size=self.hw_buffer_bytes,
                                    sampling_interval=self.interval_ns)  # fmt: skip
            except Exception as exc:  # unsupported combination, unknown metric, bad interval
                return f"{type(exc).__name__}: {exc}"
            return None

        err = attempt(self.metrics)
        if err is None:
            return list(self.metrics), []
        refused = [{"metrics": list(self.metrics), "reason": err}]
        accepted: list[str] = []
        for m in self.metrics:
            e = attempt([*accepted, m])
            if e is None:
                accepted.append(m)
            else:
                refused.append({"metrics": [*accepted, m], "reason": e})
        if not accepted:
            lines = "; ".join(f"{r['metrics']}: {r['reason']}" for r in refused)
            raise MetricConfigError(f"the GPU refused every requested metric: {lines}")
        if attempt(accepted) is not None:  # restore the last good configuration
            raise MetricConfigError(f"metrics {accepted} were accepted alone but not together")
        return accepted, refused

    # -- calibration bursts
    def _prepare_marker(self) -> None:
        import torch

        n = self.marker_mb * 1024 * 1024 // 4
        dev = f"cuda:{self.device}"
        src = torch.empty(n, dtype=torch.float32, device=dev).uniform_()
        dst = torch.empty_like(src)
        dst.copy_(src)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(4):
            dst.copy_(src)
        b.record()
        b.synchronize()
        per_copy_ms = max(a.elapsed_time(b) / 4, 1e-3)
        self._marker_reps = max(1, math.ceil(self.marker_ms / per_copy_ms))
        self._marker_buf = (src, dst)
        self._meta["marker"] = {"bytes_per_copy": 2 * 4 * n, "reps": self._marker_reps,
                                "copy_ms": per_copy_ms}  # fmt: skip

    def _marker(self) -> tuple[int, int]:
        import torch

        idle_s = max(2e-3, 20 * self.interval_ns / 1e9)
        torch.cuda.synchronize(self.device)
        time.sleep(idle_s)
        src, dst = self._marker_buf
        t0 = time.time_ns()
        for _ in range(self._marker_reps):
            dst.copy_(src)
        torch.cuda.synchronize(self.device)
        t1 = time.time_ns()
        time.sleep(idle_s)
        return t0, t1

    # -- decode
    def _decode(self) -> list[tuple[int, int, list[float]]]:
        span_ns = max(self._host_stop - self._host_start, 0)
        cap = int(span_ns / self.interval_ns * 1.2) + 1024
        out: list[tuple[int, int, list[float]]] = []
        last = None
        for _ in range(10_000):
            try:
                data = self._collector.decode(max_samples=cap)
            except MemoryError as exc:
                raise CaptureError(
                    f"PM sampling hardware buffer overflowed ({exc}); raise hw_buffer_mb "
                    f"(now {self.hw_buffer_bytes >> 20}) or the interval"
                ) from None
            n = int(getattr(data, "num_completed_samples", len(data)))
            for s in data:
                if last is not None and s.start_timestamp <= last:
                    continue  # decode returned a sample we already have
                out.append((int(s.start_timestamp), int(s.end_timestamp), list(s.metric_values)))
                last = s.start_timestamp
            if n < cap:
                break
        return out

    # -- result
    def _build_trace(self, raw: list[tuple[int, int, list[float]]]) -> Trace:
        starts = np.array([r[0] for r in raw], dtype=np.int64)
        ends = np.array([r[1] for r in raw], dtype=np.int64)
        vals = np.array([r[2] for r in raw], dtype=np.float64).reshape(
            len(raw), len(self.accepted)
        )
        tol = max(20_000_000, 50 * self.interval_ns)
        mapping, offset = choose_mapping(
            starts, self._host_start, self._host_stop, self._pairs, tol
        )
        t, te = starts + offset, ends + offset
        pair_err = max((p.width_ns // 2 for p in self._pairs), default=None)
        alignment: dict[str, Any] = {"mapping": mapping, "offset_ns": offset,
                                     "clock_pair_half_width_ns": pair_err}  # fmt: skip
        dram_col = self.accepted.index(DRAM_METRIC) if DRAM_METRIC in self.accepted else 0
        residuals = []
        for k, (m0, m1) in enumerate(self._markers):
            edges = find_edges(t, te, vals[:, dram_col], m0, m1, margin_ns=tol)
            rec = {"host_launch_ns": m0, "host_done_ns": m1}
            if edges is not None:
                rec.update(rise_ns=edges[0], fall_ns=edges[1], rise_residual_ns=edges[0] - m0,
                           fall_residual_ns=edges[1] - m1)  # fmt: skip
                residuals.append(edges[0] - m0)
            alignment[f"marker{k}"] = rec
        if residuals and abs(residuals[0]) > tol and mapping != "anchor":
            shift = -residuals[0]
            t, te = t + shift, te + shift
            alignment.update(mapping=f"{mapping}+marker", offset_ns=offset + shift)
            residuals = [r + shift for r in residuals]
        if residuals:
            alignment["error_estimate_ns"] = int(max(abs(r) for r in residuals))
            alignment["drift_ns"] = (
                int(residuals[-1] - residuals[0]) if len(residuals) > 1 else None
            )
            alignment["how"] = "max |burst rise - host launch| over the calibration bursts"
        else:
            alignment["error_estimate_ns"] = int((pair_err or 0) + self.interval_ns)
            alignment["how"] = "clock-pair half width + one sampling interval (no bursts found)"
        keep = np.ones(t.size, dtype=bool)
        if self._markers and not self.keep_calibration:
            keep = (t >= self._window_start) & (te <= self._window_end)
        frames = [
            make_series(t[keep], m, vals[keep, j], "cupti") for j, m in enumerate(self.accepted)
        ]
        series = pd.concat(frames, ignore_index=True)
        steps = np.diff(starts)
        missing = int((steps > 1.5 * self.interval_ns).sum()) if steps.size else 0
        meta = {
            **self._meta,
            "format": "kdtree-cupti-pm-sampling",
            "clock": "unix_epoch_ns",
            "metrics_requested": list(self.metrics),
            "metrics_collected": list(self.accepted),
            "metrics_refused": self.refused,
            "interval_ns": self.interval_ns,
            "interval_ns_measured": int(np.median(steps)) if steps.size else None,
            "n_samples_raw": int(starts.size),
            "n_samples": int(keep.sum()),
            "sampling_holes": missing,
            "host_start_ns": self._host_start,
            "host_stop_ns": self._host_stop,
            "window_ns": [self._window_start, self._window_end],
            "alignment": alignment,
            "timings_s": dict(self.timings),
        }
        return Trace(series, empty_intervals(), meta)


def dram_sampler(
    metrics: Sequence[str] = DEFAULT_METRICS, interval_us: float = 100.0, **kwargs
) -> DramSampler:
    """``with dram_sampler(...) as s: ...`` then ``s.trace`` (see :class:`DramSampler`)."""
    return DramSampler(metrics, interval_us, **kwargs)


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
