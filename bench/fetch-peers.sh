#!/usr/bin/env bash
# Fetches the peers that bench/peers.py times, from PyPI, for a GPU machine without network:
#   .whl/   flashinfer-python 0.6.9 and apache-tvm-ffi wheels (install there with
#           pip install --no-index --no-deps --target DIR .whl/*.whl)
#   .peers/sglang/sglang/kernels/ops/attention/{extend,decode}_attention.py, score_mod.py
#           (the three files of the sglang 0.5.23 wheel that SGLang's Triton tree path needs)
# Nothing fetched here is committed (.whl/ and .peers/ are git-ignored by this script).
# Usage: bench/fetch-peers.sh [python-version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
for d in /.whl/ /.peers/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "$d" >> .git/info/exclude; }; done
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64; do
  plat+=(--platform "$p")
done
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp "${plat[@]}" "$@"; }
mkdir -p .whl .peers
dl -d .whl "flashinfer-python==0.6.9" "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0"
tmp=$(mktemp -d)
dl -d "$tmp" "sglang==0.5.23"
rm -rf .peers/sglang
mkdir -p .peers/sglang
(cd .peers/sglang && python3 -m zipfile -e "$tmp"/sglang-0.5.23-*.whl . >/dev/null)
keep=.peers/sglang/sglang/kernels/ops/attention
find .peers/sglang -type f ! -path "$keep/extend_attention.py" ! -path "$keep/decode_attention.py" \
  ! -path "$keep/score_mod.py" -delete
find .peers/sglang -type d -empty -delete
rm -rf "$tmp"
ls -la .whl "$keep"
