"""Pure-torch references and case builders for the treemla tests.

Nothing here calls treemla: the attention reference materializes each request's
[q_len, prefix + q_len] visibility mask, gathers KV rows through the page table and runs a
float64 softmax, so it checks the library independently of its own CPU reference.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from typing import List, Optional

import torch

HEAD_QK, HEAD_V = 576, 512
POISON_PAGE = 1 << 30  # page-table padding: out of range, must never be read


def random_parents(gen: torch.Generator, n: int, shape: str = "random") -> List[int]:
    """A parent array: 'random' (parent uniform among earlier nodes), 'chain', 'star' or
    'deep' (parent among the last 3 nodes, long paths)."""
    parents = [-1]
    for i in range(1, n):
        if shape == "chain":
            parents.append(i - 1)
        elif shape == "star":
            parents.append(0)
        elif shape == "deep":
            parents.append(max(0, i - 1 - int(torch.randint(0, 3, (1,), generator=gen))))
        else:
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
    return parents


def ancestor_mask(parents: List[int], words: Optional[int] = None) -> torch.Tensor:
    """int64 [n, words]: bit j of row i set iff j is i or an ancestor of i."""
    n = len(parents)
    words = words or (n + 63) // 64
    rows = []
    for i in range(n):
        bits, j = 0, i
        while j >= 0:
            bits |= 1 << j
            j = parents[j]
        row = []
        for w in range(words):
            v = (bits >> (64 * w)) & ((1 << 64) - 1)
            row.append(v - (1 << 64) if v >= 1 << 63 else v)  # uint64 bits as int64
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64)


def depths(parents: List[int]) -> List[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


@dataclasses.dataclass
class VerifyCase:
    q: torch.Tensor
    kv_cache: torch.Tensor
    page_table: torch.Tensor
    prefix_lens: torch.Tensor
    q_indptr: torch.Tensor
    tree_mask: torch.Tensor
    sm_scale: float
    parents: List[List[int]]

    def args(self):
        return (self.q, self.kv_cache, self.page_table, self.prefix_lens, self.q_indptr,
                self.tree_mask, self.sm_scale)

    def to(self, device):
        return dataclasses.replace(self, **{f: getattr(self, f).to(device) for f in
                                            ("q", "kv_cache", "page_table", "prefix_lens",
                                             "q_indptr", "tree_mask")})


def make_case(seed: int, prefix_lens: List[int], q_lens: List[int], heads: int, page_size: int,
              dtype=torch.bfloat16, shape: str = "random", extra_pages: int = 3,
              stride_pad: int = 2, mask_words: Optional[int] = None, poison: bool = True,
              sm_scale: Optional[float] = None) -> VerifyCase:
    """A ragged batch with scattered pages (a random permutation), NaN in every cache slot no
    request owns, and poison page indices in the page-table padding."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    need = [math.ceil((p + n) / page_size) for p, n in zip(prefix_lens, q_lens)]
    num_pages = sum(need) + extra_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    stride = max(max(need), 1) + stride_pad
    table = torch.full((batch, stride), POISON_PAGE, dtype=torch.int32)
    kv = torch.randn(num_pages, page_size, HEAD_QK, generator=gen)
    owned = torch.zeros(num_pages, page_size, dtype=torch.bool)
    k = 0
    for b in range(batch):
        rows = prefix_lens[b] + q_lens[b]
        for j in range(need[b]):
            table[b, j] = perm[k]
            owned[perm[k], : min(page_size, rows - j * page_size)] = True
            k += 1
    if poison:
        kv[~owned] = float("nan")
    parents = [random_parents(gen, n, shape) if n > 0 else [] for n in q_lens]
    words = mask_words or max(1, max((n + 63) // 64 for n in q_lens))
    masks = [ancestor_mask(p, words) for p in parents if p]
    tree_mask = torch.cat(masks) if masks else torch.zeros((0, words), dtype=torch.int64)
    total_q = sum(q_lens)
    q = torch.randn(total_q, heads, HEAD_QK, generator=gen)
    indptr = [0]
    for n in q_lens:
        indptr.append(indptr[-1] + n)
    return VerifyCase(q=q.to(dtype), kv_cache=kv.to(dtype), page_table=table,
                      prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32),
                      q_indptr=torch.tensor(indptr, dtype=torch.int32), tree_mask=tree_mask,
                      sm_scale=sm_scale or 1.0 / math.sqrt(192.0), parents=parents)


def reference_verify(q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask, sm_scale,
                     part: str = "all"):
    """float64 masked softmax attention on q's device: (o [total_q, H, 512], lse [total_q, H])."""
    dev = q.device
    kv = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], HEAD_QK)
    page_size = kv.shape[1]
    total_q, heads = q.shape[0], q.shape[1]
    o = torch.zeros(total_q, heads, HEAD_V, dtype=torch.float64, device=dev)
    lse = torch.full((total_q, heads), float("-inf"), dtype=torch.float64, device=dev)
    indptr = q_indptr.tolist()
    lens = prefix_lens.tolist()
    for b in range(len(lens)):
        lo, hi, L = indptr[b], indptr[b + 1], lens[b]
        n = hi - lo
        if n == 0:
            continue
        t = torch.arange(L + n, device=dev)
        pages = page_table[b].to(dev).long()[t // page_size]
        rows = kv[pages, t % page_size].double()  # [L + n, 576]
        vis = torch.zeros(n, L + n, dtype=torch.bool, device=dev)
        if part != "tail":
            vis[:, :L] = True
        if part != "prefix":
            words = tree_mask[lo:hi].to(dev)
            j = torch.arange(n, device=dev)
            bits = (words[:, j // 64] >> (j % 64)) & 1  # arithmetic shift keeps bit 0 right
            vis[:, L:] = bits.bool()
        s = torch.einsum("ihd,td->iht", q[lo:hi].double(), rows) * sm_scale
        s = s.masked_fill(~vis[:, None, :], float("-inf"))
        lse_b = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse_b[..., None])
        p = torch.nan_to_num(p, nan=0.0)  # rows that see nothing
        o[lo:hi] = torch.einsum("iht,td->ihd", p, rows[:, :HEAD_V])
        lse[lo:hi] = lse_b
    return o, lse


def reference_merge(v_a, s_a, v_b, s_b):
    """merge_state_v2 in float64: +-inf / NaN LSE = empty part."""
    va, vb = v_a.double(), v_b.double()
    sa, sb = s_a.double(), s_b.double()
    sa = torch.where(torch.isfinite(sa), sa, torch.full_like(sa, float("-inf")))
    sb = torch.where(torch.isfinite(sb), sb, torch.full_like(sb, float("-inf")))
    m = torch.maximum(sa, sb)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa, wb = torch.exp(sa - m_safe), torch.exp(sb - m_safe)
    tot = wa + wb
    v = (va * wa[..., None] + vb * wb[..., None]) / torch.where(tot > 0, tot, 1.0)[..., None]
    s = torch.where(tot > 0, m_safe + torch.log(tot), torch.full_like(tot, float("-inf")))
    return v, s


def ddtree_brute_force(tokens: torch.Tensor, logprobs: torch.Tensor, bonus: int, budget: int,
                       max_depth: int):
    """The design's DDTree by a plain heap over rank tuples: (parents, tokens, depths)."""
    D, K = tokens.shape
    depth_cap = min(D, max_depth)
    lp = logprobs.double().tolist()

    def score(path):
        return sum(lp[d][r] for d, r in enumerate(path))

    heap = [(-score((0,)), 1, (0,))]
    node_of = {(): 0}
    parents, toks, deps = [-1], [bonus], [0]
    while heap and len(parents) < budget + 1:
        _, d, path = heapq.heappop(heap)
        node_of[path] = len(parents)
        parents.append(node_of[path[:-1]])
        toks.append(int(tokens[d - 1, path[-1]]))
        deps.append(d)
        if path[-1] + 1 < K:
            sib = path[:-1] + (path[-1] + 1,)
            heapq.heappush(heap, (-score(sib), d, sib))
        if d < depth_cap:
            child = path + (0,)
            heapq.heappush(heap, (-score(child), d + 1, child))
    return parents, toks, deps


def accept_walk(parents, node_tokens, target_tokens):
    """Acceptance by the design's rule: lowest-index child carrying the target token."""
    nodes = [0]
    while True:
        u = nodes[-1]
        t = target_tokens[u]
        nxt = [c for c in range(len(parents)) if parents[c] == u and node_tokens[c] == t]
        if not nxt:
            return nodes, t
        nodes.append(min(nxt))
