"""The profiler's files on disk: ``save`` (Parquet samples, Chrome trace, CSV report) and
``load_samples``."""

from __future__ import annotations

import os
from pathlib import Path

from kdtree.profiling.chrome import export_chrome_trace
from kdtree.profiling.core import _S
from kdtree.profiling.report import _pd, report, samples


def save(out_dir: str | Path | None = None, sync: bool = True) -> dict[str, Path]:
    """Write ``samples.parquet``, ``trace.json`` and ``report.csv`` under ``out_dir``.

    Default folder: ``KDTREE_PROFILE_DIR`` / ``enable(out_dir=...)``; file names carry the pid.
    """
    out = Path(out_dir) if out_dir is not None else _S.out_dir
    out.mkdir(parents=True, exist_ok=True)
    tag = f"kdtree-prof-{os.getpid()}"
    paths = {
        "samples": out / f"{tag}.samples.parquet",
        "trace": out / f"{tag}.trace.json",
        "report": out / f"{tag}.report.csv",
    }
    samples(sync).to_parquet(paths["samples"], index=False)
    export_chrome_trace(paths["trace"], sync=False)
    report(sync=False).to_csv(paths["report"], index=False)
    return paths


def load_samples(path: str | Path):
    """Read a samples Parquet file written by ``save``."""
    return _pd().read_parquet(path)
