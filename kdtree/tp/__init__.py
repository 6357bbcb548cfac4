"""Tensor parallelism for the target: heads, MLP / expert intermediates and the vocabulary split
over one process per device (``torchrun``; NCCL on GPUs, gloo on CPU), a distributed top-K for
the tree and a distributed argmax / rank-0 sampling for the walk.

```python
tp = kdtree.tp.init_from_env()                 # under torchrun; NVLink multicast off
target = kdtree.tp.shard_model(load_model(path), tp)   # or build_tp_model(config, tp, ...)
drafter = kdtree.tp.replicate_drafter(single_drafter, target)
res = kdtree.tp.generate_tp(target, drafter, prompts, mode="tree", budget=64, top_k=8)
```
"""

from kdtree.tp.decide import dist_argmax, dist_logsumexp, dist_target_tokens, dist_topk
from kdtree.tp.dist import (
    NVLS_OFF_ENV,
    CommTimer,
    TPGroup,
    disable_nvlink_multicast,
    free_port,
    init_from_env,
    new_tp_group,
)
from kdtree.tp.engine import TPSpecEngine, draft_local, generate_tp
from kdtree.tp.layers import (
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    VocabShard,
)
from kdtree.tp.model import (
    TPGQAForCausalLM,
    TPMLAMoEForCausalLM,
    TPMoE,
    kv_head_of_rank,
    local_config,
)
from kdtree.tp.shard import build_tp_model, replicate_drafter, shard_model, shard_tensor

__all__ = [
    "NVLS_OFF_ENV",
    "CommTimer",
    "RowParallelLinear",
    "TPGQAForCausalLM",
    "TPGroup",
    "TPMLAMoEForCausalLM",
    "TPMoE",
    "TPSpecEngine",
    "VocabParallelEmbedding",
    "VocabParallelLMHead",
    "VocabShard",
    "build_tp_model",
    "disable_nvlink_multicast",
    "dist_argmax",
    "dist_logsumexp",
    "dist_target_tokens",
    "dist_topk",
    "draft_local",
    "free_port",
    "generate_tp",
    "init_from_env",
    "kv_head_of_rank",
    "local_config",
    "new_tp_group",
    "replicate_drafter",
    "shard_model",
    "shard_tensor",
]
