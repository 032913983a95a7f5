#include "gpu/train/export.hpp"

#include <spdlog/spdlog.h>

#include <unordered_map>

#include "gpu/gguf_writer.hpp"

namespace weft::gpu::train {

namespace {

result<gguf_writer> export_writer(const gguf_file& source, const trainable_model<float>& model,
                                  ggml_type type) {
  if (type != ggml_type::f32 && type != ggml_type::f16 && type != ggml_type::bf16 &&
      type != ggml_type::q8_0) {
    return status{status_code::unsupported, "export type must be f32, f16, bf16 or q8_0, not " +
                                                std::string{type_name(type)}};
  }
  if (!model.host_current())
    return status{status_code::internal,
                  "the device holds newer weights than the host copy (pull_to_host first)"};
  std::unordered_map<std::string_view, const parameter<float>*> trained;
  for (const auto& p : model.parameters()) trained[p.name] = &p;
  gguf_writer w;
  for (const auto& [key, value] : source.metadata()) w.set(key, value);
  w.set("general.file_type", llama_file_type(type));
  for (const gguf_tensor& t : source.tensors()) {
    const std::span<const int64_t> ne(t.ne.data(), t.n_dims);
    auto it = trained.find(t.name);
    status st;
    if (it == trained.end()) {
      st = w.add_tensor(t.name, t.type, ne, std::span(t.data, t.size_bytes));
    } else {
      ggml_type as = it->second->ne[1] == 1 ? ggml_type::f32 : type;
      if (as == ggml_type::q8_0 && it->second->ne[0] % qk32 != 0) {
        spdlog::warn("export: '{}' has rows of {} values, not a multiple of 32: stored as f16",
                     t.name, it->second->ne[0]);
        as = ggml_type::f16;
      }
      st = w.add_tensor_from_f32(t.name, as, ne, it->second->value);
    }
    if (!st) return st;
  }
  return w;
}

}  // namespace

status export_gguf(const gguf_file& source, const trainable_model<float>& model, ggml_type type,
                   const std::filesystem::path& path) {
  auto w = export_writer(source, model, type);
  if (!w) return w.error();
  return w->write_file(path);
}

result<std::vector<std::byte>> export_gguf_bytes(const gguf_file& source,
                                                 const trainable_model<float>& model,
                                                 ggml_type type) {
  auto w = export_writer(source, model, type);
  if (!w) return w.error();
  return w->to_bytes();
}

}  // namespace weft::gpu::train
