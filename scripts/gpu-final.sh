#!/usr/bin/env bash
# One GPU call of this session: correctness, the kernel families at the peers' shapes, timing
# ablations of the cluster family, the verify cost table, and the peers. Binaries come prebuilt
# in .gpu/ (built here for 90a-real); results go to $OUT.
set -u
cd "$(dirname "$0")/.."
S=$(date +%s)
t() { echo "[$(( $(date +%s) - S ))s] $*"; }
G=.gpu
timeout 120 $G/treemla_gpu_tests --gtest_filter='VerifyGpu.*' > $OUT/gpu-tests.log 2>&1; t "tests rc=$?"
grep -E "^\[  (FAILED|PASSED) " $OUT/gpu-tests.log
PEERS="1:8:65:185000:64;1:8:65:131072:64;1:16:16:131072:64;1:16:65:131072:64;8:16:65:32768:64;1:128:64:131072:64;8:16:1:131072:64;8:128:1:32768:64"
timeout 200 $G/treemla bench --cases "$PEERS;1:8:1:0:64" --reps 10 --commit "${1:-unknown}" --json $OUT/bench-peer-shapes.json > $OUT/bench-peer-shapes.txt 2>&1; t "bench rc=$?"
grep -E "^(cpasync|cluster) " $OUT/bench-peer-shapes.txt | cut -c1-80
for m in 0 8 32 64 104; do
  echo "ablation $m: $(TREEMLA_WAIT_MODE=$m timeout 60 $G/treemla bench --cases 1:8:65:131072:64 --families cluster --tiles smem99k --reps 5 2>&1 | grep '^cluster' | cut -c1-75)"
done > $OUT/ablations.txt; cat $OUT/ablations.txt; t ablations
timeout 120 $G/treemla bench --cost-table $OUT/cost-table.json --reps 3 --commit "${1:-unknown}" > $OUT/cost-table.txt 2>&1; t "cost table rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
timeout 300 python3 bench/peers.py --cases "$PEERS" --json $OUT/peers.json --commit "${1:-unknown}" \
  --bench-json $OUT/bench-peer-shapes.json > $OUT/peers.txt 2>&1; t "peers rc=$?"
tail -25 $OUT/peers.txt
