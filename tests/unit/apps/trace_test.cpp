#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "apps/loadgen/trace.hpp"
#include "apps/loadgen/workload.hpp"

namespace lg = weft::apps::loadgen;

namespace {

std::string traces_dir() {
  return std::string{WEFT_SHARED_DIR} + "/traces/";
}

// A temporary file with `text`, removed at scope exit.
struct temp_file {
  explicit temp_file(const std::string& name, const std::string& text)
      : path{(std::filesystem::temp_directory_path() /
              ("weft_loadgen_" + std::to_string(::getpid()) + "_" + name))
                 .string()} {
    std::ofstream{path} << text;
  }
  ~temp_file() { std::remove(path.c_str()); }
  std::string path;
};

}  // namespace

TEST(trace, azure_timestamp_parsing) {
  auto a = lg::parse_azure_timestamp("2023-11-16 18:15:46.6805900");
  ASSERT_TRUE(a) << a.error();
  auto b = lg::parse_azure_timestamp("2023-11-16 18:15:50.9951690");
  ASSERT_TRUE(b);
  EXPECT_NEAR(b.value() - a.value(), 4.314579, 1e-6);
  auto midnight = lg::parse_azure_timestamp("1970-01-02 00:00:00");
  ASSERT_TRUE(midnight);
  EXPECT_DOUBLE_EQ(midnight.value(), 86400.0);
  EXPECT_FALSE(lg::parse_azure_timestamp("2023-13-16 18:15:46"));
  EXPECT_FALSE(lg::parse_azure_timestamp("yesterday"));
  EXPECT_FALSE(lg::parse_azure_timestamp("2023-11-16 18:15:46.12x"));
}

TEST(trace, loads_the_real_azure_traces) {
  auto conv = lg::load_trace(traces_dir() + "azure_llm_2023_conv.csv", lg::trace_format::azure);
  ASSERT_TRUE(conv) << conv.error();
  ASSERT_EQ(conv->entries.size(), 19366u);
  EXPECT_EQ(conv->entries[0].timestamp_s, 0.0);
  EXPECT_EQ(conv->entries[0].input_tokens, 374);
  EXPECT_EQ(conv->entries[0].output_tokens, 44);
  EXPECT_NEAR(conv->entries[1].timestamp_s, 4.314579, 1e-6);
  EXPECT_EQ(conv->entries[1].input_tokens, 396);
  auto code = lg::load_trace(traces_dir() + "azure_llm_2023_code.csv", lg::trace_format::azure);
  ASSERT_TRUE(code) << code.error();
  EXPECT_EQ(code->entries.size(), 8819u);
  EXPECT_EQ(lg::detect_trace_format("x/azure_llm_2023_code.csv").value(), lg::trace_format::azure);
  EXPECT_EQ(lg::detect_trace_format("x/m.jsonl").value(), lg::trace_format::mooncake);
  EXPECT_FALSE(lg::detect_trace_format("x/m.txt"));
}

TEST(trace, loads_the_real_mooncake_traces) {
  auto conv = lg::load_trace(traces_dir() + "mooncake_conversation_trace.jsonl",
                             lg::trace_format::mooncake);
  ASSERT_TRUE(conv) << conv.error();
  ASSERT_EQ(conv->entries.size(), 12031u);
  const auto& e = conv->entries[0];
  EXPECT_EQ(e.input_tokens, 6758);
  EXPECT_EQ(e.output_tokens, 500);
  ASSERT_EQ(e.hash_ids.size(), 14u);
  EXPECT_EQ(e.hash_ids[13], 13);
  auto syn =
      lg::load_trace(traces_dir() + "mooncake_synthetic_trace.jsonl", lg::trace_format::mooncake);
  ASSERT_TRUE(syn) << syn.error();
  EXPECT_EQ(syn->entries.size(), 3993u);
}

