#include "treemla/dtype.h"

#include <cmath>

#include "treemla/error.h"

namespace treemla {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP32:
      return "fp32";
  }
  return "unknown";
}

DType parse_dtype(const std::string& s, const char* what) {
  if (s == "bf16") return DType::kBF16;
  if (s == "fp16") return DType::kFP16;
  if (s == "fp32") return DType::kFP32;
  TREEMLA_FAIL(what << " must be one of bf16, fp16, fp32 (got '" << s << "')");
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t float_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (absu >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  float a;
  std::memcpy(&a, &absu, 4);
  if (a < 6.103515625e-05f) {  // subnormal in fp16: quantum 2^-24, round to nearest even
    const float q = std::nearbyint(a * 16777216.0f);
    return sign | static_cast<uint16_t>(q);
  }
  const uint32_t exp = (absu >> 23) - 127 + 15;
  uint32_t mant = absu & 0x7fffffu;
  uint32_t r = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // carries into exp correctly
  return sign | static_cast<uint16_t>(r);
}

}  // namespace treemla
