"""What the TP tests compute: the same functions run single-process (in pytest) and on every
rank of a spawned gloo group (``kdtree.tp.testing.run_spawned``), so the two can be compared.

Rank functions return ``{case: result}`` with exceptions caught per case (as a traceback
string), so one broken case fails its own test and not the others.
"""

from __future__ import annotations

import traceback

import torch

from kdtree.attention import AttnMetadata
from kdtree.cache import PagedKVCache
from kdtree.models import DFlashDrafter, build_model, dflash_config_for, get_config
from kdtree.spec import generate
from kdtree.spec.testing import OracleDrafter
from kdtree.spec.tree import build_trees, draft_topk
from kdtree.spec.verify import prepare_for_verify

BS = 5  # drafter block size
PROMPTS = [[1, 5, 7, 9, 11], [3, 4, 100, 200, 300, 11, 12, 13, 14]]
MAX_NEW = 12

#: name -> (base config, changes). Variants cover kv-head replication (kv1), q/k/v/o and MLP
#: biases, a vocabulary that does not divide by the TP size (509), tied embeddings.
MODELS = {
    "tiny-llama": ("tiny-llama", {}),
    "tiny-llama-kv1-bias-v509": (
        "tiny-llama",
        {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True, "vocab_size": 509},
    ),
    "tiny-qwen3-tied": ("tiny-qwen3", {"tie_word_embeddings": True}),
    "tiny-mla": ("tiny-mla", {}),
    "tiny-mla-v509": ("tiny-mla", {"vocab_size": 509, "q_lora_rank": None}),
}


