// KV transfer between two paged caches (actors/serve/kv_transfer.hpp) over the in-process engine
// and over UCX (tcp and shm, two engines in this process): bit-identical next-step logits after a
// transfer, refusal of mismatched descriptors, deadlines and lease expiry, corrupted bytes (on the
// wire and in the descriptor), and block accounting back to zero on both sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "actors/serve/kv_transfer.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"
#include "transport/checksum.hpp"
#include "transport/registry.hpp"

namespace {

using namespace weft;
using serve::kv_exporter;
using serve::kv_importer;
using serve::kv_offer;
using serve::kv_transfer_config;

std::vector<int32_t> prompt_of(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % 300);
  return p;
}

struct engine_spec {
  std::string label;
  std::string name;
  std::map<std::string, std::string> params;
};

std::shared_ptr<transport::engine> make_engine(
    const std::string& name, const std::map<std::string, std::string>& params = {}) {
  transport::engine_config cfg;
  cfg.params = params;
  auto e = transport::make_engine(name, cfg);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (!e.ok()) return nullptr;
  return std::shared_ptr<transport::engine>(std::move(*e));
}

kv_transfer_config identity(std::string model = "weft-tiny", uint64_t weights_version = 3) {
  kv_transfer_config c;
  c.model_id = std::move(model);
  c.weights_version = weights_version;
  c.expiry_grace_ms = 100;
  return c;
}

// A tiny model and two caches: "prefill" (a) and "decode" (b). Declared in destruction order:
// exporters and importers go first, then engines, then caches, then the model and device.
struct two_caches {
  std::unique_ptr<gpu::device> dev;
  std::unique_ptr<gpu::model> model;
  std::unique_ptr<gpu::kv_cache> a;
  std::unique_ptr<gpu::kv_cache> b;

