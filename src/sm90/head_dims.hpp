// The head dims the kernels are built for: the one list the validation, the
// dispatch and the launchers read (CMake's FLASH3_ALL_KERNELS names one
// kernel per dtype and head dim of it).
#pragma once

#include <array>
#include <string>
#include <type_traits>
#include <utility>

namespace flash3::detail {

// The 16-bit forward (and the KV-cache append); the backward; quantization
// and the FP8 V layout; the FP8 forward.
using ForwardHeadDims = std::integer_sequence<int, 64, 96, 128, 192, 256>;
using BackwardHeadDims = std::integer_sequence<int, 64, 96, 128, 192, 256>;
using HeadDims = std::integer_sequence<int, 64, 128, 256>;
using Fp8HeadDims = std::integer_sequence<int, 64, 128, 256>;
// V's (and out's) head dims of the 16-bit forward per head dim of q and k:
// the same, 128 beside 192 (DeepSeek's (192, 128)) and 256 beside 64
// (FlashAttention-3's dv != d). The other calls take v of q's head dim.
template <int kHeadDim>
struct ForwardValueDimsOf {
  using type = std::integer_sequence<int, kHeadDim>;
};
template <>
struct ForwardValueDimsOf<64> {
  using type = std::integer_sequence<int, 64, 256>;
};
template <>
struct ForwardValueDimsOf<192> {
  using type = std::integer_sequence<int, 192, 128>;
};
template <int kHeadDim>
using ForwardValueDims = typename ForwardValueDimsOf<kHeadDim>::type;
// The backward's: the forward's pairs ((64, 256) on head dim 256's split of
// the wide dims, bwd/traits.cuh).
template <int kHeadDim>
using BackwardValueDims = ForwardValueDims<kHeadDim>;

template <int... kDims>
constexpr bool contains(std::integer_sequence<int, kDims...>, long long d) {
  return ((d == kDims) || ...);
}

// "64, 128, 256"
template <int... kDims>
std::string list_text(std::integer_sequence<int, kDims...>) {
  std::string text;
  ((text += (text.empty() ? "" : ", ") + std::to_string(kDims)), ...);
  return text;
}

// fn(std::integral_constant<int, d>{}) for the head dim d of Dims equal to
// headdim, else otherwise(); both return the same default-constructible type.
template <int... kDims, class Fn, class Otherwise>
auto visit_head_dim(std::integer_sequence<int, kDims...>, int headdim, const Fn& fn,
                    const Otherwise& otherwise) -> decltype(otherwise()) {
  decltype(otherwise()) result{};
  const bool found =
      ((headdim == kDims && (result = fn(std::integral_constant<int, kDims>{}), true)) || ...);
  return found ? result : otherwise();
}

}  // namespace flash3::detail
