"""``kdtree.notebooks`` and ``kdtree notebooks``: selection, typed parameters, strip, sync and
a real papermill run of two throwaway notebooks (one failing) through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import jupytext
import nbformat
import pytest
from typer.testing import CliRunner

from kdtree import notebooks as nbr
from kdtree.cli.notebooks import app

_PY = """# %% [markdown]
# # {nn} · Throwaway
# **Question:** does the runner record {what}?

# %%
import plotly.graph_objects as go

from kdtree import nb

# %% tags=["parameters"]
DEVICE: str = "auto"  # "auto", "cpu" or "cuda"
SEED: int = 0  # seed
INTERACTIVE: bool = True  # widgets
OUT_DIR: str = "runs/x"  # outputs
N: int = 3  # points
SCALE: float = 1.0  # y scale
FAIL: str = ""  # fail when OUT_DIR contains this (non-empty) text

# %%
ctx = nb.setup(device=DEVICE, seed=SEED, out_dir=OUT_DIR)

# %%
nb.show(go.Figure(go.Scatter(x=list(range(N)), y=[SCALE * i for i in range(N)])), "line")

# %% [markdown]
# ## Conclusions

# %%
assert not FAIL or FAIL not in OUT_DIR, "failing on purpose"
nb.write_summary({{"n": N, "scale": SCALE, "interactive": INTERACTIVE}})
"""


@pytest.fixture
def series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "notebooks"
    d.mkdir()
    (d / "01_alpha.py").write_text(_PY.format(nn="01", what="success"))
    (d / "02_beta.py").write_text(_PY.format(nn="02", what="a failure"))
    (d / "README.md").write_text("not a notebook")
    nbr.sync(d)
    monkeypatch.setattr(nbr, "NOTEBOOK_DIR", d)
    return d


def test_sync_creates_stripped_pairs_with_stable_ids(series: Path):
    ipynb = series / "01_alpha.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert not nbr.strip_notebook(nb)
    assert "parameters" in nb.cells[2].metadata["tags"]
    before = ipynb.read_text()
    nbr.sync(series, prefer="py")
    assert ipynb.read_text() == before, "re-syncing an unchanged .py must not change the .ipynb"
    a = [(c.cell_type, c.source) for c in jupytext.read(ipynb).cells]
    b = [(c.cell_type, c.source) for c in jupytext.read(series / "01_alpha.py").cells]
    assert a == b


def test_strip_removes_outputs_and_counts(series: Path):
    path = series / "01_alpha.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hi")]
    nb.cells[1].execution_count = 7
    nb.cells[1].metadata["papermill"] = {"duration": 1}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    assert nbr.strip([path], check=True) == [path]
    assert nbr.strip([path]) == [path]
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[1].outputs == [] and nb.cells[1].execution_count is None
    assert "papermill" not in nb.cells[1].metadata and "language_info" not in nb.metadata
    assert nbr.strip([path], check=True) == []


def test_resolve_by_number_and_name(series: Path):
    assert [p.stem for p in nbr.resolve(["2", "01"])] == ["01_alpha", "02_beta"]
    assert [p.stem for p in nbr.resolve(["02_be"])] == ["02_beta"]
    with pytest.raises(nbr.NotebookError, match="matches no notebook"):
        nbr.resolve(["07"])
    with pytest.raises(nbr.NotebookError, match="no notebook selected"):
        nbr.resolve([])


def test_parameters_are_typed_by_the_parameters_cell(series: Path):
    infos = nbr.discover(series)
    assert infos[0].question == "does the runner record success?"
    typed = nbr.typed_parameters([("N", "5"), ("SCALE", "2.5"), ("FAIL", "x")], infos)
    assert typed["01_alpha"] == {"N": 5, "SCALE": 2.5, "FAIL": "x"}
    assert nbr.coerce("B", "off", "bool") is False and nbr.coerce("B", "1", "bool") is True
    with pytest.raises(nbr.NotebookError, match="not declared"):
        nbr.typed_parameters([("NOPE", "1")], infos)
    with pytest.raises(nbr.NotebookError, match="N='five'"):
        nbr.typed_parameters([("N", "five")], infos)
    with pytest.raises(nbr.NotebookError, match="true/false"):
        nbr.coerce("B", "maybe", "bool")
    with pytest.raises(nbr.NotebookError, match="set by the runner"):
        nbr.typed_parameters([("INTERACTIVE", "1")], infos)


def test_coerce_literals():
    assert nbr.coerce("X", "[1, 2]", "list[int]") == [1, 2]
    assert nbr.coerce("X", "abc", None) == "abc"
    with pytest.raises(nbr.NotebookError, match="literal"):
        nbr.coerce("X", "[1,", "list[int]")


def test_missing_kernel_is_a_clear_error():
    with pytest.raises(nbr.NotebookError, match="pip install ipykernel"):
        nbr.require_kernel("no-such-kernel-kdtree")


def test_cli_rejects_bad_arguments(series: Path):
    runner = CliRunner()
    res = runner.invoke(app, ["run", "01", "-p", "N"])
    assert res.exit_code == 2 and "two values" in res.output
    res = runner.invoke(app, ["run", "--all", "01"])
    assert res.exit_code == 2 and "not both" in res.output
    res = runner.invoke(app, ["run", "09"])
    assert res.exit_code == 2 and "matches no notebook" in res.output


@pytest.mark.notebook
def test_cli_run_records_failure_and_keeps_going(series: Path, tmp_path: Path):
    out = tmp_path / "runs"
    args = ["run", "--all", "-p", "N", "4", "-p", "SCALE", "3", "-p", "FAIL", "01_alpha"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output.strip().splitlines()[-1])
    assert [n["status"] for n in doc["notebooks"]] == ["failed", "ok"]  # 02 ran after 01 failed
    assert doc["ok"] == 1 and doc["failed"] == 1
    err = doc["notebooks"][0]["error"]
    assert err["ename"] == "AssertionError" and "failing on purpose" in err["evalue"]
    assert err["cell"] > 0 and "01_alpha" in res.output
    run_dir = Path(doc["run_dir"])
    assert run_dir.parent == out
    index = (run_dir / "index.html").read_text()
    assert "failed at cell" in index
    summary = json.loads((run_dir / "02_beta" / "summary.json").read_text())
    assert summary["n"] == 4 and summary["scale"] == 3.0 and summary["interactive"] is False
    assert "02_beta/summary.json" in index and "02_beta/line.html" in index
    for name in ("01_alpha", "02_beta"):
        assert f"{name}.ipynb" in index and (run_dir / f"{name}.html").exists()
        fig = (run_dir / name / "line.html").read_text()
        assert 'src="../plotly.min.js"' in fig and "cdn" not in fig.lower()
    assert (run_dir / "plotly.min.js").stat().st_size > 1_000_000
