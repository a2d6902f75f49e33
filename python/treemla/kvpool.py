"""KV page pool: host bookkeeping (KvPool) and the operators that move cache data.

The cache is ``[num_pages, page_size, row_width]`` (or ``[num_pages, page_size, 1, row_width]``),
any dtype; logical row t of a request is ``cache[pages[t // page_size], t % page_size]``. KvPool
owns the free list and each request's page list; its defrag and commit return plans, which the
operators here apply to the cache on the CPU or the GPU (one launch per plan, current stream,
no host synchronization).

Two ways to commit accepted tree paths; use one per round, never both on the same round:
  1. Host plan: ``pool.commit_accepted(request, prefix_len, accepted)`` per request, then
     ``apply_commit(cache, plans)``.
  2. Device driven, CUDA-graph safe: ``accept_paths`` then ``commit_accepted`` (the functions of
     this module) read everything from device memory. Later, on the host, call
     ``pool.commit_accepted`` for the bookkeeping only and do NOT apply its moves again (their
     source rows have been overwritten); only its released pages and token count matter.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from . import _C
from ._args import as_int, as_int32

__all__ = ["KvPool", "DefragPlan", "CommitPlan", "KV_STATUS", "move_workspace",
           "check_move_status", "apply_page_moves", "apply_row_moves", "apply_defrag",
           "apply_commit", "merge_commit_plans", "flatten_page_table_updates",
           "update_page_tables", "accept_paths", "commit_accepted", "with_cuda_kvpool"]

# Per-request status codes of accept_paths / commit_accepted.
KV_STATUS = {0: "ok", 1: "bad_tree_size", 2: "bad_parents", 3: "bad_accept_len", 4: "bad_path",
             5: "bad_prefix_len", 6: "bad_page"}


def with_cuda_kvpool() -> bool:
    """True when the GPU KV-pool kernels are compiled in (CPU tensors always work)."""
    return bool(_C.with_cuda_kvpool())


@dataclasses.dataclass
class DefragPlan:
    """Page moves of a defrag. ``moves`` int32 ``[m, 2]`` (src, dst) in wave order;
    ``wave_offsets`` int32 ``[waves + 1]``; ``tables``: (request, new page list) of every request
    whose pages changed; ``pages_relocated``: live pages that moved."""
    moves: torch.Tensor
    wave_offsets: torch.Tensor
    tables: List[Tuple[int, torch.Tensor]]
    pages_relocated: int


@dataclasses.dataclass
class CommitPlan:
    """Row moves of one request's commit: ``moves`` int32 ``[m, 4]`` (src page, src slot, dst
    page, dst slot), ``wave_offsets``, the pages the commit released and the new token count."""
    request: int
    num_tokens: int
    moves: torch.Tensor
    wave_offsets: torch.Tensor
    released_pages: torch.Tensor


class KvPool:
    """Host bookkeeping of a paged cache (treemla/kvpool.h): free list and per-request pages.

    ``policy``: "as_freed" (FIFO, as serving engines keep it) or "sorted" (lowest pages first).
    Request ids are any int, unique among live requests. Every method checks its arguments before
    changing anything, so a RuntimeError leaves the pool as it was.
    """

    def __init__(self, num_pages: int, page_size: int, row_width: int = 576, elem_size: int = 2,
                 policy: str = "as_freed"):
        self._pool = _C.KvPool(as_int(num_pages, "num_pages"), as_int(page_size, "page_size"),
                               as_int(row_width, "row_width"), as_int(elem_size, "elem_size"),
                               policy)

    # The integer parameters of the methods that come straight from the C++ class: checked here,
    # because pybind11 would truncate a NumPy float (np.float32(2.7) -> 2).
    _INT_PARAMS = {"pages_for": ("num_tokens",), "alloc": ("request", "num_tokens"),
                   "extend": ("request", "num_tokens"), "truncate": ("request", "num_tokens"),
                   "free": ("request",), "num_tokens": ("request",), "pages": ("request",),
                   "locate": ("request", "row"), "page_table_row": ("request", "stride", "pad"),
                   "runs": ("request",)}

    def __getattr__(self, name):
        # alloc, extend, truncate, free, num_tokens, pages, request_ids, num_free_pages,
        # num_used_pages, free_list, locate, page_table_row, runs, metrics, pages_for,
        # check_invariants and the config properties come straight from the C++ class.
        attr = getattr(self._pool, name)
        params = KvPool._INT_PARAMS.get(name)
        if params is None:
            return attr

        def checked(*args, **kwargs):
            args = [as_int(a, n) for a, n in zip(args, params)] + list(args[len(params):])
            kwargs = {k: as_int(v, k) if k in params else v for k, v in kwargs.items()}
            return attr(*args, **kwargs)
        checked.__doc__ = attr.__doc__
        return checked

    def __contains__(self, request: int) -> bool:
        return as_int(request, "request") in self._pool

    def plan_defrag(self) -> DefragPlan:
        """Plan a full defrag (each request's pages contiguous, ascending) without applying it."""
        return DefragPlan(**self._pool.plan_defrag())

    def defrag(self) -> DefragPlan:
        """Full defrag: updates the bookkeeping now; apply the plan with :func:`apply_defrag`
        before anything is written into pages handed out afterwards."""
        return DefragPlan(**self._pool.defrag())

    def plan_partial_defrag(self, max_moves: int) -> DefragPlan:
        return DefragPlan(**self._pool.plan_partial_defrag(as_int(max_moves, "max_moves")))

    def partial_defrag(self, max_moves: int) -> DefragPlan:
        """Defrag at most ``max_moves`` pages, cheapest fragmented requests first."""
        return DefragPlan(**self._pool.partial_defrag(as_int(max_moves, "max_moves")))

    def commit_accepted(self, request: int, prefix_len: int, accepted) -> CommitPlan:
        """Commit accepted tree nodes, a path from the root (``accepted[0] == 0``, strictly
        increasing, as :func:`commit_accepted` on the device requires): row
        ``prefix_len + accepted[k]`` moves to ``prefix_len + k``; the request then holds
        ``prefix_len + len(accepted)`` rows and whole pages past them are released. A path that
        breaks these rules raises RuntimeError and leaves the pool unchanged."""
        return CommitPlan(**self._pool.commit_accepted(as_int(request, "request"),
                                                        as_int(prefix_len, "prefix_len"),
                                                        as_int32(accepted, "accepted")))


def move_workspace(device) -> torch.Tensor:
    """A zeroed workspace for the move operators (64 bytes), reusable on one stream."""
    return torch.zeros(_C.move_workspace_bytes(), dtype=torch.uint8, device=device)


def check_move_status(workspace: torch.Tensor) -> None:
    """Synchronize and raise RuntimeError naming the first move or page-table update that the
    GPU skipped as out of range (then clear the record). GPU workspaces only."""
    _C.check_move_status(workspace)


def apply_page_moves(cache: torch.Tensor, moves: torch.Tensor, wave_offsets: torch.Tensor,
                     workspace: Optional[torch.Tensor] = None) -> None:
    """Copy page ``src`` to page ``dst`` for every (src, dst) row of ``moves``, in wave order, in
    place. moves/wave_offsets int32 on the cache's device.

    ``wave_offsets`` ``[num_waves + 1]`` cuts the moves into waves as a :class:`DefragPlan` does:
    ``wave_offsets[0] == 0``, non-decreasing, ``wave_offsets[-1] == len(moves)``; within a wave the
    destinations are distinct and no destination is another move's source, because the GPU runs
    a wave's moves concurrently. On the CPU a plan that breaks this raises RuntimeError and
    nothing is copied; on the GPU the offsets are read on the device only (no host
    synchronization): malformed offsets can reorder the moves but never reach outside the
    cache, and a move with an index out of range is skipped and reported by
    :func:`check_move_status`."""
    torch.ops.treemla.apply_page_moves(cache, moves, wave_offsets, workspace)


def apply_row_moves(cache: torch.Tensor, moves: torch.Tensor, wave_offsets: torch.Tensor,
                    workspace: Optional[torch.Tensor] = None) -> None:
    """Copy row (src page, src slot) to (dst page, dst slot) for every row of ``moves``; waves
    and checks as :func:`apply_page_moves`, with rows in place of pages."""
    torch.ops.treemla.apply_row_moves(cache, moves, wave_offsets, workspace)


def apply_defrag(cache: torch.Tensor, plan: DefragPlan,
                 workspace: Optional[torch.Tensor] = None) -> None:
    """Apply a defrag plan's page moves to the cache (page tables: see
    :func:`flatten_page_table_updates` and :func:`update_page_tables`)."""
    dev = cache.device
    apply_page_moves(cache, plan.moves.to(dev), plan.wave_offsets.to(dev), workspace)


def merge_commit_plans(plans: Sequence[CommitPlan]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row moves of several commits as one plan ``(moves [m, 4], wave_offsets)``: wave w of the
    result is wave w of every plan. Valid for commits made one after another with no alloc or
    extend in between (each then touches only its own request's pages)."""
    waves = max((p.wave_offsets.numel() - 1 for p in plans), default=0)
    parts, offsets, count = [], [0], 0
    for w in range(waves):
        for p in plans:
            if w + 1 < p.wave_offsets.numel():
                lo, hi = int(p.wave_offsets[w]), int(p.wave_offsets[w + 1])
                parts.append(p.moves[lo:hi])
                count += hi - lo
        offsets.append(count)
    moves = torch.cat(parts) if parts else torch.zeros((0, 4), dtype=torch.int32)
    return moves, torch.tensor(offsets, dtype=torch.int32)


def apply_commit(cache: torch.Tensor, plans, workspace: Optional[torch.Tensor] = None) -> None:
    """Apply one CommitPlan or a sequence of them (merged, one launch) to the cache."""
    plans = [plans] if isinstance(plans, CommitPlan) else list(plans)
    moves, offsets = merge_commit_plans(plans)
    apply_row_moves(cache, moves.to(cache.device), offsets.to(cache.device), workspace)


def flatten_page_table_updates(tables: Sequence[Tuple[int, torch.Tensor]],
                               row_of: Callable[[int], int]
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows, offsets, pages)`` int32 for :func:`update_page_tables` from a defrag plan's
    ``tables``; ``row_of(request)`` gives the request's page-table row."""
    rows = [as_int(row_of(r), f"row_of({r})") for r, _ in tables]
    offsets = [0]
    for _, pages in tables:
        offsets.append(offsets[-1] + pages.numel())
    pages = (torch.cat([p.to(torch.int32) for _, p in tables]) if tables
             else torch.zeros(0, dtype=torch.int32))
    return (torch.tensor(rows, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int32),
            pages)


def update_page_tables(page_table: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor,
                       pages: torch.Tensor, num_pages: int,
                       workspace: Optional[torch.Tensor] = None) -> None:
    """Scatter new page lists into ``page_table`` ``[num_rows, stride]`` in place: update u
    writes ``pages[offsets[u]:offsets[u+1]]`` at the start of row ``rows[u]``. An invalid update
    is skipped whole (the CPU raises after the valid ones; the GPU records it for
    :func:`check_move_status`)."""
    torch.ops.treemla.update_page_tables(page_table, rows, offsets, pages,
                                         as_int(num_pages, "num_pages"), workspace)


def accept_paths(q_indptr: torch.Tensor, parents: torch.Tensor, node_tokens: torch.Tensor,
                 target_tokens: torch.Tensor, max_accept: int
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched :func:`treemla.accept` on the device.

    All int32 on one device; ``parents``/``node_tokens``/``target_tokens`` are ``[total_q]`` with
    request-local node indices (-1 at each root), requests split by ``q_indptr``. Returns
    ``(accepted [batch, max_accept] (-1 padded), accept_len [batch], bonus_tokens [batch],
    status [batch])``; a path longer than max_accept is cut (bonus = target token at the last
    kept node); a bad request gets accept_len 0, bonus -1 and its code (``KV_STATUS``).
    """
    return torch.ops.treemla.accept_paths(q_indptr, parents, node_tokens, target_tokens,
                                          as_int(max_accept, "max_accept"))


def commit_accepted(cache: torch.Tensor, page_table: torch.Tensor, prefix_lens: torch.Tensor,
                    accepted: torch.Tensor, accept_len: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Device-driven commit: for each request copy row ``prefix + accepted[b, k]`` to
    ``prefix + k`` (k < accept_len[b]) in place. Returns ``(new_seq_lens, status)`` int32
    ``[batch]``: ``prefix_lens[b] + accept_len[b]``, or ``prefix_lens[b]`` and a non-zero status
    for a request that failed its checks (nothing of it moved)."""
    return torch.ops.treemla.commit_accepted(cache, page_table, prefix_lens, accepted, accept_len)
