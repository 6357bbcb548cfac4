"""Named sizes for the trained pair: ``h200`` (the shipped GPU run), ``cpu`` (interim model
trained on a 2-core CPU), ``toy`` (seconds; tests and the end-to-end smoke run).

Each preset fixes the target architecture (DeepSeek-V3 style MLA + MoE, first layer dense,
8 routed experts top-2 + 1 shared), the drafter shape and the step/batch/length knobs.

``steps`` is an upper bound: :func:`planned_steps` cuts it to ``max_epochs`` passes over the data
actually found (the stdlib differs between interpreters), and early stopping on held-out data
(``eval_every``, ``patience``) ends a run whose validation score stopped improving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class TargetPreset:
    hidden_size: int
    num_layers: int
    heads: int
    dense_intermediate: int
    moe_intermediate: int
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head: int
    seq_len: int
    batch_size: int
    lr: float
    steps: int
    eval_batches: int = 8
    n_routed_experts: int = 8
    experts_per_tok: int = 2
    tie_embeddings: bool = True
    #: cap on passes over the training tokens (None: ``steps`` alone decides)
    max_epochs: float | None = None
    #: evaluate at most every this many steps (and at least ``min_evals`` times per run)
    eval_every: int = 250
    min_evals: int = 16
    #: stop after this many evaluations without a new best validation loss (0: never)
    patience: int = 3
    weight_decay: float = 0.1
    #: training tokens a full stdlib gives; far fewer is warned about (0: no check)
    expected_train_tokens: int = 0
    #: long-context extension after the main run (DeepSeek-V3 style: a short-window run, then
    #: a phase on long windows): window lengths visited in turn, () for none. A model trained
    #: on ``seq_len`` windows alone falls apart past them (the h200 target after its 1k-window
    #: run: held-out loss on a window's last 512 tokens 3.3 at 1k, 6.1-6.9 at 4k-64k windows)
    extend_seq_lens: tuple[int, ...] = ()
    #: tokens per extension step (batch = tokens // length, at least 1)
    extend_tokens_per_step: int = 65536
    extend_steps: int = 0
    extend_lr: float = 5e-4
    #: share of the target stage's wall-clock budget given to the extension
    extend_budget_share: float = 0.4
    #: held-out loss measured on the last ``extend_tail`` tokens of each window length
    extend_tail: int = 512


@dataclass(frozen=True)
class DrafterPreset:
    num_layers: int
    block_size: int
    n_taps: int
    intermediate: int
    # generation of training data with the trained target
    gen_prompt_len: int
    gen_new_tokens: int
    gen_batch: int
    gen_sequences: int
    # training
    batch_size: int
    anchors_per_seq: int
    lr: float
    steps: int
    kl_weight: float = 0.0
    #: share of the generated sequences (and of the selection set) whose prompt ends just past
    #: a function's docstring (:mod:`kdtree.train.docprompts`), the shape of a HumanEval prompt;
    #: the rest continue random windows of the corpus
    gen_doc_share: float = 0.0
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    eval_sequences: int = 64
    #: cap on passes over the generated tokens, counted in anchor blocks seen per generated
    #: token (None: ``steps`` alone decides)
    max_epochs: float | None = None
    #: held-out greedy sequences (from validation prompts) that select the best drafter
    select_sequences: int = 64
    eval_every: int = 200
    min_evals: int = 12
    patience: int = 3
    weight_decay: float = 0.1


@dataclass(frozen=True)
class Preset:
    name: str
    target: TargetPreset
    drafter: DrafterPreset
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    "h200": Preset(
        "h200",
        TargetPreset(
            hidden_size=256,
            num_layers=6,
            heads=4,
            dense_intermediate=640,
            moe_intermediate=112,
            kv_lora_rank=64,
            qk_nope=32,
            qk_rope=16,
            v_head=32,
            seq_len=1024,
            batch_size=32,
            lr=2e-3,
            steps=4000,
            eval_batches=8,
            max_epochs=6.0,
            eval_every=100,
            patience=3,
            weight_decay=0.2,
            expected_train_tokens=7_000_000,
            extend_seq_lens=(4096, 16384, 65536),
            extend_tokens_per_step=65536,
            extend_steps=600,
            extend_lr=5e-4,
            extend_budget_share=0.4,
        ),
        DrafterPreset(
            num_layers=2,
            block_size=16,
            n_taps=3,
            intermediate=768,
            gen_prompt_len=64,
            gen_new_tokens=192,
            gen_batch=512,
            gen_sequences=16384,
            gen_doc_share=0.5,
            batch_size=128,
            anchors_per_seq=16,
            lr=1e-3,
            steps=3000,
            eval_sequences=256,
            max_epochs=4.0,
            select_sequences=128,
            eval_every=150,
        ),
        notes="one H200, fp32 + TF32; steps capped by epochs over the corpus found, early "
        "stopping on held-out modules, stages cut by their wall-clock budgets",
    ),
    "cpu": Preset(
        "cpu",
        TargetPreset(
            hidden_size=128,
            num_layers=6,
            heads=4,
            dense_intermediate=256,
            moe_intermediate=64,
            kv_lora_rank=32,
            qk_nope=16,
            qk_rope=16,
            v_head=32,
            seq_len=128,
            batch_size=16,
            lr=3e-3,
            steps=3000,
            eval_batches=4,
            max_epochs=6.0,
            expected_train_tokens=7_000_000,
        ),
        DrafterPreset(
            num_layers=1,
            block_size=16,
            n_taps=3,
            intermediate=256,
            gen_prompt_len=32,
            gen_new_tokens=96,
            gen_batch=64,
            gen_sequences=1024,
            batch_size=16,
            anchors_per_seq=8,
            lr=2e-3,
            steps=3000,
            eval_sequences=32,
            max_epochs=4.0,
            select_sequences=32,
        ),
        notes="interim default trained on a 2-core CPU (fp32), cut by its time budget; "
        "replaced by the h200 run",
    ),
    "toy": Preset(
        "toy",
        TargetPreset(
            hidden_size=32,
            num_layers=6,
            heads=2,
            dense_intermediate=64,
            moe_intermediate=16,
            kv_lora_rank=16,
            qk_nope=8,
            qk_rope=8,
            v_head=8,
            seq_len=32,
            batch_size=4,
            lr=3e-3,
            steps=4,
            eval_batches=2,
            extend_seq_lens=(64,),
            extend_tokens_per_step=128,
            extend_steps=2,
            extend_tail=16,
        ),
        DrafterPreset(
            num_layers=1,
            block_size=8,
            n_taps=3,
            intermediate=64,
            gen_prompt_len=8,
            gen_new_tokens=24,
            gen_batch=4,
            gen_sequences=8,
            batch_size=4,
            anchors_per_seq=4,
            lr=2e-3,
            steps=4,
            eval_sequences=4,
            select_sequences=4,
        ),
        notes="smoke-test size: seconds on a CPU, meaningless quality",
    ),
}


def get_preset(name: str, **overrides: Any) -> Preset:
    """A preset by name; ``overrides`` like ``target_steps=10`` or ``drafter_kl_weight=0.5``."""
    try:
        p = PRESETS[name]
    except KeyError:
        raise ValueError(f"preset={name!r}: expected one of {', '.join(PRESETS)}") from None
    t_over, d_over = (
        {
            k.removeprefix(pre): v
            for k, v in overrides.items()
            if k.startswith(pre) and v is not None
        }
        for pre in ("target_", "drafter_")
    )
    bad = [k for k in overrides if not k.startswith(("target_", "drafter_"))]
    if bad:
        raise ValueError(f"overrides {bad}: expected keys starting with target_ or drafter_")
    try:
        return replace(p, target=replace(p.target, **t_over), drafter=replace(p.drafter, **d_over))
    except TypeError as exc:
        raise ValueError(f"overrides {overrides}: {exc}") from exc


def target_config(p: TargetPreset, vocab_size: int, eos_token_id: int):
    """The MLA + MoE config (DeepSeek-V3 field names) for a preset."""
    from kdtree.models.config import MLAConfig

    return MLAConfig(
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.dense_intermediate,
        moe_intermediate_size=p.moe_intermediate,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.heads,
        q_lora_rank=None,
        kv_lora_rank=p.kv_lora_rank,
        qk_nope_head_dim=p.qk_nope,
        qk_rope_head_dim=p.qk_rope,
        v_head_dim=p.v_head,
        n_routed_experts=p.n_routed_experts,
        n_shared_experts=1,
        num_experts_per_tok=p.experts_per_tok,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        first_k_dense_replace=1,
        max_position_embeddings=262144,
        rope_theta=100000.0,
        tie_word_embeddings=p.tie_embeddings,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )


def planned_steps(
    steps: int, tokens_per_step: int, data_tokens: int, max_epochs: float | None
) -> tuple[int, float]:
    """``(steps, epochs)``: ``steps`` cut to at most ``max_epochs`` passes over ``data_tokens``
    (at least 1 step), and the passes that many steps make."""
    if steps < 1:
        raise ValueError(f"steps={steps}: expected >= 1")
    if tokens_per_step < 1 or data_tokens < 1:
        raise ValueError(
            f"tokens_per_step={tokens_per_step}, data_tokens={data_tokens}: expected >= 1"
        )
    if max_epochs is not None:
        if max_epochs <= 0:
            raise ValueError(f"max_epochs={max_epochs}: expected > 0 or None")
        steps = max(1, min(steps, math.ceil(max_epochs * data_tokens / tokens_per_step)))
    return steps, steps * tokens_per_step / data_tokens


def eval_interval(steps: int, every: int, min_evals: int) -> int:
    """Steps between evaluations: ``every``, shortened so a run of ``steps`` gets at least
    ``min_evals`` evaluations (early stopping needs several)."""
    if every < 1 or min_evals < 1:
        raise ValueError(f"every={every}, min_evals={min_evals}: expected >= 1")
    return max(1, min(every, steps // min_evals))
