#!/usr/bin/env bash
# Time measurement builds of this tree against each other in alternating runs of the verify
# bench (v1, v2, ..., v1, v2, ...: clock drift falls on all), same points and providers.
#   bash tools/gpu/ab_defines.sh OUT_DIR "DEFS_1;DEFS_2;..." [bench args...]
# Each DEFS is a KDTREE_CUDA_DEFINES value (NAME[=VALUE][,...]; "-" for none): its libraries build
# into their own cache entries on first use (the bench does not charge that call). Rows go to
# OUT_DIR/v<i>r<round>/, and OUT_DIR/variants.txt maps v<i> to its DEFS.
set -u
out=$1 defs=$2
shift 2
mkdir -p "$out"
IFS=';' read -r -a variants <<< "$defs"
: > "$out/variants.txt"
for i in "${!variants[@]}"; do echo "v$i ${variants[$i]}" >> "$out/variants.txt"; done
for round in 1 2; do
  for i in "${!variants[@]}"; do
    d=${variants[$i]}
    [ "$d" = - ] && d=
    KDTREE_CUDA_DEFINES=$d python3 -m kdtree bench verify-attention "$@" --out "$out/v${i}r$round" \
      2>&1 | tail -1 | cut -c1-100
    echo "v$i ($d) round $round done"
  done
done