TEST(trace, malformed_files_are_clear_errors) {
  temp_file bad_csv{"bad.csv",
                    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 "
                    "18:15:46.68,12,3\n2023-11-16 18:15:47,abc,3\n"};
  auto a = lg::load_trace(bad_csv.path, lg::trace_format::azure);
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().find(":3:"), std::string::npos) << a.error();
  temp_file bad_jsonl{"bad.jsonl",
                      "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": "
                      "[1]}\n{\"timestamp\": 1,\n"};
  auto m = lg::load_trace(bad_jsonl.path, lg::trace_format::mooncake);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().find(":2:"), std::string::npos) << m.error();
  temp_file missing_field{"missing.jsonl", "{\"timestamp\": 0, \"input_length\": 5}\n"};
  EXPECT_FALSE(lg::load_trace(missing_field.path, lg::trace_format::mooncake));
  temp_file empty{"empty.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"};
  EXPECT_FALSE(lg::load_trace(empty.path, lg::trace_format::azure));
  EXPECT_FALSE(lg::load_trace("/nonexistent/trace.csv", lg::trace_format::azure));
}

TEST(trace, azure_scaling_to_context_and_rate) {
  auto t = lg::load_trace(traces_dir() + "azure_llm_2023_conv.csv", lg::trace_format::azure);
  ASSERT_TRUE(t);
  lg::trace_scaling_config c;
  c.count = 500;
  c.target_rate_rps = 2.0;
  c.max_prompt_tokens = 1024;
  c.max_output_tokens = 128;
  auto s = lg::scale_trace(t.value(), c);
  ASSERT_TRUE(s) << s.error();
  ASSERT_EQ(s->requests.size(), 500u);
  const auto& reqs = s->requests;
  EXPECT_NEAR(static_cast<double>(reqs.size() - 1) / reqs.back().send_time_s, 2.0, 1e-9);
  EXPECT_NEAR(s->scaling.scaled_rate_rps, 2.0, 1e-9);
  EXPECT_LT(s->scaling.prompt_scale, 1.0);
  int64_t max_in = 0, max_out = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    max_in = std::max(max_in, reqs[i].prompt_tokens);
    max_out = std::max(max_out, reqs[i].output_tokens);
    EXPECT_GE(reqs[i].prompt_tokens, 1);
    EXPECT_GE(reqs[i].output_tokens, 1);
    // Linear scaling (percentile 100): ratios are kept, up to rounding.
    EXPECT_NEAR(
        static_cast<double>(reqs[i].prompt_tokens),
        std::max(1.0, static_cast<double>(t->entries[i].input_tokens) * s->scaling.prompt_scale),
        0.51);
  }
  EXPECT_EQ(max_in, 1024);
  EXPECT_LE(max_out, 128);
  EXPECT_EQ(s->scaling.n_prompt_clipped, 0u);

  // A lower percentile maps onto the maximum and clips the rest.
  c.scale_percentile = 50;
  auto p = lg::scale_trace(t.value(), c);
  ASSERT_TRUE(p);
  EXPECT_GT(p->scaling.prompt_scale, s->scaling.prompt_scale);
  EXPECT_GT(p->scaling.n_prompt_clipped, 100u);

  lg::trace_scaling_config ts;
  ts.count = 10;
  ts.time_scale = 0.5;
  auto h = lg::scale_trace(t.value(), ts);
  ASSERT_TRUE(h);
  EXPECT_NEAR(h->requests[1].send_time_s, 4.314579 * 0.5, 1e-6);
  EXPECT_DOUBLE_EQ(h->scaling.prompt_scale, 1.0);
  ts.offset = 1000000;
  EXPECT_FALSE(lg::scale_trace(t.value(), ts));
}

