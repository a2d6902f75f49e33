#!/usr/bin/env bash
# Builds one commit's GPU binaries for the device machine (sm_90a SASS only: the H100/H200 there)
# into .gpu/, from a git worktree, so that a baseline and candidates built from different commits
# can run side by side in one call (scripts/gpu-final.sh, steps "rounds:N" and "tests").
# Usage: scripts/build-gpu-binaries.sh REF [NAME]
#   without NAME: .gpu/treemla and .gpu/treemla_gpu_tests (the call's baseline and its tests)
#   with NAME:    .gpu/treemla-NAME and .gpu/treemla_gpu_tests-NAME (a candidate)
# Each build takes two to three minutes on two cores (the whole library for one architecture,
# 2.2-2.5 min in the forty-third session); the build trees stay under /tmp/gpubuild-<commit> for a
# rebuild after a small change (remove them with `git worktree remove --force`).
set -euo pipefail
REF=${1:?usage: scripts/build-gpu-binaries.sh REF [NAME]}
NAME=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHA=$(git -C "$ROOT" rev-parse --short "$REF^{commit}")
WT=/tmp/gpubuild-$SHA
if [ ! -e "$WT/.git" ]; then
  git -C "$ROOT" worktree add --detach "$WT" "$SHA" > /dev/null
fi
cmake -S "$WT" -B "$WT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real > "$WT/configure.log"
cmake --build "$WT/build" --parallel --target treemla_tool treemla_gpu_tests
mkdir -p "$ROOT/.gpu"
suffix=${NAME:+-$NAME}
cp "$WT/build/treemla" "$ROOT/.gpu/treemla$suffix"
cp "$WT/build/tests/treemla_gpu_tests" "$ROOT/.gpu/treemla_gpu_tests$suffix"
echo "$SHA" > "$ROOT/.gpu/commit$suffix"
echo "built .gpu/treemla$suffix and .gpu/treemla_gpu_tests$suffix from $SHA"
