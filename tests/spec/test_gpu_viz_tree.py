"""Tree figures: the layout is a valid drawing, the figures carry the data they were given."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

pytest.importorskip("plotly")

from kdtree.spec.gpu.tree_build import build_trees_device  # noqa: E402
from kdtree.spec.gpu.walk import walk_trees_device  # noqa: E402
from kdtree.spec.tree import draft_topk  # noqa: E402
from kdtree.viz.tree import make_tree_build_fig, make_tree_fig, tree_layout  # noqa: E402


def test_layout_depths_and_order():
    parents = [-1, 0, 0, 1, 1, 2, -1]  # last node is padding
    pos = tree_layout(parents)
    assert [p[0] for p in pos[:6]] == [0, 1, 1, 2, 2, 2]
    assert math.isnan(pos[6][0])
    assert pos[1][1] == (pos[3][1] + pos[4][1]) / 2  # parent centred over its children
    assert len({p[1] for p in pos[3:6]}) == 3  # leaves on distinct rows


def test_tree_fig_highlights_accepted_path(gen):
    lp, tok = draft_topk(torch.randn(1, 5, 40, generator=gen) * 3, 3)
    dt = build_trees_device(lp, tok, 12, torch.tensor([7]), backend="torch")
    post = torch.randint(0, 40, (1, 13), generator=gen)
    post[0, 0] = dt.tokens[0, 1]  # the walk accepts at least node 1
    acc = walk_trees_device(dt, post)
    path = acc.path[0, : int(acc.count[0])].tolist()
    fig = make_tree_fig(
        dt.tokens[0],
        dt.parents[0],
        scores=dt.scores[0],
        accepted_path=path,
        decode=lambda t: f"t{t}",
    )
    nodes = fig.data[-1]
    assert len(nodes.x) == int(dt.n_nodes[0])
    highlighted = fig.data[1]
    assert sum(v is None for v in highlighted.x) == len(path) - 1  # one segment per path edge
    with pytest.raises(ValueError, match="accepted_path"):
        make_tree_fig(dt.tokens[0], dt.parents[0], accepted_path=[0, 99])


def test_tree_build_fig_from_rows():
    rows = []
    for prov, base in (("heap", 1.0), ("device_torch", 0.05)):
        for batch in (1, 8):
            for B in (16, 64):
                rows.append(
                    dict(
                        name=f"tree_build_b{batch}",
                        provider=prov,
                        metric="time",
                        unit="ms",
                        x_value=B,
                        p50=base * B * batch,
                        p20=base * B * batch,
                        p80=base * B * batch,
                        device="cpu",
                    )
                )
    fig = make_tree_build_fig(pd.DataFrame(rows))
    assert len(fig.data) == 4
    assert sorted(fig.data[0].x) == [16, 64]
    with pytest.raises(ValueError, match="metric"):
        make_tree_build_fig(pd.DataFrame(rows), metric="speedup_vs_heap")
