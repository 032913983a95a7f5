// Request migration at the engine level: a request resumed on a fresh engine from its prompt plus
// the tokens generated so far (engine::add_resumed_request) must continue with exactly the tokens
// and log-probs of an undisturbed run, greedy or seeded, alone or inside a batch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"
#include "tests/unit/gpu/tiny_engine_support.hpp"

namespace {

using namespace weft::gpu;
using weft::gpu::engine_test::load_tiny_model;
using weft::gpu::engine_test::loaded;
using weft::gpu::engine_test::prompt_of;

#ifdef WEFT_RESUME_REAL_MODEL
// The oracle-tier build of this test runs on the real default model (SmolLM2-135M, head_dim 64),
// where prefill and decode attention round differently.
std::string real_model_path() {
  if (const char* m = std::getenv("WEFT_MODEL"); m != nullptr && *m != '\0') return m;
  const char* home = std::getenv("HOME");
  return std::string{home != nullptr ? home : "."} +
         "/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}
#endif

// The real-model build (oracle tier) skips when the default model is not fetched; the tiny model
// of the unit build is generated in memory and must always load.
#ifdef WEFT_RESUME_REAL_MODEL
#define REQUIRE_MODEL(l) \
  if (!(l).m) GTEST_SKIP() << "default model not fetched (scripts/fetch_model.sh)"
#else
#define REQUIRE_MODEL(l) ASSERT_TRUE((l).m) << "tiny model did not load"
#endif

loaded load_tiny() {
#ifdef WEFT_RESUME_REAL_MODEL
  loaded r;
  auto rf = gguf_file::open(real_model_path());
  if (!rf.ok()) return r;
  r.dev = std::move(device_registry::instance().create("cpu", device_config{2, 0}).value());
  auto rm = model::load(std::move(rf.value()), *r.dev);
  EXPECT_TRUE(rm.ok());
  if (rm.ok()) r.m = std::move(rm.value());
  return r;
#endif
  tiny_model_config c;
  c.weight_type = ggml_type::q4_1;
  c.embedding_type = ggml_type::q8_0;
  c.output = output_weight::separate;  // tied random heads repeat tokens and would hide mistakes
  // head_dim 64 (like SmolLM2): prefill (GEMM) and decode (GEMV) attention then sum in different
  // orders, so replaying generated tokens with the wrong numerics shows in the log-probs.
  c.n_embd = 256;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 256;
  return load_tiny_model(c);
}

struct token_trace {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // chosen + top alternatives, bit for bit
};

/// Runs every request to completion on one engine; returns each request's trace (and, in
/// `cached`, the cached prompt tokens of each request's first output).
std::map<request_id, token_trace> drain(engine& e,
                                        std::map<request_id, int64_t>* cached = nullptr) {
  std::map<request_id, token_trace> out;
  while (e.has_work()) {
    auto outs = e.step();
    EXPECT_TRUE(outs.ok());
    if (!outs.ok()) break;
    for (const auto& o : *outs) {
      EXPECT_NE(o.finish, finish_reason::error) << o.error;
      if (cached != nullptr) cached->emplace(o.id, o.cached_prompt_tokens);
      auto& t = out[o.id];
      for (size_t i = 0; i < o.new_tokens.size(); ++i) {
        t.tokens.push_back(o.new_tokens[i]);
        t.logprobs.push_back(o.samples[i].logprob);
        for (const auto& a : o.samples[i].top) t.logprobs.push_back(a.logprob);
      }
    }
  }
  return out;
}

/// Copies the KV of the first head.size() tokens of `snap` into fresh blocks (as a pool fetch
/// does: prepare_import, bytes, commit) and frees `snap`; returns the new sequence (0 on failure).
seq_id copy_kv_head(kv_cache& kv, seq_id snap, std::span<const int32_t> head) {
  auto src = kv.export_ranges(snap);
  auto dst = kv.prepare_import(kv.layout(), head);
  EXPECT_TRUE(src.ok() && dst.ok());
  if (!src.ok() || !dst.ok()) return 0;
  for (size_t i = 0; i < dst->second.size(); ++i)
    std::memcpy(dst->second[i].data, (*src)[i].data, dst->second[i].size_bytes);
  EXPECT_TRUE(kv.commit(dst->first, head).ok());
  EXPECT_TRUE(kv.free_sequence(snap).ok());
  return dst->first;
}

sampling_params params_for(bool sampled, int max_tokens, uint64_t seed) {
  sampling_params sp;
  sp.max_tokens = max_tokens;
  sp.n_logprobs = 2;
  if (sampled) {
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.seed = seed;
  }
  return sp;
}

class EngineResume : public ::testing::TestWithParam<bool> {};

TEST_P(EngineResume, ContinuesExactlyLikeAnUndisturbedRun) {
  const bool sampled = GetParam();
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  engine_config ec;
  ec.kv_blocks = 256;
  ec.block_size = 8;
  const int total = 24;
  const std::vector<int> prompt_lengths = {1, 2, 9, 17, 30};
  // Reference: each request alone, undisturbed.
  std::vector<token_trace> ref;
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->add_request(1, prompt_of(prompt_lengths[i], 7 + i),
                                  params_for(sampled, total, 40 + i))
                    .ok());
    ref.push_back(drain(**e)[1]);
    ASSERT_EQ(ref.back().tokens.size(), static_cast<size_t>(total));
  }
  // Resume each after k generated tokens, all in one batch on a fresh engine ("the new worker"),
  // next to an unrelated request: with the default budget, and with small passes (16 tokens) whose
  // rebuild passes may take 128 (engine_config::rebuild_batch_tokens, as a serving worker sets it).
  // Expedited (as a serving worker does for migrated requests) or not, the tokens are the same.
  for (int k : {1, 5, 23})
    for (const bool small_passes : {false, true})
      for (const bool expedite : {false, true}) {
        if (expedite && !small_passes) continue;
        engine_config rc = ec;
        if (small_passes) {
          rc.max_batch_tokens = 16;
          rc.rebuild_batch_tokens = 128;
        }
        auto e = engine::create(*l.m, rc);
        ASSERT_TRUE(e.ok());
        ASSERT_TRUE((*e)->add_request(99, prompt_of(12, 999), params_for(sampled, 10, 5)).ok());
        for (size_t i = 0; i < prompt_lengths.size(); ++i) {
          auto tokens = prompt_of(prompt_lengths[i], 7 + i);
          tokens.insert(tokens.end(), ref[i].tokens.begin(), ref[i].tokens.begin() + k);
          ASSERT_TRUE((*e)->add_resumed_request(static_cast<request_id>(i + 1), tokens, k,
                                                params_for(sampled, total - k, 40 + i))
                          .ok());
          if (expedite) {
            ASSERT_TRUE((*e)->expedite(static_cast<request_id>(i + 1)).ok());
          }
        }
        auto got = drain(**e);
        for (size_t i = 0; i < prompt_lengths.size(); ++i) {
          const auto& g = got[static_cast<request_id>(i + 1)];
          const std::vector<int32_t> want(ref[i].tokens.begin() + k, ref[i].tokens.end());
          EXPECT_EQ(g.tokens, want) << "prompt " << prompt_lengths[i] << ", resumed after " << k;
          const size_t per_token = ref[i].logprobs.size() / ref[i].tokens.size();
          const std::vector<float> want_lp(
              ref[i].logprobs.begin() + static_cast<std::ptrdiff_t>(k * per_token),
              ref[i].logprobs.end());
          EXPECT_EQ(g.logprobs, want_lp)
              << "prompt " << prompt_lengths[i] << ", resumed after " << k;
        }
        EXPECT_EQ((*e)->stats().kv.n_blocks_used, 0);
      }
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSeeded, EngineResume, ::testing::Values(false, true));

