"""The notebook series as a batch job: list, run (papermill), sync (jupytext), strip.

A run executes the selected notebooks one after another into ``runs/<timestamp>/``::

    runs/20261129-081500/
        plotly.min.js             shared by every figure of the run (offline, no CDN)
        01_dram_traces.ipynb      the executed notebook
        01_dram_traces.html       the same, rendered with nbconvert
        01_dram_traces/           its OUT_DIR: summary.json and the figures as *.html
        index.html                links all of the above, with each notebook's summary
        run.json                  what ``kdtree notebooks run`` printed as its last line

``INTERACTIVE`` is always forced to ``False`` and ``OUT_DIR`` points into the run folder. A
failing cell is recorded (notebook, cell number, error) and the remaining notebooks still run.
"""

from __future__ import annotations

import ast
import datetime as _dt
import html
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
KERNEL_NAME = "python3"
STANDARD_PARAMETERS = ("DEVICE", "SEED", "INTERACTIVE", "OUT_DIR")
_NAME_RE = re.compile(r"^(\d{2})_[a-z0-9_]+$")
#: Notebook-level metadata keys kept by :func:`strip_notebook` (everything else goes).
_KEEP_NB_METADATA = ("kernelspec", "jupytext")
#: Cell-level metadata keys kept by :func:`strip_notebook`.
_KEEP_CELL_METADATA = ("tags",)


class NotebookError(RuntimeError):
    """A notebook could not be found, parsed or prepared (not a failing cell: see NotebookRun)."""


# ---------------------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------------------


@dataclass
class NotebookInfo:
    """One notebook of the series: ``NN_name.ipynb`` (and its paired ``NN_name.py``)."""

    number: str
    name: str
    path: Path
    question: str
    parameters: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return self.path.stem


def notebook_paths(directory: Path | None = None) -> list[Path]:
    """The series' ``.ipynb`` files, sorted by number (``NN_snake_case.ipynb``)."""
    directory = Path(directory or NOTEBOOK_DIR)
    if not directory.is_dir():
        raise NotebookError(f"notebook folder {directory} does not exist")
    return sorted(p for p in directory.glob("*.ipynb") if _NAME_RE.match(p.stem))


def question_of(nb: Any) -> str:
    """The question a notebook answers, from its title (first markdown) cell.

    The title cell holds ``# NN · Title`` and a line starting with ``**Question:**`` (or, failing
    that, the first non-heading line).
    """
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        lines = [ln.strip() for ln in cell.source.splitlines()]
        for i, ln in enumerate(lines):
            if ln.lower().startswith("**question:**"):
                para = [ln.split(":**", 1)[1].strip()]
                for nxt in lines[i + 1 :]:
                    if not nxt or nxt.startswith("#"):
                        break
                    para.append(nxt)
                return " ".join(para)
        body = [ln for ln in lines if ln and not ln.startswith("#")]
        heads = [ln.lstrip("# ") for ln in lines if ln]
        return body[0] if body else (heads[0] if heads else "")
    return ""


def inspect(path: Path) -> NotebookInfo:
    """Read one notebook's number, question and parameters (``papermill.inspect_notebook``)."""
    import nbformat
    import papermill

    path = Path(path)
    m = _NAME_RE.match(path.stem)
    if not m:
        raise NotebookError(f"{path}: expected a name like NN_snake_case.ipynb")
    nb = nbformat.read(path, as_version=4)
    try:
        params = papermill.inspect_notebook(str(path))
    except ValueError as exc:  # e.g. no kernelspec in the metadata
        raise NotebookError(f"{path}: {exc} (run 'kdtree notebooks sync' to re-pair)") from None
    return NotebookInfo(m.group(1), path.stem, path, question_of(nb), dict(params))


def discover(directory: Path | None = None) -> list[NotebookInfo]:
    """Every notebook of the series with its question and parameters."""
    return [inspect(p) for p in notebook_paths(directory)]


