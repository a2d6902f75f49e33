// treemla: verify attention, problem description and CPU reference (the specification).
//
// One call covers a ragged batch of requests. Request b owns the query rows
// [q_indptr[b], q_indptr[b+1]) -- its tree nodes, node 0 being the root -- and a
// logical KV sequence of prefix_lens[b] + q_len(b) latent rows:
//   logical rows [0, prefix_len)             the cached prefix (every node sees all of it)
//   logical row  prefix_len + j              tail node j's own latent row (written by the
//                                            engine before verify, in node order)
// Logical row t of request b is
//   kv_cache[page_table[b * page_table_stride + t / page_size], t % page_size, :].
// So the tree tail lives in the same paged cache, right after the prefix, as serving engines
// already write it. Tail node j is visible to node i iff bit j of tree_mask row i is set
// (word j / 64, bit j % 64, rows in the batch's global node order).
//
// K is the whole 576-wide latent row, V its first 512 columns. Output row i, head h:
//   O[i, h, :] = sum_t softmax_t(sm_scale * q[i,h,:] . k_t) v_t over the visible t,
//   LSE[i, h]  = log(sum_t exp(sm_scale * q[i,h,:] . k_t))   (natural log).
// A row that sees nothing has O = 0 and LSE = -inf.
#pragma once

#include <cstdint>

#include "treemla/dtype.h"
#include "treemla/paged_cache.h"

namespace treemla {

constexpr int kHeadDimQK = 576;  // 512 latent ("nope") + 64 rope
constexpr int kHeadDimV = 512;   // V = first 512 columns of the latent row
constexpr int kMaxHeads = 128;
constexpr int kMaxTreeNodes = 1025;                       // 1 + B with B <= 1024
constexpr int kMaxMaskWords = (kMaxTreeNodes + 63) / 64;  // 17
constexpr int kMaxPrefixLen = 1 << 20;  // generous bound; design range is 0..262144

// Which keys a call attends to. kAll = prefix + tail (the verify attention); kPrefix and kTail
// give the two partial states that merge_state combines into kAll.
enum class VerifyPart : int { kAll = 0, kPrefix = 1, kTail = 2 };

struct VerifyParams {
  DType dtype = DType::kBF16;  // element type of q and o (and of kv_cache unless kv_dtype says)
  // Element type of kv_cache as a DType value; -1 (the default) means the same as dtype. Every
  // implementation today requires the two to match; the field is where an 8-bit cache will go.
  int kv_dtype = -1;
  int batch = 0;      // number of requests, >= 1
  int num_heads = 0;  // H, 1..128
  // The paged cache's geometry; bounds and their one check in paged_cache.h (cache_layout_of).
  int page_size = 0;          // tokens per page, a power of two in [1, 65536]
  int num_pages = 0;          // pages in kv_cache, >= 1
  int page_table_stride = 0;  // int32 entries per page_table row, >= 0
  int mask_words = 0;         // uint64 words per tree_mask row, >= ceil(max q_len / 64), <= 17
  float sm_scale = 0.f;       // softmax scale applied to q . k
  VerifyPart part = VerifyPart::kAll;

  const void* q = nullptr;               // [total_q, H, 576], dtype
  const void* kv_cache = nullptr;        // [num_pages, page_size, 576], dtype
  const int32_t* page_table = nullptr;   // [batch, page_table_stride]
  const int32_t* prefix_lens = nullptr;  // [batch]
  const int32_t* q_indptr = nullptr;     // [batch + 1], q_indptr[0] = 0, non-decreasing
  const uint64_t* tree_mask = nullptr;   // [total_q, mask_words]
};

// The element type of kv_cache.
inline DType kv_dtype_of(const VerifyParams& p) {
  return p.kv_dtype < 0 ? p.dtype : static_cast<DType>(p.kv_dtype);
}

// The geometry of the paged cache the call reads: rows of kHeadDimQK elements of kv_dtype_of(p).
inline PagedCacheLayout cache_layout_of(const VerifyParams& p) {
  return PagedCacheLayout{p.num_pages, p.page_size, kHeadDimQK, dtype_size(kv_dtype_of(p)),
                          p.page_table_stride};
}

namespace cpu {

// Checks every field and the per-request arrays (host pointers): lengths, page indices of all
// rows the call reads, mask rows (no bit at or past its request's q_len).
// Throws treemla::Error naming the argument and the bound it broke.
void validate(const VerifyParams& p);

// The specification: materializes each request's full [q_len x (prefix_len + q_len)] visibility
// mask and computes masked softmax attention in double precision. Independent of the split
// design. o: [total_q, H, 512] float, lse: [total_q, H] float (natural log).
void verify_full(const VerifyParams& p, float* o, float* lse);

// The split design on the CPU: p.part selects prefix-only, tail-only, or both (online merge).
void verify_split(const VerifyParams& p, float* o, float* lse);

// merge_state_v2 semantics: v_* [tokens, heads, dim], s_* [tokens, heads], natural-log LSE.
// An LSE of +-inf (or NaN) marks an empty part, which contributes nothing; two empty parts give
// v = 0 and s = -inf. v may alias v_a or v_b, s may alias s_a or s_b.
void merge_state(const float* v_a, const float* s_a, const float* v_b, const float* s_b, float* v,
                 float* s, int64_t tokens, int heads, int dim);

}  // namespace cpu
}  // namespace treemla
