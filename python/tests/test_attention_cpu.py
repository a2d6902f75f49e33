"""verify_attention and merge_state on the CPU against the pure-torch references, the
validation errors, and torch.compile over the operators."""
import math

import pytest
import torch

import treemla
from reference import HEAD_QK, make_case, reference_merge, reference_verify

# (prefix_lens, q_lens): single requests, a ragged batch with an empty request, prefix 0.
SHAPES = [
    ([37], [1]),
    ([0], [9]),
    ([64], [16]),
    ([5, 0, 130], [7, 3, 65]),
    ([12, 40], [0, 17]),
]


def tolerances(dtype):
    # The CPU path computes in double and rounds o once to the output dtype.
    return {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 1e-2),
            torch.float16: (2e-3, 2e-3)}[dtype]


def check_against_reference(case, part="all", **kw):
    o, lse = treemla.verify_attention(*case.args(), part=part, **kw)
    o_ref, lse_ref = reference_verify(*case.args(), part=part)
    assert o.dtype == case.q.dtype and lse.dtype == torch.float32
    assert o.shape == (case.q.shape[0], case.q.shape[1], 512)
    rtol, atol = tolerances(case.q.dtype)
    torch.testing.assert_close(o.double(), o_ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-5, atol=1e-4)
    return o, lse


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("page_size", [1, 4, 64])
@pytest.mark.parametrize("shape_idx", range(len(SHAPES)))
def test_verify_matches_reference(dtype, page_size, shape_idx):
    prefix_lens, q_lens = SHAPES[shape_idx]
    seed = 1000 * shape_idx + page_size
    case = make_case(seed, prefix_lens, q_lens, heads=3, page_size=page_size, dtype=dtype)
    check_against_reference(case)


@pytest.mark.parametrize("tree_shape", ["chain", "star", "deep", "random"])
@pytest.mark.parametrize("heads", [1, 8])
def test_verify_tree_shapes(tree_shape, heads):
    case = make_case(7, [33, 2], [70, 12], heads=heads, page_size=16, shape=tree_shape)
    check_against_reference(case)


@pytest.mark.parametrize("part", ["prefix", "tail"])
def test_parts_merge_into_all(part):
    case = make_case(3, [50, 0, 9], [13, 5, 1], heads=4, page_size=8, dtype=torch.float32)
    check_against_reference(case, part=part)
    o_p, s_p = treemla.verify_attention(*case.args(), part="prefix")
    o_t, s_t = treemla.verify_attention(*case.args(), part="tail")
    o_all, s_all = treemla.verify_attention(*case.args())
    o_m, s_m = treemla.merge_state(o_p, s_p, o_t, s_t)
    torch.testing.assert_close(o_m, o_all, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s_m, s_all, rtol=1e-5, atol=1e-5)


def test_out_variant_and_layouts():
    case = make_case(11, [20, 3], [4, 6], heads=2, page_size=4)
    o_ref, lse_ref = treemla.verify_attention(*case.args())
    # 4-D cache [num_pages, page_size, 1, 576] and a column slice of a wider page table.
    kv4 = case.kv_cache.unsqueeze(2)
    wide = torch.full((2, case.page_table.shape[1] + 5), 7, dtype=torch.int32)
    wide[:, : case.page_table.shape[1]] = case.page_table
    table = wide[:, : case.page_table.shape[1]]
    assert not table.is_contiguous()
    out = torch.empty_like(o_ref)
    lse = torch.empty_like(lse_ref)
    res = treemla.verify_attention(case.q, kv4, table, case.prefix_lens, case.q_indptr,
                                   case.tree_mask, case.sm_scale, out=out, lse=lse)
    assert res[0] is out and res[1] is lse
    torch.testing.assert_close(out, o_ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_ref, rtol=0, atol=0)


def test_rows_past_indptr_and_padding_words():
    # q has 3 spare rows past q_indptr[-1] (as with a fixed-size graph buffer) and the mask
    # carries 2 words for 10-node trees.
    case = make_case(5, [8], [10], heads=2, page_size=2, mask_words=2)
    q = torch.cat([case.q, torch.randn(3, 2, HEAD_QK).to(case.q.dtype)])
    mask = torch.cat([case.tree_mask, torch.zeros(3, 2, dtype=torch.int64)])
    o, lse = treemla.verify_attention(q, case.kv_cache, case.page_table, case.prefix_lens,
                                      case.q_indptr, mask, case.sm_scale)
    o_ref, lse_ref = reference_verify(*case.args())
    torch.testing.assert_close(o[:10].double(), o_ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse[:10].double(), lse_ref, rtol=1e-5, atol=1e-4)
    assert (o[10:] == 0).all() and torch.isneginf(lse[10:]).all()


