#include "actors/serve/model_host.hpp"

#include "actors/cache_dir.hpp"

#include <fstream>
#include <iterator>

#include <spdlog/spdlog.h>

#include <cstdlib>

namespace weft::serve {

namespace fs = std::filesystem;

fs::path default_model_path() {
  if (const char* m = std::getenv("WEFT_MODEL"); m != nullptr && *m != '\0') return m;
  return actors::weft_cache_dir() / "models" / default_model_file;
}

std::string model_id_for(const fs::path& path) {
  std::string name = path.filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

namespace {

// Logs the file's loading progress in quarters.
std::function<void(size_t, size_t)> load_progress(const std::string& what) {
  return [what, next = size_t{0}](size_t done, size_t total) mutable {
    if (done < next && done < total) return;
    spdlog::info("loading {}: {}% of {:.1f} MiB", what, total == 0 ? 100 : done * 100 / total,
                 static_cast<double>(total) / (1 << 20));
    next = done + total / 4 + 1;
  };
}

}  // namespace

result<std::unique_ptr<model_host>> load_model_host(const model_host_options& o) {
  auto fail = [&](const std::string& step, const std::string& why) {
    return make_error(errc::invalid_argument,
                      "model " + o.path.string() + ": " + step + ": " + why);
  };
  if (!fs::exists(o.path)) {
    return make_error(
        errc::not_found,
        "model file " + o.path.string() +
            " not found (scripts/fetch_model.sh fetches the default model; or pass --model PATH)");
  }
  gpu::gguf_open_config oc;
  if (o.load_weights) {
    oc.memory = o.weights_memory;
    oc.load_now = o.preload;
    oc.progress = load_progress(model_id_for(o.path));
  }
  auto file = gpu::gguf_file::open(o.path, oc);
  if (!file) return fail("open", file.error().to_string());
  auto tok = gpu::tokenizer::from_gguf(*file);
  if (!tok) return fail("tokenizer", tok.error().to_string());
  auto host = std::make_unique<model_host>(
      model_host{model_id_for(o.path), std::move(tok.value()), std::nullopt, nullptr, nullptr, 0});
  if (!o.chat_template_file.empty()) {
    std::ifstream in(o.chat_template_file, std::ios::binary);
    if (!in) {
      return make_error(errc::invalid_argument,
                        "--chat-template " + o.chat_template_file.string() + ": cannot read it");
    }
    const std::string src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto t = gpu::chat_template::from_jinja(src, &*file);
    if (!t) {
      return make_error(errc::invalid_argument, "--chat-template " + o.chat_template_file.string() +
                                                    ": " + t.error().message());
    }
    host->tmpl = std::move(t.value());
    spdlog::info("model {}: chat template from {}", host->id, o.chat_template_file.string());
  } else if (auto t = gpu::chat_template::from_gguf(*file)) {
    host->tmpl = std::move(t.value());
    spdlog::info("model {}: chat template: {}", host->id,
                 host->tmpl->runs_jinja() ? "the model's own (Jinja)"
                                          : "native " + host->tmpl->describe() + " format");
  } else {
    spdlog::warn("model {}: no usable chat template ({}); /v1/chat/completions is disabled",
                 host->id, t.error().to_string());
  }
  {
    const std::string arch{file->architecture()};
    const auto u32 = [&](const std::string& k, uint32_t dflt) {
      auto v = file->get_u32(arch + "." + k);
      return v ? static_cast<int64_t>(*v) : static_cast<int64_t>(dflt);
    };
    const int64_t n_layer = u32("block_count", 0);
    const int64_t n_head = u32("attention.head_count", 1);
    const int64_t n_head_kv = u32("attention.head_count_kv", static_cast<uint32_t>(n_head));
    const int64_t n_embd = u32("embedding_length", 0);
    const int64_t head_dim =
        u32("attention.key_length", static_cast<uint32_t>(n_head > 0 ? n_embd / n_head : 0));
    host->kv_bytes_per_token = n_layer * n_head_kv * head_dim * 2 /*K,V*/ * 2 /*f16*/;
    host->n_embd = n_embd;
  }
  if (!o.load_weights) {
    if (auto ctx = file->get_u32(std::string{file->architecture()} + ".context_length"))
      host->n_ctx = *ctx;
    return host;
  }
  auto dev = gpu::device_registry::instance().open(o.device, o.threads);
  if (!dev) return fail("device " + o.device, dev.error().to_string());
  host->dev = std::move(dev.value());
  gpu::model_load_config mc;
  mc.max_batch_tokens = o.max_batch_tokens;
  auto m = gpu::model::load(std::move(file.value()), *host->dev, mc);
  if (!m) return fail("weights", m.error().to_string());
  host->model = std::move(m.value());
  host->n_ctx = host->model->hparams().n_ctx_train;
  return host;
}

weft::result<std::vector<int32_t>> encode_user_turn(const model_host& host,
                                                    const std::string& user_text) {
  std::string text = user_text;
  if (host.tmpl) {
    std::vector<gpu::chat_message> messages{{"user", user_text}};
    auto rendered = host.tmpl->apply(messages, gpu::generation_prompt::add);
    if (!rendered) return make_error(errc::invalid_argument, rendered.error().to_string());
    text = std::move(*rendered);
  }
  auto ids = host.tok.encode(text, gpu::add_special::yes,
                             host.tmpl ? gpu::parse_special::yes : gpu::parse_special::no);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

}  // namespace weft::serve
