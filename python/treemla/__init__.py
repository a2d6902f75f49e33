"""treemla: tree-verify attention for MLA models (speculative decoding, DDTree) as torch
operators, with the draft-tree helpers and the KV page pool around it.

Operators live in ``torch.ops.treemla`` (CPU, CUDA and fake kernels: they work under
torch.compile and in captured CUDA graphs); the functions here wrap them with checks and
documentation. See python/README.md for installation and an example.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers torch.ops.treemla.*)
from . import _fake  # noqa: F401  (fake kernels for torch.compile)
from .attention import (HEAD_DIM_QK, HEAD_DIM_V, MAX_HEADS, MAX_MASK_WORDS, MAX_TREE_NODES,
                        VerifyPlan, check_status, compiled_architectures, merge_state,
                        plan_verify, tree_tail_slots, verify_attention, with_cuda)
from .tree import (accept, batch_layout, build_ddtree, depths_from_parents, parents_from_mask,
                   plan_commit, positions_from_parents, tree_mask_from_parents)
from . import budget, kvpool
from .kvpool import KvPool

__version__ = "0.1.0"

__all__ = [
    "verify_attention", "plan_verify", "VerifyPlan", "check_status", "merge_state",
    "tree_tail_slots", "with_cuda", "compiled_architectures",
    "build_ddtree", "tree_mask_from_parents", "positions_from_parents", "depths_from_parents",
    "parents_from_mask", "batch_layout", "accept", "plan_commit",
    "kvpool", "KvPool", "budget",
    "HEAD_DIM_QK", "HEAD_DIM_V", "MAX_HEADS", "MAX_TREE_NODES", "MAX_MASK_WORDS",
]
