#!/usr/bin/env python3
"""Time the peer MLA kernels at treemla bench's shapes, in the same GPU run as `treemla bench`.

Peers (installed from PyPI when the benchmark runs; nothing of theirs is in this repository):
  fa2, fa3  FlashInfer's BatchMLAPagedAttentionWrapper (flashinfer-python 0.6.9) with backend
            "fa2" (the portable mma.sync MLA kernel) and "fa3" (Hopper wgmma). It has no tree
            mask, so it computes the prefix part only: every query row attends the whole prefix.
  sglang    SGLang's Triton extend_attention_fwd (sglang 0.5.23) with the tree mask over a page-1
            cache: what a serving engine runs for tree verify on MLA today.
FlashMLA is not among them: PyPI has no wheel of it (checked 2026-12-08: only flash-mla
1.0.0.dev0, a 6 KB source archive of its first release, whose setup.py needs torch to run and
fetches CUTLASS as a git submodule that the archive does not carry, so it does not build from
PyPI), so fa3 is the Hopper wgmma peer.

Method, the same as `treemla bench`: random bf16 inputs, pages scattered in a random order,
enough copies of the cache that one rotation touches more than 3x the L2; one CUDA graph holds
back-to-back calls over the copies; the median of `--reps` replays divided by the calls per
replay is the time of one call.

Output: a JSON list of {impl, batch, heads, q_len, prefix, page_size, us} (the GPU, date and
commit go to a .meta.json beside it), with treemla's own rows from --bench-json when given, and a
table on stdout. A peer that is
not installed is reported as skipped, not as a failure.

Usage: bench/peers.py --json bench/results/<date>_<gpu>_<commit>_peers.json --commit <sha>
       [--cases "1:8:65:185000:64;..."] [--impls fa2,fa3,sglang] [--sglang-dir DIR] [--reps 20]
--sglang-dir points at a folder holding sglang/kernels/ops/attention/{extend_attention,
decode_attention,score_mod}.py, e.g. extracted from the sglang wheel by bench/fetch-peers.sh.
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import sys
import types

DEFAULT_CASES = [
    (1, 8, 65, 185000, 64),
    (1, 8, 65, 131072, 64),
    (1, 16, 16, 131072, 64),
    (1, 16, 65, 131072, 64),
    (8, 16, 65, 32768, 64),
    (1, 128, 64, 131072, 64),
    (8, 16, 1, 131072, 64),
    (8, 128, 1, 32768, 64),
]
SGLANG_CASES = {(1, 8, 65, 185000, 64), (1, 16, 16, 131072, 64), (8, 16, 1, 131072, 64)}


def parse_cases(text):
    cases = []
    for item in text.split(";"):
        parts = item.split(":")
        if len(parts) != 5:
            raise SystemExit(f"--cases entry '{item}' must be batch:heads:q_len:prefix:page_size")
        b, h, q, l, ps = (int(x) for x in parts)
        if b < 1 or not 1 <= h <= 128 or not 1 <= q <= 1025 or l < 1 or ps < 1 or ps & (ps - 1):
            raise SystemExit(f"--cases entry '{item}': batch >= 1, heads 1..128, q_len 1..1025, prefix >= 1, "
                             "page_size a power of two")
        cases.append((b, h, q, l, ps))
    return cases


def graph_time_us(torch, calls, reps):
    """calls: list of zero-argument callables (one per input copy). Median us per call."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for c in calls:  # warm-up outside the capture (JIT, allocations)
            c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for c in calls:
            c()
    times = []
    for i in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) * 1e3 / len(calls))
    times.sort()
    return times[len(times) // 2]


def copies_for(torch, kv_bytes):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return int(min(8, max(1, 3 * l2 // max(kv_bytes, 1) + 1)))


def make_pages(torch, batch, prefix, page_size, gen):
    pages_per_req = (prefix + page_size - 1) // page_size
    perm = torch.randperm(batch * pages_per_req, generator=gen).int()
    return perm.view(batch, pages_per_req), pages_per_req


def time_flashinfer(torch, flashinfer, backend, case, reps):
    b, h, q, l, ps = case
    gen = torch.Generator().manual_seed(1)
    table, per_req = make_pages(torch, b, l, ps, gen)
    num_pages = b * per_req
    kv_bytes = num_pages * ps * 576 * 2
    copies = copies_for(torch, kv_bytes)
    dev = "cuda"
    qo_indptr = torch.arange(0, b + 1, dtype=torch.int32, device=dev) * q
    kv_indptr = torch.arange(0, b + 1, dtype=torch.int32, device=dev) * per_req
    kv_indices = table.flatten().to(dev)
    kv_len = torch.full((b,), l, dtype=torch.int32, device=dev)
    ws = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend=backend)
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_len, h, 512, 64, ps, False, 1.0 / math.sqrt(576),
                 torch.bfloat16, torch.bfloat16)
    calls = []
    for i in range(copies):
        kv = (torch.rand(num_pages, ps, 576, device=dev, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
        qq = (torch.rand(b * q, h, 576, device=dev, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
        out = torch.empty(b * q, h, 512, device=dev, dtype=torch.bfloat16)
        q_nope, q_pe = qq[..., :512].contiguous(), qq[..., 512:].contiguous()
        ckv, kpe = kv[..., :512], kv[..., 512:]
        calls.append(lambda q_nope=q_nope, q_pe=q_pe, ckv=ckv, kpe=kpe, out=out:
                     wrapper.run(q_nope, q_pe, ckv, kpe, out=out))
    return graph_time_us(torch, calls, reps)


def load_sglang_extend(sglang_dir):
    """extend_attention_fwd from the wheel's files, with the few sglang runtime helpers it imports
    stubbed for an NVIDIA GPU (no AMD paths, no environment switches)."""
    base = os.path.join(sglang_dir, "sglang", "kernels", "ops", "attention")
    for name in ("extend_attention.py", "decode_attention.py", "score_mod.py"):
        if not os.path.isfile(os.path.join(base, name)):
            raise FileNotFoundError(os.path.join(base, name))

    class _Flag:
        def get(self):
            return False

    class _Envs:
        def __getattr__(self, name):
            return _Flag()

    def stub(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        mod.__getattr__ = lambda attr: (lambda *a, **k: False)
        sys.modules[name] = mod
        return mod

    for pkg in ("sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention"):
        mod = stub(pkg)
        mod.__path__ = []
    stub("sglang.srt.environ", envs=_Envs())
    stub("sglang.srt.utils", is_cuda=lambda: True, is_hip=lambda: False)

    def load(modname, fname):
        spec = importlib.util.spec_from_file_location(modname, os.path.join(base, fname))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        return mod

    load("sglang.kernels.ops.attention.score_mod", "score_mod.py")
    load("sglang.kernels.ops.attention.decode_attention", "decode_attention.py")
    return load("sglang.kernels.ops.attention.extend_attention", "extend_attention.py").extend_attention_fwd


def tree_mask_rows(torch, q, gen):
    """DDTree-like random tree: parent[i] uniform in [max(0, i - 8), i)."""
    vis = torch.zeros(q, q, dtype=torch.bool)
    for i in range(q):
        if i > 0:
            lo = max(0, i - 8)
            par = lo + int(torch.randint(0, i - lo, (1,), generator=gen))
            vis[i] = vis[par]
        vis[i, i] = True
    return vis


def time_sglang(torch, extend_fwd, case, reps):
    b, h, q, l, _ = case  # SGLang's tree path runs over a page-1 cache
    gen = torch.Generator().manual_seed(2)
    dev = "cuda"
    slots = b * (l + q)
    perm = torch.randperm(slots, generator=gen).int()
    kv_indptr = torch.arange(0, b + 1, dtype=torch.int32, device=dev) * l
    kv_indices = torch.cat([perm[r * (l + q): r * (l + q) + l] for r in range(b)]).to(dev)
    qo_indptr = torch.arange(0, b + 1, dtype=torch.int32, device=dev) * q
    masks = []
    for _ in range(b):  # per request [q, prefix + q]: the whole prefix, then the tree
        m = torch.ones(q, l + q, dtype=torch.bool)
        m[:, l:] = tree_mask_rows(torch, q, gen)
        masks.append(m.flatten())
    custom_mask = torch.cat(masks).to(dev)
    mask_indptr = torch.arange(0, b + 1, dtype=torch.int64, device=dev) * (q * (l + q))
    kv_bytes = slots * 576 * 2
    copies = min(copies_for(torch, kv_bytes), 3)
    calls = []
    for _ in range(copies):
        kbuf = (torch.rand(slots, 1, 576, device=dev) * 2 - 1).to(torch.bfloat16)
        vbuf = kbuf[..., :512]
        qx = (torch.rand(b * q, h, 576, device=dev) * 2 - 1).to(torch.bfloat16)
        kx = (torch.rand(b * q, 1, 576, device=dev) * 2 - 1).to(torch.bfloat16)
        vx = kx[..., :512].contiguous()
        ox = torch.empty(b * q, h, 512, device=dev, dtype=torch.bfloat16)
        # k_scale and v_scale are Python floats: the kernel multiplies the scores by them as
        # scalars (a tensor there is a pointer argument, which its Triton code cannot multiply).
        calls.append(lambda qx=qx, kx=kx, vx=vx, ox=ox, kbuf=kbuf, vbuf=vbuf: extend_fwd(
            qx, kx, vx, ox, kbuf, vbuf, qo_indptr, kv_indptr, kv_indices, custom_mask, False, mask_indptr, q,
            1.0, 1.0, sm_scale=1.0 / math.sqrt(576), skip_prefix_custom_mask=True))
    return graph_time_us(torch, calls, max(3, reps // 4))


def treemla_rows(path, cases):
    """treemla's own rows at the given shapes from a `treemla bench --json` file of the same run,
    in the peers' format (the same timing method: graph replay of back-to-back calls)."""
    with open(path) as f:
        doc = json.load(f)
    want = set(cases)
    out = []
    for r in doc.get("results", []):
        key = (r["batch"], r["heads"], r["q_len"], r["prefix"], r["page_size"])
        if key in want:
            out.append({"impl": f"treemla {r['family']}/{r['tile']}", "batch": r["batch"],
                        "heads": r["heads"], "q_len": r["q_len"], "prefix": r["prefix"],
                        "page_size": r["page_size"], "us": r["us"]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=None, help="semicolon-separated batch:heads:q_len:prefix:page_size")
    ap.add_argument("--impls", default="fa2,fa3,sglang", help="comma-separated: fa2, fa3, sglang")
    ap.add_argument("--sglang-dir", default=os.path.join(os.path.dirname(__file__), "..", ".peers", "sglang"),
                    help="folder with sglang/kernels/ops/attention/*.py from the sglang 0.5.23 wheel")
    ap.add_argument("--sglang-cases", default="default",
                    help="'default' (three shapes: each call takes 15-40 ms), 'all', or a --cases list")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--bench-json", default="",
                    help="treemla bench --json of the same run: its rows at these shapes join the "
                         "output as impl 'treemla <family>/<tile>', for one side-by-side file")
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    if args.reps < 3:
        raise SystemExit(f"--reps = {args.reps} must be >= 3")
    impls = [x for x in args.impls.split(",") if x]
    for x in impls:
        if x not in ("fa2", "fa3", "sglang"):
            raise SystemExit(f"--impls entry '{x}' must be fa2, fa3 or sglang")
    cases = parse_cases(args.cases) if args.cases else DEFAULT_CASES
    if args.sglang_cases == "default":
        sg_cases = [c for c in cases if c in SGLANG_CASES]
    elif args.sglang_cases == "all":
        sg_cases = cases
    else:
        sg_cases = parse_cases(args.sglang_cases)

    try:
        import torch
    except ImportError:
        print("peers: torch is not installed; nothing to time")
        return 0
    if not torch.cuda.is_available():
        print("peers: no CUDA device; nothing to time")
        return 0

    results, skipped = [], []
    flashinfer = None
    if "fa2" in impls or "fa3" in impls:
        try:
            import flashinfer  # noqa: F401
            import flashinfer.mla  # noqa: F401
        except Exception as e:  # not installed, or its JIT prerequisites are missing
            skipped.append(f"flashinfer ({type(e).__name__}: {e})")
            flashinfer = None
    extend_fwd = None
    if "sglang" in impls:
        try:
            extend_fwd = load_sglang_extend(args.sglang_dir)
        except Exception as e:
            skipped.append(f"sglang ({type(e).__name__}: {e})")

    print(f"# peers  gpu: {torch.cuda.get_device_name(0)}  torch {torch.__version__}  commit {args.commit}")
    print(f"{'impl':8s} {'batch':>5s} {'H':>4s} {'q_len':>5s} {'prefix':>7s} {'page':>5s} | {'us':>10s}")
    for impl in impls:
        for case in (sg_cases if impl == "sglang" else cases):
            try:
                if impl in ("fa2", "fa3"):
                    if flashinfer is None:
                        continue
                    us = time_flashinfer(torch, flashinfer, impl, case, args.reps)
                else:
                    if extend_fwd is None:
                        continue
                    us = time_sglang(torch, extend_fwd, case, args.reps)
            except Exception as e:
                # the end of the message: a Triton CompilationError puts the source excerpt first
                # and the reason last
                skipped.append(f"{impl} {case} ({type(e).__name__}: {str(e)[-300:]})")
                continue
            b, h, q, l, ps = case
            results.append({"impl": impl, "batch": b, "heads": h, "q_len": q, "prefix": l,
                            "page_size": 1 if impl == "sglang" else ps, "us": us})
            print(f"{impl:8s} {b:5d} {h:4d} {q:5d} {l:7d} {results[-1]['page_size']:5d} | {us:10.1f}", flush=True)
    if args.bench_json:
        results += treemla_rows(args.bench_json, cases)
    for s in skipped:
        print(f"peers: skipped {s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        meta = {"gpu": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
                "commit": args.commit, "torch": torch.__version__, "skipped": skipped}
        with open(os.path.splitext(args.json)[0] + ".meta.json", "w") as f:
            json.dump(meta, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