  explicit two_caches(int64_t block_size = 4, int64_t blocks_a = 64, int64_t blocks_b = 40) {
    gpu::tiny_model_config c;
    c.output = gpu::output_weight::separate;
    auto img = gpu::make_tiny_model(c);
    EXPECT_TRUE(img.ok());
    auto f = gpu::gguf_file::parse(*img);
    EXPECT_TRUE(f.ok());
    dev =
        std::move(gpu::device_registry::instance().create("cpu", gpu::device_config{1, 0}).value());
    model = std::move(gpu::model::load(std::move(f.value()), *dev).value());
    a = make_cache(block_size, blocks_a);
    b = make_cache(block_size, blocks_b);
  }
  std::unique_ptr<gpu::kv_cache> make_cache(int64_t block_size, int64_t n_blocks) {
    gpu::kv_cache_config kc;
    kc.layout = model->kv_layout_for(block_size);
    kc.n_blocks = n_blocks;
    return std::move(gpu::kv_cache::create(*dev, kc).value());
  }
  // Prefills `tokens` into a new sequence of `kv`; returns it and the last token's logits.
  gpu::seq_id prefill(gpu::kv_cache& kv, std::span<const int32_t> tokens,
                      std::vector<float>* logits = nullptr) {
    const gpu::seq_id s = kv.create_sequence();
    gpu::forward_batch fb;
    fb.add(s, tokens, true);
    gpu::forward_output out;
    EXPECT_TRUE(model->forward(fb, kv, out).ok());
    if (logits != nullptr) *logits = out.logits;
    return s;
  }
  // One decode step of `token` on `seq`; returns its logits.
  std::vector<float> step(gpu::kv_cache& kv, gpu::seq_id seq, int32_t token) {
    gpu::forward_batch fb;
    const int32_t t[1] = {token};
    fb.add(seq, t, true);
    gpu::forward_output out;
    auto st = model->forward(fb, kv, out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out.logits;
  }
};

void expect_empty(const gpu::kv_cache& kv) {
  const auto st = kv.stats();
  EXPECT_EQ(st.n_blocks_used, 0);
  EXPECT_EQ(st.n_sequences, 0);
  EXPECT_TRUE(kv.check_invariants().ok()) << kv.check_invariants().to_string();
}

// -- transfer over every engine ----------------------------------------------------------------

class kv_transfer_engines : public ::testing::TestWithParam<engine_spec> {};

TEST_P(kv_transfer_engines, transferred_sequence_decodes_bit_identically) {
  two_caches c;
  auto ea = make_engine(GetParam().name, GetParam().params);
  auto eb = make_engine(GetParam().name, GetParam().params);
  ASSERT_TRUE(ea && eb);
  auto exporter = kv_exporter::create(*c.a, ea, identity());
  auto importer = kv_importer::create(*c.b, eb, identity());
  ASSERT_TRUE(exporter.ok()) << exporter.error().to_string();
  ASSERT_TRUE(importer.ok()) << importer.error().to_string();

  // Fragment both pools so the block ids differ between the two sides and are not 0, 1, 2, ...
  const auto filler_tokens = prompt_of(9, 1);
  const gpu::seq_id filler_a = c.prefill(*c.a, filler_tokens);
  const auto prompt = prompt_of(37, 2);
  std::vector<float> prefill_logits;
  const gpu::seq_id s = c.prefill(*c.a, prompt, &prefill_logits);
  ASSERT_TRUE(c.a->free_sequence(filler_a).ok());
  const gpu::seq_id filler_b = c.b->create_sequence();
  ASSERT_TRUE(c.b->reserve(filler_b, 13).ok());

  auto desc =
      (*exporter)->offer({.request_id = 77, .seq = s, .tokens = prompt, .lease_ms = 20'000});
  ASSERT_TRUE(desc.ok()) << desc.error().to_string();
  EXPECT_EQ((*exporter)->n_leases(), 1u);
  // Across processes the descriptor travels as bytes.
  const auto wire_bytes = desc->to_bytes();
  EXPECT_LT(wire_bytes.size(), 4096u);
  const auto received = schema::envelope::from_bytes(schema::kind::kv_descriptor, wire_bytes);
  auto info = serve::read_kv_descriptor(received);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->request_id, 77u);
  EXPECT_EQ(info->n_tokens, 37);

  // Asynchronous path: the callback fires on the progress thread, finish() on this one.
  std::promise<transport::completion> done;
  auto pull_id = (*importer)->start(
      received, [&](uint64_t, const transport::completion& cpl) { done.set_value(cpl); });
  ASSERT_TRUE(pull_id.ok()) << pull_id.error().to_string();
  auto fut = done.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(fut.get().result.ok());
  auto got = (*importer)->finish(*pull_id);
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_TRUE(got->checksum_verified);
  EXPECT_EQ(got->request_id, 77u);
  EXPECT_EQ(got->n_tokens, 37);
  EXPECT_EQ(got->size_bytes, static_cast<uint64_t>(c.a->blocks_for(37)) * 2 *
                                 c.a->layout().n_layers * c.a->layout().block_bytes());
  EXPECT_EQ(c.b->length(got->seq), 37);
  EXPECT_EQ((*importer)->finish(*pull_id).error().code, errc::not_found);
  EXPECT_EQ((*importer)->n_pending(), 0u);

  // The next decode step gives bit-identical logits on both caches.
  const int32_t next = 123;
  const auto la = c.step(*c.a, s, next);
  const auto lb = c.step(*c.b, got->seq, next);
  ASSERT_EQ(la.size(), lb.size());
  ASSERT_FALSE(la.empty());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
  // ...and they depend on the transferred KV: the same step without that context differs.
  const int32_t lone[1] = {next};
  const gpu::seq_id bare = c.b->create_sequence();
  gpu::forward_batch fb;
  fb.add(bare, lone, true);
  gpu::forward_output out;
  ASSERT_TRUE(c.model->forward(fb, *c.b, out).ok());
  EXPECT_NE(std::memcmp(la.data(), out.logits.data(), la.size() * sizeof(float)), 0);

  // Release: the exporter hands the sequence back once; its caller frees it.
  auto back = (*exporter)->release(got->lease_id);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->seq, s);
  auto again = (*exporter)->release(got->lease_id);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, errc::not_found);
  EXPECT_NE(again.error().message.find("already released"), std::string::npos)
      << again.error().message;
  EXPECT_TRUE(c.a->free_sequence(back->seq).ok());
  EXPECT_TRUE(c.b->free_sequence(got->seq).ok());
  EXPECT_TRUE(c.b->free_sequence(bare).ok());
  EXPECT_TRUE(c.b->free_sequence(filler_b).ok());
  importer->reset();
  exporter->reset();
  expect_empty(*c.a);
  expect_empty(*c.b);
}

INSTANTIATE_TEST_SUITE_P(engines, kv_transfer_engines,
                         ::testing::Values(engine_spec{"inproc", "inproc", {}},
                                           engine_spec{"ucx_tcp", "ucx", {{"ucx.tls", "tcp"}}},
                                           engine_spec{"ucx_shm", "ucx", {{"ucx.tls", "shm"}}}),
                         [](const auto& info) { return info.param.label; });