def resolve(selectors: Sequence[str], directory: Path | None = None) -> list[Path]:
    """Map ``["03", "5", "04_tree_build"]`` to notebook paths (series order, no duplicates)."""
    paths = notebook_paths(directory)
    if not selectors:
        raise NotebookError("no notebook selected: give numbers (e.g. 01 03) or --all")
    chosen: list[Path] = []
    for sel in selectors:
        key = sel.strip().removesuffix(".ipynb").removesuffix(".py")
        key = Path(key).name
        if key.isdigit():
            hits = [p for p in paths if int(p.stem[:2]) == int(key)]
        else:
            hits = [p for p in paths if p.stem == key or p.stem.startswith(key)]
        if len(hits) != 1:
            known = ", ".join(p.stem for p in paths) or "(none)"
            what = "matches no notebook" if not hits else "is ambiguous"
            raise NotebookError(f"notebook selector {sel!r} {what}; known: {known}")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return sorted(chosen, key=paths.index)


# ---------------------------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def coerce(name: str, raw: str, type_name: str | None) -> Any:
    """Turn the text of ``-p NAME VALUE`` into the type the parameters cell declares."""
    t = (type_name or "").strip().lower()
    try:
        if t == "bool":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError("expected true/false (or 1/0, yes/no, on/off)")
        if t == "int":
            return int(raw)
        if t == "float":
            return float(raw)
        if t == "str":
            return raw
        # list[int], tuple[...], dict, None or unannotated: a Python literal, else the text.
        try:
            return ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            if t in ("", "none"):
                return raw
            raise ValueError(f"expected a Python literal of type {type_name}") from None
    except ValueError as exc:
        raise NotebookError(f"parameter {name}={raw!r}: {exc}") from None


def typed_parameters(
    pairs: Iterable[tuple[str, str]], infos: Sequence[NotebookInfo]
) -> dict[str, dict[str, Any]]:
    """Per notebook, the ``-p`` values it declares, typed through its parameters cell.

    A name that no selected notebook declares is an error (a typo must not be silently ignored).
    """
    per_nb: dict[str, dict[str, Any]] = {info.stem: {} for info in infos}
    for name, raw in pairs:
        if name in ("INTERACTIVE", "OUT_DIR"):
            raise NotebookError(f"parameter {name} is set by the runner and cannot be overridden")
        declared = [info for info in infos if name in info.parameters]
        if not declared:
            known = sorted({p for info in infos for p in info.parameters})
            raise NotebookError(
                f"parameter {name!r} is not declared by any selected notebook; known: {known}"
            )
        for info in declared:
            type_name = info.parameters[name].get("inferred_type_name")
            per_nb[info.stem][name] = coerce(name, raw, type_name)
    return per_nb


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------


@dataclass
class CellError:
    """Where a notebook failed: the cell index in the executed notebook and the exception."""

    cell: int
    execution_count: int | None
    ename: str
    evalue: str
    source_head: str = ""

    def __str__(self) -> str:
        return f"cell {self.cell} ({self.source_head!r}): {self.ename}: {self.evalue}"


@dataclass
class NotebookRun:
    """The outcome of executing one notebook."""

    name: str
    status: str  # "ok" | "failed"
    seconds: float
    executed: str
    out_dir: str
    html: str | None = None
    summary_path: str | None = None
    summary: dict[str, Any] | None = None
    figures: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    error: CellError | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("summary")
        return d


@dataclass
class RunResult:
    run_dir: Path
    index: Path
    notebooks: list[NotebookRun]

    @property
    def failed(self) -> list[NotebookRun]:
        return [r for r in self.notebooks if r.status != "ok"]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "index": str(self.index),
            "ok": len(self.notebooks) - len(self.failed),
            "failed": len(self.failed),
            "notebooks": [r.to_json() for r in self.notebooks],
        }