// The text of a resumed request continues the text its first engine streamed: what that engine
// held back from its deltas (an incomplete UTF-8 character, the start of a stop string) comes in
// the resumed engine's first delta, so the two streams concatenate to the undisturbed run's text
// whichever token the request moves after. Tokens detokenize to pieces of multi-byte characters
// here so that most split points fall inside one.
TEST(EngineResumeText, DeltasConcatenateToTheUndisturbedTextAtEverySplit) {
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  engine_config ec;
  ec.kv_blocks = 128;
  ec.block_size = 8;
  ec.detokenize = [](int32_t t) -> std::string {
    switch (t % 4) {
      case 0:
        return "\xE2\x82";  // the first two bytes of a euro sign
      case 1:
        return "\xAC";  // its last byte
      case 2:
        return "a\xF0\x9F";  // half of a 4-byte emoji
      default:
        return "\x98\x80"
               "b";
    }
  };
  const int total = 24;
  auto params = [&](int max_tokens) {
    sampling_params sp = params_for(true, max_tokens, 11);
    sp.stop_strings = {"b\xE2\x82\xACZ"};  // never completed: only its prefixes are held back
    return sp;
  };
  const auto prompt = prompt_of(9, 3);
  // The undisturbed run, one token per step: what it had streamed after each token.
  auto ref = engine::create(*l.m, ec);
  ASSERT_TRUE(ref.ok());
  ASSERT_TRUE((*ref)->add_request(1, prompt, params(total)).ok());
  std::vector<int32_t> tokens = prompt;
  std::vector<std::string> streamed;  // streamed[k]: the text streamed with the first k+1 tokens
  std::string want;
  while ((*ref)->has_work()) {
    auto outs = (*ref)->step();
    ASSERT_TRUE(outs.ok());
    for (const auto& o : *outs) {
      ASSERT_LE(o.new_tokens.size(), 1u);
      want += o.text_delta;
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (!o.new_tokens.empty()) streamed.push_back(want);
    }
  }
  ASSERT_EQ(streamed.size(), static_cast<size_t>(total));
  int held = 0;
  for (int k = 1; k < total; ++k) {
    std::string all;  // the k tokens' whole text
    for (int i = 0; i < k; ++i)
      all += ec.detokenize(tokens[prompt.size() + static_cast<size_t>(i)]);
    const std::string& before = streamed[static_cast<size_t>(k - 1)];
    if (before.size() < all.size()) ++held;
    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    std::vector<int32_t> resumed(tokens.begin(),
                                 tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()) + k);
    ASSERT_TRUE((*e)->add_resumed_request(1, resumed, k, params(total - k)).ok());
    std::string rest;
    while ((*e)->has_work()) {
      auto outs = (*e)->step();
      ASSERT_TRUE(outs.ok());
      for (const auto& o : *outs) rest += o.text_delta;
    }
    EXPECT_EQ(before + rest, want) << "moved after " << k << " tokens";
  }
  EXPECT_GT(held, 5) << "too few splits fell inside a character: the test would show nothing";
}

