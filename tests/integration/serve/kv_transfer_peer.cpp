// The prefill side of the two-process KV transfer test: prefills the test prompt into its cache,
// offers it (a KvDescriptor in hex on stdout) and answers commands on stdin:
//   step <token>      -> "logits <hex>" of one decode step of the offered sequence
//   release <lease>   -> "released <0|1> blocks_used <n>" after freeing the handed-back sequence
//   offer             -> "descriptor <hex>": the prompt again, in a new sequence
//   big               -> "descriptor <hex>": 512 pattern tokens in a SmolLM2-135M-shaped cache
//                        (model id "smollm2"); "release <lease>" frees it as well
//   quit
// Usage: kv_transfer_peer <ucx tls> <lease_ms>. Logs go to stderr.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <string>

#include "tests/integration/serve/kv_transfer_common.hpp"
#include "tests/integration/transport/line_protocol.hpp"
#include "transport/checksum.hpp"
#include "transport/registry.hpp"

using namespace weft;
using transport::testing::read_line;
using transport::testing::to_hex;
using transport::testing::write_line;

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("kv_peer"));
  if (argc != 3) return 2;
  auto host = serve::testing::model_and_cache::make(64);
  if (!host) return 3;
  transport::engine_config cfg;
  cfg.params = {{"ucx.tls", argv[1]}};
  auto e = transport::make_engine("ucx", cfg);
  if (!e) return 4;
  std::shared_ptr<transport::engine> eng(std::move(*e));
  auto exporter = serve::kv_exporter::create(*host->kv, eng, serve::testing::test_identity());
  if (!exporter) return 5;
  // A freed filler first, so the offered blocks do not start at block 0.
  const std::vector<int32_t> filler(9, 7);
  const gpu::seq_id f = host->kv->create_sequence();
  if (host->run(f, filler).empty() || !host->kv->free_sequence(f).ok()) return 6;
  const auto prompt = serve::testing::test_prompt();
  const gpu::seq_id s = host->kv->create_sequence();
  if (host->run(s, prompt).empty()) return 7;
  auto desc = (*exporter)->offer(
      {.request_id = 42, .seq = s, .tokens = prompt, .lease_ms = std::stoull(argv[2])});
  if (!desc) return 8;
  write_line(stdout, "descriptor " + to_hex(desc->to_bytes()));
  std::unique_ptr<gpu::kv_cache> big;  // declared before its exporter: destroyed after it
  std::unique_ptr<serve::kv_exporter> big_exporter;
  while (auto line = read_line(stdin)) {
    if (*line == "offer") {
      const gpu::seq_id again = host->kv->create_sequence();
      auto d = host->run(again, prompt).empty()
                   ? weft::result<schema::envelope>(make_error(errc::internal, "prefill failed"))
                   : (*exporter)->offer({.request_id = 43,
                                         .seq = again,
                                         .tokens = prompt,
                                         .lease_ms = std::stoull(argv[2])});
      write_line(stdout,
                 d ? "descriptor " + to_hex(d->to_bytes()) : "error " + d.error().to_string());
      continue;
    }
    if (*line == "big") {
      if (!big) {
        gpu::kv_cache_config kc;
        kc.layout = serve::testing::smollm2_layout();
        kc.n_blocks = 40;
        big = std::move(gpu::kv_cache::create(*host->dev, kc).value());
        const size_t pool =
            kc.layout.block_bytes() * static_cast<size_t>(kc.n_blocks * kc.layout.n_layers);
        transport::fill_pattern({reinterpret_cast<std::byte*>(big->k_layer(0)), pool}, 1);
        transport::fill_pattern({reinterpret_cast<std::byte*>(big->v_layer(0)), pool}, 2);
        auto cfg = serve::testing::test_identity();
        cfg.model_id = "smollm2";
        big_exporter = std::move(serve::kv_exporter::create(*big, eng, cfg).value());
      }
      const std::vector<int32_t> tokens(512, 5);
      const gpu::seq_id b = big->create_sequence();
      (void)big->reserve(b, 512);
      (void)big->commit(b, tokens);
      auto d =
          big_exporter->offer({.request_id = 44, .seq = b, .tokens = tokens, .lease_ms = 30'000});
      write_line(stdout,
                 d ? "descriptor " + to_hex(d->to_bytes()) : "error " + d.error().to_string());
      continue;
    }
    if (line->rfind("step ", 0) == 0) {
      const int32_t tok[1] = {std::stoi(line->substr(5))};
      auto logits = host->run(s, tok);
      transport::bytes b(logits.size() * sizeof(float));
      std::memcpy(b.data(), logits.data(), b.size());
      write_line(stdout, "logits " + to_hex(b));
    } else if (line->rfind("release ", 0) == 0) {
      // Lease ids are per exporter: ids of the big exporter are sent as "big:<id>".
      const bool is_big = line->rfind("release big:", 0) == 0;
      auto& cache = is_big ? *big : *host->kv;
      auto back = is_big ? big_exporter->release(std::stoull(line->substr(12)))
                         : (*exporter)->release(std::stoull(line->substr(8)));
      const bool ok = back.ok() && cache.free_sequence(back->seq).ok();
      write_line(stdout, std::string{"released "} + (ok ? "1" : "0") + " blocks_used " +
                             std::to_string(cache.stats().n_blocks_used));
    } else if (*line == "quit") {
      break;
    }
  }
  big_exporter.reset();
  exporter->reset();
  return 0;
}
