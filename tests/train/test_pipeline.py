"""End to end at toy scale through the CLI: tokenizer → target → generated data → drafter →
offline τ → pack; then the checkpoints load, and broken files give errors naming the file."""

from __future__ import annotations

import json
import math
import shutil
import tarfile

import pytest
import torch


def test_all_writes_both_models_cards_and_packs(trained):
    out, summary = trained
    assert summary["target_steps"] == 3 and summary["drafter_steps"] == 3
    assert 1.0 <= summary["offline_tau"] <= 8.0
    live = summary["detail"]["drafter"]["live"]
    assert not [k for k in live if k.endswith("_error")], live
    assert live["chain_match_greedy"] >= 0.9 and live["tree_match_greedy"] >= 0.9
    for d in ("target", "drafter"):
        for f in ("config.json", "model.safetensors", "model_card.md", "training.json"):
            assert (out / d / f).is_file(), f"{d}/{f}"
    card = (out / "target" / "model_card.md").read_text()
    assert "sha256" in card and "json/decoder.py" in card and "Validation loss" in card
    meta = json.loads((out / "target" / "training.json").read_text())
    assert meta["corpus"]["n_files"] > 10 and meta["metrics"]["steps"] == 3
    m = meta["metrics"]
    assert 1 <= m["best_step"] <= 3 and m["stop_reason"] and "restored_best" in m
    assert (
        meta["training"]["corpus_source"]["root"] and "early stop" in meta["training"]["selection"]
    )
    assert "best" in card and str(m["best_step"]) in card
    ext = m["extension"]  # the toy preset runs a 2-step extension on 64-token windows
    assert ext["steps"] == 2 and ext["steps_per_len"] == {"64": 2}
    assert set(ext["tail_loss_after"]) == {"32", "64"} and ext["tail"] == 16
    assert m["val_loss"] == ext["val_loss_after"] and "long-context extension" in card
    # the card leads with the shipped (post-extension) validation loss
    assert f"Validation loss {m['val_loss']:.3f}" in card
    dmeta = json.loads((out / "drafter" / "training.json").read_text())
    assert dmeta["config"]["mask_token_id"] == 1 and dmeta["config"]["block_size"] == 8
    assert 1 <= dmeta["metrics"]["best_step"] <= 3 and dmeta["metrics"]["stop_reason"]
    assert math.isfinite(dmeta["metrics"]["best_val_loss"])
    # half of the prompts were cut just past a docstring; τ is also reported on such cuts
    assert dmeta["training"]["gen_doc_share"] == 0.5 and "docstring" in dmeta["training"]["data"]
    assert 1.0 <= dmeta["metrics"]["offline_tau_doc"] <= dmeta["config"]["block_size"]
    assert (
        f"after docstring cuts: τ = {dmeta['metrics']['offline_tau_doc']:.2f}"
        in (out / "drafter" / "model_card.md").read_text()
    )
    assert summary["offline_tau_doc"] == dmeta["metrics"]["offline_tau_doc"]
    with tarfile.open(out / "pack" / "target.tar.gz") as tf:
        names = tf.getnames()
    assert "target/model.safetensors" in names and "tokenizer.json" in names
    with tarfile.open(out / "pack" / "drafter.tar.gz") as tf:
        assert "drafter/model.safetensors" in tf.getnames()


def test_checkpoints_load_in_bf16_and_draft(trained):
    from kdtree.models import load_model
    from kdtree.train.pipeline import load_target

    out, _ = trained
    from safetensors import safe_open

    with safe_open(str(out / "target" / "model.safetensors"), "pt") as fh:
        # bf16 weights; the MoE router (gate weight, correction bias) stays fp32 by design
        dtypes = {k: fh.get_tensor(k).dtype for k in fh.keys()}  # noqa: SIM118
    assert {d for k, d in dtypes.items() if ".mlp.gate." not in k} == {torch.bfloat16}
    assert sum(d == torch.bfloat16 for d in dtypes.values()) > 0.8 * len(dtypes)
    target = load_target(out, torch.device("cpu"))
    drafter = load_model(out / "drafter", target=target)
    ctx = drafter.new_context(1, 32)
    taps = target.forward_dense(torch.tensor([[5, 6, 7, 8]]), return_taps=True).taps
    drafter.append_context(ctx, taps, torch.arange(4)[None])
    logits = drafter.draft(ctx, torch.tensor([9]), torch.tensor([4]))
    assert logits.shape == (1, 7, 400) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "broken", ["missing_weights", "corrupt_weights", "missing_config", "corrupt_config"]
)
def test_broken_checkpoint_names_the_file(trained, tmp_path, broken):
    from kdtree.models import load_model

    out, _ = trained
    d = tmp_path / "target"
    shutil.copytree(out / "target", d)
    if broken == "missing_weights":
        (d / "model.safetensors").unlink()
        bad, exc = d / "model.safetensors", FileNotFoundError
    elif broken == "corrupt_weights":
        (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
        bad, exc = d / "model.safetensors", ValueError
    elif broken == "missing_config":
        (d / "config.json").unlink()
        bad, exc = d / "config.json", FileNotFoundError
    else:
        (d / "config.json").write_text("{")
        bad, exc = d / "config.json", ValueError
    with pytest.raises(exc, match=str(bad).replace(".", r"\.")):
        load_model(d)


def test_truncated_weights_name_the_file(trained, tmp_path):
    from kdtree.models import load_model

    out, _ = trained
    d = tmp_path / "target"
    shutil.copytree(out / "target", d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=str(d / "model.safetensors").replace(".", r"\.")):
        load_model(d)