/// Steps `e` until request `id` has a token; returns, per request, the tokens produced meanwhile
/// (the step that gave `id` its token included), and how many steps it took.
std::pair<std::map<request_id, int>, int> until_first_token(engine& e, request_id id) {
  std::map<request_id, int> produced;
  for (int steps = 1; e.has_work() && steps < 1000; ++steps) {
    auto outs = e.step();
    EXPECT_TRUE(outs.ok());
    if (!outs.ok()) break;
    for (const auto& o : *outs) {
      EXPECT_NE(o.finish, finish_reason::error) << o.error;
      produced[o.id] += static_cast<int>(o.new_tokens.size());
    }
    if (produced[id] > 0) return {produced, steps};
  }
  ADD_FAILURE() << "request " << id << " never produced a token";
  return {produced, -1};
}

// A migrated request (a serving worker calls expedite() for it) goes ahead of the requests queued
// before it and runs on top of max_running, without pausing the ones running; without expedite()
// it waits for a slot behind the queue (the control, so the check can fail).
TEST(EngineExpedite, GoesAheadOfTheQueueAndBeyondMaxRunning) {
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  engine_config ec;
  ec.kv_blocks = 256;
  ec.block_size = 8;
  ec.max_running = 2;
  ec.max_batch_tokens = 16;
  ec.rebuild_batch_tokens = 64;
  for (const bool expedite : {true, false}) {
    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    // Two running requests fill max_running; two more queue behind them.
    for (request_id id : {1, 2, 3, 4})
      ASSERT_TRUE((*e)->add_request(id, prompt_of(12, 100 + static_cast<uint32_t>(id)),
                                    params_for(false, 40, 0))
                      .ok());
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*e)->step().ok());  // 1 and 2 are decoding
    auto migrated = prompt_of(12, 105);
    migrated.insert(migrated.end(), {7, 8, 9});
    ASSERT_TRUE((*e)->add_resumed_request(5, migrated, 3, params_for(false, 10, 0)).ok());
    if (expedite) {
      ASSERT_TRUE((*e)->expedite(5).ok());
    }
    auto [produced, steps] = until_first_token(**e, 5);
    if (expedite) {
      EXPECT_LE(steps, 2) << "prompt (12 tokens) then replay (3): two rebuild passes";
      EXPECT_EQ(produced[3] + produced[4], 0) << "the queued requests wait behind it";
      EXPECT_EQ(produced[1], steps) << "the running requests were not paused";
      EXPECT_EQ(produced[2], steps);
    } else {
      EXPECT_GT(steps, 30) << "without expedite() it waits for one of the 40-token requests";
    }
    while ((*e)->has_work()) ASSERT_TRUE((*e)->step().ok());
    EXPECT_EQ((*e)->stats().kv.n_blocks_used, 0);
  }
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->expedite(42).code(), status_code::not_found);
}

