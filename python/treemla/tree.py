"""Draft trees on the host: DDTree builder, ancestor masks, positions, batch layout, acceptance.

A tree of n nodes is its parent array: ``parents[0] == -1`` (the root, the last accepted "bonus"
token) and ``0 <= parents[i] < i``. Inputs may be lists or CPU integer tensors (floats, bools and
values outside int32 raise, they are never truncated); outputs are CPU int32 tensors (masks
int64). Invalid trees raise RuntimeError with the library's message naming the node and the rule
it broke.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from . import _C  # noqa: F401  (registers the operators)
from ._args import IntLike, as_int, as_int32

__all__ = ["build_ddtree", "tree_mask_from_parents", "positions_from_parents",
           "depths_from_parents", "parents_from_mask", "batch_layout", "accept", "plan_commit"]


def build_ddtree(topk_tokens: torch.Tensor, topk_logprobs: torch.Tensor, bonus_token: int,
                 budget: int, max_depth: int = 15
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best-first DDTree from the drafter's per-depth top-K.

    topk_tokens: ``[D, K]`` int32 (row d-1 = the K best tokens at depth d, distinct, best first);
    topk_logprobs: ``[D, K]`` float32 (<= 0, non-increasing along a row). The tree is the root
    (carrying ``bonus_token``) plus the ``budget`` best paths by summed log-probability, in pop
    order, depth at most ``max_depth`` (fewer nodes only when every path fits).
    Returns ``(parents, tokens, depths)``, each int32 ``[n]``.
    """
    tokens = as_int32(topk_tokens, "topk_tokens")
    if not isinstance(topk_logprobs, torch.Tensor):
        topk_logprobs = torch.tensor(topk_logprobs, dtype=torch.float32)
    return torch.ops.treemla.build_ddtree(tokens, topk_logprobs.contiguous(),
                                          as_int(bonus_token, "bonus_token"),
                                          as_int(budget, "budget"), as_int(max_depth, "max_depth"))


def _mask_words(mask_words: Optional[int]) -> int:
    """0 (the operators' "tight") for None."""
    return 0 if mask_words is None else as_int(mask_words, "mask_words")


def tree_mask_from_parents(parents: IntLike, mask_words: Optional[int] = None) -> torch.Tensor:
    """Packed ancestor rows ``[n, mask_words]`` int64: bit j of row i (word j // 64, bit j % 64)
    is set iff j == i or j is an ancestor of i. ``mask_words`` defaults to ceil(n / 64); a larger
    value (<= 17) pads with zero words so trees of a batch can share one stride."""
    return torch.ops.treemla.tree_mask_from_parents(as_int32(parents, "parents"),
                                                    _mask_words(mask_words))


def positions_from_parents(parents: IntLike, prefix_len: int) -> torch.Tensor:
    """RoPE positions ``prefix_len + depth`` per node, int32 ``[n]``."""
    return torch.ops.treemla.positions_from_parents(as_int32(parents, "parents"),
                                                    as_int(prefix_len, "prefix_len"))


def depths_from_parents(parents: IntLike) -> torch.Tensor:
    """Depth per node (root 0), int32 ``[n]``."""
    return torch.ops.treemla.depths_from_parents(as_int32(parents, "parents"))


def parents_from_mask(tree_mask: torch.Tensor) -> torch.Tensor:
    """The parent array of an ancestor mask ``[n, mask_words]`` (int64); raises if the mask is
    not the ancestor mask of any tree."""
    return torch.ops.treemla.parents_from_mask(tree_mask.contiguous())


def batch_layout(parents: Sequence[IntLike], prefix_lens: IntLike,
                 mask_words: Optional[int] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verify_attention layout of a batch of trees.

    Returns ``(tree_mask, q_indptr, positions)``: tree_mask ``[total_q, mask_words]`` int64 with
    every request's rows in order (bits index nodes of the same request), q_indptr
    ``[batch + 1]`` int32, positions ``[total_q]`` int32 (``prefix_lens[b] + depth``).
    ``mask_words`` defaults to the smallest stride for the largest tree.
    """
    trees = [as_int32(p, f"parents[{i}]") for i, p in enumerate(parents)]
    return torch.ops.treemla.batch_layout(trees, as_int32(prefix_lens, "prefix_lens"),
                                          _mask_words(mask_words))


def accept(parents: IntLike, node_tokens: IntLike, target_tokens: IntLike
           ) -> Tuple[torch.Tensor, int]:
    """Walk the verified tree from the root: at node u take ``t = target_tokens[u]``; move to the
    (lowest-index) child carrying t, else stop. ``node_tokens[u]`` is the token node u carries.
    Lossless for greedy (argmax targets) and sampled (one target sample per node) verification.
    Returns ``(accepted_nodes, bonus_token)``: int32 node indices, root first (node k has depth
    k), and the target token at the last accepted node (the next round's root)."""
    nodes, bonus = torch.ops.treemla.accept_path(as_int32(parents, "parents"),
                                                 as_int32(node_tokens, "node_tokens"),
                                                 as_int32(target_tokens, "target_tokens"))
    return nodes, int(bonus)


def plan_commit(parents: IntLike, accepted: IntLike, prefix_len: int) -> torch.Tensor:
    """Row copies that commit an accepted path: int32 ``[copies, 2]`` of (src, dst) logical rows.
    Accepted node ``accepted[k]`` moves from row ``prefix_len + accepted[k]`` to
    ``prefix_len + k``; identity copies are left out. Applying them in order, in place, is safe."""
    return torch.ops.treemla.plan_commit(as_int32(parents, "parents"),
                                         as_int32(accepted, "accepted"),
                                         as_int(prefix_len, "prefix_len"))
