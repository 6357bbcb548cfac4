"""At Kimi-K2 scale: a shape-faithful slice of one TP8 rank, per-layer verify timing, the
61-layer extrapolation, MoE expert load under tree verify, and a cost-aware budget policy.

Modules: ``spec`` (shapes, TP8 sharding, bytes, memory check), ``slice`` (build the slice and
its verify inputs), ``moe`` (grouped expert execution), ``routing`` (expert-load statistics),
``layer_timing`` (time one layer's parts), ``extrapolate`` (decode step at 61 layers + TP8
all-reduces), ``budget`` (latency models, the cost-aware policy, offline simulation),
``record`` (engines that record trees, paths and routing), ``bench`` (benchmark rows).
"""

from kdtree.scale.spec import K2_REFERENCE, K2RankSpec, ShapeDoesNotFitError, check_fits

__all__ = ["K2_REFERENCE", "K2RankSpec", "ShapeDoesNotFitError", "check_fits"]