TEST(EngineResumeArgs, RejectsReplayWithoutPrompt) {
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  auto e = engine::create(*l.m, engine_config{});
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE((*e)->add_resumed_request(1, {5, 6}, 2, sampling_params{}).ok());
  EXPECT_FALSE((*e)->add_resumed_request(1, {5, 6}, -1, sampling_params{}).ok());
}

// Disaggregation inside one engine: a request detached after its first token (KV kept, owned by the
// caller) and added back as an imported request continues exactly like an undisturbed run, next to
// an unrelated request. (Moving the KV between caches is tested bit for bit in kv_transfer_test.)
TEST_P(EngineResume, DetachedAndImportedContinuesExactly) {
  const bool sampled = GetParam();
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  engine_config ec;
  ec.kv_blocks = 256;
  ec.block_size = 8;
  const int total = 20;
  for (int n_prompt : {3, 17}) {
    const auto prompt = prompt_of(n_prompt, 70 + n_prompt);
    auto ref_engine = engine::create(*l.m, ec);
    ASSERT_TRUE(ref_engine.ok());
    ASSERT_TRUE((*ref_engine)->add_request(1, prompt, params_for(sampled, total, 9)).ok());
    const auto ref = drain(**ref_engine)[1];
    ASSERT_EQ(ref.tokens.size(), static_cast<size_t>(total));

    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->add_request(1, prompt, params_for(sampled, total, 9)).ok());
    token_trace first;
    while (first.tokens.empty()) {
      auto outs = (*e)->step();
      ASSERT_TRUE(outs.ok());
      for (const auto& o : *outs) {
        if (o.id != 1) continue;
        for (size_t i = 0; i < o.new_tokens.size(); ++i) {
          first.tokens.push_back(o.new_tokens[i]);
          first.logprobs.push_back(o.samples[i].logprob);
          for (const auto& a : o.samples[i].top) first.logprobs.push_back(a.logprob);
        }
      }
    }
    auto d = (*e)->detach(1);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    EXPECT_EQ(d->n_generated, 1);
    EXPECT_EQ(d->tokens.size(), prompt.size() + 1);
    EXPECT_EQ((*e)->kv().length(d->seq), static_cast<int64_t>(prompt.size()));
    EXPECT_FALSE((*e)->has_work());
    EXPECT_FALSE((*e)->abort(1).ok()) << "a detached request is gone from the engine";
    ASSERT_TRUE((*e)->add_request(99, prompt_of(12, 999), params_for(sampled, 10, 5)).ok());
    ASSERT_TRUE(
        (*e)->add_imported_request(2, d->seq, d->tokens, 1, params_for(sampled, total - 1, 9))
            .ok());
    auto rest = drain(**e)[2];
    first.tokens.insert(first.tokens.end(), rest.tokens.begin(), rest.tokens.end());
    first.logprobs.insert(first.logprobs.end(), rest.logprobs.begin(), rest.logprobs.end());
    EXPECT_EQ(first.tokens, ref.tokens) << "prompt " << n_prompt;
    EXPECT_EQ(first.logprobs, ref.logprobs) << "prompt " << n_prompt;
    EXPECT_EQ((*e)->stats().kv.n_blocks_used, 0);
  }
}

