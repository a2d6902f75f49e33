"""The KV pool on the CPU: bookkeeping through KvPool, plans applied by the operators, and the
device-driven acceptance/commit operators against the host-side rules."""
import pytest
import torch

import treemla
from treemla import kvpool
from reference import accept_walk, random_parents


def fill_rows(cache, pool, request):
    """Write a recognizable value into every row of a request: request * 1000 + row."""
    for t in range(pool.num_tokens(request)):
        page, slot = pool.locate(request, t)
        cache[page, slot] = request * 1000 + t


def check_rows(cache, pool, request, values):
    for t, v in enumerate(values):
        page, slot = pool.locate(request, t)
        assert torch.all(cache[page, slot] == v), (request, t)


@pytest.mark.parametrize("policy", ["as_freed", "sorted"])
def test_defrag_keeps_every_row(policy):
    gen = torch.Generator().manual_seed(5)
    pool = treemla.KvPool(num_pages=160, page_size=4, row_width=8, elem_size=4, policy=policy)
    cache = torch.zeros(160, 4, 8, dtype=torch.float32)
    live = {}
    for step in range(30):
        r = step
        pool.alloc(r, int(torch.randint(1, 12, (1,), generator=gen)))
        live[r] = True
        if step % 3 == 2:
            victim = sorted(live)[int(torch.randint(0, len(live), (1,), generator=gen))]
            pool.free(victim)
            del live[victim]
    for r in live:
        fill_rows(cache, pool, r)
    before = {r: [r * 1000 + t for t in range(pool.num_tokens(r))] for r in live}
    plan = pool.defrag()
    assert isinstance(plan, kvpool.DefragPlan)
    kvpool.apply_defrag(cache, plan)
    pool.check_invariants()
    for r, vals in before.items():
        check_rows(cache, pool, r, vals)
        assert pool.runs(r) <= 1
    assert pool.metrics()["fraction_contiguous"] == 1.0
    # The table updates scatter into a page table as the pool now sees it.
    ids = sorted(live)
    table = torch.zeros(len(ids), 8, dtype=torch.int32)
    rows, offsets, pages = kvpool.flatten_page_table_updates(plan.tables, ids.index)
    kvpool.update_page_tables(table, rows, offsets, pages, pool.num_pages)
    for u, (r, new_pages) in enumerate(plan.tables):
        assert table[ids.index(r), : new_pages.numel()].tolist() == new_pages.tolist()


def test_commit_host_plan_and_device_ops_agree():
    gen = torch.Generator().manual_seed(8)
    page_size, batch = 4, 3
    prefix, trees, accepted = [13, 0, 6], [], []
    pool = treemla.KvPool(num_pages=64, page_size=page_size, row_width=8, elem_size=4)
    cache = torch.zeros(64, page_size, 8)
    for b in range(batch):
        parents = random_parents(gen, 11, "deep")
        node_tokens = torch.randint(0, 2, (11,), generator=gen).tolist()
        target = torch.randint(0, 2, (11,), generator=gen).tolist()
        trees.append((parents, node_tokens, target))
        pool.alloc(b, prefix[b] + 11)
        fill_rows(cache, pool, b)
    # Device-driven path (CPU kernels): acceptance, then commit, straight from tensors.
    q_indptr = torch.tensor([0, 11, 22, 33], dtype=torch.int32)
    par = torch.tensor([p for t in trees for p in t[0]], dtype=torch.int32)
    nt = torch.tensor([x for t in trees for x in t[1]], dtype=torch.int32)
    tt = torch.tensor([x for t in trees for x in t[2]], dtype=torch.int32)
    acc, acc_len, bonus, status = kvpool.accept_paths(q_indptr, par, nt, tt, max_accept=16)
    assert status.tolist() == [0, 0, 0]
    for b, (parents, node_tokens, target) in enumerate(trees):
        nodes, want_bonus = accept_walk(parents, node_tokens, target)
        accepted.append(nodes)
        assert acc_len[b] == len(nodes) and bonus[b] == want_bonus
        assert acc[b, : len(nodes)].tolist() == nodes and (acc[b, len(nodes):] == -1).all()
    table = torch.stack([pool.page_table_row(b, 8, pad=0) for b in range(batch)])
    device_cache = cache.clone()
    new_lens, st = kvpool.commit_accepted(device_cache, table, torch.tensor(prefix, dtype=torch.int32),
                                          acc, acc_len)
    assert st.tolist() == [0, 0, 0]
    assert new_lens.tolist() == [p + len(a) for p, a in zip(prefix, accepted)]
    # Host path: pool plans applied in one merged launch give the same cache.
    plans = [pool.commit_accepted(b, prefix[b], accepted[b]) for b in range(batch)]
    kvpool.apply_commit(cache, plans)
    pool.check_invariants()
    for b in range(batch):
        want = [b * 1000 + t for t in range(prefix[b])] + [b * 1000 + prefix[b] + a for a in accepted[b]]
        check_rows(cache, pool, b, want)
        assert pool.num_tokens(b) == prefix[b] + len(accepted[b])
    assert torch.equal(device_cache, cache)


