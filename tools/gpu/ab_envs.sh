#!/usr/bin/env bash
# Time one tree under several environments in alternating rounds of the verify bench (A B C .. A B
# C ..: clock drift falls on every side), e.g. the variants of a measurement knob:
#   bash tools/gpu/ab_envs.sh OUT_DIR ROUNDS "NAME=v ..." "NAME=w ..." -- [bench args...]
# Rows go to OUT_DIR/v{index}_{round}/ (index = the environment's position, from 0), and
# OUT_DIR/variants.txt lists the environments by index.
set -u
out=$1 rounds=$2
shift 2
envs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
shift
mkdir -p "$out"
for i in "${!envs[@]}"; do echo "v$i ${envs[$i]}"; done > "$out/variants.txt"
for round in $(seq 1 "$rounds"); do
  for i in "${!envs[@]}"; do
    env ${envs[$i]} python3 -m kdtree bench verify-attention "$@" --out "$out/v${i}_$round" 2>&1 |
      tail -1 | cut -c1-100
  done
done
