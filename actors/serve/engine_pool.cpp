#include "actors/serve/engine_pool.hpp"

#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "actors/cache/cache_shard.hpp"
#include "actors/cluster_client.hpp"
#include "actors/runtime.hpp"
#include "actors/serve/engine_worker.hpp"
#include "actors/serve/router.hpp"
#include "actors/serve/serve_atoms.hpp"

namespace weft::serve {

struct engine_pool::impl {
  caf::actor_system* sys = nullptr;
  caf::actor router;
  caf::actor supervisor;
  uint16_t router_port = 0;
  std::vector<std::string> workers;
  std::unique_ptr<model_host> host;
  bool stopped = false;
};

namespace {

int count_ready(caf::actor_system& sys, const caf::actor& router) {
  int ready = 0;
  caf::scoped_actor s{sys};
  s->request(router, std::chrono::seconds(2), status_atom::value)
      .receive(
          [&](const std::string& json) {
            auto j = nlohmann::json::parse(json, nullptr, false);
            if (j.is_discarded()) return;
            if (j.contains("workers")) ready += static_cast<int>(j["workers"].size());
            if (j.contains("shards")) ready += static_cast<int>(j["shards"].size());
          },
          [](caf::error&) {});
  return ready;
}

void stop_and_wait(caf::actor_system& sys, const caf::actor& a) {
  if (!a) return;
  caf::scoped_actor s{sys};
  s->monitor(a);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  s->receive([](const caf::down_msg&) {},
             caf::after(std::chrono::seconds(5)) >>
                 [] { spdlog::warn("engine pool: an actor did not stop within 5 s"); });
}

}  // namespace

result<std::unique_ptr<engine_pool>> engine_pool::start(actors::node& node,
                                                        engine_pool_options opts) {
  if (opts.workers < 1) {
    return make_error(errc::invalid_argument, "an engine pool needs at least one worker");
  }
  if (opts.cache_shards > 0 &&
      (opts.segment_tokens < opts.block_size || opts.segment_tokens % opts.block_size != 0)) {
    return make_error(errc::invalid_argument, "segment_tokens " +
                                                  std::to_string(opts.segment_tokens) +
                                                  " must be a positive multiple of block_size " +
                                                  std::to_string(opts.block_size));
  }
  model_host_options mo;
  mo.path = opts.model.empty() ? default_model_path() : std::filesystem::path{opts.model};
  mo.load_weights = false;
  auto host = load_model_host(mo);
  if (!host) return host.error();

  std::unique_ptr<engine_pool> pool(new engine_pool());
  pool->impl_ = std::make_unique<impl>();
  auto& im = *pool->impl_;
  im.sys = &node.system();
  im.host = std::move(*host);

  router_config rc;
  rc.secret = node.options().secret;
  rc.max_outstanding = opts.max_outstanding;
  im.router = spawn_router(*im.sys, rc);
  auto port = actors::publish_actor(*im.sys, im.router, 0, "127.0.0.1");
  if (!port) {
    return make_error(port.error().code,
                      "cannot publish the pool's router: " + port.error().message);
  }
  im.router_port = *port;

  worker_config wc;
  wc.model = std::filesystem::absolute(mo.path).string();
  wc.router_host = "127.0.0.1";
  wc.router_port = im.router_port;
  wc.threads =
      opts.threads > 0
          ? opts.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / opts.workers);
  wc.kv_blocks = opts.kv_blocks;
  wc.block_size = opts.block_size;
  wc.max_batch_tokens = opts.max_batch_tokens;
  wc.idle_batch_tokens = opts.idle_batch_tokens;
  wc.policy = opts.policy;
  std::vector<actors::child_spec> children;
  for (int i = 0; i < opts.workers; ++i) {
    im.workers.push_back(opts.name + "-worker-" + std::to_string(i));
    children.push_back(
        {im.workers.back(), "engine_worker", wc.to_json(), actors::restart_type::permanent});
  }
  if (opts.cache_shards > 0) {
    wc.segment_tokens = opts.segment_tokens;
    for (auto& c : children) c.config_json = wc.to_json();
  }
  for (int i = 0; i < opts.cache_shards; ++i) {
    cache::shard_config sc;
    sc.router_host = "127.0.0.1";
    sc.router_port = im.router_port;
    sc.segment_bytes = opts.segment_tokens * im.host->kv_bytes_per_token;
    sc.capacity_bytes = std::max<int64_t>(
        static_cast<int64_t>(opts.cache_mem_gb * double(int64_t{1} << 30)), sc.segment_bytes);
    im.workers.push_back(opts.name + "-cache-shard-" + std::to_string(i));
    children.push_back(
        {im.workers.back(), "cache_shard", sc.to_json(), actors::restart_type::permanent});
  }
  const int members = opts.workers + opts.cache_shards;
  actors::restart_intensity intensity{opts.max_restarts, 60'000};
  actors::backoff_policy backoff{opts.restart_delay_ms, 5000, 2.0, 30000};
  auto sup = actors::supervise_on_cluster(*im.sys, node.head(), node.options().secret, opts.name,
                                          actors::restart_strategy::one_for_one, intensity, backoff,
                                          children, opts.ready_timeout_s * 1000u);
  if (!sup) {
    stop_and_wait(*im.sys, im.router);
    return make_error(sup.error().code, "cannot start the pool's workers: " + sup.error().message);
  }
  im.supervisor = *sup;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(opts.ready_timeout_s);
  while (count_ready(*im.sys, im.router) < members) {
    if (std::chrono::steady_clock::now() > deadline) {
      const int ready = count_ready(*im.sys, im.router);
      pool->stop();
      return make_error(errc::timeout, std::to_string(ready) + " of " + std::to_string(members) +
                                           " engine workers and cache shards were ready after " +
                                           std::to_string(opts.ready_timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  spdlog::info(
      "engine pool {}: {} worker(s) of {} and {} cache shard(s) ready, router on "
      "127.0.0.1:{}",
      opts.name, opts.workers, im.host->id, opts.cache_shards, im.router_port);
  return pool;
}

engine_pool::~engine_pool() {
  stop();
}

void engine_pool::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  // The supervisor first, so that nothing is restarted or migrated while the router goes.
  stop_and_wait(*impl_->sys, impl_->supervisor);
  stop_and_wait(*impl_->sys, impl_->router);
}

caf::actor engine_pool::router() const {
  return impl_->router;
}
std::string engine_pool::router_address() const {
  return "127.0.0.1:" + std::to_string(impl_->router_port);
}
caf::actor engine_pool::supervisor() const {
  return impl_->supervisor;
}
std::vector<std::string> engine_pool::worker_names() const {
  return impl_->workers;
}
int engine_pool::ready_workers() const {
  return count_ready(*impl_->sys, impl_->router);
}
const model_host& engine_pool::model() const {
  return *impl_->host;
}

result<generation> engine_pool::generate(std::span<const int32_t> prompt,
                                         gpu::sampling_params params, uint32_t timeout_ms) {
  if (impl_->stopped) return make_error(errc::unavailable, "the engine pool is stopped");
  return serve::generate(*impl_->sys, impl_->router, prompt, params, timeout_ms);
}

result<std::pair<generation, std::string>> engine_pool::generate_text(const std::string& prompt,
                                                                      gpu::sampling_params params,
                                                                      uint32_t timeout_ms) {
  const auto& host = *impl_->host;
  auto prompt_ids = encode_user_turn(host, prompt);
  if (!prompt_ids) return prompt_ids.error();
  auto eog = host.tok.end_of_generation_ids();
  params.stop_tokens.insert(params.stop_tokens.end(), eog.begin(), eog.end());
  auto g = generate(*prompt_ids, params, timeout_ms);
  if (!g) return g.error();
  std::vector<gpu::token_id> out(g->tokens.begin(), g->tokens.end());
  std::string decoded = host.tok.decode(out);
  return std::make_pair(std::move(*g), std::move(decoded));
}

}  // namespace weft::serve