def require_kernel(kernel_name: str = KERNEL_NAME) -> None:
    """Fail early, and clearly, when the Jupyter kernel the runner needs is not installed."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        hint = "pip install ipykernel (it provides the 'python3' kernelspec)"
        raise NotebookError(f"Jupyter kernel {kernel_name!r} not found: {hint}") from None


def new_run_dir(out_root: Path) -> Path:
    """``out_root/<YYYYmmdd-HHMMSS>`` (a suffix keeps two runs in one second apart)."""
    out_root = Path(out_root)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = out_root / stamp
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = out_root / f"{stamp}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir


def write_plotlyjs(run_dir: Path) -> Path:
    """One offline copy of plotly.js for every figure of the run (see ``kdtree.nb.show``)."""
    from plotly.offline import get_plotlyjs

    path = Path(run_dir) / "plotly.min.js"
    if not path.exists():
        path.write_text(get_plotlyjs(), encoding="utf-8")
    return path


def _cell_error(exc: Exception) -> CellError:
    head = (getattr(exc, "source", "") or "").strip().splitlines()
    return CellError(
        cell=int(getattr(exc, "cell_index", -1)),
        execution_count=getattr(exc, "exec_count", None),
        ename=str(getattr(exc, "ename", type(exc).__name__)),
        evalue=str(getattr(exc, "evalue", exc)),
        source_head=head[0][:80] if head else "",
    )


def execute(
    path: Path,
    run_dir: Path,
    parameters: dict[str, Any] | None = None,
    *,
    kernel_name: str = KERNEL_NAME,
    timeout_s: float | None = None,
) -> NotebookRun:
    """Execute one notebook with papermill into ``run_dir`` (never raises for a failing cell)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path = Path(path)
    out_dir = run_dir / path.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = run_dir / path.name
    params = {**(parameters or {}), "INTERACTIVE": False, "OUT_DIR": str(out_dir)}
    t0 = time.perf_counter()
    error: CellError | None = None
    try:
        papermill.execute_notebook(
            str(path),
            str(executed),
            parameters=params,
            kernel_name=kernel_name,
            progress_bar=False,
            cwd=str(REPO_ROOT),
            execution_timeout=timeout_s,
        )
    except PapermillExecutionError as exc:
        error = _cell_error(exc)
    except Exception as exc:  # kernel died, timeout, bad notebook: record, keep going
        error = CellError(-1, None, type(exc).__name__, str(exc).strip()[:2000])
    seconds = time.perf_counter() - t0
    result = NotebookRun(
        name=path.stem,
        status="ok" if error is None else "failed",
        seconds=round(seconds, 2),
        executed=str(executed),
        out_dir=str(out_dir),
        parameters=params,
        error=error,
    )
    summary = out_dir / "summary.json"
    if summary.exists():
        result.summary_path = str(summary)
        try:
            result.summary = json.loads(summary.read_text())
        except json.JSONDecodeError as exc:
            result.summary = {"error": f"summary.json is not valid JSON: {exc}"}
    elif error is None:
        result.status = "failed"
        result.error = CellError(-1, None, "MissingSummary", f"{summary} was not written")
    result.figures = sorted(str(p) for p in out_dir.glob("*.html"))
    if executed.exists():
        result.html = render_html(executed)
    return result


def render_html(executed: Path) -> str | None:
    """Render an executed notebook to HTML next to it (None when nbconvert is missing).

    Plotly outputs carry a ``text/html`` fallback (an iframe of the saved figure, see
    ``kdtree.nb.show``), which is what nbconvert shows. CDN script tags are left out.
    """
    try:
        import nbformat
        from nbconvert import HTMLExporter
    except ImportError:
        return None
    exporter = HTMLExporter(mathjax_url="", require_js_url="", jquery_url="")
    exporter.embed_images = True
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    body = re.sub(r'<script[^>]*src="(https?://[^"]*)?"[^>]*>\s*</script>', "", body)
    out = executed.with_suffix(".html")
    out.write_text(body, encoding="utf-8")
    return str(out)


