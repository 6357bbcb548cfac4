"""Acceptance walk on the device: accepted path, count and bonus for a batch, no host sync.

A node is accepted when it and all its ancestors carry the target's token at their parent
(``tokens[j] == post[parent[j]]``). With the packed ancestor bitmask that is one test per node:
``mask[j] & ~matched == 0``. Siblings carry distinct tokens (distinct top-K ranks), so the
accepted nodes form one root-to-node chain; node ``j`` sits at path slot ``depth[j]``. The new
bonus is the target's token at the deepest accepted node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdtree.spec.bitmask import pack_bits
from kdtree.spec.gpu.tree_build import DeviceTree

__all__ = ["DeviceAcceptance", "sample_tokens_device", "walk_trees_device"]


@dataclass
class DeviceAcceptance:
    """Walk result on the device. ``path [B, P]``: accepted node indices by depth (root 0
    first), ``-1`` beyond ``count``; ``count [B]``: accepted nodes including the root (τ);
    ``bonus [B]``: the next root token; ``accepted bool [B, T]``."""

    path: torch.Tensor
    count: torch.Tensor
    bonus: torch.Tensor
    accepted: torch.Tensor


def walk_trees_device(
    tree: DeviceTree, post: torch.Tensor, max_path: int | None = None
) -> DeviceAcceptance:
    """Walk every tree with the target's tokens ``post int64 [B, T]`` (one per node).

    ``max_path`` is the static path width ``P`` (default ``T``); use ``max depth + 1``.
    """
    B, T = tree.tokens.shape
    if post.shape != (B, T):
        raise ValueError(
            f"post: expected target tokens of shape {(B, T)}, got {tuple(post.shape)}"
        )
    if post.device != tree.tokens.device:
        raise ValueError(
            f"post: on {post.device}, expected the tree's device {tree.tokens.device}"
        )
    P = T if max_path is None else int(max_path)
    if not 1 <= P <= T:
        raise ValueError(f"max_path={max_path}: expected 1 <= max_path <= T={T}")
    post = post.to(torch.int64)
    par = tree.parents.clamp(min=0)
    at_parent = post.gather(1, par)
    matched = (tree.tokens == at_parent) & (tree.parents >= 0)
    matched[:, 0] = True  # the root is always kept
    bad = pack_bits(~matched)  # [B, W]
    accepted = ((tree.mask & bad.unsqueeze(1)) == 0).all(dim=-1) & tree.valid
    count = accepted.sum(dim=1)
    slot = torch.where(accepted & (tree.depths < P), tree.depths, P)
    path = torch.full((B, P + 1), -1, dtype=torch.int64, device=post.device)
    node = torch.arange(T, device=post.device).unsqueeze(0).expand(B, T)
    path.scatter_(1, slot, torch.where(slot < P, node, -1))
    path = path[:, :P]
    last = path.gather(1, (count - 1).clamp(min=0, max=P - 1).unsqueeze(1))
    bonus = post.gather(1, last.clamp(min=0)).squeeze(1)
    return DeviceAcceptance(path=path, count=count, bonus=bonus, accepted=accepted)


def sample_tokens_device(
    logits: torch.Tensor,
    temperature: float,
    *,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The target's token at every node, ``logits [B, T, V]`` → ``int64 [B, T]``, on device.

    ``temperature == 0``: argmax. ``> 0``: inverse-CDF sampling of ``softmax(logits / temp)``
    (fp32) with one uniform per node — ``uniforms [B, T]`` pre-drawn in ``[0, 1)`` (what a
    CUDA graph replays from a buffer), else drawn with ``generator``.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits: expected [B, T, V], got shape {tuple(logits.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: expected >= 0")
    if temperature == 0:
        return logits.argmax(dim=-1)
    B, T, V = logits.shape
    if uniforms is None:
        uniforms = torch.rand(B, T, generator=generator, device=logits.device)
    if uniforms.shape != (B, T):
        raise ValueError(f"uniforms: expected shape {(B, T)}, got {tuple(uniforms.shape)}")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    cdf = probs.cumsum(dim=-1)
    u = (uniforms.float() * cdf[..., -1]).unsqueeze(-1)
    tok = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    # never pick a zero-probability tail token through rounding of the last bins
    return tok.clamp(max=V - 1)
