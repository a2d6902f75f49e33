"""Verify attention over a paged MLA cache, its GPU plan/workspace, and merge_state."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

import torch

from . import _C
from ._args import as_int

__all__ = ["VerifyPlan", "plan_verify", "verify_attention", "check_status", "merge_state",
           "tree_tail_slots", "with_cuda", "compiled_architectures",
           "HEAD_DIM_QK", "HEAD_DIM_V", "MAX_HEADS", "MAX_TREE_NODES", "MAX_MASK_WORDS"]

HEAD_DIM_QK = 576  # 512 latent ("nope") + 64 rope columns of one cache row / query head
HEAD_DIM_V = 512   # V is the first 512 columns of the same row
MAX_HEADS = 128
MAX_TREE_NODES = 1025
MAX_MASK_WORDS = 17

_PARTS = {"all": 0, "prefix": 1, "tail": 2}
# Tile configurations by the names the C++ library, `treemla bench` and VerifyPlan.tile use;
# "smem_large" is accepted as an alias of "smem-large".
_TILES = {"auto": 0, "smem99k": 1, "smem-large": 2, "smem_large": 2}
# Kernel families (docs/verify-kernel.md): "cpasync" (sm_80 and newer), "cluster" (sm_90 and
# newer), "sm90a" (sm_90 with sm_90a code in the build), "decode" (sm_80 and newer, plans with
# max_q_len * num_heads <= 16) and "warpspec" (sm_90 and newer, smem99k only). The operators
# carry tile + 16 * family + 256 * max_q_len as one integer.
_FAMILIES = {"auto": 0, "cpasync": 1, "cluster": 2, "sm90a": 3, "decode": 4, "warpspec": 5}


def with_cuda() -> bool:
    """True when the extension was built with the CUDA kernels."""
    return bool(_C.with_cuda())


def compiled_architectures() -> str:
    """The CUDA architectures compiled in, e.g. "90" or "80 86 89 90 100 120" ('' without CUDA)."""
    return str(_C.compiled_architectures())


@dataclasses.dataclass(frozen=True)
class VerifyPlan:
    """Limits and launch configuration of GPU verify attention on one device.

    Made by :func:`plan_verify`. A call may use the plan when its batch <= max_batch,
    q_indptr[batch] <= max_total_q and its head count equals num_heads. The workspace it needs is
    workspace_bytes of device memory, zeroed once (:meth:`new_workspace` does both).
    """

    max_batch: int
    max_total_q: int
    num_heads: int
    device: int
    tile: str               # resolved tile configuration: "smem99k" or "smem-large"
    tile_request: int       # what was asked for (tile + 16 * family + 256 * max_q_len): the
                            # plan's identity
    sm_count: int
    compute_capability: int
    num_ctas: int
    workspace_bytes: int
    family: str = "cpasync"  # resolved kernel family (a key of _FAMILIES other than "auto")
    max_q_len: int = 0       # bound on one request's tree nodes (0: none below MAX_TREE_NODES)

    def new_workspace(self) -> torch.Tensor:
        """A zeroed uint8 workspace of workspace_bytes on the plan's device."""
        return torch.zeros(self.workspace_bytes, dtype=torch.uint8,
                           device=torch.device("cuda", self.device))


def _device_index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


def plan_verify(max_batch: int, max_total_q: int, num_heads: int,
                device: Union[torch.device, str, int, None] = None,
                tile: str = "auto", family: str = "auto", max_q_len: int = 0) -> VerifyPlan:
    """Plan GPU verify attention for calls of up to ``max_batch`` requests and ``max_total_q``
    query rows (tree nodes, summed over the batch) with ``num_heads`` heads on ``device``.

    Reads device properties and sets kernel attributes, so call it outside CUDA-graph capture;
    plans are cached, so calling it again with the same arguments is cheap. ``tile`` forces a
    shared-memory configuration ("smem99k", the sm_120 one, runs everywhere; "smem-large" needs more
    than 99 KB per block); "auto" picks the largest the device allows. ``family`` forces a kernel
    family ("cpasync"; "cluster" on sm_90 and newer; "sm90a" on sm_90, "smem-large" only;
    "decode" when ``max_q_len * num_heads <= 16``, "smem99k" only; "warpspec" on sm_90 and newer,
    "smem99k" only); "auto" is "decode" for such a bound (sm_90 included), else "sm90a" on
    sm_90 when the build has sm_90a code, else "warpspec" (sm_90 and newer) when
    ``max_q_len * num_heads >= 64`` (a tree verify), else "cpasync". ``plan.tile``
    and ``plan.family`` name the choice. ``max_q_len`` (0..MAX_TREE_NODES, 0: no bound) bounds the
    tree nodes of any one request: the GPU rejects a longer request (:func:`check_status` reports
    it), and a bound with ``max_q_len * num_heads <= 16`` (q_len = 1 decode with up to 16 heads)
    lets the plan use the decode family, which streams the cache with two CTAs per SM.
    """
    if not isinstance(tile, str) or tile not in _TILES:
        raise ValueError(f"tile must be one of {sorted(_TILES)}, got {tile!r}")
    if not isinstance(family, str) or family not in _FAMILIES:
        raise ValueError(f"family must be one of {sorted(_FAMILIES)}, got {family!r}")
    max_q_len = as_int(max_q_len, "max_q_len")
    if not 0 <= max_q_len <= MAX_TREE_NODES:
        raise ValueError(f"max_q_len must be in [0, {MAX_TREE_NODES}], got {max_q_len}")
    index = _device_index(device)
    request = _TILES[tile] + 16 * _FAMILIES[family] + 256 * max_q_len
    d = _C.plan_verify(as_int(max_batch, "max_batch"), as_int(max_total_q, "max_total_q"),
                       as_int(num_heads, "num_heads"), index, request)
    return VerifyPlan(max_batch=d["max_batch"], max_total_q=d["max_total_q"],
                      num_heads=d["num_heads"], device=d["device"], tile=d["tile"],
                      tile_request=request, sm_count=d["sm_count"],
                      compute_capability=d["compute_capability"], num_ctas=d["num_ctas"],
                      workspace_bytes=d["workspace_bytes"], family=d["family"],
                      max_q_len=d["max_q_len"])


