"""Notebook setup: resolve the device, print the environment, show and save figures, find the
shipped data, write ``summary.json``.

Every notebook of the series calls :func:`setup` right after its parameters cell::

    ctx = nb.setup(device=DEVICE, seed=SEED, out_dir=OUT_DIR)
    nb.show(make_gap_fig(df), "gaps")          # displayed, and saved as OUT_DIR/gaps.html
    nb.write_summary(ctx, {"duty_cycle": 0.23})

Figures are saved as standalone offline HTML. Inside a ``kdtree notebooks run`` folder they
share the run's one ``plotly.min.js``; elsewhere a copy is written next to them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdtree import env

REPO_ROOT = Path(__file__).resolve().parent.parent


def _interpret_without_gpu() -> None:
    """As in tests/conftest.py: Triton runs in its CPU interpreter when there is no GPU. Must
    happen before ``kdtree.kernels`` is imported, which is why notebooks import ``nb`` first."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_interpret_without_gpu()
_CURRENT: NotebookContext | None = None


@dataclass
class NotebookContext:
    """What the resolve cell computed: the device, where outputs go, what data is shipped."""

    device: str
    seed: int
    out_dir: Path
    gpu: bool
    interpret: bool
    versions: dict[str, str]
    data_dir: Path
    shipped: dict[str, list[str]] = field(default_factory=dict)

    @property
    def live_gpu(self) -> bool:
        """True when this run measures on a CUDA device (else: shipped data + live CPU runs)."""
        return self.device.startswith("cuda")

    def env_line(self) -> str:
        v = self.versions
        mode = "TRITON_INTERPRET=1" if self.interpret else "compiled"
        return (
            f"device={self.device} ({v.get('device_name', '?')}) · torch {v.get('torch')} · "
            f"triton {v.get('triton') or '-'} ({mode}) · python {v.get('python')} · "
            f"{os.cpu_count()} CPU cores · seed {self.seed} · out {self.out_dir}"
        )


def resolve_device(device: str) -> str:
    """``"auto"`` → ``"cuda"`` when a GPU is usable, else ``"cpu"``; ``"cuda"`` without one fails."""
    import torch

    if not isinstance(device, str) or not device:
        raise ValueError(f"DEVICE={device!r}: expected 'auto', 'cpu' or 'cuda[:N]'")
    dev = device.strip().lower()
    if dev == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        return "cpu"
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"DEVICE={device!r} but torch sees no CUDA device (torch {torch.__version__}); "
                "use DEVICE='auto' or 'cpu' to run on shipped data and the CPU"
            )
        return dev
    raise ValueError(f"DEVICE={device!r}: expected 'auto', 'cpu' or 'cuda[:N]'")


def _versions(device: str) -> dict[str, str]:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "triton": ""}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    if device.startswith("cuda"):
        out["device_name"] = torch.cuda.get_device_name(torch.device(device))
    else:
        out["device_name"] = platform.processor() or platform.machine()
    return out


def shipped_data(data_dir: Path | None = None) -> dict[str, list[str]]:
    """The measured data shipped in ``data/``: bench CSVs, traces and model folders by name."""
    data_dir = Path(data_dir or env.DATA_DIR)
    found: dict[str, list[str]] = {"bench": [], "traces": [], "models": []}
    if (data_dir / "bench").is_dir():
        found["bench"] = sorted(p.stem for p in (data_dir / "bench").glob("*.csv"))
    if (data_dir / "traces").is_dir():
        found["traces"] = sorted(
            p.relative_to(data_dir / "traces").as_posix()
            for p in (data_dir / "traces").rglob("*")
            if p.is_file() and p.name != "README.md"
        )
    if (data_dir / "models").is_dir():
        found["models"] = sorted(
            p.name for p in (data_dir / "models").iterdir() if (p / "config.json").exists()
        )
    return found


def resolve_out_dir(out_dir: str | Path) -> Path:
    """Relative ``OUT_DIR`` values are taken from the repository root (not the notebook's cwd)."""
    path = Path(out_dir).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def setup(*, device: str = "auto", seed: int = 0, out_dir: str | Path) -> NotebookContext:
    """Resolve the device, seed every RNG, create OUT_DIR, set the plotly renderer, print the
    environment line and what shipped data exists. Returns the context the notebook uses."""
    global _CURRENT
    import numpy as np
    import plotly.io as pio
    import torch

    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"SEED={seed!r}: expected an int")
    dev = resolve_device(device)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    out = resolve_out_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pio.renderers.default = "plotly_mimetype"
    ctx = NotebookContext(
        device=dev,
        seed=seed,
        out_dir=out,
        gpu=torch.cuda.is_available(),
        interpret=os.environ.get("TRITON_INTERPRET") == "1",
        versions=_versions(dev),
        data_dir=Path(env.DATA_DIR),
        shipped=shipped_data(),
    )
    _CURRENT = ctx
    print(ctx.env_line())
    for kind, names in ctx.shipped.items():
        print(f"shipped {kind}: {', '.join(names) if names else 'none yet'}")
    return ctx


def current() -> NotebookContext:
    if _CURRENT is None:
        raise RuntimeError("kdtree.nb.setup(...) has not been called in this kernel")
    return _CURRENT


