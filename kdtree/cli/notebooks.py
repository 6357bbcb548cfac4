"""``kdtree notebooks``: list, run (papermill, headless), sync (jupytext pairs), strip."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from kdtree import notebooks as nbr

app = typer.Typer(
    help="The notebook series: list, run (papermill), sync, strip.", no_args_is_help=True
)
_out = Console()
_err = Console(stderr=True)


def _fail(msg: str) -> None:
    _err.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(2)


@app.command("list")
def list_cmd() -> None:
    """Each notebook's question and parameters (from its ``parameters`` cell)."""
    try:
        infos = nbr.discover()
    except nbr.NotebookError as exc:
        _fail(str(exc))
    table = Table(title="kdtree notebooks", show_lines=True)
    table.add_column("NN")
    table.add_column("notebook / question", overflow="fold")
    table.add_column("parameters (name: type = default  # help)", overflow="fold")
    for info in infos:
        params = "\n".join(
            f"{p['name']}: {p.get('inferred_type_name') or '?'} = {p['default']}"
            + (f"  # {p['help']}" if p.get("help") else "")
            for p in info.parameters.values()
        )
        table.add_row(info.number, f"[bold]{info.name}[/bold]\n{info.question}", params)
    _out.print(table)
    doc = [
        {
            "number": i.number,
            "name": i.name,
            "question": i.question,
            "parameters": {
                k: {
                    "type": v.get("inferred_type_name"),
                    "default": v.get("default"),
                    "help": v.get("help"),
                }
                for k, v in i.parameters.items()
            },
        }
        for i in infos
    ]
    print(json.dumps({"notebooks": doc}))


def _parse_run_args(args: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Split the free arguments of ``run`` into notebook selectors and ``-p NAME VALUE`` pairs."""
    selectors: list[str] = []
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok in ("-p", "--param"):
            if i + 2 >= len(args) or args[i + 1].startswith("-"):
                _fail(f"{tok} takes two values: {tok} NAME VALUE")
            pairs.append((args[i + 1], args[i + 2]))
            i += 3
        elif tok.startswith("-"):
            _fail(f"unknown option {tok!r} (see kdtree notebooks run --help)")
        else:
            selectors.append(tok)
            i += 1
    return selectors, pairs


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(
    ctx: typer.Context,
    all_: bool = typer.Option(False, "--all", help="Run the whole series in order."),
    out: Path = typer.Option(Path("runs"), "--out", help="Root folder for runs/<timestamp>/."),
    kernel: str = typer.Option(nbr.KERNEL_NAME, "--kernel", help="Jupyter kernel name."),
    timeout: float | None = typer.Option(
        None, "--cell-timeout", help="Seconds allowed per cell (default: no limit)."
    ),
) -> None:
    """Execute notebooks headless into OUT/<timestamp>/ with an index.html.

    Usage: kdtree notebooks run [NN ...|--all] [-p NAME VALUE]... [--out runs/]

    NN is a number (01, 3) or a name prefix (04_tree). Each -p NAME VALUE is typed through the
    notebook's parameters cell; INTERACTIVE is always False and OUT_DIR points into the run.
    Exit code 1 if any notebook failed (the others still run).
    """
    notebooks, pairs = _parse_run_args(list(ctx.args))
    if all_ and notebooks:
        _fail("give notebook numbers or --all, not both")
    try:
        paths = nbr.notebook_paths() if all_ else nbr.resolve(notebooks)
        infos = [nbr.inspect(p) for p in paths]
        typed = nbr.typed_parameters(pairs, infos)
        nbr.require_kernel(kernel)
    except nbr.NotebookError as exc:
        _fail(str(exc))
    if not paths:
        _fail(f"no notebooks in {nbr.NOTEBOOK_DIR}")

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=_err,
    )
    with progress:
        task = progress.add_task("notebooks", total=len(paths))

        def start(path: Path) -> None:
            progress.update(task, description=f"running {path.stem}")

        def done(res: nbr.NotebookRun) -> None:
            mark = "[green]ok[/green]" if res.status == "ok" else "[red]FAILED[/red]"
            progress.console.print(f"{res.name}: {mark} in {res.seconds:.1f} s")
            if res.error:
                progress.console.print(f"  [red]{res.name}, {res.error}[/red]")
            progress.advance(task)

        result = nbr.run(
            paths, out, typed, kernel_name=kernel, timeout_s=timeout, on_start=start, on_done=done
        )

    table = Table(title=f"run {result.run_dir}")
    for col in ("notebook", "status", "seconds", "error"):
        table.add_column(col, overflow="fold")
    for r in result.notebooks:
        style = "green" if r.status == "ok" else "red"
        table.add_row(
            r.name,
            f"[{style}]{r.status}[/{style}]",
            f"{r.seconds:.1f}",
            str(r.error) if r.error else "",
        )
    _out.print(table)
    _out.print(f"index: {result.index}")
    print(json.dumps(result.to_json(), default=str))
    if result.failed:
        raise typer.Exit(1)


@app.command("sync")
def sync_cmd(
    prefer: str = typer.Option(
        "newer", "--prefer", help="Which side wins: newer (like jupytext --sync), py or ipynb."
    ),
) -> None:
    """Re-pair each notebooks/NN_name.py (percent) with its stripped .ipynb (jupytext)."""
    try:
        done = nbr.sync(prefer=prefer)
    except nbr.NotebookError as exc:
        _fail(str(exc))
    for stem, source in done:
        _out.print(f"{stem.name}: synced from .{source}")
    print(json.dumps({"synced": [{"notebook": s.name, "source": src} for s, src in done]}))


@app.command("strip")
def strip_cmd(
    paths: list[Path] | None = typer.Argument(None, help="Notebooks (default: the series)."),
    check: bool = typer.Option(False, "--check", help="Only report; exit 1 if any is unstripped."),
) -> None:
    """Remove outputs, execution counts and volatile metadata from .ipynb files."""
    try:
        changed = nbr.strip(paths or None, check=check)
    except nbr.NotebookError as exc:
        _fail(str(exc))
    verb = "not stripped" if check else "stripped"
    for p in changed:
        _out.print(f"{p}: {verb}")
    print(json.dumps({"changed": [str(p) for p in changed], "check": check}))
    if check and changed:
        raise typer.Exit(1)