def test_accept_paths_cut_and_status():
    # A chain accepted in full is cut to max_accept; a bad tree gets its status code.
    q_indptr = torch.tensor([0, 4, 6], dtype=torch.int32)
    parents = torch.tensor([-1, 0, 1, 2, -1, 5], dtype=torch.int32)
    node_tokens = torch.tensor([9, 1, 2, 3, 9, 0], dtype=torch.int32)
    target = torch.tensor([1, 2, 3, 4, 0, 0], dtype=torch.int32)
    acc, acc_len, bonus, status = kvpool.accept_paths(q_indptr, parents, node_tokens, target, 2)
    assert acc[0].tolist() == [0, 1] and acc_len[0] == 2 and bonus[0] == 2
    assert kvpool.KV_STATUS[int(status[1])] == "bad_parents" and acc_len[1] == 0


def test_commit_accepted_rejects_bad_request():
    cache = torch.arange(4 * 2 * 8, dtype=torch.float32).view(4, 2, 8)
    before = cache.clone()
    table = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    acc = torch.tensor([[0, 2, 1]], dtype=torch.int32)  # not increasing
    new_lens, status = kvpool.commit_accepted(cache, table, torch.tensor([1], dtype=torch.int32),
                                              acc, torch.tensor([3], dtype=torch.int32))
    assert kvpool.KV_STATUS[int(status[0])] == "bad_path" and new_lens[0] == 1
    assert torch.equal(cache, before)


def test_pool_errors():
    pool = treemla.KvPool(num_pages=4, page_size=2)
    with pytest.raises(RuntimeError, match="treemla: "):
        pool.alloc(1, 100)
    with pytest.raises(RuntimeError):
        pool.free(7)
    with pytest.raises(ValueError, match="policy"):
        treemla.KvPool(num_pages=4, page_size=2, policy="lifo")
    cache = torch.zeros(4, 2, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"moves must have shape \[num_moves, 2\]"):
        kvpool.apply_page_moves(cache, torch.zeros(1, 3, dtype=torch.int32),
                                torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"moves\[0\].dst must be in \[0, 4\)"):
        kvpool.apply_page_moves(cache, torch.tensor([[0, 9]], dtype=torch.int32),
                                torch.tensor([0, 1], dtype=torch.int32))


def test_pool_operator_schemas():
    q_indptr = torch.tensor([0, 3], dtype=torch.int32)
    parents = torch.tensor([-1, 0, 0], dtype=torch.int32)
    toks = torch.tensor([5, 1, 2], dtype=torch.int32)
    torch.library.opcheck(torch.ops.treemla.accept_paths.default, (q_indptr, parents, toks, toks, 4))
    cache = torch.randn(3, 2, 16)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    acc = torch.tensor([[0, 2]], dtype=torch.int32)
    torch.library.opcheck(torch.ops.treemla.commit_accepted.default,
                          (cache, table, torch.tensor([1], dtype=torch.int32), acc,
                           torch.tensor([2], dtype=torch.int32)))
