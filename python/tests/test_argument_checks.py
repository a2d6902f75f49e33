"""Inputs that were once accepted silently (truncated, wrapped or ignored) must raise an error that
names the argument and the rule it broke, and change nothing."""

import numpy as np
import pytest
import torch

import treemla
from treemla import kvpool


# ---- integers given as floats, bools or values outside int32 --------------------------------


@pytest.mark.parametrize("make", [list, tuple, lambda v: torch.tensor(v)])
def test_float_parents_are_refused(make):
    parents = make([-1, 0.9, 1.7])
    want = r"parents must hold integers, got (parents\[1\] = 0\.9|a torch\.float32 tensor)"
    for call in (
        treemla.tree_mask_from_parents,
        treemla.depths_from_parents,
        lambda p: treemla.positions_from_parents(p, 0),
    ):
        with pytest.raises(TypeError, match=want):
            call(parents)
    with pytest.raises(TypeError, match=r"parents\[0\] must hold integers"):
        treemla.batch_layout([parents], [10])
    with pytest.raises(TypeError, match=r"parents must hold integers"):
        treemla.accept(parents, [0, 1, 2], [0, 1, 2])


def test_float_and_wide_prefix_lens_are_refused():
    with pytest.raises(
        TypeError, match=r"prefix_lens must hold integers, got prefix_lens\[0\] = 10\.9"
    ):
        treemla.batch_layout([[-1, 0]], [10.9])
    with pytest.raises(
        TypeError, match=r"prefix_lens must hold integers, got a torch\.float64 tensor"
    ):
        treemla.batch_layout([[-1, 0]], torch.tensor([10.9], dtype=torch.float64))
    with pytest.raises(
        TypeError, match=r"prefix_lens must hold integers, got prefix_lens\[1\] = True"
    ):
        treemla.batch_layout([[-1], [-1]], [3, True])
    # int64 values past int32 would wrap (2**32 + 5 -> 5) when narrowed.
    with pytest.raises(ValueError, match=r"prefix_lens\[0\] = 4294967301 is outside int32"):
        treemla.batch_layout([[-1, 0]], [2**32 + 5])
    with pytest.raises(ValueError, match=r"prefix_lens\[1\] = -4294967296 is outside int32"):
        treemla.batch_layout([[-1], [-1]], torch.tensor([1, -(2**32)]))
    # Integers of other kinds are fine: NumPy integers, int64 tensors in range.
    mask, ip, pos = treemla.batch_layout([np.array([-1, 0])], np.array([7], dtype=np.int64))
    assert pos.tolist() == [7, 8] and ip.tolist() == [0, 2]


def test_float_scalars_are_refused():
    parents = [-1, 0, 1]
    cases = [
        (lambda: treemla.positions_from_parents(parents, 10.9), "prefix_len"),
        (lambda: treemla.tree_mask_from_parents(parents, mask_words=2.5), "mask_words"),
        (lambda: treemla.plan_commit(parents, [0, 1], 1.5), "prefix_len"),
        (
            lambda: treemla.build_ddtree(
                torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 3), 0, 4.5
            ),
            "budget",
        ),
        (lambda: treemla.KvPool(num_pages=4.5, page_size=2), "num_pages"),
        (lambda: treemla.KvPool(num_pages=4, page_size=2).partial_defrag(2.5), "max_moves"),
        (
            lambda: kvpool.accept_paths(
                *(torch.zeros(n, dtype=torch.int32) for n in (2, 1, 1, 1)), 2.0
            ),
            "max_accept",
        ),
        (
            lambda: treemla.tree_tail_slots(
                torch.zeros(1, 4, dtype=torch.int32),
                torch.zeros(1, dtype=torch.int32),
                torch.tensor([0, 1], dtype=torch.int32),
                16.0,
            ),
            "page_size",
        ),
    ]
    for call, name in cases:
        with pytest.raises(TypeError, match=f"{name} must be an integer"):
            call()
    # The pool's own methods: pybind11 alone would truncate a NumPy float.
    pool = treemla.KvPool(num_pages=4, page_size=2)
    for bad in (2.5, np.float32(2.7)):
        with pytest.raises(TypeError, match="num_tokens must be an integer"):
            pool.alloc(1, bad)
        with pytest.raises(TypeError, match="num_tokens must be an integer"):
            pool.alloc(request=1, num_tokens=bad)
    assert pool.request_ids() == []
    pool.alloc(np.int64(1), 3)
    with pytest.raises(TypeError, match="row must be an integer"):
        pool.locate(1, np.float32(1))
    assert pool.locate(1, 2) == (1, 0) and 1 in pool and np.int32(1) in pool


