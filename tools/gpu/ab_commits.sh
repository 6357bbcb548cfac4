#!/usr/bin/env bash
# Time the CUDA GQA / MLA kernels of an older commit against the working tree's, in alternating runs of
# the verify bench (old, new, old, new: clock drift falls on both), same points and provider.
#   bash tools/gpu/ab_commits.sh OLD_COMMIT OUT_DIR [bench args...]
# The old tree comes from `git archive` into /tmp/ab_old (its kernels build into its own cache
# entry: the build cache is keyed by source); OLD_COMMIT "worktree" copies the working tree
# instead, a directory copies that tree (`git archive C kdtree kernels pyproject.toml | tar -x -C
# DIR` before the call: the device's .git is the session's first state), and OLD_DEFINE=NAME puts `#define NAME 1` at the top of its GQA and MLA kernels (a measurement
# build of this tree); OLD_ENV / NEW_ENV ("NAME=value ...") set environment variables for one side
# only (e.g. OLD_ENV=KDTREE_CUDA_SPLIT_PDL=0 with OLD_COMMIT worktree: a launch option's A/B).
# Rows go to OUT_DIR/{old,new}{1,2}/.
set -u
old=$1 out=$2
shift 2
rm -rf /tmp/ab_old && mkdir -p /tmp/ab_old
if [ "$old" = worktree ]; then
  cp -r kdtree kernels pyproject.toml /tmp/ab_old/
elif [ -d "$old" ]; then  # a tree unpacked here (a commit the device's .git does not have yet)
  cp -r "$old"/. /tmp/ab_old/
else
  git archive "$old" | tar -x -C /tmp/ab_old || { echo "git archive $old failed"; exit 2; }
fi
if [ -n "${OLD_DEFINE:-}" ]; then
  sed -i "1i #define $OLD_DEFINE 1" /tmp/ab_old/kernels/gqa_tree_sm90.cu /tmp/ab_old/kernels/mla_tree_sm90.cu
fi
for round in 1 2; do
  for side in old new; do
    dir=$PWD side_env=${NEW_ENV:-}
    [ "$side" = old ] && dir=/tmp/ab_old side_env=${OLD_ENV:-}
    (cd "$dir" && env $side_env PYTHONPATH=/tmp/site:$dir python3 -m kdtree bench verify-attention "$@" \
      --out "$out/$side$round" 2>&1 | tail -1 | cut -c1-120)
    echo "$side$round done"
  done
done
