"""The notebook series: each runs headless, writes its summary, keeps the conventions.

Execution cases carry the ``notebook`` marker (part of the default suite); the structural checks
(pairs agree, parameters cell, cell order, stripped) are fast and unmarked.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jupytext
import nbformat
import papermill
import pytest

from kdtree import notebooks as nbr

NOTEBOOKS = nbr.notebook_paths()
IDS = [p.stem for p in NOTEBOOKS]

#: The keys each notebook's summary.json must carry (besides "env", added by nb.write_summary).
EXPECTED_KEYS = {
    "01_dram_traces": {
        "source",
        "gpu_data_shipped",
        "n_bursts",
        "n_gaps",
        "duty_cycle",
        "idle_fraction",
        "attribution",
    },
    "02_hypotheses": {
        "source",
        "gpu_data_shipped",
        "contexts",
        "verdicts",
        "step_ms",
        "mask_build_ms_at_max_context",
    },
    "03_verify_kernel": {"source", "gpu_data_shipped", "correctness", "speed", "backends"},
    "04_tree_build": {
        "source",
        "gpu_data_shipped",
        "tree_size",
        "accepted_len",
        "budgets",
        "tau_by_budget",
        "heap_ms",
        "device_builder_ms",
        "builders_agree",
    },
    "05_end_to_end_decode": {
        "source",
        "gpu_data_shipped",
        "modes",
        "decode_tok_s",
        "tau",
        "phase_share",
        "speedup_vs_ar",
    },
    "06_moe_and_scale": {
        "source",
        "gpu_data_shipped",
        "step_modelled",
        "distinct_experts",
        "mini_routing",
        "budget",
        "live",
    },
}


def test_series_is_complete():
    assert sorted(EXPECTED_KEYS) == IDS, f"notebooks/ holds {IDS}"
    for p in NOTEBOOKS:
        assert p.with_suffix(".py").exists(), f"{p.name} has no paired .py"


def _cells(path: Path) -> list[tuple[str, str]]:
    nb = jupytext.read(path)
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_pair_agrees(path: Path):
    assert _cells(path) == _cells(path.with_suffix(".py")), (
        f"{path.name} and its .py differ: run 'kdtree notebooks sync'"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_notebook_is_stripped(path: Path):
    nb = nbformat.read(path, as_version=4)
    assert not nbr.strip_notebook(nb), f"{path.name} has outputs/metadata: kdtree notebooks strip"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_parameters_cell_has_standard_names(path: Path):
    params = papermill.inspect_notebook(str(path))
    cell = next(
        c
        for c in nbformat.read(path, as_version=4).cells
        if "parameters" in c.metadata.get("tags", [])
    )
    declared = [n.target.id for n in ast.parse(cell.source).body]
    assert list(params) == declared, "papermill could not parse some lines (avoid '=' in help)"
    for name, type_name in (
        ("DEVICE", "str"),
        ("SEED", "int"),
        ("INTERACTIVE", "bool"),
        ("OUT_DIR", "str"),
    ):
        assert name in params, f"{path.name}: parameters cell lacks {name}"
        assert params[name]["inferred_type_name"] == type_name, (name, params[name])
    assert params["DEVICE"]["default"] == '"auto"'
    for p in params.values():
        assert p["help"], f"{path.name}: parameter {p['name']} has no '# help' comment"
        assert p["inferred_type_name"] not in (None, "None"), f"{p['name']} is not typed"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_cell_order(path: Path):
    cells = nbformat.read(path, as_version=4).cells
    title, imports, params, resolve = cells[:4]
    assert title.cell_type == "markdown" and title.source.startswith(f"# {path.stem[:2]}")
    assert "**Question:**" in title.source
    assert nbr.question_of(nbformat.read(path, as_version=4))
    tree = ast.parse(imports.source)
    assert all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body), "imports only"
    assert "parameters" in params.metadata.get("tags", [])
    for node in ast.parse(params.source).body:  # typed constants, nothing derived
        assert isinstance(node, ast.AnnAssign), ast.unparse(node)
        ast.literal_eval(node.value)  # a literal: raises for anything computed
    assert "nb.setup(" in resolve.source
    md = [i for i, c in enumerate(cells) if c.cell_type == "markdown"]
    concl = [i for i in md if cells[i].source.startswith("## Conclusions")]
    assert concl, "no '## Conclusions' section"
    last = cells[-1]
    assert concl[-1] < len(cells) - 1 and "write_summary(" in last.source
    assert "assert" in last.source or "nb.check(" in last.source
    for c in cells:
        if c.cell_type == "code":
            n = len(c.source.strip().splitlines())
            assert n <= 40, f"{path.name}: a {n}-line cell; move the logic into kdtree/"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_headless(path: Path, tmp_path: Path):
    nbr.require_kernel("python3")
    out = tmp_path / path.stem
    papermill.execute_notebook(
        str(path),
        str(tmp_path / path.name),
        kernel_name="python3",
        progress_bar=False,
        parameters={"INTERACTIVE": False, "OUT_DIR": str(out)},
        cwd=str(nbr.REPO_ROOT),
    )
    summary = json.loads((out / "summary.json").read_text())
    missing = EXPECTED_KEYS[path.stem] - set(summary)
    assert not missing, f"{path.name}: summary.json lacks {sorted(missing)}"
    assert summary["env"]["device"] in ("cpu", "cuda")
    assert list(out.glob("*.html")), "no figure saved"
