// Structured outputs' cost (docs/serving.md): the engine decoding B sequences on the default model
// with and without a grammar (every sequence under the JSON Schema of a person record, sampled so
// the outputs differ), same prompts, same run; plus the token mask's own time per step (cold: a
// state never seen; warm: from the per-state cache).
//
//   gpu_grammar_bench [--model M.gguf] [--threads 2] [--batch 16] [--tokens 64] [--repeat 3]
//                     [--json F]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/grammar.hpp"
#include "gpu/model.hpp"
#include "gpu/tokenizer.hpp"

namespace {

using namespace weft::gpu;
using clk = std::chrono::steady_clock;

double secs(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"},
  "city": {"enum": ["Paris", "London", "Tokyo"]},
  "hobbies": {"type": "array", "items": {"type": "string"}}},
  "required": ["name", "age", "city", "hobbies"]})";

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, json_path;
  int threads = 2, batch = 16, tokens = 64, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--model")
      model_path = v;
    else if (k == "--threads")
      threads = std::atoi(v);
    else if (k == "--batch")
      batch = std::atoi(v);
    else if (k == "--tokens")
      tokens = std::atoi(v);
    else if (k == "--repeat")
      repeat = std::atoi(v);
    else if (k == "--json")
      json_path = v;
    else {
      std::fprintf(stderr, "unknown option %s (see the header of grammar_bench.cpp)\n", k.c_str());
      return 2;
    }
  }
  if (model_path.empty()) {
    const char* home = std::getenv("HOME");
    model_path = std::string{home != nullptr ? home : "."} +
                 "/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  auto dev = device_registry::instance().create("cpu", device_config{threads, 0});
  auto file = gguf_file::open(model_path);
  if (!dev || !file) {
    std::fprintf(stderr, "cannot open %s\n", model_path.c_str());
    return 1;
  }
  auto tok = tokenizer::from_gguf(*file);
  if (!tok) return 1;
  auto m = model::load(std::move(*file), **dev);
  if (!m) return 1;
  auto gbnf = grammar::json_schema_to_gbnf(kSchema);
  if (!gbnf) return 1;
  auto trie = grammar::token_trie::of(*tok);
  // The mask alone: cold (cache empty at every state) and warm.
  double cold_ms = 0, warm_ms = 0;
  {
    auto g = grammar::grammar::parse(*gbnf);
    const std::string doc =
        R"({ "name": "Alexandra Smith", "age": 42, "city": "Tokyo", "hobbies": ["chess", "long walks"] })";
    grammar::matcher mt(*g);
    std::vector<uint8_t> mask;
    int n = 0;
    auto t = clk::now();
    for (char c : doc) {
      trie->mask(mt, mask);
      ++n;
      if (!mt.advance(static_cast<uint8_t>(c))) break;
    }
    cold_ms = 1e3 * secs(t) / n;
    // Per step through a constraint with a fresh cache (first-time states and lookups mixed).
    t = clk::now();
    int k = 0;
    for (int rep = 0; rep < 3; ++rep) {
      grammar::constraint again(*g, trie, {*tok->eos()});
      for (char ch : doc) {
        (void)again.allowed();
        (void)again.accept(std::string(1, ch));
        ++k;
      }
    }
    warm_ms = 1e3 * secs(t) / k;
  }
  auto run = [&](bool constrained) {
    engine_config ec;
    ec.kv_blocks = 2048;
    ec.max_running = batch;
    ec.vocab = trie;
    auto e = engine::create(**m, ec);
    const auto prompt = tok->encode(
        "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
        add_special::no, parse_special::yes);
    for (int i = 0; i < batch; ++i) {
      sampling_params p;
      p.temperature = 0.8f;
      p.seed = static_cast<uint64_t>(i + 1);
      p.max_tokens = tokens;
      p.stop_tokens = {};  // exactly `tokens` tokens each (a finished grammar would stop early)
      if (constrained) {
        p.grammar = *gbnf;
        p.stop_tokens = {*tok->eos()};
        p.max_tokens = tokens;
      }
      (void)(*e)->add_request(static_cast<request_id>(i + 1), prompt, p);
    }
    int64_t generated = 0;
    // Prefill first (not timed), then decode.
    double decode_s = 0;
    bool prefilled = false;
    clk::time_point t0;
    while ((*e)->has_work()) {
      auto st = (*e)->stats();
      if (!prefilled && st.n_waiting == 0) {
        prefilled = true;
        t0 = clk::now();
        generated = 0;
      }
      auto outs = (*e)->step();
      if (!outs) return std::pair<double, int64_t>{0, 0};
      for (auto& o : *outs) generated += static_cast<int64_t>(o.new_tokens.size());
    }
    decode_s = secs(t0);
    return std::pair<double, int64_t>{static_cast<double>(generated) / decode_s, generated};
  };
  std::vector<double> plain, constrained;
  for (int r = 0; r < repeat; ++r) {
    plain.push_back(run(false).first);
    constrained.push_back(run(true).first);
  }
  std::sort(plain.begin(), plain.end());
  std::sort(constrained.begin(), constrained.end());
  const double p50 = plain[plain.size() / 2], c50 = constrained[constrained.size() / 2];
  std::printf(
      "token mask over %zu tokens: %.2f ms per state cold, %.2f ms per step through a fresh "
      "constraint\n",
      trie->n_tokens(), cold_ms, warm_ms);
  std::printf(
      "decode at batch %d: %.1f tok/s plain, %.1f tok/s under the JSON Schema grammar "
      "(%.1f%% slower; medians of %d)\n",
      batch, p50, c50, 100.0 * (1.0 - c50 / p50), repeat);
  if (!json_path.empty()) {
    nlohmann::json j{{"model", model_path},
                     {"threads", threads},
                     {"batch", batch},
                     {"tokens", tokens},
                     {"repeat", repeat},
                     {"vocab", trie->n_tokens()},
                     {"mask_cold_ms_per_state", cold_ms},
                     {"mask_ms_per_step_fresh_cache", warm_ms},
                     {"plain_tok_s", plain},
                     {"constrained_tok_s", constrained},
                     {"slowdown_median", 1.0 - c50 / p50}};
    std::ofstream(json_path) << j.dump(1);
  }
  return 0;
}