# ---------------------------------------------------------------------------------------------
# figures and text
# ---------------------------------------------------------------------------------------------


def save_figure(fig: Any, name: str, out_dir: str | Path | None = None) -> Path:
    """Write ``fig`` as standalone offline HTML ``OUT_DIR/name.html`` and return the path.

    Inside a run folder (``plotly.min.js`` one level up) the page links that shared copy;
    otherwise plotly writes ``plotly.min.js`` next to the page (``include_plotlyjs="directory"``).
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"figure name {name!r}: expected a plain file stem like 'gap_histogram'")
    out = resolve_out_dir(out_dir) if out_dir is not None else current().out_dir
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.html"
    shared = out.parent / "plotly.min.js"
    include: str | bool = "../plotly.min.js" if shared.exists() else "directory"
    fig.write_html(path, include_plotlyjs=include, full_html=True)
    return path


def show(fig: Any, name: str) -> Path:
    """Display a plotly figure (static, light: plotly mimetype) and save it as offline HTML.

    The display bundle also carries a ``text/html`` iframe of the saved page, which is what an
    nbconvert HTML rendering of the executed notebook shows.
    """
    from IPython.display import display

    path = save_figure(fig, name)
    bundle = fig.to_plotly_json()
    rel = f"{path.parent.name}/{path.name}"
    height = int((fig.layout.height or 450) + 30)
    display(
        {
            "application/vnd.plotly.v1+json": {
                "data": bundle.get("data", []),
                "layout": bundle.get("layout", {}),
                "config": {"displaylogo": False},
            },
            "text/html": (
                f'<iframe src="{rel}" style="width:100%;height:{height}px;border:0"></iframe>'
                f'<p><a href="{rel}">{path.name}</a></p>'
            ),
            "text/plain": f"<figure {name}: {path}>",
        },
        raw=True,
    )
    return path


def markdown(text: str) -> None:
    """Display computed Markdown (used for the Conclusions, so the numbers are the measured ones)."""
    from IPython.display import Markdown, display

    display(Markdown(text))


def note(text: str) -> None:
    """A visible one-line notice, e.g. that GPU data is not shipped yet."""
    from IPython.display import Markdown, display

    display(Markdown(f"> **Note.** {text}"))


def show_tables(tables: dict[str, Any], digits: int = 3) -> None:
    """Each table of ``tables`` (title -> DataFrame) under its title, rounded to ``digits``."""
    from IPython.display import display

    for title, table in tables.items():
        print(title)
        display(table.round(digits))


# ---------------------------------------------------------------------------------------------
# shipped data
# ---------------------------------------------------------------------------------------------


def data_path(*parts: str, data_dir: Path | None = None) -> Path:
    """A path under the shipped data folder (``KDTREE_DATA_DIR`` or ``data/``)."""
    return Path(data_dir or env.DATA_DIR).joinpath(*parts)


def bench_csv(suite: str, data_dir: Path | None = None) -> Path | None:
    """``data/bench/<suite>.csv`` if it is shipped, else None."""
    path = data_path("bench", f"{suite}.csv", data_dir=data_dir)
    return path if path.exists() and path.stat().st_size > 0 else None


def load_bench(suite: str, *, gpu_only: bool = False, data_dir: Path | None = None):
    """The shipped long-format rows of one suite as a DataFrame (None when not shipped).

    ``gpu_only`` keeps rows measured on a CUDA device (CPU and GPU numbers never share a chart).
    """
    import pandas as pd

    path = bench_csv(suite, data_dir)
    if path is None:
        return None
    df = pd.read_csv(path)
    if gpu_only and "device" in df.columns:
        df = df[~df["device"].astype(str).str.startswith("cpu")]
    return df if len(df) else None


# ---------------------------------------------------------------------------------------------
# summary.json
# ---------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy / torch scalars
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_summary(summary: dict[str, Any], ctx: NotebookContext | None = None) -> Path:
    """Write ``OUT_DIR/summary.json``: the notebook's key numbers plus the environment."""
    if not isinstance(summary, dict) or not summary:
        raise ValueError("summary: expected a non-empty dict of the notebook's key numbers")
    ctx = ctx or current()
    doc = {
        **_jsonable(summary),
        "env": {
            "device": ctx.device,
            "seed": ctx.seed,
            "interpret": ctx.interpret,
            **ctx.versions,
            "shipped": ctx.shipped,
        },
    }
    path = ctx.out_dir / "summary.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=False))
    return path


def check(condition: Any, message: str) -> None:
    """An invariant the notebook relies on; fails the (headless) run loudly with ``message``."""
    if not bool(condition):
        raise AssertionError(f"invariant violated: {message}")


def interact(render: Any, **controls: Any) -> None:
    """Widgets over a pure figure builder: ``render(**values) -> go.Figure`` is re-run when a
    control changes (sliders get ``continuous_update=False``, so compute runs on release)."""
    import ipywidgets as widgets
    from IPython.display import display

    for c in controls.values():
        if hasattr(c, "continuous_update"):
            c.continuous_update = False
    out = widgets.interactive_output(lambda **kw: render(**kw).show(), controls)
    display(widgets.VBox([widgets.HBox(list(controls.values())), out]))
