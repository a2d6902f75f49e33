// Draft-tree operators (host only): DDTree builder, ancestor masks, positions, the batched
// verify layout, acceptance and the commit plan. CPU tensors in and out; the library checks the
// trees themselves and its errors surface as RuntimeError.
//
// Registered under CompositeExplicitAutograd rather than CPU so that a tensor on another device
// reaches our own check ("parents must be a CPU tensor") instead of a dispatcher error.
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "common.h"
#include "ops.h"
#include "treemla/tree.h"

namespace treemla::binding {

namespace {

// A 1-D int32 CPU tensor as a span.
std::span<const int32_t> int_span(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  check_dtype(t, name, {at::kInt});
  TREEMLA_CHECK_VALUE(t.dim() == 1, name, " must be 1-D, got shape ", shape_str(t));
  check_contiguous(t, name);
  return {t.data_ptr<int32_t>(), static_cast<size_t>(t.numel())};
}

at::Tensor to_tensor(const std::vector<int32_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::dtype(at::kInt));
  if (!v.empty()) std::memcpy(t.data_ptr<int32_t>(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_ddtree_op(const at::Tensor& topk_tokens,
                                                               const at::Tensor& topk_logprobs,
                                                               int64_t bonus_token, int64_t budget,
                                                               int64_t max_depth) {
  check_cpu(topk_tokens, "topk_tokens");
  check_cpu(topk_logprobs, "topk_logprobs");
  check_dtype(topk_tokens, "topk_tokens", {at::kInt});
  check_dtype(topk_logprobs, "topk_logprobs", {at::kFloat});
  TREEMLA_CHECK_VALUE(
      topk_tokens.dim() == 2 && topk_tokens.size(0) >= 1 && topk_tokens.size(1) >= 1,
      "topk_tokens must have shape [D, K] with D, K >= 1, got ", shape_str(topk_tokens));
  TREEMLA_CHECK_VALUE(topk_logprobs.sizes() == topk_tokens.sizes(),
                      "topk_logprobs must have topk_tokens' shape ", shape_str(topk_tokens),
                      ", got ", shape_str(topk_logprobs));
  check_contiguous(topk_tokens, "topk_tokens");
  check_contiguous(topk_logprobs, "topk_logprobs");
  tree::DraftTopK draft;
  draft.num_depths = to_int32(topk_tokens.size(0), "topk_tokens.shape[0]");
  draft.top_k = to_int32(topk_tokens.size(1), "topk_tokens.shape[1]");
  draft.tokens = {topk_tokens.data_ptr<int32_t>(), static_cast<size_t>(topk_tokens.numel())};
  draft.log_probs = {topk_logprobs.data_ptr<float>(), static_cast<size_t>(topk_logprobs.numel())};
  const tree::DDTree t = guarded([&] {
    return tree::build_ddtree(draft, to_int32(bonus_token, "bonus_token"),
                              to_int32(budget, "budget"), to_int32(max_depth, "max_depth"));
  });
  return {to_tensor(t.parents), to_tensor(t.tokens), to_tensor(t.depths)};
}

at::Tensor tree_mask_op(const at::Tensor& parents, int64_t mask_words) {
  const auto par = int_span(parents, "parents");
  const int64_t n = static_cast<int64_t>(par.size());
  guarded([&] { tree::validate_parents(par); });
  const int64_t words = mask_words == 0 ? tree::mask_words_for(static_cast<int>(n)) : mask_words;
  TREEMLA_CHECK_VALUE(words >= tree::mask_words_for(static_cast<int>(n)) && words <= kMaxMaskWords,
                      "mask_words = ", mask_words, " must be 0 (tight) or in [ceil(n / 64) = ",
                      tree::mask_words_for(static_cast<int>(n)), ", ", kMaxMaskWords,
                      "] for n = ", n);
  at::Tensor out = at::empty({n, words}, at::dtype(at::kLong));
  guarded([&] {
    tree::write_ancestor_mask(
        par, static_cast<int>(words),
        {reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>()), static_cast<size_t>(n * words)});
  });
  return out;
}

at::Tensor positions_op(const at::Tensor& parents, int64_t prefix_len) {
  const auto par = int_span(parents, "parents");
  return to_tensor(
      guarded([&] { return tree::compute_positions(par, to_int32(prefix_len, "prefix_len")); }));
}

at::Tensor depths_op(const at::Tensor& parents) {
  const auto par = int_span(parents, "parents");
  return to_tensor(guarded([&] { return tree::compute_depths(par); }));
}

at::Tensor parents_from_mask_op(const at::Tensor& tree_mask) {
  check_cpu(tree_mask, "tree_mask");
  check_dtype(tree_mask, "tree_mask", {at::kLong, at::kUInt64});
  TREEMLA_CHECK_VALUE(tree_mask.dim() == 2 && tree_mask.size(0) >= 1 && tree_mask.size(1) >= 1,
                      "tree_mask must have shape [n, mask_words], got ", shape_str(tree_mask));
  check_contiguous(tree_mask, "tree_mask");
  const auto* words = static_cast<const uint64_t*>(tree_mask.data_ptr());
  return to_tensor(guarded([&] {
    return tree::parents_from_mask({words, static_cast<size_t>(tree_mask.numel())},
                                   to_int32(tree_mask.size(0), "tree_mask.shape[0]"),
                                   to_int32(tree_mask.size(1), "tree_mask.shape[1]"));
  }));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_layout_op(at::TensorList parents,
                                                               const at::Tensor& prefix_lens,
                                                               int64_t mask_words) {
  TREEMLA_CHECK_VALUE(!parents.empty(), "parents must hold at least one tree");
  std::vector<std::vector<int32_t>> trees;
  trees.reserve(parents.size());
  for (size_t b = 0; b < parents.size(); ++b) {
    const std::string name = "parents[" + std::to_string(b) + "]";
    const auto par = int_span(parents[b], name.c_str());
    trees.emplace_back(par.begin(), par.end());
  }
  const auto lens = int_span(prefix_lens, "prefix_lens");
  TREEMLA_CHECK_VALUE(lens.size() == trees.size(), "prefix_lens must have shape [batch] = [",
                      trees.size(), "] (one per tree), got ", shape_str(prefix_lens));
  const tree::BatchLayout l = guarded(
      [&] { return tree::build_batch_layout(trees, lens, to_int32(mask_words, "mask_words")); });
  at::Tensor mask = at::empty({l.total_q, l.mask_words}, at::dtype(at::kLong));
  if (!l.tree_mask.empty()) {
    std::memcpy(mask.data_ptr<int64_t>(), l.tree_mask.data(),
                l.tree_mask.size() * sizeof(uint64_t));
  }
  return {mask, to_tensor(l.q_indptr), to_tensor(l.positions)};
}

std::tuple<at::Tensor, int64_t> accept_path_op(const at::Tensor& parents,
                                               const at::Tensor& node_tokens,
                                               const at::Tensor& target_tokens) {
  const auto par = int_span(parents, "parents");
  const auto nt = int_span(node_tokens, "node_tokens");
  const auto tt = int_span(target_tokens, "target_tokens");
  const tree::Acceptance a = guarded([&] { return tree::accept_path(par, nt, tt); });
  return {to_tensor(a.nodes), static_cast<int64_t>(a.bonus_token)};
}

at::Tensor plan_commit_op(const at::Tensor& parents, const at::Tensor& accepted,
                          int64_t prefix_len) {
  const auto par = int_span(parents, "parents");
  const auto acc = int_span(accepted, "accepted");
  const tree::CommitPlan plan =
      guarded([&] { return tree::plan_commit(par, acc, to_int32(prefix_len, "prefix_len")); });
  at::Tensor out = at::empty({static_cast<int64_t>(plan.copies.size()), 2}, at::dtype(at::kInt));
  auto* o = out.data_ptr<int32_t>();
  for (size_t k = 0; k < plan.copies.size(); ++k) {
    o[2 * k] = plan.copies[k].src;
    o[2 * k + 1] = plan.copies[k].dst;
  }
  return out;
}

}  // namespace

void define_tree_ops(torch::Library& m) {
  const auto key = c10::DispatchKey::CompositeExplicitAutograd;
  m.def(
      "build_ddtree(Tensor topk_tokens, Tensor topk_logprobs, int bonus_token, int budget, "
      "int max_depth=15) -> (Tensor, Tensor, Tensor)",
      torch::dispatch(key, &build_ddtree_op));
  m.def("tree_mask_from_parents(Tensor parents, int mask_words=0) -> Tensor",
        torch::dispatch(key, &tree_mask_op));
  m.def("positions_from_parents(Tensor parents, int prefix_len) -> Tensor",
        torch::dispatch(key, &positions_op));
  m.def("depths_from_parents(Tensor parents) -> Tensor", torch::dispatch(key, &depths_op));
  m.def("parents_from_mask(Tensor tree_mask) -> Tensor",
        torch::dispatch(key, &parents_from_mask_op));
  m.def(
      "batch_layout(Tensor[] parents, Tensor prefix_lens, int mask_words=0) -> (Tensor, Tensor, "
      "Tensor)",
      torch::dispatch(key, &batch_layout_op));
  m.def("accept_path(Tensor parents, Tensor node_tokens, Tensor target_tokens) -> (Tensor, int)",
        torch::dispatch(key, &accept_path_op));
  m.def("plan_commit(Tensor parents, Tensor accepted, int prefix_len) -> Tensor",
        torch::dispatch(key, &plan_commit_op));
}

}  // namespace treemla::binding
