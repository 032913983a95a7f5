// Oracle: weft's CPU engine against llama.cpp (llama-cpp-python) on the same GGUF.
// Greedy continuations must be identical; teacher-forced top-1 must agree on >= 99.5% of positions,
// disagreeing only where llama.cpp's two best logits are a near-tie.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gpu/cpu/quant_dot.hpp"
#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "tests/support/oracle_env.hpp"

namespace {

namespace fs = std::filesystem;
using weft::testing::in_ci;
const auto model_path = weft::testing::default_model_path;
using namespace weft::gpu;

const char* const prompts[] = {
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1492, Christopher Columbus",
    "#include <stdio.h>\nint main() {",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nName three "
    "fruits.<|im_end|>\n<|im_start|>assistant\n",
    "SELECT name, age FROM users WHERE",
    "1, 1, 2, 3, 5, 8,",
    "The mitochondria is",
    "Dear Sir or Madam,\n\nI am writing to",
    "import numpy as np\n\nx = np.",
    "A haiku about the sea:\n",
    "The largest planet in our solar system",
};

struct fixture_data {
  nlohmann::json ref;
  std::string skip_reason;  ///< a reference that is legitimately absent here (never under CI)
  std::string failure;      ///< the reference crashed or produced nothing: a failure, never a skip
};

/// Ends the current test as skipped (locally) or failed (CI, or a broken reference).
#define WEFT_REQUIRE_REFERENCE(r)                                                      \
  do {                                                                                 \
    if (!(r).failure.empty()) FAIL() << (r).failure;                                   \
    if (!(r).skip_reason.empty()) {                                                    \
      if (in_ci()) FAIL() << "CI=true and the oracle cannot run: " << (r).skip_reason; \
      GTEST_SKIP() << (r).skip_reason;                                                 \
    }                                                                                  \
  } while (0)

const fixture_data& reference() {
  static fixture_data data = [] {
    fixture_data d;
    if (!fs::exists(model_path())) {
      d.skip_reason = "model not found at " + model_path() + " (run scripts/fetch_model.sh)";
      return d;
    }
    const fs::path dir = fs::temp_directory_path() / ("weft_oracle_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    nlohmann::json p;
    p["prompts"] = std::vector<std::string>(std::begin(prompts), std::end(prompts));
    std::ofstream(dir / "prompts.json") << p.dump();
    const std::string script = std::string{WEFT_ORACLE_DIR} + "/llama_ref.py";
    const std::string cmd = "python3 " + script + " '" + model_path() + "' '" +
                            (dir / "prompts.json").string() + "' '" + (dir / "ref.json").string() +
                            "' --tokens 64 2>" + (dir / "stderr.txt").string();
    const int rc = std::system(cmd.c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 3) {  // llama_ref.py: llama_cpp is not installed
      d.skip_reason = "llama_cpp is not installed (scripts/setup.sh --test)";
      return d;
    }
    if (code != 0) {
      d.failure = "the llama_cpp reference script failed (status " + std::to_string(rc) +
                  "), see " + (dir / "stderr.txt").string();
      return d;
    }
    std::ifstream in(dir / "ref.json");
    d.ref = nlohmann::json::parse(in);
    fs::remove_all(dir);
    return d;
  }();
  return data;
}

struct engine_under_test {
  std::unique_ptr<device> dev;
  std::unique_ptr<model> m;
  std::unique_ptr<kv_cache> kv;
};

engine_under_test make_engine() {
  engine_under_test e;
  auto d = device_registry::instance().create("cpu", device_config{2, 0});
  EXPECT_TRUE(d.ok());
  e.dev = std::move(d.value());
  auto f = gguf_file::open(model_path());
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().to_string());
  auto m = model::load(std::move(f.value()), *e.dev);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
  e.m = std::move(m.value());
  kv_cache_config kc;
  kc.layout = e.m->kv_layout_for(16);
  kc.n_blocks = 256;
  auto kv = kv_cache::create(*e.dev, kc);
  EXPECT_TRUE(kv.ok());
  e.kv = std::move(kv.value());
  return e;
}

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// The oracle checks llama.cpp's x86 numerics, which the ggml matmul kernel reproduces bit for bit:
// pinned here, before any device reads it, unless WEFT_CPU_MATMUL asks for another kernel (to
// measure its drift from llama.cpp: docs/engine.md "AMX matmuls").
[[maybe_unused]] const bool ggml_kernel_pinned = [] {
  return ::setenv("WEFT_CPU_MATMUL", "ggml", 0) == 0;
}();

TEST(engine_oracle, greedy_continuations_match_llama_cpp) {
  const auto& r = reference();
  WEFT_REQUIRE_REFERENCE(r);
  auto e = make_engine();
  int n_identical = 0;
  for (const auto& item : r.ref["results"]) {
    const auto prompt = item["prompt_tokens"].get<std::vector<int32_t>>();
    const auto expect = item["greedy"].get<std::vector<int32_t>>();
    const seq_id s = e.kv->create_sequence();
    forward_batch b;
    forward_output out;
    b.add(s, prompt, true);
    std::vector<int32_t> got;
    for (size_t i = 0; i < expect.size(); ++i) {
      ASSERT_TRUE(e.m->forward(b, *e.kv, out).ok());
      const int32_t t = argmax(out.logits.data(), out.n_vocab);
      got.push_back(t);
      b.clear();
      b.add(s, std::span<const int32_t>(&t, 1), true);
    }
    ASSERT_TRUE(e.kv->free_sequence(s).ok());
    size_t first_diff = 0;
    while (first_diff < got.size() && got[first_diff] == expect[first_diff]) ++first_diff;
    EXPECT_EQ(got, expect) << "prompt: " << item["prompt"].get<std::string>()
                           << " — first difference at token " << first_diff;
    n_identical += got == expect ? 1 : 0;
  }
  // The reduction orders weft reproduces depend on the host (docs/engine.md); say which ones ran.
  std::cout << "[oracle] ggml SIMD layout: " << cpu::ggml_simd_name(cpu::ggml_simd_layout())
            << "\n";
  std::cout << "[oracle] identical greedy continuations: " << n_identical << "/"
            << r.ref["results"].size() << "\n";
  EXPECT_TRUE(e.kv->check_invariants().ok());
}

// All prompts at once through the continuous-batching engine (chunked prefill, mixed batches):
// every continuation must still equal llama.cpp's single-sequence greedy output.
TEST(engine_oracle, batched_engine_matches_llama_cpp) {
  const auto& r = reference();
  WEFT_REQUIRE_REFERENCE(r);
  auto e = make_engine();
  engine_config ec;
  ec.kv_blocks = 256;
  ec.max_batch_tokens = 96;
  ec.max_running = 8;
  auto eng = engine::create(*e.m, ec);
  ASSERT_TRUE(eng.ok());
  std::map<request_id, std::vector<int32_t>> got;
  request_id id = 0;
  for (const auto& item : r.ref["results"]) {
    sampling_params sp;
    sp.max_tokens = static_cast<int32_t>(item["greedy"].size());
    ASSERT_TRUE(
        (*eng)->add_request(id++, item["prompt_tokens"].get<std::vector<int32_t>>(), sp).ok());
  }
  while ((*eng)->has_work()) {
    auto outs = (*eng)->step();
    ASSERT_TRUE(outs.ok());
    for (const auto& o : *outs)
      got[o.id].insert(got[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
  }
  id = 0;
  int n_identical = 0;
  for (const auto& item : r.ref["results"]) {
    const auto expect = item["greedy"].get<std::vector<int32_t>>();
    EXPECT_EQ(got[id], expect) << "prompt: " << item["prompt"].get<std::string>();
    n_identical += got[id] == expect ? 1 : 0;
    ++id;
  }
  std::cout << "[oracle] batched engine, identical greedy continuations: " << n_identical << "/"
            << r.ref["results"].size() << "\n";
  EXPECT_EQ((*eng)->kv().stats().n_blocks_used, 0);
}

TEST(engine_oracle, teacher_forced_top1_agreement) {
  const auto& r = reference();
  WEFT_REQUIRE_REFERENCE(r);
  auto e = make_engine();
  int64_t total = 0;
  int64_t agree = 0;
  double worst_margin = 0.0;
  for (const auto& item : r.ref["results"]) {
    auto seq = item["prompt_tokens"].get<std::vector<int32_t>>();
    const auto gen = item["greedy"].get<std::vector<int32_t>>();
    seq.insert(seq.end(), gen.begin(), gen.end());
    const auto ref_top = item["tf_argmax"].get<std::vector<int32_t>>();
    const auto margin = item["tf_margin"].get<std::vector<double>>();
    const seq_id s = e.kv->create_sequence();
    forward_batch b;
    for (size_t i = 0; i < seq.size(); ++i) {
      b.tokens.push_back(seq[i]);
      b.seq_index.push_back(0);
      b.want_logits.push_back(1);
    }
    b.seqs.push_back(s);
    forward_output out;
    ASSERT_TRUE(e.m->forward(b, *e.kv, out).ok());
    for (size_t i = 0; i < seq.size(); ++i) {
      const int32_t t = argmax(out.logits.data() + i * out.n_vocab, out.n_vocab);
      ++total;
      if (t == ref_top[i]) {
        ++agree;
      } else {
        worst_margin = std::max(worst_margin, margin[i]);
        EXPECT_LT(margin[i], 0.05) << "disagreement at a non-tie, position " << i << " of '"
                                   << item["prompt"].get<std::string>() << "'";
      }
    }
    ASSERT_TRUE(e.kv->free_sequence(s).ok());
  }
  const double rate = static_cast<double>(agree) / static_cast<double>(total);
  std::cout << "[oracle] teacher-forced top-1 agreement: " << agree << "/" << total << " = " << rate
            << ", largest llama.cpp top-2 gap at a disagreement: " << worst_margin << "\n";
  EXPECT_GE(rate, 0.995);
}

}  // namespace
