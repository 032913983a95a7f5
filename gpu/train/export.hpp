#pragma once
/// Saving a trained model as GGUF (docs/training.md): the source file's metadata and tokenizer, the
/// trained weights in the chosen type, every other tensor copied as it was. Loadable by
/// `weft serve`, llama.cpp and Hugging Face transformers.

#include <cstddef>
#include <filesystem>
#include <vector>

#include "gpu/ggml_types.hpp"
#include "gpu/gguf.hpp"
#include "gpu/status.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::train {

/// Writes `model`'s weights with the metadata of `source` to `path` (atomically). Matrices and the
/// embedding are stored as `type` (f32, f16, bf16 or q8_0); norm weights stay f32 as llama.cpp
/// requires. A matrix whose rows do not split into q8_0 blocks is stored as f16 (as llama.cpp's
/// quantizer does) and logged.
status export_gguf(const gguf_file& source, const trainable_model<float>& model, ggml_type type,
                   const std::filesystem::path& path);

/// The same file image in memory (e.g. for an engine that serves the trainer's weights: parse it
/// with gguf_file::parse, then update it in place with model::set_weight).
result<std::vector<std::byte>> export_gguf_bytes(const gguf_file& source,
                                                 const trainable_model<float>& model,
                                                 ggml_type type);

}  // namespace weft::gpu::train