TEST(EngineResumeArgs, DetachAndImportRefuseWhatTheyCannotTake) {
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  auto e = engine::create(*l.m, engine_config{});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->detach(7).error().code(), status_code::not_found);
  ASSERT_TRUE((*e)->add_request(1, prompt_of(5, 1), sampling_params{}).ok());
  EXPECT_EQ((*e)->detach(1).error().code(), status_code::invalid_argument)
      << "waiting, not decoding";
  // An import whose cache length does not match its tokens is refused and its sequence freed.
  auto& kv = (*e)->kv();
  const seq_id s = kv.create_sequence();
  EXPECT_FALSE((*e)->add_imported_request(2, s, {5, 6, 7}, 1, sampling_params{}).ok());
  EXPECT_EQ(kv.stats().n_sequences, 0);
  const seq_id s2 = kv.create_sequence();
  EXPECT_FALSE((*e)->add_imported_request(1, s2, {5, 6}, 1, sampling_params{}).ok())
      << "duplicate id";
  EXPECT_EQ(kv.stats().n_sequences, 0);
}

// Prefix-cache pool path inside one engine: a request's prompt KV snapshot (fork_kv) copied byte
// for byte into fresh blocks (prepare_import, as a pool fetch does) and queued with
// add_prefilled_request gives the tokens and log-probs of a cold run, with the copied tokens
// counted as cached. match_prefix sees the cached blocks without attaching them.
TEST_P(EngineResume, PrefilledFromCopiedKvEqualsColdRun) {
  const bool sampled = GetParam();
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  engine_config ec;
  ec.kv_blocks = 256;
  ec.block_size = 8;
  const auto prompt = prompt_of(29, 5);
  auto cold_engine = engine::create(*l.m, ec);
  ASSERT_TRUE(cold_engine.ok());
  ASSERT_TRUE((*cold_engine)->add_request(1, prompt, params_for(sampled, 12, 3)).ok());
  const auto cold = drain(**cold_engine)[1];

  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  auto& kv = (*e)->kv();
  ASSERT_TRUE((*e)->add_request(1, prompt, params_for(sampled, 12, 3)).ok());
  bool first = false;
  while (!first) {
    auto outs = (*e)->step();
    ASSERT_TRUE(outs.ok());
    for (const auto& o : *outs) first = first || (o.id == 1 && !o.new_tokens.empty());
  }
  auto snap = (*e)->fork_kv(1);
  ASSERT_TRUE(snap.ok()) << snap.error().to_string();
  EXPECT_FALSE((*e)->fork_kv(42).ok());
  ASSERT_EQ(kv.length(*snap), static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(kv.match_prefix(prompt), 24) << "three full blocks of 8, one token left to compute";
  const int64_t n = 16;  // two blocks "from the pool"
  const seq_id copy = copy_kv_head(kv, *snap, std::span<const int32_t>(prompt).first(n));
  ASSERT_NE(copy, 0);
  ASSERT_TRUE((*e)->abort(1).ok());
  ASSERT_TRUE((*e)->add_prefilled_request(2, copy, prompt, params_for(sampled, 12, 3)).ok());
  std::map<request_id, int64_t> cached;
  const auto got = drain(**e, &cached)[2];
  EXPECT_EQ(cached[2], n);
  EXPECT_EQ(got.tokens, cold.tokens);
  EXPECT_EQ(got.logprobs, cold.logprobs);
  EXPECT_EQ(kv.stats().n_blocks_used, 0);
  // Refusals free the sequence they were given.
  const seq_id bad = kv.create_sequence();
  EXPECT_FALSE((*e)->add_prefilled_request(3, bad, prompt, sampling_params{}).ok())
      << "no cached tokens";
  EXPECT_EQ(kv.stats().n_sequences, 0);
}

// A migrated request whose dead worker had published its KV to the pool (prompt and generated
// tokens, PoolCheckpoint): the survivor copies the leading blocks and queues the request with
// add_prefilled_request(..., n_replay). Whether the copy ends inside the prompt or past it, the
// continuation has exactly the tokens and log-probs of the undisturbed run; the cached prompt
// tokens never count generated ones; a copy that would leave one prompt token is refused.
TEST_P(EngineResume, ResumedFromCopiedKvOfGeneratedTokensEqualsUndisturbedRun) {
  const bool sampled = GetParam();
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  engine_config ec;
  ec.kv_blocks = 256;
  ec.block_size = 8;
  const int total = 24, k = 15;
  const auto prompt = prompt_of(29, 11);
  auto ref_engine = engine::create(*l.m, ec);
  ASSERT_TRUE(ref_engine.ok());
  ASSERT_TRUE((*ref_engine)->add_request(1, prompt, params_for(sampled, total, 5)).ok());
  const auto ref = drain(**ref_engine)[1];
  ASSERT_EQ(ref.tokens.size(), static_cast<size_t>(total));
  const size_t per_token = ref.logprobs.size() / ref.tokens.size();

  for (const int64_t n : {16, 32, 40}) {  // inside the prompt; the prompt and 3, then 11 generated
    SCOPED_TRACE("copied tokens " + std::to_string(n));
    auto e = engine::create(*l.m, ec);
    ASSERT_TRUE(e.ok());
    auto& kv = (*e)->kv();
    ASSERT_TRUE((*e)->add_request(1, prompt, params_for(sampled, total, 5)).ok());
    std::vector<int32_t> generated;
    while (generated.size() < static_cast<size_t>(k)) {
      auto outs = (*e)->step();
      ASSERT_TRUE(outs.ok());
      for (const auto& o : *outs)
        generated.insert(generated.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
    ASSERT_EQ(generated.size(), static_cast<size_t>(k));
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), generated.begin(), generated.end());
    auto snap = (*e)->fork_kv(1);
    ASSERT_TRUE(snap.ok());
    ASSERT_EQ(kv.length(*snap), static_cast<int64_t>(tokens.size()) - 1);
    const seq_id copy =
        copy_kv_head(kv, *snap, std::span<const int32_t>(tokens).first(static_cast<size_t>(n)));
    ASSERT_NE(copy, 0);
    ASSERT_TRUE((*e)->abort(1).ok());
    ASSERT_TRUE(
        (*e)->add_prefilled_request(2, copy, tokens, params_for(sampled, total - k, 5), k).ok());
    ASSERT_TRUE((*e)->expedite(2).ok());
    std::map<request_id, int64_t> cached;
    const auto got = drain(**e, &cached)[2];
    EXPECT_EQ(cached[2], std::min<int64_t>(n, static_cast<int64_t>(prompt.size())));
    EXPECT_EQ(got.tokens, std::vector<int32_t>(ref.tokens.begin() + k, ref.tokens.end()));
    EXPECT_EQ(got.logprobs,
              std::vector<float>(ref.logprobs.begin() + static_cast<std::ptrdiff_t>(k * per_token),
                                 ref.logprobs.end()));
    EXPECT_EQ(kv.stats().n_blocks_used, 0);
  }

  // 32 of a 33-token prompt would leave one prompt token (decode numerics): refused, and the
  // sequence it was given is freed.
  auto e = engine::create(*l.m, ec);
  ASSERT_TRUE(e.ok());
  auto& kv = (*e)->kv();
  auto tokens = prompt_of(33, 3);
  tokens.insert(tokens.end(), {5, 6, 7});
  auto dst = kv.prepare_import(kv.layout(), std::span<const int32_t>(tokens).first(32));
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE(kv.commit(dst->first, std::span<const int32_t>(tokens).first(32)).ok());
  EXPECT_FALSE((*e)->add_prefilled_request(3, dst->first, tokens, params_for(false, 4, 1), 3).ok());
  EXPECT_EQ(kv.stats().n_sequences, 0);
}

}  // namespace