@torch.no_grad()
def make_target(name: str, seed: int = 0):
    """A tiny target with every tensor random (norms 1 + noise, router bias too)."""
    base, changes = MODELS[name]
    cfg = get_config(base).replace(initializer_range=0.2, **changes)
    model = build_model(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    for pname, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if p.dim() >= 2:
            p.copy_(noise * 0.2)
        elif "norm" in pname:
            p.copy_(1.0 + 0.1 * noise)
        else:
            p.copy_(0.1 * noise)
    for bname, b in model.named_buffers():
        if bname.endswith("e_score_correction_bias"):
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return model


def make_drafter(target, seed: int = 1) -> DFlashDrafter:
    cfg = dflash_config_for(target.config, block_size=BS)
    drafter = DFlashDrafter(cfg, target).eval()
    drafter.init_weights(torch.Generator().manual_seed(seed))
    return drafter


def _guard(fn, *args) -> dict:
    try:
        return {"ok": True, "value": fn(*args)}
    except Exception:
        return {"ok": False, "value": traceback.format_exc()}


# ----------------------------------------------------------------------------- logits


@torch.no_grad()
def forward_suite(model) -> dict[str, torch.Tensor]:
    """Dense forward, cached prefill (ragged prompts) and one tree verify on top of it."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (2, 11), generator=gen)
    out = {"dense": model.forward_dense(ids).logits}
    cache = PagedKVCache.for_model(model.config, max_batch=2, max_len=64, page_size=4)
    lens = [7, 11]
    cache.reserve([0, 1], lens)
    slots = torch.full((2, 11), -1, dtype=torch.int64)
    for b, n in enumerate(lens):
        slots[b, :n] = cache.slots(b, 0, n)
    attn = AttnMetadata(
        mode="prefill",
        slot_mapping=slots,
        page_table=cache.batch_page_table([0, 1]),
        prefix_lens=torch.zeros(2, dtype=torch.int32),
        backend="ref",
    )
    pos = torch.arange(11).expand(2, 11)
    pre = model(ids, pos, cache, attn, return_taps=True)
    out["prefill"] = torch.cat([pre.logits[0, :7], pre.logits[1]])
    out["prefill_taps"] = torch.cat([pre.taps[0, :7], pre.taps[1]])
    for b, n in enumerate(lens):
        cache.set_length(b, n)
    lp, tok = draft_topk(torch.randn(2, 4, vocab, generator=gen) * 3, 3)
    trees = build_trees(lp, tok, 9, [5, 6])
    vin = prepare_for_verify(cache, [0, 1], trees, backend="ref")
    ver = model(vin.input_ids, vin.positions, cache, vin.attn, return_taps=True)
    out["tree"] = ver.logits
    out["tree_taps"] = ver.taps
    out["cache"] = torch.stack(cache.kv) if cache.kind == "mla" else torch.stack(cache.k)
    if hasattr(model, "vocab_shard"):
        vin2 = prepare_for_verify(cache, [0, 1], trees, backend="ref")
        local = model(vin2.input_ids, vin2.positions, cache, vin2.attn, gather_logits=False)
        out["tree_local"] = local.logits
    return out


def rank_logits(tp, names: list[str]) -> dict:
    from kdtree.tp import shard_model

    def one(name):
        tp_model = shard_model(make_target(name), tp)
        res = forward_suite(tp_model)
        s = tp_model.vocab_shard
        res["shard"] = (s.start, s.end, s.per)
        return res

    return {name: _guard(one, name) for name in names}


# ----------------------------------------------------------------------------- decisions

DECIDE_V = 509


def decide_inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, 6, DECIDE_V, generator=gen) * 4
    logits[0, 0, 3] = logits[0, 0, 300] = logits[0, 0].max() + 1.0  # tie across ranks
    logits[0, 1, 10] = logits[0, 1, 20] = logits[0, 1].max() + 1.0  # tie inside a rank
    return {"logits": logits}


def rank_decide(tp) -> dict:
    from kdtree.tp import (
        VocabShard,
        dist_argmax,
        dist_logsumexp,
        dist_target_tokens,
        dist_topk,
    )

    full = decide_inputs()["logits"]
    shard = VocabShard.of(DECIDE_V, tp.rank, tp.size)
    local = shard.slice_full(full)

    def sample():
        gen = torch.Generator().manual_seed(5)
        if not tp.is_first:
            gen.manual_seed(99)  # only rank 0's generator may matter
        return dist_target_tokens(local, 0.8, shard, tp, gen)

    return {
        "lse": _guard(dist_logsumexp, local, tp),
        "topk8": _guard(dist_topk, local, 8, shard, tp),
        "topk300": _guard(dist_topk, local, 300, shard, tp),
        "argmax": _guard(dist_argmax, local, shard, tp),
        "greedy": _guard(dist_target_tokens, local, 0.0, shard, tp),
        "sample": _guard(sample),
    }


# ----------------------------------------------------------------------------- decoding

#: id -> (mode, drafter kind, budget, top_k, engine): engine "tp" = TPSpecEngine (sharded
#: decisions), "plain" = the unmodified SpecEngine on the TP target (all-gathered logits).
DECODE_CASES = {
    "ar": ("ar", None, 0, 1, "tp"),
    "tree-dflash-b8k3": ("tree", "dflash", 8, 3, "tp"),
    "tree-oracle-b6k2": ("tree", "oracle", 6, 2, "tp"),
    "chain-dflash": ("chain", "dflash", 0, 1, "tp"),
    "tree-dflash-plain-engine": ("tree", "dflash", 8, 3, "plain"),
}


def _drafter(kind, target, single_drafter=None):
    if kind is None:
        return None
    if kind == "oracle":
        return OracleDrafter(target, block_size=BS)
    return single_drafter


def single_decode(name: str) -> dict[str, list[list[int]]]:
    target = make_target(name)
    drafter = make_drafter(target)
    out = {}
    for case, (mode, kind, budget, top_k, _) in DECODE_CASES.items():
        res = generate(
            target, _drafter(kind, target, drafter), PROMPTS, mode=mode, budget=budget,
            top_k=top_k, max_new_tokens=MAX_NEW,
        )  # fmt: skip
        out[case] = res.tokens
    return out


def rank_decode(tp, names: list[str]) -> dict:
    from kdtree.tp import TPSpecEngine, generate_tp, replicate_drafter, shard_model

    def run(name):
        single = make_target(name)
        single_drafter = make_drafter(single)
        target = shard_model(single, tp)
        drafter = replicate_drafter(single_drafter, target)
        out = {}
        for case, (mode, kind, budget, top_k, engine) in DECODE_CASES.items():
            d = _drafter(kind, target, drafter)
            if engine == "tp":
                res = generate_tp(
                    target, d, PROMPTS, mode=mode, budget=budget, top_k=top_k,
                    max_new_tokens=MAX_NEW,
                )  # fmt: skip
            else:
                res = generate(
                    target, d, PROMPTS, mode=mode, budget=budget, top_k=top_k,
                    max_new_tokens=MAX_NEW,
                )  # fmt: skip
            out[case] = {"tokens": res.tokens, "tau": res.tau_mean}
        eng = TPSpecEngine(
            target, drafter, mode="tree", budget=8, top_k=3, temperature=1.0,
            generator=torch.Generator().manual_seed(100 + tp.rank),  # ranks differ on purpose
        )  # fmt: skip
        state = eng.prefill(PROMPTS, max_new_tokens=MAX_NEW)
        while state.active:
            eng.step(state)
        out["sampled"] = {"tokens": state.tokens}
        return out

    return {name: _guard(run, name) for name in names}
