#!/usr/bin/env bash
# The host code under AddressSanitizer and UndefinedBehaviorSanitizer: a CPU-only build of the
# library, the tool and the CPU test suites (no CUDA kernels: device code is not instrumented, and
# compute-sanitizer covers it on the GPU, docs/gpu-check.md), then every CTest test. A heap or
# stack overflow, use after free, leak, signed overflow, misaligned or out-of-range access fails
# the run (-fno-sanitize-recover: no report is only a warning). CI runs it after the test command.
# Environment: SAN_BUILD_DIR (default build-san), JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SAN_BUILD_DIR:-build-san}
JOBS=${JOBS:-$(nproc)}
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

./scripts/install-deps.sh
# A CPU-only build by design, whatever CI asks of the main build.
TREEMLA_REQUIRE_CUDA=0 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTREEMLA_ENABLE_CUDA=OFF -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="$flags"
cmake --build "$BUILD_DIR" --parallel "$JOBS"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# cli.DefaultJob among them runs the README's default job and expects an empty stderr.
ctest --test-dir "$BUILD_DIR" --output-on-failure --parallel "$JOBS"