def test_verify_operator_schema():
    # Schema, fake kernel and functionalization agree with the real kernel.
    case = make_case(2, [6, 1], [3, 2], heads=2, page_size=4, dtype=torch.float32)
    torch.library.opcheck(torch.ops.treemla.verify_attention.default,
                          case.args() + (0, 0, 0, 0, None))
    o = torch.empty(5, 2, 512)
    lse = torch.empty(5, 2)
    torch.library.opcheck(torch.ops.treemla.verify_attention_out.default,
                          case.args() + (0, 0, 0, 0, o, lse, None))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    case = make_case(9, [10, 4], [5, 3], heads=2, page_size=4)

    def step(q, kv, table, lens, indptr, mask):
        o, lse = treemla.verify_attention(q, kv, table, lens, indptr, mask, case.sm_scale)
        o_p, s_p = treemla.verify_attention(q, kv, table, lens, indptr, mask, case.sm_scale,
                                            part="prefix")
        o_t, s_t = treemla.verify_attention(q, kv, table, lens, indptr, mask, case.sm_scale,
                                            part="tail")
        o_m, s_m = treemla.merge_state(o_p.float(), s_p, o_t.float(), s_t)
        return o.float() * 2, lse, o_m, s_m

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    args = case.args()[:-1]
    got = compiled(*args)
    want = step(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


# ---- merge_state ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_merge_state_matches_formula(dtype):
    gen = torch.Generator().manual_seed(4)
    tokens, heads, dim = 9, 3, 40
    v_a = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    v_b = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    s_a = torch.randn(tokens, heads, generator=gen) * 3
    s_b = torch.randn(tokens, heads, generator=gen) * 3
    inf = float("inf")
    # empty parts: -inf, +inf and NaN mark an empty side; row 3 has both sides empty.
    s_a[0, 0], s_b[1, 1], s_a[2, 2] = -inf, inf, float("nan")
    s_a[3, :], s_b[3, :] = -inf, -inf
    v, s = treemla.merge_state(v_a, s_a, v_b, s_b)
    v_ref, s_ref = reference_merge(v_a, s_a, v_b, s_b)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(v.double(), v_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(s.double(), s_ref, rtol=1e-5, atol=1e-5)
    assert (v[3] == 0).all() and torch.isneginf(s[3]).all()
    assert not torch.isnan(v).any() and not torch.isnan(s).any()
    # In place into v_a / s_a.
    v_a2, s_a2 = v_a.clone(), s_a.clone()
    res = treemla.merge_state(v_a2, s_a2, v_b, s_b, out=(v_a2, s_a2))
    assert res[0] is v_a2
    torch.testing.assert_close(v_a2, v, rtol=0, atol=0)
    torch.testing.assert_close(s_a2, s, rtol=0, atol=0, equal_nan=True)


def test_merge_state_operator_schema():
    v = torch.randn(4, 2, 8)
    s = torch.randn(4, 2)
    torch.library.opcheck(torch.ops.treemla.merge_state.default, (v, s, v * 2, s - 1))


# ---- validation --------------------------------------------------------------------------

def _args(case, **changes):
    names = ["q", "kv_cache", "page_table", "prefix_lens", "q_indptr", "tree_mask", "sm_scale"]
    args = dict(zip(names, case.args()))
    args.update(changes)
    return [args[n] for n in names]


@pytest.fixture(scope="module")
def small_case():
    return make_case(1, [6], [3], heads=8, page_size=4)


@pytest.mark.parametrize("change, exc, pattern", [
    (lambda c: {"q": torch.zeros(3, 8, 512, dtype=torch.bfloat16)}, ValueError,
     r"q must have shape \[total_q, H, 576\], got \[3, 8, 512\]"),
    (lambda c: {"q": c.q.to(torch.int32)}, TypeError, r"q must be torch.bfloat16 or torch.float16"),
    (lambda c: {"q": c.q.transpose(0, 1).contiguous().transpose(0, 1)}, ValueError,
     r"q must be contiguous"),
    (lambda c: {"kv_cache": c.kv_cache.float()}, TypeError, r"kv_cache must have q's dtype"),
    (lambda c: {"kv_cache": c.kv_cache[..., :512]}, ValueError, r"kv_cache must have shape"),
    (lambda c: {"kv_cache": torch.zeros(4, 3, 576, dtype=torch.bfloat16)}, ValueError,
     r"page_size .* power of two"),
    (lambda c: {"page_table": c.page_table.long()}, TypeError, r"page_table must be torch.int32"),
    (lambda c: {"page_table": c.page_table.t()}, ValueError, r"page_table"),
    (lambda c: {"prefix_lens": c.prefix_lens.float()}, TypeError, r"prefix_lens must be"),
    (lambda c: {"q_indptr": torch.tensor([0, 3, 3], dtype=torch.int32)}, ValueError,
     r"q_indptr must have shape \[batch \+ 1\] = \[2\]"),
    (lambda c: {"tree_mask": c.tree_mask[:2]}, ValueError, r"tree_mask must have shape \[total_q, mask_words\]"),
    (lambda c: {"tree_mask": c.tree_mask.int()}, TypeError, r"tree_mask must be torch.int64"),
    (lambda c: {"sm_scale": -1.0}, ValueError, r"sm_scale must be finite and > 0"),
    (lambda c: {"page_table": torch.full_like(c.page_table, 999)}, RuntimeError,
     r"page_table\[0\]\[0\] = 999 is out of range"),
    (lambda c: {"q_indptr": torch.tensor([0, 4], dtype=torch.int32)}, ValueError,
     r"q_indptr\[batch\]"),
    (lambda c: {"tree_mask": c.tree_mask | 8}, RuntimeError, r"tree_mask row 0 .* has bit 3 set"),
])
def test_validation_errors(small_case, change, exc, pattern):
    with pytest.raises(exc, match=pattern):
        treemla.verify_attention(*_args(small_case, **change(small_case)))


def test_validation_wrapper_errors(small_case):
    with pytest.raises(ValueError, match="part must be"):
        treemla.verify_attention(*small_case.args(), part="middle")
    with pytest.raises(ValueError, match="out and lse must be given together"):
        treemla.verify_attention(*small_case.args(), out=torch.empty(3, 8, 512))
    with pytest.raises(ValueError, match=r"out must have shape"):
        treemla.verify_attention(*small_case.args(), out=torch.empty(3, 8, 576),
                                 lse=torch.empty(3, 8))
    with pytest.raises(TypeError, match=r"lse must be torch.float32"):
        treemla.verify_attention(*small_case.args(),
                                 out=torch.empty(3, 8, 512, dtype=torch.bfloat16),
                                 lse=torch.empty(3, 8, dtype=torch.float64))
    v, s = torch.randn(2, 2, 4), torch.randn(2, 2)
    with pytest.raises(ValueError, match=r"s_b must have shape \[tokens, heads\] = \[2, 2\]"):
        treemla.merge_state(v, s, v, s[:1])
    with pytest.raises(TypeError, match=r"v_b must have v_a's dtype"):
        treemla.merge_state(v, s, v.double(), s)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error path")
def test_gpu_helpers_without_gpu():
    if treemla.with_cuda():
        with pytest.raises(RuntimeError):
            treemla.plan_verify(1, 1, 8, device=0)
    else:
        with pytest.raises(RuntimeError, match="built without CUDA"):
            treemla.plan_verify(1, 1, 8, device=0)


def test_tree_tail_slots():
    case = make_case(6, [5, 0, 17], [3, 4, 2], heads=1, page_size=4)
    slots = treemla.tree_tail_slots(case.page_table, case.prefix_lens, case.q_indptr, 4)
    want = []
    for b, (p, n) in enumerate(zip([5, 0, 17], [3, 4, 2])):
        for j in range(n):
            t = p + j
            want.append(int(case.page_table[b, t // 4]) * 4 + t % 4)
    assert slots.tolist() == want
    # The slots hold the rows the reference attends to as the tail (not NaN poison).
    flat = case.kv_cache.view(-1, 576)
    assert not torch.isnan(flat[slots].float()).any()
    assert math.isclose(case.sm_scale, 1 / math.sqrt(192))


def test_plan_rejects_unknown_tile_name():
    with pytest.raises(ValueError, match=r"tile must be one of .*'smem-large'.*got 'large'"):
        treemla.plan_verify(1, 1, 8, tile="large")


@pytest.mark.parametrize("bad", [-1, 1026, 1.5])
def test_plan_rejects_a_bad_max_q_len(bad):
    # Checked before any device access, so it runs without a GPU too.
    with pytest.raises((ValueError, TypeError), match="max_q_len"):
        treemla.plan_verify(1, 1, 8, tile="smem99k", family="decode", max_q_len=bad)
