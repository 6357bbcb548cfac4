"""The ``kdtree`` command: one sub-app per area, assembled here.

Each area owns ``kdtree/cli/<area>.py`` (exposing ``app``) or, for benchmark suites,
``kdtree/cli/bench_<suite>.py`` (exposing ``register(bench_app)``). Sub-apps are imported
lazily-by-module so ``kdtree --help`` stays fast and one broken area cannot hide the others'
commands: an import failure is reported as such when that area's command is used.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="kdtree: find and remove the time lost in tree speculative decoding on GPUs.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
bench_app = typer.Typer(
    help="Benchmarks; rows go to data/bench/ (long-format CSV).", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")

_SUBAPPS = {
    "profile": "Phase profiler: parse logs, hypothesis sweeps.",
    "trace": "DRAM traces: capture (CUPTI), summarize, attribute gaps to phases.",
    "train": "Train the tokenizer, the MLA+MoE target and the DFlash drafter.",
    "notebooks": "The notebook series: list, run (papermill), sync, strip.",
}
_BENCH_SUITES = ("profiler", "verify", "step", "decode", "tp", "scale")
_broken: dict[str, str] = {}


def _err_app(name: str, err: str) -> typer.Typer:
    sub = typer.Typer(help=f"(unavailable: {err})")

    @sub.callback(invoke_without_command=True)
    def _unavailable() -> None:
        raise typer.BadParameter(f"'kdtree {name}' could not be loaded: {err}")

    return sub


for _name, _help in _SUBAPPS.items():
    try:
        _mod = importlib.import_module(f"kdtree.cli.{_name}")
        app.add_typer(_mod.app, name=_name, help=_help)
    except ModuleNotFoundError as exc:
        if exc.name != f"kdtree.cli.{_name}":
            _broken[_name] = repr(exc)
            app.add_typer(_err_app(_name, repr(exc)), name=_name)
    except Exception as exc:  # a broken area must not take the whole CLI down
        _broken[_name] = repr(exc)
        app.add_typer(_err_app(_name, repr(exc)), name=_name)

for _suite in _BENCH_SUITES:
    try:
        importlib.import_module(f"kdtree.cli.bench_{_suite}").register(bench_app)
    except ModuleNotFoundError as exc:
        if exc.name != f"kdtree.cli.bench_{_suite}":
            _broken[f"bench {_suite}"] = repr(exc)
    except Exception as exc:
        _broken[f"bench {_suite}"] = repr(exc)

try:
    from kdtree.cli.demo import demo as _demo

    app.command(
        "demo",
        help="Generate with ar / chain / tree on a tiny model; "
        "print acceptance statistics and the per-phase time table.",
    )(_demo)
except ModuleNotFoundError as exc:
    if exc.name != "kdtree.cli.demo":
        _broken["demo"] = repr(exc)


@app.command("env")
def env_cmd(as_json: bool = typer.Option(False, "--json", help="JSON only.")) -> None:
    """Versions, device, interpreter mode and every KDTREE_* setting."""
    import os

    import torch

    from kdtree import env as kenv

    info: dict[str, object] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", ""),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    for key in (
        "PROFILE",
        "PROFILE_EVERY",
        "PROFILE_GPU",
        "PROFILE_DIR",
        "DATA_DIR",
        "VERIFY_BACKEND",
        "CUPTI_LIB_DIR",
    ):
        info[f"KDTREE_{key}"] = str(getattr(kenv, key))
    if _broken:
        info["unavailable_commands"] = _broken
    if not as_json:
        table = Table(title="kdtree env", show_header=False)
        for k, v in info.items():
            table.add_row(k, str(v))
        Console().print(table)
    print(json.dumps(info, default=str))


if __name__ == "__main__":
    app()