TEST(trace, mooncake_equal_hash_ids_give_equal_prompt_blocks) {
  auto t = lg::load_trace(traces_dir() + "mooncake_conversation_trace.jsonl",
                          lg::trace_format::mooncake);
  ASSERT_TRUE(t);
  lg::workload_config w;
  w.source_trace = &t.value();
  w.num_requests = 300;
  w.seed = 5;
  w.scaling.max_prompt_tokens = 2048;
  w.scaling.max_output_tokens = 256;
  w.scaling.time_scale = 0.01;
  auto built = lg::build_workload(w, 0.0);
  ASSERT_TRUE(built) << built.error();
  const auto& d = built->description["scaling"];
  const int64_t block = d["block_tokens"].get<int64_t>();
  EXPECT_EQ(block, std::llround(512 * d["prompt_scale"].get<double>()));
  EXPECT_GE(block, 1);

  // Re-derive which requests share which blocks from the trace, then check the texts agree.
  auto scaled =
      lg::scale_trace(t.value(), lg::trace_scaling_config{0, 300, 0.01, 0, 2048, 256, 100});
  ASSERT_TRUE(scaled);
  std::map<int64_t, std::string> block_text;
  size_t n_shared = 0;
  for (size_t i = 0; i < built->requests.size(); ++i) {
    const auto& spec = built->requests[i];
    const auto& src = scaled->requests[spec.index];
    // Split the prompt into words, then into blocks.
    std::vector<std::string> words;
    for (size_t pos = 0; pos < spec.prompt.size();) {
      const size_t next = spec.prompt.find(' ', pos + 1);
      words.push_back(spec.prompt.substr(pos, next - pos));
      pos = next == std::string::npos ? spec.prompt.size() : next;
    }
    ASSERT_EQ(static_cast<int64_t>(words.size()), spec.prompt_tokens_target);
    for (size_t b = 0; b + 1 < src.hash_ids.size(); ++b) {  // full blocks only
      std::string text;
      for (int64_t k = 0; k < block; ++k) text += words[b * block + k];
      auto [it, inserted] = block_text.emplace(src.hash_ids[b], text);
      if (!inserted) {
        ++n_shared;
        EXPECT_EQ(it->second, text) << "hash id " << src.hash_ids[b];
      }
    }
  }
  EXPECT_GT(n_shared, 50u);  // the conversation trace shares prefixes (hash id 0 at least)
  // Different hash ids give different text.
  EXPECT_NE(block_text.at(0), block_text.at(1));
}

TEST(workload, synthetic_builds_sorted_requests_of_the_target_lengths) {
  lg::workload_config w;
  w.num_requests = 200;
  w.seed = 1;
  w.synthetic.arrival = {lg::arrival_kind::gamma, 5.0, 0.5, 0};
  w.synthetic.prompt = {lg::length_dist::uniform, 0, 10, 40};
  w.synthetic.output = {lg::length_dist::pareto, 50, 2, 400, 1.5, 1.0};
  w.synthetic.shared_prefix_tokens = 16;
  auto built = lg::build_workload(w, 8.0);
  ASSERT_TRUE(built) << built.error();
  ASSERT_EQ(built->requests.size(), 200u);
  const std::string prefix =
      built->requests[0].prompt.substr(0, built->requests[0].prompt.find(' ', 1));
  for (size_t i = 0; i < built->requests.size(); ++i) {
    const auto& r = built->requests[i];
    if (i > 0) {
      EXPECT_GE(r.send_time_s, built->requests[i - 1].send_time_s);
    }
    EXPECT_EQ(std::count(r.prompt.begin(), r.prompt.end(), ' '), r.prompt_tokens_target);
    EXPECT_GE(r.prompt_tokens_target, 26);
    EXPECT_LE(r.prompt_tokens_target, 56);
    EXPECT_GE(r.max_tokens, 2);
    EXPECT_LE(r.max_tokens, 400);
  }
  // The shared prefix: the first 16 words are the same everywhere.
  const auto first16 = [](const std::string& p) {
    size_t pos = 0;
    for (int k = 0; k < 16; ++k) pos = p.find(' ', pos + 1);
    return p.substr(0, pos);
  };
  EXPECT_EQ(first16(built->requests[0].prompt), first16(built->requests[1].prompt));
  EXPECT_NE(built->requests[0].prompt, built->requests[1].prompt);
  EXPECT_EQ(built->description["arrival"]["rate_rps"].get<double>(), 8.0);
  w.synthetic.output.pareto_alpha = 0.9;
  EXPECT_FALSE(lg::build_workload(w, 1.0));
}