// -- refusals ----------------------------------------------------------------------------------

TEST(kv_transfer, mismatched_descriptors_are_refused_and_allocate_nothing) {
  two_caches c;
  auto ea = make_engine("inproc");
  auto eb = make_engine("inproc");
  auto exporter = kv_exporter::create(*c.a, ea, identity());
  ASSERT_TRUE(exporter.ok());
  const auto prompt = prompt_of(11, 3);
  const gpu::seq_id s = c.prefill(*c.a, prompt);
  auto desc = (*exporter)->offer({.request_id = 1, .seq = s, .tokens = prompt, .lease_ms = 20'000});
  ASSERT_TRUE(desc.ok());

  struct refusal {
    std::string what;
    kv_transfer_config config;
    int64_t block_size;
    errc expected;
  };
  const refusal cases[] = {
      {"model id", identity("another-model"), 4, errc::version_mismatch},
      {"weights version", identity("weft-tiny", 4), 4, errc::version_mismatch},
      {"layout (block size)", identity(), 8, errc::version_mismatch},
  };
  for (const auto& r : cases) {
    auto cache = c.make_cache(r.block_size, 16);
    auto importer = kv_importer::create(*cache, eb, r.config);
    ASSERT_TRUE(importer.ok());
    auto got = (*importer)->pull(*desc);
    ASSERT_FALSE(got.ok()) << r.what;
    EXPECT_EQ(got.error().code, r.expected) << r.what << ": " << got.error().to_string();
    EXPECT_FALSE((*importer)->check(*desc).ok()) << r.what;
    importer->reset();
    expect_empty(*cache);
  }
  // An engine that cannot reach the exporter's engine kind is refused before any connect.
  {
    auto ucx = make_engine("ucx", {{"ucx.tls", "tcp"}});
    auto importer = kv_importer::create(*c.b, ucx, identity());
    ASSERT_TRUE(importer.ok());
    auto got = (*importer)->pull(*desc);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.error().code, errc::invalid_argument) << got.error().to_string();
    expect_empty(*c.b);
  }
  // Offers the exporter refuses: wrong token count, unknown sequence, a second lease on one seq.
  const gpu::seq_id t = c.prefill(*c.a, prompt);
  const auto short_prompt = std::span<const int32_t>(prompt).first(5);
  EXPECT_EQ((*exporter)->offer({.request_id = 2, .seq = t, .tokens = short_prompt}).error().code,
            errc::invalid_argument);
  EXPECT_TRUE(c.a->free_sequence(t).ok());
  EXPECT_EQ((*exporter)->offer({.request_id = 2, .seq = 999, .tokens = prompt}).error().code,
            errc::not_found);
  EXPECT_EQ((*exporter)->offer({.request_id = 2, .seq = s, .tokens = prompt}).error().code,
            errc::already_exists);

  auto info = serve::read_kv_descriptor(*desc);
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE((*exporter)->release(info->lease_id).ok());
  EXPECT_TRUE(c.a->free_sequence(s).ok());
  exporter->reset();
  expect_empty(*c.a);
}

// -- deadlines and leases --------------------------------------------------------------------

TEST(kv_transfer, passed_deadline_is_refused_and_expired_lease_is_handed_back_once) {
  two_caches c;
  auto ea = make_engine("inproc");
  auto eb = make_engine("inproc");
  auto exporter = kv_exporter::create(*c.a, ea, identity());
  auto importer = kv_importer::create(*c.b, eb, identity());
  ASSERT_TRUE(exporter.ok() && importer.ok());
  const auto prompt = prompt_of(21, 4);
  const gpu::seq_id s = c.prefill(*c.a, prompt);
  const uint64_t long_ago = serve::unix_now_ms() - 60'000;
  auto desc = (*exporter)->offer(
      {.request_id = 5, .seq = s, .tokens = prompt, .lease_ms = 1'000, .now_ms = long_ago});
  ASSERT_TRUE(desc.ok());
  auto got = (*importer)->pull(*desc);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, errc::timeout) << got.error().to_string();
  expect_empty(*c.b);

  // Nothing expires before deadline + grace; then the lease ends exactly once.
  const uint64_t deadline = long_ago + 1'000;
  EXPECT_EQ((*exporter)->next_expiry_ms(), deadline + 100);
  EXPECT_TRUE((*exporter)->expire(deadline + 99).empty());
  auto expired = (*exporter)->expire(deadline + 100);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].seq, s);
  EXPECT_EQ(expired[0].request_id, 5u);
  EXPECT_TRUE((*exporter)->expire(deadline + 1'000'000).empty());
  auto late = (*exporter)->release(expired[0].lease_id);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.error().message.find("already expired"), std::string::npos)
      << late.error().message;
  EXPECT_EQ((*exporter)->renew(expired[0].lease_id, 1000).error().code, errc::not_found);
  EXPECT_EQ((*exporter)->n_leases(), 0u);
  EXPECT_TRUE(c.a->free_sequence(s).ok());
  exporter->reset();
  importer->reset();
  expect_empty(*c.a);
}

