"""DRAM time series on the GPU through CUPTI PM sampling (``cupti-python`` >= 13.4).

    with kdtree.trace.dram_sampler(interval_us=100) as s:
        run_decode_loop()
    trace = s.trace          # series: t_ns (Unix epoch), metric, value, source="cupti"

What it needs: a CUDA GPU, ``cupti-python`` with ``nvidia-cuda-cupti`` of the same minor version
(``libcupti.so``, ``libnvperf_host.so``, ``libnvperf_target.so``; the folder comes from
``KDTREE_CUPTI_LIB_DIR`` or is searched under the installed ``nvidia`` packages and preloaded),
and the right to read performance counters (root, or ``NVreg_RestrictProfilingToAdminUsers=0``).
Each missing piece raises its own :class:`CaptureError` subclass with what to do.

Clock: PM samples carry GPU timestamps; :mod:`kdtree.trace.align` maps them to Unix-epoch ns.
Samples with unusable raw timestamps (the first PM sample can carry ``start_timestamp == 0``)
are re-placed by index; then three mappings are tried in order and the first that puts the
samples inside the host's start/stop window wins: ``identity`` (the GPU global timer already
counts epoch ns), ``cupti`` (offset from paired ``cuptiGetTimestamp`` / ``time.time_ns``
readings), ``anchor`` (first sample = host start); ``synthetic`` (host start + k * interval) is
the last resort. With ``calibrate=True`` a short device-to-device copy burst is issued right
after start and right before stop at known host times; the distance between each burst edge in
the series and its host launch time is the measured alignment error (``meta['alignment']``), and
a guessed mapping (or one off by more than the tolerance) is re-anchored on the first burst.
Samples are never dropped silently: ``meta['warnings']``, ``meta['alignment']['approximate']``,
``meta['window_filter']`` and ``meta['raw_timestamps']`` (first/last raw values and deltas)
say what happened.
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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kdtree import env
from kdtree.trace.align import (  # noqa: F401  (re-exported: the clock helpers used to live here)
    ClockPair,
    align_samples,
    choose_mapping,
    clock_pair,
    find_edges,
)
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
        last: tuple[int, int] | None = None
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
                key = (int(s.start_timestamp), int(s.end_timestamp))
                # a sample we already have (a zero start, seen on the first PM sample, is not
                # an order key: alignment repairs it)
                if last is not None and (key == last or 0 < key[0] <= last[0]):
                    continue
                out.append((key[0], key[1], list(s.metric_values)))
                last = key if key[0] > 0 or last is None else last
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
        dram_col = self.accepted.index(DRAM_METRIC) if DRAM_METRIC in self.accepted else 0
        window = (
            getattr(self, "_window_start", self._host_start),
            getattr(self, "_window_end", self._host_stop),
        )
        res = align_samples(starts, ends, vals[:, dram_col], interval_ns=self.interval_ns,
                            host_start_ns=self._host_start, host_stop_ns=self._host_stop,
                            window_ns=window, markers=self._markers, pairs=self._pairs,
                            keep_calibration=self.keep_calibration)  # fmt: skip
        keep = res.keep
        frames = [
            make_series(res.t[keep], m, vals[keep, j], "cupti")
            for j, m in enumerate(self.accepted)
        ]
        series = pd.concat(frames, ignore_index=True)
        steps = np.diff(res.t)
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
            "window_ns": list(window),
            "window_filter": res.window_filter,
            "alignment": res.alignment,
            "raw_timestamps": res.raw,
            "warnings": list(res.alignment["warnings"]),
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
