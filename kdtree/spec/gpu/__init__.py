"""The decode step on the device (issue 5): tree build, verify inputs, walk, one-launch KV commit
and the CUDA-graph step runner. Nothing here reads a device value on the host per step."""

from kdtree.spec.gpu.commit import CommitPlan, commit_kv, commit_slots, make_commit_plan
from kdtree.spec.gpu.tree_build import DeviceTree, build_trees_device
from kdtree.spec.gpu.verify_inputs import DeviceVerifyBuffers, reserve_ahead
from kdtree.spec.gpu.walk import DeviceAcceptance, sample_tokens_device, walk_trees_device

__all__ = [
    "CommitPlan",
    "DeviceAcceptance",
    "DeviceTree",
    "DeviceVerifyBuffers",
    "GraphStepRunner",
    "build_trees_device",
    "commit_kv",
    "commit_slots",
    "make_commit_plan",
    "reserve_ahead",
    "sample_tokens_device",
    "walk_trees_device",
]


def __getattr__(name: str):
    if name == "GraphStepRunner":  # imports the engine stack: resolved lazily
        from kdtree.spec.gpu.runner import GraphStepRunner

        return GraphStepRunner
    raise AttributeError(f"module 'kdtree.spec.gpu' has no attribute {name!r}")
