#!/usr/bin/env bash
# GPU calls of a session, by steps. Binaries come prebuilt in .gpu/ (built here for 90a-real:
# treemla, treemla_gpu_tests, and optional variants .gpu/treemla-<name>); results go to $OUT.
# Usage: scripts/gpu-final.sh COMMIT "STEPS", STEPS from:
#   tests     every GPU test, every family and configuration (328 s on the H200 at 1ef5d71)
#   family F  (as "family:F") the GPU tests of one family (TREEMLA_TEST_FAMILY; sm90a's verify
#             tests took over 200 s at 3c79289)
#   sanitize  compute-sanitizer memcheck and racecheck, on the families in $SAN_FAMILIES (sm90a;
#             the decode family on its own tests)
#   bench     treemla bench at the peers' shapes, every family and tile, plus the fixed-cost,
#             page-size-1 and tail cases (bench.json / bench.txt)
#   mutations:F  .gpu/treemla_gpu_tests_mut{1,2,3} (scripts/build-mutations.sh, family F) and the
#             unmutated tests on F's mutation-sensitive tests (mutations-F.log; $MUT_FILTER
#             replaces the gtest filter)
#   rounds:N  A/B rounds (experiments): .gpu/treemla (the baseline, named "main") and each
#             .gpu/treemla-<name>, alternated N times in one call, the order reversed every other
#             round, each at $VAR_CASES (the bench step's cases) for the families in
#             $VAR_FAMILIES (sm90a) and tiles $VAR_TILES (smem-large); then
#             scripts/bench-compare.py of every candidate against the baseline's rounds
#             (rounds-<name>.md) and the raw tables in rounds.tgz
#   env:V=X   the sm90a rows of .gpu/treemla with environment variable V set to X (for builds
#             that read a measurement switch; e.g. the cluster family's TREEMLA_WAIT_MODE,
#             verify_kernel_params.h, has none for sm90a today)
#   l2:F      Nsight Compute at full clock: L2 requests, sectors, tag lookups and DRAM throughput of
#             family F's main kernel and of the bench's plain copy of the same pages, at
#             8,16,1,131072 ($L2_CASE, $L2_TILES override; l2-F.txt). The plain copy is the reference: it
#             makes one L2 request a 128-byte line
#   cost      the verify cost table of the default family (cost-table.json)
#   binding   builds the PyTorch binding for 9.0a in the background (binding-build.log); a later
#             "binding-test" waits for it and runs the binding's tests (binding-tests.log)
#   peers     FlashInfer fa2/fa3 (and SGLang when its files are in .peers) at the peers' shapes,
#             joined with bench.json of the same call (run "bench peers" together)
set -u
cd "$(dirname "$0")/.."
S=$(date +%s)
t() { echo "[$(( $(date +%s) - S ))s] $*"; }
G=.gpu
C=${1:-unknown}
STEPS=${2:-tests bench}
PEERS="1:8:65:185000:64;1:8:65:131072:64;1:16:16:131072:64;1:16:65:131072:64;8:16:65:32768:64;1:128:64:131072:64;8:16:1:131072:64;8:128:1:32768:64"
EXTRA="1:8:1:0:64;8:16:65:32768:1;1:8:65:185000:1;8:16:1:131072:1;8:8:1:131072:64;32:16:1:32768:64"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for step in $STEPS; do
  case $step in
    tests)
      timeout 540 $G/treemla_gpu_tests > $OUT/gpu-tests.log 2>&1; t "all GPU tests rc=$?"
      grep -E "^\[  (FAILED|PASSED) " $OUT/gpu-tests.log ;;
    family:*)
      f=${step#family:}
      TREEMLA_TEST_FAMILY=$f timeout 420 $G/treemla_gpu_tests --gtest_filter='VerifyGpu.*:VerifyOracle.*' \
        > $OUT/gpu-tests-$f.log 2>&1; t "$f GPU tests rc=$?"
      grep -E "^\[  (FAILED|PASSED) " $OUT/gpu-tests-$f.log ;;
    sanitize)
      for f in ${SAN_FAMILIES:-sm90a}; do
        # The decode family runs only requests of at most 16 rows: its own tests.
        mem='VerifyGpu.TreeShapes:VerifyGpu.RaggedBatch:VerifyGpu.BadPageIndexIsReported'
        race='VerifyGpu.TreeShapes'
        if [ "$f" = decode ]; then
          mem='VerifyGpu.DecodeTiles:VerifyGpu.BadPageIndexIsReportedDecode'; race='VerifyGpu.DecodeTiles'
        fi
        TREEMLA_TEST_FAMILY=$f timeout 150 compute-sanitizer --tool memcheck $G/treemla_gpu_tests \
          --gtest_filter="$mem" > $OUT/memcheck-$f.log 2>&1; t "$f memcheck rc=$?"
        grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck-$f.log
        TREEMLA_TEST_FAMILY=$f timeout 150 compute-sanitizer --tool racecheck $G/treemla_gpu_tests \
          --gtest_filter="$race" > $OUT/racecheck-$f.log 2>&1
        t "$f racecheck rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/racecheck-$f.log
      done ;;
    bench)
      timeout 200 $G/treemla bench --cases "$PEERS;$EXTRA" --reps 10 --commit "$C" \
        --json $OUT/bench.json > $OUT/bench.txt 2>&1; t "bench rc=$?"
      grep -E "^(sm90a|cpasync|cluster|decode|warpspec|#) " $OUT/bench.txt | cut -c1-112 ;;
    mutations:*)
      f=${step#mutations:}
      filt='VerifyGpu.TreeShapes:VerifyOracle.TailRowsOfEveryTreeShape:VerifyOracle.EdgesBlocksAndSplits'
      # decode: the quick tests that caught each of its mutations (731bc08 and c6b04c9 logs), ~12 s
      # a build instead of ~80 s with DecodeTiles and the long prefixes; $MUT_FILTER overrides.
      [ "$f" = decode ] && filt='VerifyGpu.DecodeQLenOne:VerifyGpu.GraphReplayWithNewLengthsDecode:VerifyOracle.DecodeTilesRagged'
      filt=${MUT_FILTER:-$filt}
      for b in $G/treemla_gpu_tests $G/treemla_gpu_tests_mut1 $G/treemla_gpu_tests_mut2 $G/treemla_gpu_tests_mut3; do
        [ -e "$b" ] || continue
        echo "===== ${b##*/} (TREEMLA_TEST_FAMILY=$f)" >> $OUT/mutations-$f.log
        TREEMLA_TEST_FAMILY=$f timeout 120 $b --gtest_filter="$filt" >> $OUT/mutations-$f.log 2>&1
        t "${b##*/} rc=$?"
      done
      grep -E "^=====|^\[  (FAILED|PASSED) |^\[  FAILED  \] [A-Z]" $OUT/mutations-$f.log ;;
    rounds:*)
      n=${step#rounds:}
      rm -rf /tmp/rounds && mkdir -p /tmp/rounds
      vs="$G/treemla"; for v in $G/treemla-*; do [ -e "$v" ] && vs="$vs $v"; done
      for r in $(seq 1 "$n"); do
        order=$vs; [ $((r % 2)) = 0 ] && order=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ' ')
        for v in $order; do
          nm=main; [ "$v" != "$G/treemla" ] && nm=${v##*/treemla-}
          timeout 150 $v bench --cases "${VAR_CASES:-$PEERS;$EXTRA}" --families "${VAR_FAMILIES:-sm90a}" \
            --tiles "${VAR_TILES:-smem-large}" --reps 10 --commit "$C-$nm" \
            --json /tmp/rounds/round$r-$nm.json > /tmp/rounds/round$r-$nm.txt 2>&1
          t "round $r $nm rc=$?"
        done
      done
      for v in $vs; do
        [ "$v" = "$G/treemla" ] && continue
        nm=${v##*/treemla-}
        python3 scripts/bench-compare.py --baseline-runs /tmp/rounds/round*-main.json \
          --candidate-runs /tmp/rounds/round*-$nm.json > $OUT/rounds-$nm.md 2>&1
        cat $OUT/rounds-$nm.md
      done
      tar -C /tmp -czf $OUT/rounds.tgz rounds ;;
    env:*)
      kv=${step#env:}
      env "$kv" timeout 100 $G/treemla bench --cases "$PEERS;$EXTRA" --families sm90a \
        --tiles smem-large --reps 10 --commit "$C-$kv" > "$OUT/bench-env-${kv//=/_}.txt" 2>&1
      t "env $kv rc=$?"; grep -E "^sm90a " "$OUT/bench-env-${kv//=/_}.txt" | cut -c1-100 ;;
    binding)
      (env TREEMLA_BUILD_CUDA=1 MAX_JOBS=12 TORCH_CUDA_ARCH_LIST=9.0a nice -n 19 python3 -m pip \
        install -q --no-build-isolation --no-deps ./python > $OUT/binding-build.log 2>&1
       echo $? > /tmp/binding.rc) &
      t "binding build started" ;;
    binding-test)
      while [ ! -e /tmp/binding.rc ]; do sleep 2; done
      t "binding build rc=$(cat /tmp/binding.rc)"; tail -3 $OUT/binding-build.log
      timeout 300 python3 -m pytest -q -rs python/tests > $OUT/binding-tests.log 2>&1
      t "binding tests rc=$?"; tail -15 $OUT/binding-tests.log ;;
    l2:*)
      f=${step#l2:}
      M="lts__t_requests_srcunit_tex.sum,lts__t_sectors_srcunit_tex.sum,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum"
      for k in "main_kernel:2" "paged_read:0"; do
        timeout 90 ncu --clock-control none --metrics "$M" -k regex:${k%%:*} -s ${k#*:} -c 1 \
          $G/treemla bench --cases "${L2_CASE:-8:16:1:131072:64}" --families "$f" --tiles "${L2_TILES:-all}" \
          --reps 3 >> $OUT/l2-$f.txt 2>&1
        t "l2 $f ${k%%:*} rc=$?"
      done
      grep -E "^  [a-zA-Z_].*\(|lts__|dram__|gpu__" $OUT/l2-$f.txt | cut -c1-120 ;;
    cost)
      timeout 200 $G/treemla bench --cost-table $OUT/cost-table.json --reps 3 --commit "$C" \
        > $OUT/cost-table.txt 2>&1; t "cost table rc=$?" ;;
    peers)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl > $OUT/pip.log 2>&1
      export PYTHONPATH=/tmp/site FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
      # SGLang's Triton path too when bench/fetch-peers.sh put its files in .peers (peers.py skips
      # it, saying why, if they do not load)
      impls=fa2,fa3; [ -d .peers/sglang/sglang ] && impls=fa2,fa3,sglang
      timeout 420 python3 bench/peers.py --cases "$PEERS" --impls $impls --json $OUT/peers.json \
        --commit "$C" --bench-json $OUT/bench.json > $OUT/peers.txt 2>&1; t "peers rc=$?"
      tail -30 $OUT/peers.txt ;;
  esac
done
