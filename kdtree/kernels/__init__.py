"""Triton kernels, each next to its torch reference, registered as attention backends.

Importing this package registers backend ``"triton"`` for kinds ``"gqa"`` and ``"mla"`` with
:mod:`kdtree.attention`. It imports on a CPU-only machine (Triton then runs only under
``TRITON_INTERPRET=1``); calling a kernel on a CPU tensor without the interpreter raises.
"""

from kdtree.kernels.heuristics import MAX_TREE_TOKENS, TileConfig
from kdtree.kernels.tree_attention import (
    clear_caches,
    tree_attention_mla_triton,
    tree_attention_triton,
)
from kdtree.kernels.workspace import TreeAttentionPlan

__all__ = [
    "MAX_TREE_TOKENS",
    "TileConfig",
    "TreeAttentionPlan",
    "clear_caches",
    "tree_attention_mla_triton",
    "tree_attention_triton",
]


def _register() -> None:
    from kdtree.attention import register_backend

    register_backend("gqa", "triton", tree_attention_triton)
    register_backend("mla", "triton", tree_attention_mla_triton)
    # the sm_90 CUDA C++ kernels register backend "cuda": kernels/mla_tree_sm90.cu for kind
    # "mla" ("auto" picks it for 512 + 64 in bf16 / fp16 on sm_90,
    # kdtree.attention.resolve_backend), kernels/gqa_tree_sm90.cu for kind "gqa" (head dim 128
    # in bf16 / fp16); each is built with nvcc on first call
    from kdtree.kernels import cuda_gqa, cuda_mla  # noqa: F401


_register()
