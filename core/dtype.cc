// Names of element types (see core/dtype.h).
#include "core/dtype.h"

#include <string>

namespace strata {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
  }
  return "?";
}

bool parse_dtype(std::string_view text, DType* out) {
  const std::string v(text);
  if (v == "fp32" || v == "f32" || v == "float32" || v == "float") {
    *out = DType::F32;
  } else if (v == "bf16" || v == "bfloat16") {
    *out = DType::BF16;
  } else if (v == "fp16" || v == "f16" || v == "float16" || v == "half") {
    *out = DType::F16;
  } else {
    return false;
  }
  return true;
}

}  // namespace strata
