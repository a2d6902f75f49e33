"""GPU tests: the CUDA kernels against the float64 torch reference, CUDA-graph replay with new
lengths, torch.compile, merge_state and the KV-pool operators. Skipped without a GPU."""
import math

import pytest
import torch

import treemla
from treemla import kvpool
from reference import HEAD_QK, make_case, reference_merge, reference_verify

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
needs_kernels = pytest.mark.skipif(not treemla.with_cuda(), reason="treemla built without CUDA")

# bf16/fp16 tensor-core products with fp32 accumulation, o rounded once to 16 bits.
O_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def check_cuda(case, part="all", **kw):
    dev = case.to("cuda")
    o, lse = treemla.verify_attention(*dev.args(), part=part, **kw)
    torch.cuda.synchronize()
    o_ref, lse_ref = reference_verify(*dev.args(), part=part)
    rows = int(case.q_indptr[-1])
    tol = O_TOL[case.q.dtype]
    torch.testing.assert_close(o[:rows].double(), o_ref[:rows], rtol=tol, atol=tol)
    torch.testing.assert_close(lse[:rows].double(), lse_ref[:rows], rtol=1e-3, atol=2e-3)
    return o, lse


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [1, 8, 16, 128])
@pytest.mark.parametrize("q_len", [1, 16, 65])
@pytest.mark.parametrize("page_size", [1, 64])
def test_verify_cuda_matches_reference(dtype, heads, q_len, page_size):
    seed = heads * 1000 + q_len * 10 + page_size
    case = make_case(seed, [203], [q_len], heads=heads, page_size=page_size, dtype=dtype)
    check_cuda(case)


@needs_kernels
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_verify_cuda_ragged_batch(page_size):
    case = make_case(17, [0, 1, 4097, 63, 650], [9, 1, 65, 0, 130], heads=8,
                     page_size=page_size, dtype=torch.bfloat16)
    check_cuda(case)


