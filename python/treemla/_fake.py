"""Fake (meta) kernels: output shapes and dtypes of the operators without running them, so
torch.compile can trace them (also with symbolic shapes). Mutating operators return nothing;
their effect on the mutated arguments is declared by the schemas' (a!) annotations."""
from __future__ import annotations

import torch

_register = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract


@_register("treemla::verify_attention")
def _verify_attention(q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask, sm_scale,
                      part=0, max_batch=0, max_total_q=0, tile=0, workspace=None):
    if q.dim() != 3 or q.shape[2] != 576:
        raise ValueError(f"q must have shape [total_q, H, 576], got {list(q.shape)}")
    o = q.new_empty((q.shape[0], q.shape[1], 512))
    lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    return o, lse


@_register("treemla::verify_attention_out")
def _verify_attention_out(q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask, sm_scale,
                          part, max_batch, max_total_q, tile, out, lse, workspace=None):
    return None


@_register("treemla::merge_state")
def _merge_state(v_a, s_a, v_b, s_b):
    return torch.empty_like(v_a), torch.empty_like(s_a)


@_register("treemla::merge_state_out")
def _merge_state_out(v_a, s_a, v_b, s_b, v, s):
    return None


@_register("treemla::apply_page_moves")
def _apply_page_moves(cache, moves, wave_offsets, workspace=None):
    return None


@_register("treemla::apply_row_moves")
def _apply_row_moves(cache, moves, wave_offsets, workspace=None):
    return None


@_register("treemla::update_page_tables")
def _update_page_tables(page_table, rows, offsets, pages, num_pages, workspace=None):
    return None


@_register("treemla::accept_paths")
def _accept_paths(q_indptr, parents, node_tokens, target_tokens, max_accept):
    batch = q_indptr.shape[0] - 1
    return (q_indptr.new_empty((batch, max_accept)), q_indptr.new_empty((batch,)),
            q_indptr.new_empty((batch,)), q_indptr.new_empty((batch,)))


@_register("treemla::commit_accepted")
def _commit_accepted(cache, page_table, prefix_lens, accepted, accept_len):
    return torch.empty_like(prefix_lens), torch.empty_like(prefix_lens)