TEST(kv_transfer, transfer_that_outlives_the_lease_frees_the_half_imported_sequence) {
  two_caches c;
  auto ea = make_engine("inproc");
  // Every transfer of the importer's engine is dropped: it can only end at its deadline.
  auto eb = make_engine("fault:inproc", {{"fault.drop_probability", "1"}});
  ASSERT_TRUE(ea && eb);
  auto exporter = kv_exporter::create(*c.a, ea, identity());
  auto importer = kv_importer::create(*c.b, eb, identity());
  ASSERT_TRUE(exporter.ok() && importer.ok())
      << (importer.ok() ? "" : importer.error().to_string());
  const auto prompt = prompt_of(30, 5);
  const gpu::seq_id s = c.prefill(*c.a, prompt);
  auto desc = (*exporter)->offer({.request_id = 6, .seq = s, .tokens = prompt, .lease_ms = 300});
  ASSERT_TRUE(desc.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto id = (*importer)->start(*desc, {});
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  EXPECT_GT(c.b->stats().n_blocks_used, 0);  // allocated while in flight
  EXPECT_EQ((*importer)->finish(*id).error().code, errc::invalid_argument);  // still in flight
  auto got = (*importer)->pull(*desc);  // a second pull of the same descriptor: also dropped
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, errc::timeout) << got.error().to_string();
  const auto waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_GE(waited_ms, 200);
  EXPECT_LT(waited_ms, 5'000);
  // The first pull ended at the same deadline: finish() reports it and frees its sequence.
  errc first = errc::invalid_argument;
  for (int i = 0; i < 500 && first == errc::invalid_argument; ++i) {
    auto r = (*importer)->finish(*id);
    ASSERT_FALSE(r.ok());
    first = r.error().code;
    if (first == errc::invalid_argument) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(first, errc::timeout);
  EXPECT_EQ((*importer)->n_pending(), 0u);
  expect_empty(*c.b);

  // The exporter's lease expires after deadline + grace and hands the sequence back once.
  auto info = serve::read_kv_descriptor(*desc);
  EXPECT_TRUE((*exporter)->expire(info->lease_deadline_ms + 99).empty());
  auto expired = (*exporter)->expire(info->lease_deadline_ms + 100);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].seq, s);
  EXPECT_TRUE(c.a->free_sequence(s).ok());
  exporter->reset();
  importer->reset();
  expect_empty(*c.a);
}

