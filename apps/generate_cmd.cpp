// `weft generate`: runs the engine in-process on one prompt and streams the text to stdout.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fstream>
#include <iterator>
#include "actors/serve/model_host.hpp"
#include "apps/commands.hpp"
#include "gpu/chat_template.hpp"
#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tokenizer.hpp"

namespace weft::apps {

namespace {

namespace fs = std::filesystem;

constexpr const char* default_model_name = serve::default_model_file;
using serve::default_model_path;

struct generate_options {
  std::string model_path;
  std::string prompt;
  std::string system_prompt;
  bool chat = false;
  std::string chat_template;  ///< a Jinja file instead of the model's template (implies --chat)
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repeat_penalty = 1.0f;
  uint64_t seed = 0;
  int threads = 0;
  std::string weights_memory = "huge-pages";
  std::string cpu_matmul = "auto";
  std::vector<std::string> stop;
  std::string device = "cpu";
};

int run_generate(const generate_options& o) {
  // stdout carries the generated text only; logs go to stderr.
  const auto level = spdlog::get_level();
  auto logger = spdlog::get("weft-generate");
  if (!logger) logger = spdlog::stderr_color_mt("weft-generate");
  spdlog::set_default_logger(logger);
  spdlog::set_level(level);
  const fs::path path = o.model_path.empty() ? default_model_path() : fs::path{o.model_path};
  if (!fs::exists(path)) {
    spdlog::error(
        "model file {} not found; fetch the default model with scripts/fetch_model.sh or pass "
        "--model PATH",
        path.string());
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  gpu::gguf_open_config oc;
  oc.memory = *gpu::parse_gguf_memory(o.weights_memory);
  oc.load_now = true;
  oc.progress = [](size_t done, size_t total) {
    std::fprintf(stderr, "\rloading model: %3zu%% of %.1f MiB",
                 total == 0 ? 100 : done * 100 / total, static_cast<double>(total) / (1 << 20));
    if (done == total) std::fputc('\n', stderr);
  };
  auto file = gpu::gguf_file::open(path, oc);
  if (!file) {
    spdlog::error("cannot open {}: {}", path.string(), file.error().to_string());
    return 1;
  }
  auto tok = gpu::tokenizer::from_gguf(*file);
  if (!tok) {
    spdlog::error("tokenizer: {}", tok.error().to_string());
    return 1;
  }
  std::string prompt = o.prompt;
  if (prompt == "-") {  // `-p -`: the prompt is stdin, whole
    std::ostringstream in;
    in << std::cin.rdbuf();
    prompt = in.str();
    if (prompt.empty()) {
      spdlog::error("--prompt -: stdin was empty");
      return 2;
    }
  }
  std::string prompt_text = prompt;
  if (o.chat || !o.chat_template.empty()) {
    auto tmpl = [&]() -> gpu::result<gpu::chat_template> {
      if (o.chat_template.empty()) return gpu::chat_template::from_gguf(*file);
      std::ifstream in(o.chat_template, std::ios::binary);
      if (!in)
        return gpu::status{gpu::status_code::invalid_argument,
                           "--chat-template " + o.chat_template + ": cannot read it"};
      const std::string src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return gpu::chat_template::from_jinja(src, &*file);
    }();
    if (!tmpl) {
      spdlog::error("chat template: {}", tmpl.error().to_string());
      return 1;
    }
    std::vector<gpu::chat_message> messages;
    if (!o.system_prompt.empty()) messages.push_back({"system", o.system_prompt});
    messages.push_back({"user", prompt});
    auto rendered = tmpl->apply(messages, gpu::generation_prompt::add);
    if (!rendered) {
      spdlog::error("chat template: {}", rendered.error().to_string());
      return 1;
    }
    prompt_text = *rendered;
  }
  auto dev = gpu::device_registry::instance().open(o.device, o.threads);
  if (!dev) {
    spdlog::error("device '{}': {}", o.device, dev.error().to_string());
    return 1;
  }
  auto m = gpu::model::load(std::move(file.value()), *dev.value());
  if (!m) {
    spdlog::error("model: {}", m.error().to_string());
    return 1;
  }
  const gpu::tokenizer& tk = tok.value();
  gpu::engine_config ec;
  ec.kv_blocks = 512;
  ec.detokenize = [&tk](int32_t id) { return tk.token_to_piece(id); };
  auto eng = gpu::engine::create(*m.value(), ec);
  if (!eng) {
    spdlog::error("engine: {}", eng.error().to_string());
    return 1;
  }
  const auto t1 = std::chrono::steady_clock::now();
  spdlog::info("loaded {} in {:.2f} s on {}", path.filename().string(),
               std::chrono::duration<double>(t1 - t0).count(), dev.value()->capabilities().name);

  std::vector<int32_t> prompt_ids =
      tk.encode(prompt_text, gpu::add_special::yes,
                o.chat ? gpu::parse_special::yes : gpu::parse_special::no);
  gpu::sampling_params sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.min_p = o.min_p;
  sp.repetition_penalty = o.repeat_penalty;
  sp.seed = o.seed;
  sp.max_tokens = o.max_tokens;
  sp.stop_strings = o.stop;
  const auto eog = tk.end_of_generation_ids();
  sp.stop_tokens.assign(eog.begin(), eog.end());
  if (auto st = eng.value()->add_request(1, prompt_ids, sp); !st) {
    spdlog::error("request: {}", st.to_string());
    return 1;
  }
  const auto t2 = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first_token;
  int64_t n_generated = 0;
  gpu::finish_reason reason = gpu::finish_reason::none;
  while (eng.value()->has_work()) {
    auto outs = eng.value()->step();
    if (!outs) {
      spdlog::error("step: {}", outs.error().to_string());
      return 1;
    }
    for (const auto& out : *outs) {
      if (!first_token && !out.new_tokens.empty()) first_token = std::chrono::steady_clock::now();
      n_generated += static_cast<int64_t>(out.new_tokens.size());
      std::fwrite(out.text_delta.data(), 1, out.text_delta.size(), stdout);
      std::fflush(stdout);
      if (out.finish == gpu::finish_reason::error) {
        spdlog::error("generation failed: {}", out.error);
        return 1;
      }
      if (out.finish != gpu::finish_reason::none) reason = out.finish;
    }
  }
  std::fputc('\n', stdout);
  const auto t3 = std::chrono::steady_clock::now();
  const double ttft = first_token ? std::chrono::duration<double>(*first_token - t2).count() : 0.0;
  const double decode_s =
      first_token ? std::chrono::duration<double>(t3 - *first_token).count() : 0.0;
  spdlog::info(
      "{} prompt tokens, {} generated ({}); prefill {:.1f} ms, decode {:.1f} tokens/s",
      prompt_ids.size(), n_generated, gpu::finish_reason_name(reason), ttft * 1e3,
      n_generated > 1 && decode_s > 0 ? static_cast<double>(n_generated - 1) / decode_s : 0.0);
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, const global_options& /*globals*/) {
  auto opts = std::make_shared<generate_options>();
  CLI::App* cmd =
      app.add_subcommand("generate", "Generate text from a prompt with a local GGUF model");
  cmd->add_option(
      "--model,-m", opts->model_path,
      "GGUF model (default: $WEFT_MODEL, else $WEFT_CACHE_DIR or ~/.cache/weft: models/" +
          std::string{default_model_name} + ")");
  cmd->add_option("--prompt,-p", opts->prompt, "Prompt text; - reads it from stdin")->required();
  cmd->add_flag("--chat", opts->chat, "Wrap the prompt in the model's chat template");
  cmd->add_option("--chat-template", opts->chat_template,
                  "Jinja chat template file to wrap the prompt in instead of the model's "
                  "(implies --chat)");
  cmd->add_option("--system", opts->system_prompt, "System message (with --chat)");
  cmd->add_option("--max-tokens,-n", opts->max_tokens, "Tokens to generate at most")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--temperature,-t", opts->temperature, "Sampling temperature (0 = greedy)")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--top-k", opts->top_k, "Keep the k most likely tokens (0 = off)")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--top-p", opts->top_p, "Nucleus sampling mass (1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", opts->min_p, "Drop tokens below min-p x the best (0 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", opts->repeat_penalty, "Repetition penalty (1 = off)")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "Compute threads (0 = all cores)")
      ->capture_default_str()
      ->check(non_negative_number);
  add_weights_memory_option(cmd, opts->weights_memory);
  add_cpu_matmul_option(cmd, opts->cpu_matmul);
  cmd->add_option("--stop", opts->stop, "Stop string (repeatable)");
  cmd->add_option("--device", opts->device, "Device: cpu, cuda or cuda:N")->capture_default_str();
  cmd->callback([opts] {
    const int rc = run_generate(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace weft::apps