def check_status(plan: VerifyPlan, workspace: torch.Tensor) -> None:
    """Raise RuntimeError if a GPU call that used this workspace met bad lengths or page indices.

    The GPU never reads or writes out of bounds on bad input: the schedule kernel records the
    first violation in the workspace and skips the affected rows. This synchronizes the current
    stream (not for use inside a captured graph), reads that record, clears it and raises with a
    message naming the request and the value.
    """
    _C.check_status(workspace, plan.max_batch, plan.max_total_q, plan.num_heads,
                    plan.tile_request)


def verify_attention(q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
                     prefix_lens: torch.Tensor, q_indptr: torch.Tensor,
                     tree_mask: torch.Tensor, sm_scale: float, *, part: str = "all",
                     workspace: Optional[torch.Tensor] = None,
                     plan: Optional[VerifyPlan] = None,
                     out: Optional[torch.Tensor] = None,
                     lse: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Tree-verify attention of a ragged batch over a paged MLA latent cache.

    Request ``b`` owns the query rows ``q_indptr[b] .. q_indptr[b+1]`` (its tree nodes, node 0
    the root) and a logical KV sequence of ``prefix_lens[b] + q_len`` rows: the cached prefix,
    then **the tree tail in the same cache, right after the prefix: logical row
    ``prefix_len + j`` is tree node ``j``'s own latent row**, written by the caller before this
    call (see :func:`tree_tail_slots`). Logical row ``t`` of request ``b`` is
    ``kv_cache[page_table[b, t // page_size], t % page_size]``. Every node sees the whole prefix;
    tail node ``j`` is visible to node ``i`` iff bit ``j`` of ``tree_mask`` row ``i`` is set.
    K is the whole 576-wide row, V its first 512 columns.

    Args:
        q: ``[total_q, H, 576]`` bfloat16 or float16 (float32 also on the CPU), contiguous.
            H in 1..128.
        kv_cache: ``[num_pages, page_size, 576]`` or ``[num_pages, page_size, 1, 576]``, q's
            dtype, contiguous; page_size a power of two.
        page_table: ``[batch, max_pages]`` int32; rows contiguous (a column slice of a wider
            table is fine). It must map every row a request reads:
            ``ceil((prefix_lens[b] + q_len) / page_size) <= max_pages``. Both devices check this
            bound and the page values: the CPU raises; the GPU reads nothing past the row and
            :func:`check_status` reports the request. For a column slice of a wider table the
            GPU's bound is the wider row (``page_table.stride(0)`` entries).
        prefix_lens: ``[batch]`` int32.
        q_indptr: ``[batch + 1]`` int32, ``q_indptr[0] == 0``, non-decreasing,
            ``q_indptr[batch] <= total_q``; q_len = 1..1025 per request (0 is allowed).
        tree_mask: ``[total_q, mask_words]`` int64 (or torch.uint64), 1 <= mask_words <= 17.
            Each row is a uint64 bit set stored as int64 (same bits: bit 63 makes it negative):
            bit ``j % 64`` of word ``j // 64`` is tail node ``j`` of the same request. Build it
            with :func:`treemla.tree_mask_from_parents` / :func:`treemla.batch_layout`.
        sm_scale: softmax scale applied to ``q . k`` (e.g. 1/sqrt(192) for DeepSeek-V3).
        part: "all" (prefix + tail), "prefix" or "tail". The two partial states combine into
            "all" with :func:`merge_state`.
        workspace: GPU only. A uint8 CUDA tensor of ``plan.workspace_bytes``, zeroed once
            (:meth:`VerifyPlan.new_workspace`), reused across calls on one stream. Without it each
            call allocates one through torch.
        plan: GPU only. From :func:`plan_verify`; without it the plan is made (and cached) from
            the shapes: max_batch = batch, max_total_q = total_q.
        out, lse: optional outputs to write into (both or neither), shaped as the results.

    Returns:
        ``(o, lse)``: o ``[total_q, H, 512]`` in q's dtype; lse ``[total_q, H]`` float32, natural
        log of the softmax denominator. A row that sees nothing has o = 0 and lse = -inf. Rows at
        or past ``q_indptr[batch]`` are not written on the GPU (o = 0, lse = -inf from the CPU's
        functional form).

    CPU tensors run the library's reference (the specification, double precision inside, output
    rounded to q's dtype). CUDA tensors run the GPU kernels on the current torch stream, with no
    host synchronization: lengths are read on the device, so a captured CUDA graph replays with
    new ``prefix_lens`` / ``q_indptr`` / ``page_table`` / ``tree_mask`` values written in place.
    For capture, make the plan and workspace beforehand (``plan_verify`` for the largest batch
    and total_q the graph will see; ``plan.new_workspace()``) and pass both, plus ``out`` and
    ``lse`` if the outputs should live in static buffers. Bad lengths or page indices on the GPU
    are skipped, not read out of bounds; :func:`check_status` reports them.

    Raises:
        ValueError / TypeError naming the argument for a wrong shape, stride, device or dtype;
        RuntimeError with the library's message for bad contents (e.g. a page index out of
        range on the CPU).
    """
    if part not in _PARTS:
        raise ValueError(f"part must be 'all', 'prefix' or 'tail', got {part!r}")
    max_batch = max_total_q = tile = 0
    if plan is not None:
        if not isinstance(plan, VerifyPlan):
            raise TypeError(f"plan must be a VerifyPlan from plan_verify, got {type(plan).__name__}")
        if q.dim() == 3 and q.shape[1] != plan.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads but the plan was made for "
                             f"num_heads = {plan.num_heads}")
        if q.is_cuda and q.device.index != plan.device:
            raise ValueError(f"q is on {q.device} but the plan was made for cuda:{plan.device}")
        max_batch, max_total_q, tile = plan.max_batch, plan.max_total_q, plan.tile_request
    if (out is None) != (lse is None):
        raise ValueError("out and lse must be given together (or neither)")
    if out is None:
        return torch.ops.treemla.verify_attention(
            q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask, float(sm_scale),
            _PARTS[part], max_batch, max_total_q, tile, workspace)
    torch.ops.treemla.verify_attention_out(
        q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask, float(sm_scale), _PARTS[part],
        max_batch, max_total_q, tile, out, lse, workspace)
    return out, lse


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor, *,
                out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention states (SGLang ``merge_state_v2`` semantics).

    v_a, v_b: ``[tokens, heads, dim]`` bfloat16 / float16 / float32, contiguous, one dtype.
    s_a, s_b: ``[tokens, heads]`` float32 natural-log LSE of each part. An LSE of +-inf (or NaN)
    marks an empty part, which contributes nothing; two empty parts give v = 0, s = -inf.
    Returns ``(v, s)`` with ``v = (v_a e^{s_a} + v_b e^{s_b}) / (e^{s_a} + e^{s_b})`` and
    ``s = log(e^{s_a} + e^{s_b})``. ``out=(v, s)`` writes into given tensors, which may be v_a / s_a
    (in place). CPU and CUDA.
    """
    if out is None:
        return torch.ops.treemla.merge_state(v_a, s_a, v_b, s_b)
    v, s = out
    torch.ops.treemla.merge_state_out(v_a, s_a, v_b, s_b, v, s)
    return v, s


def tree_tail_slots(page_table: torch.Tensor, prefix_lens: torch.Tensor,
                    q_indptr: torch.Tensor, page_size: int,
                    total_q: Optional[int] = None) -> torch.Tensor:
    """Flat cache slots where the tree nodes' latent rows go before :func:`verify_attention`.

    Node ``j`` of request ``b`` lives at logical row ``prefix_lens[b] + j``, i.e. at
    ``page_table[b, t // page_size] * page_size + t % page_size`` with ``t = prefix_lens[b] + j``.
    Returns int64 ``[total_q]`` in the global node order of ``q_indptr``; write the rows with
    ``kv_cache.view(-1, 576)[slots] = latent_rows``. Pure torch on the inputs' device.
    ``total_q`` defaults to ``q_indptr[-1]``, which synchronizes on the GPU: pass it (e.g. the
    static row count) when capturing a graph.
    """
    page_size = as_int(page_size, "page_size")
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two >= 1, got {page_size}")
    total_q = int(q_indptr[-1]) if total_q is None else as_int(total_q, "total_q")
    rows = torch.arange(total_q, device=q_indptr.device, dtype=torch.int64)
    qi = q_indptr.to(torch.int64)
    req = torch.searchsorted(qi, rows, right=True) - 1
    t = prefix_lens.to(torch.int64)[req] + (rows - qi[req])
    pages = page_table.to(torch.int64)[req, t // page_size]
    return pages * page_size + t % page_size
