#pragma once
/// A non-owning view of a 2-D (or stacked 3-D) weight tensor in device memory.

#include <cstddef>
#include <cstdint>

#include "gpu/ggml_types.hpp"

namespace weft::gpu {

/// Rows of `n_cols` elements of `type`, `row_bytes` apart; `n_mats` matrices `mat_bytes` apart
/// (MoE expert stacks). `data` is a device pointer of the device that will read it.
struct tensor_view {
  ggml_type type = ggml_type::f32;
  const void* data = nullptr;
  int64_t n_cols = 0;  ///< Elements per row (ggml ne0).
  int64_t n_rows = 0;  ///< Rows per matrix (ggml ne1).
  int64_t n_mats = 1;  ///< Matrices (ggml ne2), e.g. experts.
  size_t row_bytes = 0;
  size_t mat_bytes = 0;
  /// A copy in the layout the backend's matmul reads fastest (compute_ops::pack_weight; null:
  /// none), `mat_bytes` per matrix like `data`. The values stay in `data` for every other reader.
  const void* packed = nullptr;

  /// Matrix `i` of a stack as a single-matrix view.
  tensor_view matrix(int64_t i) const {
    tensor_view v = *this;
    v.data = static_cast<const char*>(data) + static_cast<size_t>(i) * mat_bytes;
    if (packed != nullptr)
      v.packed = static_cast<const char*>(packed) + static_cast<size_t>(i) * mat_bytes;
    v.n_mats = 1;
    return v;
  }
  const void* row(int64_t r) const {
    return static_cast<const char*>(data) + static_cast<size_t>(r) * row_bytes;
  }
};

}  // namespace weft::gpu
