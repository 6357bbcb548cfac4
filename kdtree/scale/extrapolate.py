"""From measured per-layer times to a modelled decode step of the whole model on TP8.

``step = first_dense · dense_layer(T, L) + n_moe · moe_layer(T, L) + lm_head(T)
        + 2 · n_layers · all_reduce(T · hidden · 2 bytes)``

The per-layer times are *measured* on one rank's slice (one GPU); the all-reduces are
*modelled* (a GPU cannot measure NVLink traffic it does not have): ring all-reduce time
``latency + 2 (n-1)/n · bytes / bus_bandwidth`` with the link's parameters stated in
:class:`LinkModel`. Everything the model adds is labelled ``modelled`` in its output.

``what_if`` rescales a step to another machine (the original investigation: TP8 on RTX PRO 6000
Blackwell, PCIe, int4 experts): expert time × (expert bytes ratio) × (bandwidth ratio), other
GPU time × bandwidth ratio, all-reduces on the other link. A first-order what-if, not a
measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from kdtree.scale.spec import K2RankSpec

__all__ = [
    "H200_NVLINK",
    "INVESTIGATION",
    "PCIE5_X16",
    "LinkModel",
    "MachineWhatIf",
    "RTX_PRO_6000_INT4",
    "StepModel",
    "allreduce_ms",
    "what_if",
]


@dataclass(frozen=True)
class LinkModel:
    """A TP interconnect for the all-reduce model: per-GPU bus bandwidth (GB/s, one direction,
    what NCCL's ``busbw`` reports at large messages) and a per-call latency (µs)."""

    name: str
    bus_GBps: float  # noqa: N815
    latency_us: float
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


H200_NVLINK = LinkModel(
    "H200 HGX NVLink 4 (NVSwitch)",
    bus_GBps=360.0,
    latency_us=8.0,
    note="modelled: 450 GB/s per direction nominal, ~80 % as NCCL busbw; ~8 µs per small "
    "all-reduce (custom/one-shot all-reduce class)",
)
PCIE5_X16 = LinkModel(
    "PCIe 5.0 x16, no NVLink",
    bus_GBps=40.0,
    latency_us=20.0,
    note="modelled: 64 GB/s per direction nominal, ~40 GB/s busbw through the host bridge; "
    "~20 µs per small all-reduce",
)


def allreduce_ms(nbytes: float, n_ranks: int, link: LinkModel) -> float:
    """Modelled ring all-reduce time in ms: ``latency + 2 (n-1)/n · bytes / bus_bandwidth``."""
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes}: expected >= 0")
    if n_ranks < 1:
        raise ValueError(f"n_ranks={n_ranks}: expected >= 1")
    if n_ranks == 1:
        return 0.0
    wire = 2.0 * (n_ranks - 1) / n_ranks * nbytes / (link.bus_GBps * 1e9)
    return link.latency_us * 1e-3 + wire * 1e3


#: A layer-time function: ``(kind, T, L) -> {part: ms}`` with kind "dense" or "moe"; the
#: "experts" part (MoE) is kept separate so what-ifs can rescale it.
LayerTimeFn = Callable[[str, int, int], dict[str, float]]


@dataclass
class StepModel:
    """A decode (verify) step of the whole model on one TP rank, from measured layer parts."""

    spec: K2RankSpec
    layer_ms: LayerTimeFn
    lm_head_ms: Callable[[int], float]
    link: LinkModel = H200_NVLINK
    allreduces_per_layer: int = 2
    act_bytes: int = 2

    def parts(self, t: int, context: int) -> dict[str, float]:
        """ms per step by part: ``dense_layers``, ``moe_attention``, ``moe_experts``,
        ``moe_other``, ``lm_head``, ``allreduce`` (modelled) and ``total``."""
        s = self.spec
        dense = self.layer_ms("dense", t, context) if s.first_dense else {}
        moe = self.layer_ms("moe", t, context) if s.n_moe_layers else {}
        out = {
            "dense_layers": s.first_dense * sum(dense.values()),
            "moe_attention": s.n_moe_layers
            * sum(v for k, v in moe.items() if k.startswith("attn")),
            "moe_experts": s.n_moe_layers * moe.get("experts", 0.0),
            "moe_other": s.n_moe_layers
            * sum(v for k, v in moe.items() if not k.startswith("attn") and k != "experts"),
            "lm_head": self.lm_head_ms(t),
            "allreduce": self.allreduces_per_layer
            * s.n_layers
            * allreduce_ms(t * s.hidden * self.act_bytes, s.tp, self.link),
        }
        out["total"] = sum(out.values())
        return out

    def step_ms(self, t: int, context: int) -> float:
        return self.parts(t, context)["total"]

    def tokens_per_s(self, t: int, context: int, tau: float) -> float:
        """Decode tokens/s when a step of ``t`` verify tokens accepts ``tau`` on average
        (drafting and host work not included: state it next to the number)."""
        return tau / (self.step_ms(t, context) * 1e-3)


@dataclass(frozen=True)
class MachineWhatIf:
    """Another machine for a first-order what-if of a modelled step."""

    name: str
    bandwidth_TBps: float  # noqa: N815
    expert_bytes_ratio: float  # expert bytes there / bf16 bytes here
    link: LinkModel
    note: str = ""


RTX_PRO_6000_INT4 = MachineWhatIf(
    "TP8 RTX PRO 6000 Blackwell, int4 experts",
    bandwidth_TBps=1.79,
    expert_bytes_ratio=4.25 / 16.0,
    link=PCIE5_X16,
    note="GDDR7 1.79 TB/s vs HBM3e 4.8 TB/s; int4 experts with a bf16 scale per 64 weights "
    "(4.25 bits) instead of bf16; PCIe instead of NVLink",
)
H200_BANDWIDTH_TBPS = 4.8

#: The original investigation's measurement this model is set beside.
INVESTIGATION = {
    "tokens_per_s": 5.2,
    "context": 46_000,
    "setup": "Kimi-K2-class, TP8 on RTX PRO 6000 Blackwell (PCIe), int4 experts, DFlash + "
    "DDTree, batch 1 (measured in the original investigation, not here)",
}


def what_if(parts: dict[str, float], machine: MachineWhatIf, model: StepModel, t: int) -> dict:
    """``parts`` (from :meth:`StepModel.parts`) rescaled to ``machine``; every key modelled."""
    bw = H200_BANDWIDTH_TBPS / machine.bandwidth_TBps
    s = model.spec
    out = {
        "dense_layers": parts["dense_layers"] * bw,
        "moe_attention": parts["moe_attention"] * bw,
        "moe_experts": parts["moe_experts"] * bw * machine.expert_bytes_ratio,
        "moe_other": parts["moe_other"] * bw,
        "lm_head": parts["lm_head"] * bw,
        "allreduce": model.allreduces_per_layer
        * s.n_layers
        * allreduce_ms(t * s.hidden * model.act_bytes, s.tp, machine.link),
    }
    out["total"] = sum(out.values())
    return out
