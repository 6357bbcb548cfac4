"""Corpus, tokenizer, target and drafter training: everything behind ``kdtree train``.

``corpus`` (stdlib file list, checksums, module-level split) → ``tokenizer`` (byte-level BPE) →
``data`` (token streams, windows) → ``target`` (MLA + MoE training) → ``generate`` (the target's
own continuations) → ``anchors`` + ``drafter`` (DFlash training) → ``evaluate`` (offline and
live τ); ``pipeline`` strings them together under one wall-clock budget, ``presets`` fixes the
sizes, ``card`` writes model cards, ``prompts`` builds the benchmark's prompts.
"""