namespace {

// engine_config::prefix_into_replay (an RL rollout engine): a request resumed on the engine that
// generated its tokens takes the cached blocks of those tokens (their KV was computed with decode
// numerics, as the replay would) and continues exactly like a cold resume on a fresh engine;
// without the option the replayed tokens are recomputed.
TEST_P(EngineResume, ReplayedTokensFromThePrefixCacheEqualAColdResume) {
  const bool sampled = GetParam();
  auto l = load_tiny();
  REQUIRE_MODEL(l);
  engine_config ec;
  ec.kv_blocks = 256;
  ec.block_size = 8;
  const int first = 21, more = 12;
  const auto prompt = prompt_of(17, 3);
  for (const bool into_replay : {true, false}) {
    engine_config rc = ec;
    rc.prefix_into_replay = into_replay;
    auto e = engine::create(*l.m, rc);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->add_request(1, prompt, params_for(sampled, first, 77)).ok());
    const auto turn = drain(**e)[1];
    ASSERT_EQ(turn.tokens.size(), static_cast<size_t>(first));
    // The next turn: the prompt, the generated tokens and two more (a tool's result), all replayed.
    auto tokens = prompt;
    tokens.insert(tokens.end(), turn.tokens.begin(), turn.tokens.end());
    tokens.push_back(5);
    tokens.push_back(6);
    const int64_t replay = first + 2;
    ASSERT_TRUE((*e)->add_resumed_request(2, tokens, replay, params_for(sampled, more, 91)).ok());
    std::map<request_id, int64_t> cached;
    const auto warm = drain(**e, &cached)[2];
    auto cold_engine = engine::create(*l.m, ec);
    ASSERT_TRUE(cold_engine.ok());
    ASSERT_TRUE(
        (*cold_engine)->add_resumed_request(2, tokens, replay, params_for(sampled, more, 91)).ok());
    const auto cold = drain(**cold_engine)[2];
    EXPECT_EQ(warm.tokens, cold.tokens) << "prefix_into_replay " << into_replay;
    EXPECT_EQ(warm.logprobs, cold.logprobs) << "prefix_into_replay " << into_replay;
    const int64_t n_true = static_cast<int64_t>(prompt.size());
    if (into_replay) {
      EXPECT_GT(cached[2], n_true) << "blocks of generated tokens come from the cache";
      EXPECT_EQ(cached[2] % 8, 0);
    } else {
      EXPECT_LE(cached[2], n_true - 1);
    }
  }
}

}  // namespace
