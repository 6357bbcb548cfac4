"""Run a list of GPU stages inside one device call, robustly, and pack what they produced.

Usage (on the GPU machine, from the repo root):
    python3 tools/gpu/session.py STAGEFILE [--budget-s 560]

STAGEFILE holds one stage per line: ``name | timeout_s | shell command``. Each stage runs with
its own timeout and log; a failing stage never stops the next. Everything a stage writes under
``$RES/<name>/`` plus all logs is packed into ``$OUT/results.tar.gz`` (the device call returns at
most 8 files), and a one-line-per-stage summary is printed last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path


def main() -> int:
    stagefile = Path(sys.argv[1])
    budget = float(sys.argv[sys.argv.index("--budget-s") + 1]) if "--budget-s" in sys.argv else 560
    out = Path(os.environ.get("OUT", "/tmp/out"))
    res = Path(os.environ.get("RES", "/tmp/res"))
    res.mkdir(parents=True, exist_ok=True)
    (res / "logs").mkdir(exist_ok=True)
    t_start = time.monotonic()
    summary = []
    for raw in stagefile.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, timeout, cmd = (part.strip() for part in raw.split("|", 2))
        left = budget - (time.monotonic() - t_start)
        if left < 10:
            summary.append(f"{name:24s} SKIPPED (session budget spent)")
            continue
        timeout_s = min(float(timeout), left)
        stage_dir = res / name
        stage_dir.mkdir(exist_ok=True)
        env = dict(os.environ, STAGE_OUT=str(stage_dir), PYTHONUNBUFFERED="1")
        log = res / "logs" / f"{name}.log"
        t0 = time.monotonic()
        with log.open("w") as fh:
            # own process group: a timeout kills the whole stage (python children included),
            # so a stuck stage never keeps the GPU busy under the next one
            proc = subprocess.Popen(
                ["bash", "-c", cmd],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "TIMEOUT"
        dt = time.monotonic() - t0
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        summary.append(f"{name:24s} rc={rc!s:8s} {dt:7.1f}s  {tail[0][:150]}")
        print(summary[-1], flush=True)
    (res / "logs" / "SUMMARY.txt").write_text("\n".join(summary) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        tar.add(res, arcname="results")
    print("==== summary ====")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