@needs_kernels
def test_verify_cuda_parts_merge():
    case = make_case(21, [300, 5], [33, 7], heads=16, page_size=16, dtype=torch.bfloat16)
    o_p, s_p = check_cuda(case, part="prefix")
    o_t, s_t = check_cuda(case, part="tail")
    o_a, s_a = check_cuda(case)
    o_m, s_m = treemla.merge_state(o_p, s_p, o_t, s_t)
    torch.testing.assert_close(o_m.float(), o_a.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(s_m, s_a, rtol=1e-4, atol=1e-4)


@needs_kernels
@pytest.mark.parametrize("family", ["cpasync", "cluster", "sm90a", "warpspec"])
@pytest.mark.parametrize("tile", ["smem99k", "smem-large"])
def test_verify_cuda_each_tile_configuration(tile, family):
    # smem99k is the configuration sm_120 runs (99 KB per block); it runs on every GPU.
    props = torch.cuda.get_device_properties(0)
    optin = props.shared_memory_per_block_optin
    if tile == "smem-large" and optin <= 101376:
        pytest.skip(f"this GPU allows {optin} B of shared memory per block: smem99k only")
    if family in ("cluster", "warpspec") and props.major < 9:
        pytest.skip(f"the {family} family needs compute capability 9.0, this GPU has {props.major}.{props.minor}")
    if family == "warpspec" and tile == "smem-large":
        with pytest.raises(RuntimeError, match="only the smem99k"):
            treemla.plan_verify(4, 300, 16, device="cuda", tile=tile, family=family)
        return
    if family == "sm90a":
        if (props.major, props.minor) != (9, 0):
            pytest.skip(f"the sm90a family needs compute capability 9.0, this GPU has {props.major}.{props.minor}")
        if "90a" not in treemla.compiled_architectures().split():
            pytest.skip("the binding was built without sm_90a code (TORCH_CUDA_ARCH_LIST=9.0a)")
        if tile == "smem99k":
            with pytest.raises(RuntimeError, match="only the smem-large"):
                treemla.plan_verify(4, 300, 16, device="cuda", tile=tile, family=family)
            return
    case = make_case(23, [0, 4097, 100, 33], [65, 1, 130, 16], heads=16, page_size=32,
                     dtype=torch.bfloat16)
    plan = treemla.plan_verify(4, int(case.q_indptr[-1]), 16, device="cuda", tile=tile,
                               family=family)
    assert (plan.tile, plan.family) == (tile, family)
    assert treemla.plan_verify(4, int(case.q_indptr[-1]), 16, device="cuda", tile=plan.tile,
                               family=plan.family).tile == tile  # a plan's names are valid requests
    check_cuda(case, plan=plan)


@needs_kernels
def test_verify_cuda_decode_family():
    # Requests of at most 16 rows (q_len * heads): a bound max_q_len with max_q_len * heads <= 16
    # lets the plan use the decode family (smem99k only), and the GPU rejects a longer request.
    case = make_case(29, [0, 4097, 100000, 33], [1, 2, 1, 2], heads=8, page_size=16,
                     dtype=torch.bfloat16)
    plan = treemla.plan_verify(4, int(case.q_indptr[-1]), 8, device="cuda", tile="smem99k",
                               max_q_len=2)
    assert (plan.family, plan.tile, plan.max_q_len) == ("decode", "smem99k", 2)
    check_cuda(case, plan=plan)
    with pytest.raises(RuntimeError, match="only the smem99k"):
        treemla.plan_verify(4, 8, 8, device="cuda", tile="smem-large", family="decode",
                            max_q_len=1)
    with pytest.raises(RuntimeError, match="max_q_len"):
        treemla.plan_verify(4, 8, 8, device="cuda", family="decode", max_q_len=3)
    long = make_case(30, [50, 60], [1, 3], heads=8, page_size=16, dtype=torch.bfloat16)
    ws = plan.new_workspace()
    treemla.verify_attention(*long.to("cuda").args(), plan=plan, workspace=ws)
    with pytest.raises(RuntimeError, match="request 1 has q_len = 3"):
        treemla.check_status(plan, ws)


def test_plan_verify_refuses_unknown_family():
    with pytest.raises(ValueError, match="family must be one of"):
        treemla.plan_verify(1, 1, 8, device=0, family="wgmma")


@needs_kernels
def test_cuda_graph_replay_with_new_lengths():
    heads, page_size, max_batch, max_q = 8, 16, 3, 96
    plan = treemla.plan_verify(max_batch, max_q, heads, device="cuda")
    ws = plan.new_workspace()
    first = make_case(31, [40, 7, 300], [17, 5, 33], heads=heads, page_size=page_size,
                      extra_pages=40, stride_pad=30)
    second = make_case(32, [500, 0, 20], [65, 1, 9], heads=heads, page_size=page_size,
                       extra_pages=0, stride_pad=1)
    num_pages = max(first.kv_cache.shape[0], second.kv_cache.shape[0])
    stride = max(first.page_table.shape[1], second.page_table.shape[1])
    # Static buffers sized for both rounds; each round is copied in place before replay.
    q = torch.zeros(max_q, heads, HEAD_QK, dtype=torch.bfloat16, device="cuda")
    kv = torch.zeros(num_pages, page_size, HEAD_QK, dtype=torch.bfloat16, device="cuda")
    table = torch.zeros(max_batch, stride, dtype=torch.int32, device="cuda")
    lens = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    mask = torch.zeros(max_q, 2, dtype=torch.int64, device="cuda")
    out = torch.empty(max_q, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(max_q, heads, device="cuda")

    def load(case):
        n = case.q.shape[0]
        q.zero_()
        q[:n] = case.q
        kv[: case.kv_cache.shape[0]] = case.kv_cache
        table.zero_()
        table[:, : case.page_table.shape[1]] = case.page_table
        lens.copy_(case.prefix_lens)
        indptr.copy_(case.q_indptr)
        mask.zero_()
        mask[:n, : case.tree_mask.shape[1]] = case.tree_mask

    def run():
        treemla.verify_attention(q, kv, table, lens, indptr, mask, first.sm_scale, plan=plan,
                                 workspace=ws, out=out, lse=lse)

    load(first)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for case in (first, second, first):
        load(case)
        graph.replay()
        torch.cuda.synchronize()
        treemla.check_status(plan, ws)
        rows = case.q.shape[0]
        o_ref, lse_ref = reference_verify(q, kv, table, lens, indptr, mask, case.sm_scale)
        torch.testing.assert_close(out[:rows].double(), o_ref[:rows], rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(lse[:rows].double(), lse_ref[:rows], rtol=1e-3, atol=2e-3)


@needs_kernels
def test_torch_compile_cuda():
    case = make_case(41, [100, 3], [17, 4], heads=16, page_size=64).to("cuda")

    def step(q, kv, table, lens, indptr, mask):
        o, lse = treemla.verify_attention(q, kv, table, lens, indptr, mask, case.sm_scale)
        return o.float().sum(-1), lse * 2

    compiled = torch.compile(step, fullgraph=True)
    got = compiled(*case.args()[:-1])
    want = step(*case.args()[:-1])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)


@needs_kernels
def test_check_status_reports_bad_page():
    case = make_case(51, [40], [5], heads=8, page_size=16).to("cuda")
    plan = treemla.plan_verify(1, 5, 8, device="cuda")
    ws = plan.new_workspace()
    table = case.page_table.clone()
    table[0, 1] = 1 << 20
    treemla.verify_attention(case.q, case.kv_cache, table, case.prefix_lens, case.q_indptr,
                             case.tree_mask, case.sm_scale, plan=plan, workspace=ws)
    with pytest.raises(RuntimeError, match="page_table row 0"):
        treemla.check_status(plan, ws)
    treemla.check_status(plan, ws)  # cleared


@needs_kernels
def test_cuda_validation_errors():
    case = make_case(52, [4], [2], heads=8, page_size=4).to("cuda")
    with pytest.raises(ValueError, match=r"page_table must be on q's device"):
        treemla.verify_attention(case.q, case.kv_cache, case.page_table.cpu(), case.prefix_lens,
                                 case.q_indptr, case.tree_mask, case.sm_scale)
    with pytest.raises(TypeError, match=r"q must be torch.bfloat16 or torch.float16"):
        treemla.verify_attention(case.q.float(), case.kv_cache.float(), *case.args()[2:])
    plan = treemla.plan_verify(1, 2, 8, device="cuda")
    with pytest.raises(ValueError, match=r"workspace must hold at least"):
        treemla.verify_attention(*case.args(), plan=plan,
                                 workspace=torch.zeros(16, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match=r"plan was made for num_heads = 16"):
        treemla.verify_attention(*case.args(), plan=treemla.plan_verify(1, 2, 16, device="cuda"))


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_merge_state_cuda(dtype):
    gen = torch.Generator().manual_seed(61)
    v_a = torch.randn(37, 16, 512, generator=gen).to(dtype)
    v_b = torch.randn(37, 16, 512, generator=gen).to(dtype)
    s_a = torch.randn(37, 16, generator=gen) * 4
    s_b = torch.randn(37, 16, generator=gen) * 4
    s_a[0], s_b[1], s_a[2, :3] = -math.inf, math.inf, math.nan
    s_a[3], s_b[3] = -math.inf, -math.inf
    v, s = treemla.merge_state(*(t.cuda() for t in (v_a, s_a, v_b, s_b)))
    v_ref, s_ref = reference_merge(v_a, s_a, v_b, s_b)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(v.cpu().double(), v_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(s.cpu().double(), s_ref, rtol=1e-5, atol=1e-5)
    assert (v[3] == 0).all() and torch.isneginf(s[3]).all()


needs_pool = pytest.mark.skipif(not kvpool.with_cuda_kvpool(),
                                reason="treemla built without the GPU KV-pool kernels")


@needs_pool
def test_kvpool_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(71)
    pool = treemla.KvPool(num_pages=300, page_size=16)
    for r in range(40):
        pool.alloc(r, int(torch.randint(1, 100, (1,), generator=gen)))
    for r in range(0, 40, 3):
        pool.free(r)
    cache = torch.randn(300, 16, 576).to(torch.bfloat16)
    plan = pool.defrag()
    cpu, gpu = cache.clone(), cache.cuda()
    kvpool.apply_defrag(cpu, plan)
    ws = kvpool.move_workspace("cuda")
    kvpool.apply_defrag(gpu, plan, workspace=ws)
    kvpool.check_move_status(ws)
    assert torch.equal(gpu.cpu(), cpu)
    # Device-driven accept + commit equals the CPU kernels.
    q_indptr = torch.tensor([0, 20, 21, 60], dtype=torch.int32)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, 20)]
                           + [-1] + [-1] + [i - 1 for i in range(1, 39)], dtype=torch.int32)
    node_tok = torch.randint(0, 2, (60,), generator=gen, dtype=torch.int32)
    target = torch.randint(0, 2, (60,), generator=gen, dtype=torch.int32)
    want = kvpool.accept_paths(q_indptr, parents, node_tok, target, 16)
    got = kvpool.accept_paths(*(t.cuda() for t in (q_indptr, parents, node_tok, target)), 16)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    # Distinct pages per request (the commit's precondition), scattered over the cache.
    table = torch.randperm(300, generator=gen)[:24].view(3, 8).int()
    lens = torch.tensor([30, 0, 70], dtype=torch.int32)
    c_cpu, c_gpu = cache.clone(), cache.cuda()
    want = kvpool.commit_accepted(c_cpu, table, lens, want[0], want[1])
    got = kvpool.commit_accepted(c_gpu, table.cuda(), lens.cuda(), got[0], got[1])
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    assert torch.equal(c_gpu.cpu(), c_cpu)
