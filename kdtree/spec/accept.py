"""Acceptance walk: follow the target's own tokens down the draft tree.

At every node the target proposes one token (argmax at temperature 0, else one sample from
``softmax(logits / T)`` drawn with a private generator). Starting at the root, the walk moves to
the child carrying that token; the first token without a matching child is the new bonus. The
tree is fixed before the target's randomness is drawn and every emitted token is a fresh sample
from the target at its accepted prefix, so the output is distributed exactly as plain
autoregressive sampling (lossless at any temperature). A chain is the tree with K = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kdtree.spec.tree import Tree

__all__ = ["Acceptance", "target_tokens", "walk_tree", "walk_trees"]


@dataclass(frozen=True)
class Acceptance:
    """One request's walk: ``path`` = accepted node indices (root 0 first, increasing),
    ``accepted_len`` = ``len(path)`` (τ, counts the root), ``bonus`` = the next root token."""

    path: tuple[int, ...]
    bonus: int

    @property
    def accepted_len(self) -> int:
        return len(self.path)


def target_tokens(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The target's token at every node: ``logits [B, T, V]`` → ``int64 [B, T]``.

    ``temperature == 0``: argmax. ``> 0``: an independent sample per node from
    ``softmax(logits / temperature)`` (fp32) drawn with ``generator``.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits: expected [B, T, V], got shape {tuple(logits.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: expected >= 0")
    if temperature == 0:
        return logits.argmax(dim=-1)
    B, T, V = logits.shape
    probs = torch.softmax(logits.float() / temperature, dim=-1).reshape(B * T, V)
    if generator is not None and generator.device != probs.device:
        raise ValueError(
            f"generator: on {generator.device}, expected the logits' device {probs.device}"
        )
    return torch.multinomial(probs, 1, generator=generator).reshape(B, T)


def walk_tree(tree: Tree, post: Sequence[int]) -> Acceptance:
    """Walk one tree with the target's tokens ``post`` (one per node, at least ``tree.size``)."""
    if len(post) < tree.size:
        raise ValueError(f"post: expected {tree.size} target tokens, got {len(post)}")
    cur, path = 0, [0]
    children = tree.children
    while True:
        nxt = children[cur].get(int(post[cur]))
        if nxt is None:
            return Acceptance(tuple(path), int(post[cur]))
        cur = nxt
        path.append(cur)


def walk_trees(trees: Sequence[Tree], post: torch.Tensor) -> list[Acceptance]:
    """Batched walk: one host copy of ``post int64 [B, T]``, then a walk per request."""
    if post.dim() != 2 or post.shape[0] != len(trees):
        raise ValueError(
            f"post: expected [{len(trees)}, T] target tokens, got shape {tuple(post.shape)}"
        )
    rows = post.tolist()
    return [walk_tree(tree, row) for tree, row in zip(trees, rows, strict=True)]
