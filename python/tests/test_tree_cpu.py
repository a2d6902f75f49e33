"""Tree helpers against plain Python implementations of the design's rules."""
import pytest
import torch

import treemla
from reference import accept_walk, ancestor_mask, ddtree_brute_force, depths, random_parents


def trees(seed, count=12, max_n=140):
    gen = torch.Generator().manual_seed(seed)
    shapes = ["random", "chain", "star", "deep"]
    out = [[-1], [-1, 0]]
    for i in range(count):
        n = int(torch.randint(1, max_n, (1,), generator=gen))
        out.append(random_parents(gen, n, shapes[i % 4]))
    return out


@pytest.mark.parametrize("parents", trees(0))
def test_mask_positions_depths(parents):
    n = len(parents)
    mask = treemla.tree_mask_from_parents(parents)
    assert mask.dtype == torch.int64 and mask.shape == (n, (n + 63) // 64)
    assert torch.equal(mask, ancestor_mask(parents))
    padded = treemla.tree_mask_from_parents(torch.tensor(parents), mask_words=3)
    assert torch.equal(padded, ancestor_mask(parents, 3))
    assert treemla.depths_from_parents(parents).tolist() == depths(parents)
    assert treemla.positions_from_parents(parents, 100).tolist() == [100 + d for d in depths(parents)]
    assert treemla.parents_from_mask(mask).tolist() == parents


def test_batch_layout():
    ts = trees(1, count=4, max_n=80)
    lens = [0, 5, 1000, 7, 3, 9]
    mask, indptr, positions = treemla.batch_layout(ts, lens)
    words = max((len(p) + 63) // 64 for p in ts)
    assert torch.equal(mask, torch.cat([ancestor_mask(p, words) for p in ts]))
    want_indptr = [0]
    for p in ts:
        want_indptr.append(want_indptr[-1] + len(p))
    assert indptr.tolist() == want_indptr
    assert positions.tolist() == [L + d for p, L in zip(ts, lens) for d in depths(p)]
    mask4, _, _ = treemla.batch_layout([torch.tensor(p) for p in ts], torch.tensor(lens), 4)
    assert mask4.shape[1] == 4


@pytest.mark.parametrize("seed", range(6))
def test_build_ddtree_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    D, K = [(4, 3), (15, 4), (6, 8), (2, 2), (15, 1), (8, 5)][seed]
    budget = [10, 64, 200, 100, 15, 37][seed]
    tokens = torch.stack([torch.randperm(1000, generator=gen)[:K] for _ in range(D)]).int()
    raw = torch.randn(D, K, generator=gen)
    logprobs = torch.log_softmax(raw, dim=-1).sort(dim=-1, descending=True).values
    if seed == 3:
        logprobs[:] = -0.5  # ties everywhere: the tie rule decides the order
    parents, toks, deps = treemla.build_ddtree(tokens, logprobs, 42, budget, max_depth=15)
    want = ddtree_brute_force(tokens, logprobs, 42, budget, 15)
    assert parents.tolist() == want[0]
    assert toks.tolist() == want[1]
    assert deps.tolist() == want[2]
    assert parents.dtype == torch.int32


def test_accept_matches_walk():
    gen = torch.Generator().manual_seed(3)
    for parents in trees(2):
        n = len(parents)
        node_tokens = torch.randint(0, 3, (n,), generator=gen).tolist()
        target = torch.randint(0, 3, (n,), generator=gen).tolist()
        nodes, bonus = treemla.accept(parents, node_tokens, target)
        want_nodes, want_bonus = accept_walk(parents, node_tokens, target)
        assert nodes.tolist() == want_nodes and bonus == want_bonus
        copies = treemla.plan_commit(parents, nodes, 50)
        want = [(50 + a, 50 + k) for k, a in enumerate(want_nodes) if a != k]
        assert [tuple(r) for r in copies.tolist()] == want


def test_tree_errors():
    with pytest.raises(RuntimeError, match=r"parents\[0\] = 0 must be -1"):
        treemla.tree_mask_from_parents([0, 0])
    with pytest.raises(RuntimeError, match=r"parents\[2\] = 2 must be < 2"):
        treemla.positions_from_parents([-1, 0, 2], 0)
    with pytest.raises(TypeError, match="parents must hold integers"):
        treemla.depths_from_parents(torch.tensor([-1.0, 0.0]))
    with pytest.raises(ValueError, match="mask_words"):
        treemla.tree_mask_from_parents(list(range(-1, 99)), mask_words=1)
    with pytest.raises(ValueError, match=r"prefix_lens must have shape \[batch\] = \[2\]"):
        treemla.batch_layout([[-1], [-1, 0]], [0])
    with pytest.raises(ValueError, match=r"topk_logprobs must have topk_tokens' shape"):
        treemla.build_ddtree(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 2), 0, 4)
    with pytest.raises(RuntimeError, match="treemla: "):
        treemla.build_ddtree(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 3), 0, 4)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="parents must be a CPU tensor"):
            treemla.depths_from_parents(torch.tensor([-1, 0], device="cuda"))
