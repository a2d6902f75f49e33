// treemla: element types and host-side conversions (no CUDA headers).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace treemla {

enum class DType : int { kBF16 = 0, kFP16 = 1, kFP32 = 2 };

inline int dtype_size(DType t) { return t == DType::kFP32 ? 4 : 2; }
const char* dtype_name(DType t);
// Parses "bf16", "fp16", "fp32"; throws treemla::Error naming `what` otherwise.
DType parse_dtype(const std::string& s, const char* what = "dtype");

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);  // round to nearest even, overflow to inf

// Reads element i of a buffer of type t as float.
inline float load_as_float(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kFP16:
      return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

inline void store_from_float(void* p, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
      break;
    case DType::kFP16:
      static_cast<uint16_t*>(p)[i] = float_to_fp16(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}

}  // namespace treemla
