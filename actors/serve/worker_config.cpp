// The engine worker's configuration (the config_json of an "engine_worker" spawn request):
// parsing with range checks, and the JSON `weft serve` sends.

#include <nlohmann/json.hpp>

#include <tuple>

#include "actors/host_port.hpp"
#include "actors/serve/engine_worker.hpp"
#include "gpu/gguf.hpp"

namespace weft::serve {

result<worker_config> worker_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json.empty() ? "{}" : json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::invalid_argument, "engine_worker: config is not a JSON object");
  worker_config c;
  try {
    if (!j.contains("model") || !j["model"].is_string()) {
      return make_error(errc::invalid_argument,
                        "engine_worker: config.model (a GGUF path) is required");
    }
    c.model = j["model"].get<std::string>();
    if (!j.contains("router") || !j["router"].is_string()) {
      return make_error(errc::invalid_argument,
                        "engine_worker: config.router (HOST:PORT) is required");
    }
    auto router = actors::parse_host_port(j["router"].get<std::string>());
    if (!router) {
      return make_error(errc::invalid_argument,
                        "engine_worker: config.router: " + router.error().message);
    }
    std::tie(c.router_host, c.router_port) = *router;
    c.device = j.value("device", c.device);
    c.threads = j.value("threads", c.threads);
    c.weights_memory = j.value("weights_memory", c.weights_memory);
    c.kv_blocks = j.value("kv_blocks", c.kv_blocks);
    c.block_size = j.value("block_size", c.block_size);
    c.max_batch_tokens = j.value("max_batch_tokens", c.max_batch_tokens);
    c.idle_batch_tokens = j.value("idle_batch_tokens", c.idle_batch_tokens);
    c.max_running = j.value("max_running", c.max_running);
    c.policy = j.value("policy", c.policy);
    c.mlfq_prefill_cost = j.value("mlfq_prefill_cost", c.mlfq_prefill_cost);
    c.mlfq_starvation_steps = j.value("mlfq_starvation_steps", c.mlfq_starvation_steps);
    c.role = j.value("role", c.role);
    c.prefix_cache = j.value("prefix_cache", c.prefix_cache);
    c.load_interval_ms = j.value("load_interval_ms", c.load_interval_ms);
    c.kv_lease_ms = j.value("kv_lease_ms", c.kv_lease_ms);
    c.segment_tokens = j.value("segment_tokens", c.segment_tokens);
    c.pool_timeout_ms = j.value("pool_timeout_ms", c.pool_timeout_ms);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument,
                      std::string{"engine_worker: bad config field: "} + e.what());
  }
  if (c.kv_blocks < 1 || c.block_size < 1 || c.max_batch_tokens < 2 || c.max_running < 1 ||
      c.threads < 0 || c.idle_batch_tokens < 0) {
    return make_error(errc::invalid_argument,
                      "engine_worker: kv_blocks, block_size, max_running >= 1, max_batch_tokens >= "
                      "2, threads >= 0, idle_batch_tokens >= 0");
  }
  if (!gpu::parse_gguf_memory(c.weights_memory)) {
    return make_error(errc::invalid_argument,
                      "engine_worker: weights_memory must be huge-pages or mmap");
  }
  if (c.role != "both" && c.role != "prefill" && c.role != "decode") {
    return make_error(errc::invalid_argument,
                      "engine_worker: role must be both, prefill or decode");
  }
  if (c.load_interval_ms < 10) c.load_interval_ms = 10;
  if (c.segment_tokens < 0 || (c.segment_tokens > 0 && c.segment_tokens % c.block_size != 0)) {
    return make_error(errc::invalid_argument,
                      "engine_worker: segment_tokens must be a multiple of block_size");
  }
  if (c.pool_timeout_ms < 10) c.pool_timeout_ms = 10;
  if (c.kv_lease_ms < 100)
    return make_error(errc::invalid_argument, "engine_worker: kv_lease_ms must be >= 100");
  return c;
}

std::string worker_config::to_json() const {
  nlohmann::json j = {{"model", model},
                      {"router", router_host + ":" + std::to_string(router_port)},
                      {"device", device},
                      {"threads", threads},
                      {"weights_memory", weights_memory},
                      {"kv_blocks", kv_blocks},
                      {"block_size", block_size},
                      {"max_batch_tokens", max_batch_tokens},
                      {"idle_batch_tokens", idle_batch_tokens},
                      {"max_running", max_running},
                      {"policy", policy},
                      {"mlfq_prefill_cost", mlfq_prefill_cost},
                      {"mlfq_starvation_steps", mlfq_starvation_steps},
                      {"role", role},
                      {"prefix_cache", prefix_cache},
                      {"load_interval_ms", load_interval_ms},
                      {"kv_lease_ms", kv_lease_ms},
                      {"segment_tokens", segment_tokens},
                      {"pool_timeout_ms", pool_timeout_ms}};
  return j.dump();
}

}  // namespace weft::serve
