#!/usr/bin/env bash
# One GPU call for the sm90a family: its GPU tests (family filter), the bench at the peers' shapes
# for sm90a and the cpasync baseline in the same run, and compute-sanitizer on one test. Binaries
# come prebuilt in .gpu/ (built here for 90a-real); results go to $OUT. Usage: gpu-sm90a.sh COMMIT
# [STEPS], STEPS a subset of "tests bench variants memcheck racecheck full" (default: tests bench memcheck).
set -u
cd "$(dirname "$0")/.."
S=$(date +%s)
t() { echo "[$(( $(date +%s) - S ))s] $*"; }
G=.gpu
C=${1:-unknown}
STEPS=${2:-tests bench memcheck}
PEERS="1:8:65:185000:64;1:8:65:131072:64;1:16:16:131072:64;1:16:65:131072:64;8:16:65:32768:64;1:128:64:131072:64;8:16:1:131072:64;8:128:1:32768:64"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for step in $STEPS; do
  case $step in
    tests)
      TREEMLA_TEST_FAMILY=sm90a timeout 300 $G/treemla_gpu_tests --gtest_filter='VerifyGpu.*:VerifyOracle.*' \
        > $OUT/sm90a-tests.log 2>&1; t "sm90a tests rc=$?"
      grep -E "^\[  (FAILED|PASSED) |Failure|max_err|exceeds" $OUT/sm90a-tests.log | head -40 ;;
    full)
      timeout 420 $G/treemla_gpu_tests > $OUT/gpu-tests-all.log 2>&1; t "all GPU tests rc=$?"
      grep -E "^\[  (FAILED|PASSED) " $OUT/gpu-tests-all.log ;;
    bench)
      for f in sm90a cpasync; do
        tl=smem-large
        timeout 150 $G/treemla bench --cases "$PEERS;1:8:1:0:64" --families $f --tiles $tl --reps 10 \
          --commit "$C" --json $OUT/bench-$f.json > $OUT/bench-$f.txt 2>&1; t "bench $f rc=$?"
        grep -E "^($f|#|family) " $OUT/bench-$f.txt | cut -c1-110
      done ;;
    variants)  # other builds of the tool carried as .gpu/treemla-<name>: the sm90a rows only
      for v in $G/treemla-*; do
        n=${v##*/treemla-}
        timeout 100 $v bench --cases "$PEERS" --families sm90a --tiles smem-large --reps 10 \
          --commit "$C-$n" > $OUT/bench-variant-$n.txt 2>&1; t "variant $n rc=$?"
        grep -E "^sm90a " $OUT/bench-variant-$n.txt | cut -c1-100
      done ;;
    memcheck)
      TREEMLA_TEST_FAMILY=sm90a timeout 200 compute-sanitizer --tool memcheck $G/treemla_gpu_tests \
        --gtest_filter='VerifyGpu.TreeShapes:VerifyGpu.BadPageIndexIsReported' > $OUT/memcheck.log 2>&1
      t "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head ;;
    racecheck)
      TREEMLA_TEST_FAMILY=sm90a timeout 200 compute-sanitizer --tool racecheck $G/treemla_gpu_tests \
        --gtest_filter='VerifyGpu.TreeShapes' > $OUT/racecheck.log 2>&1
      t "racecheck rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/racecheck.log | head ;;
  esac
done