TEST(kv_transfer, importer_destroyed_mid_transfer_frees_its_sequence) {
  two_caches c;
  auto ea = make_engine("inproc");
  auto eb = make_engine("fault:inproc", {{"fault.delay_ms", "300"}});
  auto exporter = kv_exporter::create(*c.a, ea, identity());
  auto importer = kv_importer::create(*c.b, eb, identity());
  ASSERT_TRUE(exporter.ok() && importer.ok());
  const auto prompt = prompt_of(17, 6);
  const gpu::seq_id s = c.prefill(*c.a, prompt);
  auto desc = (*exporter)->offer({.request_id = 8, .seq = s, .tokens = prompt, .lease_ms = 10'000});
  ASSERT_TRUE(desc.ok());
  bool fired = false;
  auto id =
      (*importer)->start(*desc, [&](uint64_t, const transport::completion&) { fired = true; });
  ASSERT_TRUE(id.ok());
  importer->reset();  // cancels, waits for the completion, frees the sequence
  EXPECT_TRUE(fired);
  expect_empty(*c.b);
  auto back = (*exporter)->release(serve::read_kv_descriptor(*desc)->lease_id);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(c.a->free_sequence(back->seq).ok());
  exporter->reset();
  expect_empty(*c.a);
}

// -- corruption ----------------------------------------------------------------------------------

TEST(kv_transfer, bytes_corrupted_in_flight_fail_the_checksum) {
  two_caches c;
  auto ea = make_engine("inproc");
  auto eb = make_engine("fault:inproc", {{"fault.corrupt_probability", "1"}});
  auto exporter = kv_exporter::create(*c.a, ea, identity());
  auto importer = kv_importer::create(*c.b, eb, identity());
  ASSERT_TRUE(exporter.ok() && importer.ok());
  const auto prompt = prompt_of(25, 7);
  const gpu::seq_id s = c.prefill(*c.a, prompt);
  auto desc = (*exporter)->offer({.request_id = 9, .seq = s, .tokens = prompt, .lease_ms = 10'000});
  ASSERT_TRUE(desc.ok());
  auto got = (*importer)->pull(*desc);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, errc::malformed) << got.error().to_string();
  EXPECT_NE(got.error().message.find("checksum"), std::string::npos);
  expect_empty(*c.b);
  auto back = (*exporter)->release(serve::read_kv_descriptor(*desc)->lease_id);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(c.a->free_sequence(back->seq).ok());
  exporter->reset();
  importer->reset();
  expect_empty(*c.a);
}

TEST(kv_transfer, mutated_descriptor_bytes_never_crash_and_leak_nothing) {
  two_caches c;
  auto ea = make_engine("inproc");
  auto eb = make_engine("inproc");
  auto exporter = kv_exporter::create(*c.a, ea, identity());
  auto importer = kv_importer::create(*c.b, eb, identity());
  ASSERT_TRUE(exporter.ok() && importer.ok());
  const auto prompt = prompt_of(23, 8);
  const gpu::seq_id s = c.prefill(*c.a, prompt);
  auto desc =
      (*exporter)->offer({.request_id = 10, .seq = s, .tokens = prompt, .lease_ms = 600'000});
  ASSERT_TRUE(desc.ok());
  const auto original = desc->to_bytes();
  std::mt19937_64 rng(2026);
  int n_ok = 0, n_malformed = 0, n_refused = 0;
  for (int i = 0; i < 3000; ++i) {
    auto bytes = original;
    switch (rng() % 4) {
      case 0:  // a few bit flips
        for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) {
          bytes[rng() % bytes.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
        }
        break;
      case 1:  // random bytes
        for (int k = 0, n = 1 + static_cast<int>(rng() % 8); k < n; ++k) {
          bytes[rng() % bytes.size()] = static_cast<std::byte>(rng());
        }
        break;
      case 2:  // truncated
        bytes.resize(rng() % bytes.size());
        break;
      default:  // a random 8-byte word (pointers, sizes, list lengths)
        if (bytes.size() >= 8) {
          const uint64_t word = rng();
          std::memcpy(bytes.data() + (rng() % (bytes.size() / 8)) * 8, &word, 8);
        }
        break;
    }
    auto env = schema::envelope::from_bytes(schema::kind::kv_descriptor, bytes);
    auto got = (*importer)->pull(env);
    if (got.ok()) {
      ++n_ok;
      EXPECT_TRUE(c.b->free_sequence(got->seq).ok());
    } else if (got.error().code == errc::malformed) {
      ++n_malformed;
    } else {
      ++n_refused;
    }
    ASSERT_EQ(c.b->stats().n_blocks_used, 0) << "iteration " << i;
  }
  std::printf("mutated descriptors: %d pulled, %d malformed, %d refused\n", n_ok, n_malformed,
              n_refused);
  EXPECT_GT(n_malformed + n_refused, 1000);
  EXPECT_EQ((*importer)->n_pending(), 0u);
  // The untouched descriptor still works.
  auto good = (*importer)->pull(*desc);
  ASSERT_TRUE(good.ok()) << good.error().to_string();
  EXPECT_TRUE(c.b->free_sequence(good->seq).ok());
  auto back = (*exporter)->release(serve::read_kv_descriptor(*desc)->lease_id);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(c.a->free_sequence(back->seq).ok());
  exporter->reset();
  importer->reset();
  expect_empty(*c.a);
  expect_empty(*c.b);
}

// -- a SmolLM2-135M-sized sequence ---------------------------------------------------------------

// 512 tokens with SmolLM2-135M's KV shape (30 layers, 3 KV heads, head_dim 64, fp16): 11.25 MiB.
// Prints the transfer time per engine (a measurement, not a target) and checks the bytes arrived.
TEST(kv_transfer, smollm2_sized_sequence_moves_intact) {
  auto dev =
      std::move(gpu::device_registry::instance().create("cpu", gpu::device_config{1, 0}).value());
  gpu::kv_cache_config kc;
  kc.layout = gpu::kv_layout{30, 3, 64, 16, gpu::ggml_type::f16};
  kc.n_blocks = 40;
  const auto tokens = prompt_of(512, 9);
  const uint64_t kv_bytes = 2ull * 30 * 3 * 64 * 2 * 512;
  const engine_spec specs[] = {{"inproc", "inproc", {}},
                               {"ucx_tcp", "ucx", {{"ucx.tls", "tcp"}}},
                               {"ucx_shm", "ucx", {{"ucx.tls", "shm"}}}};
  for (const auto& spec : specs) {
    auto a = std::move(gpu::kv_cache::create(*dev, kc).value());
    auto b = std::move(gpu::kv_cache::create(*dev, kc).value());
    // Pattern-filled pools stand in for computed KV.
    const size_t pool =
        kc.layout.block_bytes() * static_cast<size_t>(kc.n_blocks * kc.layout.n_layers);
    transport::fill_pattern({reinterpret_cast<std::byte*>(a->k_layer(0)), pool}, 1);
    transport::fill_pattern({reinterpret_cast<std::byte*>(a->v_layer(0)), pool}, 2);
    auto ea = make_engine(spec.name, spec.params);
    auto eb = make_engine(spec.name, spec.params);
    ASSERT_TRUE(ea && eb);
    auto exporter = kv_exporter::create(*a, ea, identity("smollm2"));
    auto importer = kv_importer::create(*b, eb, identity("smollm2"));
    ASSERT_TRUE(exporter.ok() && importer.ok());
    for (const auto mode : {serve::kv_checksum_mode::none, serve::kv_checksum_mode::xxh3}) {
      std::vector<double> ms, offer_ms;
      for (int rep = 0; rep < 5; ++rep) {
        const gpu::seq_id s = a->create_sequence();
        ASSERT_TRUE(a->reserve(s, 512).ok());
        ASSERT_TRUE(a->commit(s, tokens).ok());
        const auto o0 = std::chrono::steady_clock::now();
        auto desc = (*exporter)->offer(
            {.request_id = 1, .seq = s, .tokens = tokens, .lease_ms = 30'000, .checksum = mode});
        offer_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - o0)
                .count());
        ASSERT_TRUE(desc.ok()) << desc.error().to_string();
        EXPECT_LT(desc->size_bytes(), 8192u);  // well under the 64 KiB control-message budget
        if (rep == 0 && mode == serve::kv_checksum_mode::none) {
          std::printf("KvDescriptor of 512 tokens over %s: %zu bytes\n", spec.label.c_str(),
                      desc->size_bytes());
        }
        const auto t0 = std::chrono::steady_clock::now();
        auto got = (*importer)->pull(*desc);
        const auto t1 = std::chrono::steady_clock::now();
        ASSERT_TRUE(got.ok()) << spec.label << ": " << got.error().to_string();
        EXPECT_EQ(got->checksum_verified, mode == serve::kv_checksum_mode::xxh3);
        EXPECT_EQ(got->size_bytes, kv_bytes);
        // Byte-exact: every range of the new sequence equals the exporter's.
        auto src = a->export_ranges(s);
        auto dst = b->export_ranges(got->seq);
        ASSERT_TRUE(src.ok() && dst.ok());
        EXPECT_EQ(serve::kv_checksum(*src, tokens), serve::kv_checksum(*dst, tokens));
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        auto back = (*exporter)->release(got->lease_id);
        ASSERT_TRUE(back.ok());
        EXPECT_TRUE(a->free_sequence(back->seq).ok());
        EXPECT_TRUE(b->free_sequence(got->seq).ok());
      }
      std::sort(ms.begin(), ms.end());
      std::sort(offer_ms.begin(), offer_ms.end());
      std::printf(
          "kv pull of 512 SmolLM2-135M tokens (%.2f MiB) over %s, checksum %s: median %.2f ms (min "
          "%.2f), "
          "%.2f GiB/s; offer %.3f ms\n",
          static_cast<double>(kv_bytes) / (1 << 20), spec.label.c_str(),
          mode == serve::kv_checksum_mode::xxh3 ? "verified" : "off", ms[2], ms[0],
          static_cast<double>(kv_bytes) / (1 << 30) / (ms[2] / 1000.0), offer_ms[2]);
    }
    importer->reset();
    exporter->reset();
    expect_empty(*a);
    expect_empty(*b);
  }
}

}  // namespace