def test_pool_config_outside_int32_is_refused():
    with pytest.raises(ValueError, match=r"num_pages = 4294967296 does not fit in int32"):
        treemla.KvPool(num_pages=2**32, page_size=2)


def test_tree_tail_slots_page_size():
    with pytest.raises(ValueError, match="page_size must be a power of two >= 1, got 12"):
        treemla.tree_tail_slots(
            torch.zeros(1, 4, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.tensor([0, 1], dtype=torch.int32),
            12,
        )


# ---- the host pool's commit takes a path, which is strictly increasing ----------------------


def pool_state(pool):
    return (
        {r: (pool.num_tokens(r), pool.pages(r).tolist()) for r in pool.request_ids()},
        pool.free_list().tolist(),
    )


@pytest.mark.parametrize(
    "accepted,want",
    [
        (
            [0, 5, 3],
            r"accepted must be strictly increasing \(a path from the root\), "
            r"got accepted\[2\] = 3 after accepted\[1\] = 5",
        ),
        ([0, 2, 2], r"accepted\[2\] = 2 after accepted\[1\] = 2"),
    ],
)
def test_commit_accepted_requires_an_increasing_path(accepted, want):
    pool = treemla.KvPool(num_pages=16, page_size=4, row_width=8, elem_size=4)
    pool.alloc(0, 3 + 8)  # prefix 3, 8 tree nodes
    before = pool_state(pool)
    with pytest.raises(RuntimeError, match=want):
        pool.commit_accepted(0, 3, accepted)
    assert pool_state(pool) == before
    pool.check_invariants()
    plan = pool.commit_accepted(0, 3, [0, 3, 5])  # a real path still commits
    assert plan.num_tokens == 6 and plan.moves.tolist() == [[1, 2, 1, 0], [2, 0, 1, 1]]


def test_commit_accepted_refuses_float_paths():
    pool = treemla.KvPool(num_pages=16, page_size=4)
    pool.alloc(0, 8)
    with pytest.raises(TypeError, match=r"accepted must hold integers, got accepted\[1\] = 1\.5"):
        pool.commit_accepted(0, 3, [0, 1.5])
    with pytest.raises(TypeError, match=r"prefix_len must be an integer"):
        pool.commit_accepted(0, 3.0, [0, 1])
    assert pool.num_tokens(0) == 8


# ---- wave offsets of the CPU move operators -------------------------------------------------


def numbered_cache(pages, page_size=2, width=4):
    return torch.arange(pages * page_size * width, dtype=torch.float32).view(
        pages, page_size, width
    )


I32 = dict(dtype=torch.int32)


@pytest.mark.parametrize(
    "moves,offsets,want",
    [
        # one move, offsets that name a 100000000th: the CPU used to ignore them
        (
            [[0, 1]],
            [0, 100000000],
            r"wave_offsets\[1\] = 100000000 must equal the number of moves, 1",
        ),
        ([[0, 1], [2, 3]], [0, 1], r"wave_offsets\[1\] = 1 must equal the number of moves, 2"),
        ([[0, 1]], [1, 1], r"wave_offsets\[0\] must be 0, got 1"),
        (
            [[0, 1], [2, 3]],
            [0, 2, 1, 2],
            r"wave_offsets must be non-decreasing, got wave_offsets\[2\] = 1 after 2",
        ),
        (
            [[0, 1]],
            [0],
            r"wave_offsets must have shape \[num_waves \+ 1\] with num_waves >= 1 for 1 moves",
        ),
        # one wave whose moves depend on each other: the GPU runs them concurrently
        (
            [[0, 1], [1, 2]],
            [0, 2],
            r"moves\[1\] reads page 1, which moves\[0\] of the same wave 0 writes",
        ),
        ([[0, 2], [1, 2]], [0, 2], r"moves\[1\] and moves\[0\] of wave 0 both write page 2"),
    ],
)
def test_page_moves_check_their_waves(moves, offsets, want):
    cache = numbered_cache(4)
    before = cache.clone()
    error = ValueError if "shape" in want else RuntimeError
    with pytest.raises(error, match=want):
        kvpool.apply_page_moves(cache, torch.tensor(moves, **I32), torch.tensor(offsets, **I32))
    assert torch.equal(cache, before)


def test_page_moves_in_dependent_waves_apply():
    cache = numbered_cache(4)
    before = cache.clone()
    # page 1 -> 2 must read page 1 before page 0 -> 1 overwrites it: two waves.
    kvpool.apply_page_moves(
        cache, torch.tensor([[1, 2], [0, 1]], **I32), torch.tensor([0, 1, 2], **I32)
    )
    assert torch.equal(cache[2], before[1]) and torch.equal(cache[1], before[0])
    kvpool.apply_page_moves(cache, torch.zeros(0, 2, **I32), torch.tensor([0], **I32))  # no moves


def test_row_moves_check_their_waves():
    cache = numbered_cache(3)
    before = cache.clone()
    moves = torch.tensor([[0, 0, 1, 1], [1, 1, 2, 0]], **I32)
    with pytest.raises(
        RuntimeError, match=r"wave_offsets\[1\] = 5 must equal the number of moves, 2"
    ):
        kvpool.apply_row_moves(cache, moves, torch.tensor([0, 5], **I32))
    with pytest.raises(
        RuntimeError, match=r"moves\[1\] reads row \(page 1, slot 1\), which moves\[0\]"
    ):
        kvpool.apply_row_moves(cache, moves, torch.tensor([0, 2], **I32))
    assert torch.equal(cache, before)
    kvpool.apply_row_moves(cache, moves.flip(0).contiguous(), torch.tensor([0, 1, 2], **I32))
    assert torch.equal(cache[2, 0], before[1, 1]) and torch.equal(cache[1, 1], before[0, 0])


# ---- page-table updates ---------------------------------------------------------------------


def test_update_page_tables_names_the_broken_bound():
    table = torch.zeros(2, 3, **I32)
    args = (
        torch.tensor([0, 5], **I32),
        torch.tensor([0, 2, 3], **I32),
        torch.tensor([1, 2, 3], **I32),
    )
    with pytest.raises(
        RuntimeError, match=r"page-table update 1 is invalid: rows\[1\] = 5 is outside \[0, 2\)"
    ):
        kvpool.update_page_tables(table, *args, num_pages=8)
    assert table[0].tolist() == [1, 2, 0]  # the valid update was made, as documented
    with pytest.raises(RuntimeError, match=r"pages\[2\] = 3 is outside \[0, 3\)"):
        kvpool.update_page_tables(table, torch.tensor([0, 1], **I32), args[1], args[2], num_pages=3)
    with pytest.raises(RuntimeError, match=r"its 4 pages do not fit in the row's stride 3"):
        kvpool.update_page_tables(
            table,
            torch.tensor([0], **I32),
            torch.tensor([0, 4], **I32),
            torch.zeros(4, **I32),
            num_pages=3,
        )
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match=r"num_pages must be in \[1, 2\^31\)"):
            kvpool.update_page_tables(table, *args, num_pages=bad)