def run(
    paths: Sequence[Path],
    out_root: Path | str = "runs",
    parameters: dict[str, dict[str, Any]] | None = None,
    *,
    kernel_name: str = KERNEL_NAME,
    timeout_s: float | None = None,
    on_start: Callable[[Path], None] | None = None,
    on_done: Callable[[NotebookRun], None] | None = None,
) -> RunResult:
    """Execute notebooks in order into a fresh ``out_root/<timestamp>/`` and write index.html."""
    require_kernel(kernel_name)
    out_root = Path(out_root)
    if not out_root.is_absolute():
        out_root = Path.cwd() / out_root
    run_dir = new_run_dir(out_root)
    write_plotlyjs(run_dir)
    results: list[NotebookRun] = []
    for path in paths:
        if on_start:
            on_start(path)
        res = execute(
            path,
            run_dir,
            (parameters or {}).get(Path(path).stem, {}),
            kernel_name=kernel_name,
            timeout_s=timeout_s,
        )
        results.append(res)
        if on_done:
            on_done(res)
    result = RunResult(run_dir, run_dir / "index.html", results)
    write_index(result)
    (run_dir / "run.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    return result


# ---------------------------------------------------------------------------------------------
# index.html
# ---------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
.ok{color:#137333;font-weight:bold}.failed{color:#c5221f;font-weight:bold}
section{border-top:2px solid #eee;padding-top:.5em}code{font-size:90%}
"""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _summary_rows(summary: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for key, value in summary.items():
        if isinstance(value, dict) and len(value) <= 12 and not prefix:
            rows += _summary_rows(value, f"{key}.")
        else:
            rows.append((prefix + str(key), _fmt(value)))
    return rows


def _rel(path: str | None, base: Path) -> str | None:
    if not path:
        return None
    try:
        return Path(path).resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return Path(path).resolve().as_uri()


def write_index(result: RunResult) -> Path:
    """An offline index.html: one section per notebook with links, figures and its summary."""
    base = result.run_dir
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kdtree workbook run</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>kdtree workbook run {esc(base.name)}</h1>",
        f"<p>{len(result.notebooks) - len(result.failed)} ok, {len(result.failed)} failed. "
        "Each notebook ran headless with <code>INTERACTIVE=False</code>.</p>",
        "<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>files</th></tr>",
    ]
    for r in result.notebooks:
        links = [f"<a href='{esc(_rel(r.executed, base) or '')}'>ipynb</a>"]
        if r.html:
            links.append(f"<a href='{esc(_rel(r.html, base) or '')}'>html</a>")
        if r.summary_path:
            links.append(f"<a href='{esc(_rel(r.summary_path, base) or '')}'>summary.json</a>")
        parts.append(
            f"<tr><td><a href='#{esc(r.name)}'>{esc(r.name)}</a></td>"
            f"<td class='{r.status}'>{r.status}</td><td>{r.seconds:.1f}</td>"
            f"<td>{' · '.join(links)}</td></tr>"
        )
    parts.append("</table>")
    for r in result.notebooks:
        parts.append(f"<section id='{esc(r.name)}'><h2>{esc(r.name)}</h2>")
        if r.error:
            parts.append(f"<p class='failed'>failed at {esc(str(r.error))}</p>")
        if r.figures:
            figs = " · ".join(
                f"<a href='{esc(_rel(f, base) or '')}'>{esc(Path(f).stem)}</a>" for f in r.figures
            )
            parts.append(f"<p>figures: {figs}</p>")
        if r.summary:
            parts.append("<table><tr><th>summary key</th><th>value</th></tr>")
            parts += [
                f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in _summary_rows(r.summary)
            ]
            parts.append("</table>")
        parts.append("</section>")
    parts.append("</body></html>")
    result.index.write_text("\n".join(parts), encoding="utf-8")
    return result.index


# ---------------------------------------------------------------------------------------------
# strip and sync
# ---------------------------------------------------------------------------------------------


def strip_notebook(nb: Any) -> bool:
    """Remove outputs, execution counts and volatile metadata in place; True if anything changed."""
    changed = False
    keep_nb = {k: nb.metadata[k] for k in _KEEP_NB_METADATA if k in nb.metadata}
    if dict(nb.metadata) != keep_nb:
        nb.metadata = keep_nb
        changed = True
    for cell in nb.cells:
        keep = {k: cell.metadata[k] for k in _KEEP_CELL_METADATA if k in cell.metadata}
        if dict(cell.metadata) != keep:
            cell.metadata = keep
            changed = True
        if cell.cell_type == "code":
            if cell.get("outputs"):
                cell.outputs = []
                changed = True
            if cell.get("execution_count") is not None:
                cell.execution_count = None
                changed = True
    return changed


def strip(paths: Iterable[Path] | None = None, *, check: bool = False) -> list[Path]:
    """Strip notebooks (default: the series); return those that were (or, with check, would be)
    changed. With ``check=True`` nothing is written."""
    import nbformat

    changed: list[Path] = []
    for path in paths or notebook_paths():
        nb = nbformat.read(path, as_version=4)
        if strip_notebook(nb):
            changed.append(Path(path))
            if not check:
                nbformat.write(nb, path)
    return changed


PAIR_FORMATS = "ipynb,py:percent"


def _stable_ids(nb: Any, previous: Path) -> None:
    """Keep cell ids across syncs: reuse the id of an unchanged cell in the previous .ipynb,
    else derive one from the cell's position and source (no random ids, so no diff noise)."""
    import hashlib

    import nbformat

    old: dict[str, list[str]] = {}
    if previous.exists():
        for cell in nbformat.read(previous, as_version=4).cells:
            if cell.get("id"):
                old.setdefault(cell.cell_type + cell.source, []).append(cell.id)
    used: set[str] = set()
    for i, cell in enumerate(nb.cells):
        ids = old.get(cell.cell_type + cell.source)
        cid = ids.pop(0) if ids else ""
        if not cid or cid in used:
            digest = hashlib.sha1(f"{i}:{cell.source}".encode()).hexdigest()[:8]
            cid = f"c{i:02d}-{digest}"
        cell["id"] = cid
        used.add(cid)


def sync(directory: Path | None = None, *, prefer: str = "newer") -> list[tuple[Path, str]]:
    """Re-pair every ``NN_name.py`` (percent) with its stripped ``NN_name.ipynb``.

    ``prefer``: ``"newer"`` (the more recently modified side wins, as ``jupytext --sync``),
    ``"py"`` or ``"ipynb"``. Returns (stem path, the side used as source).
    """
    import jupytext
    import nbformat

    if prefer not in ("newer", "py", "ipynb"):
        raise NotebookError(f"prefer={prefer!r}: expected 'newer', 'py' or 'ipynb'")
    directory = Path(directory or NOTEBOOK_DIR)
    stems = sorted(
        {p.with_suffix("") for p in directory.glob("*.py")}
        | {p.with_suffix("") for p in directory.glob("*.ipynb")}
    )
    done: list[tuple[Path, str]] = []
    for stem in stems:
        if not _NAME_RE.match(stem.name):
            continue
        py, ipynb = stem.with_suffix(".py"), stem.with_suffix(".ipynb")
        if not py.exists():
            source = "ipynb"
        elif not ipynb.exists():
            source = "py"
        elif prefer == "newer":
            source = "py" if py.stat().st_mtime >= ipynb.stat().st_mtime else "ipynb"
        else:
            source = prefer
        nb = jupytext.read(py if source == "py" else ipynb)
        nb.metadata.setdefault("jupytext", {})["formats"] = PAIR_FORMATS
        nb.metadata["jupytext"].pop("text_representation", None)
        nb.metadata.setdefault(
            "kernelspec", {"display_name": "Python 3", "language": "python", "name": KERNEL_NAME}
        )
        jupytext.write(nb, py, fmt="py:percent")
        strip_notebook(nb)
        _stable_ids(nb, ipynb)
        nbformat.write(nbformat.from_dict(nb), ipynb)
        done.append((stem, source))
    return done
