#!/usr/bin/env bash
# Builds the GPU test executable against deliberately broken kernels of one family (docs/testing.md,
# "Kernel mutations"; the cluster, decode and warpspec families have the hooks), reusing an existing Ninja
# build directory: only that family's instantiation files are compiled again with
# -DTREEMLA_KERNEL_MUTATION=n, into a copy of the library, and the tests are linked against that
# copy. The build directory is left unchanged.
# Usage: scripts/build-mutations.sh BUILD_DIR OUT_DIR [FAMILY]   (FAMILY: cluster (default), decode
# or warpspec; writes OUT_DIR/treemla_gpu_tests_mutN)
set -euo pipefail
B=$(cd "$1" && pwd)
mkdir -p "$2"
OUT=$(cd "$2" && pwd)
FAMILY=${3:-cluster}
SRC=$(cd "$(dirname "$0")/.." && pwd)/src/cuda/$FAMILY
[ -e "$SRC/kernel.cuh" ] || { echo "no kernel family '$FAMILY' (src/cuda/$FAMILY)" >&2; exit 2; }
cd "$B"
archive=$(ninja -t commands libtreemla.a | tail -1)
link=$(ninja -t commands tests/treemla_gpu_tests | tail -1)
for n in 1 2 3; do
  work=$(mktemp -d)
  lib_cmd=$archive
  for src in "$SRC"/*.cu; do
    f=$(basename "$src" .cu)
    obj="CMakeFiles/treemla.dir/src/cuda/$FAMILY/$f.cu.o"
    cmd=$(ninja -t commands libtreemla.a | grep -F -- "-o $obj" | head -1)
    cmd=${cmd/ -c / -DTREEMLA_KERNEL_MUTATION=$n -c }
    cmd=${cmd/-o $obj/-o $work/$f.cu.o}
    cmd=${cmd/-MF $obj.d/-MF $work/$f.d}
    eval "$cmd"
    lib_cmd=${lib_cmd/ $obj / $work/$f.cu.o }
  done
  lib_cmd=${lib_cmd//libtreemla.a/$work/libtreemla.a}
  eval "$lib_cmd"
  l=${link//libtreemla.a/$work/libtreemla.a}
  l=${l/-o tests\/treemla_gpu_tests/-o $OUT/treemla_gpu_tests_mut$n}
  eval "$l"
  rm -rf "$work"
  echo "built $OUT/treemla_gpu_tests_mut$n"
done
