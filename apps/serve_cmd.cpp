// `weft serve`: an OpenAI-compatible server on a local cluster. This process runs the head, the
// router and the HTTP api; every engine worker runs in its own `weft node` process, placed and
// restarted by a supervisor. Ctrl-C stops everything.

#include <spdlog/spdlog.h>
#include <caf/actor_system.hpp>
#include <caf/after.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/system_messages.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>

#include "actors/cache/cache_shard.hpp"
#include "actors/child_process.hpp"
#include "actors/cluster_client.hpp"
#include "actors/node.hpp"
#include "actors/serve/api_server.hpp"
#include "actors/serve/engine_worker.hpp"
#include "actors/serve/openai_embeddings.hpp"
#include "actors/serve/router.hpp"
#include "actors/serve/serve_atoms.hpp"
#include "apps/cluster_options.hpp"
#include "apps/commands.hpp"
#include "apps/config_file.hpp"
#include "apps/local_nodes.hpp"
#include "apps/process_control.hpp"
#include "apps/version.hpp"
#include "gpu/device.hpp"

namespace weft::apps {

namespace {

struct serve_cli {
  std::string config_file;
  int http_threads = 128;
  int http_queue = 256;
  uint32_t stall_ms = 10'000;
  std::string model;
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  int workers = 1;
  int prefill = 0;
  int decode = 0;
  uint64_t kv_lease_ms = 5000;
  int cache_shards = 0;
  std::string route = "least-ttft";
  double cache_mem_gb = 1.0;
  int64_t segment_tokens = 64;
  uint32_t cache_replicas = 2;
  bool pool_generated = true;
  std::string policy = "fcfs";
  double mlfq_prefill_cost = 0.4;
  int64_t mlfq_starvation_steps = 1024;
  int threads = 0;
  std::string device = "cpu";
  std::string pooling = "mean";
  std::string tool_call_parser = "auto";
  std::string weights_memory = "huge-pages";
  std::string cpu_matmul = "auto";
  int64_t kv_blocks = 1024;
  int64_t block_size = 16;
  int64_t max_batch_tokens = 64;
  int64_t idle_batch_tokens = 512;
  int64_t max_running = 32;
  bool no_prefix_cache = false;
  std::string api_key;
  std::string served_model_name;
  std::vector<std::string> allowed_origins;
  int64_t ctx_size = 0;
  std::string chat_template;
  uint32_t ttft_slo_ms = 0;
  size_t max_outstanding = 1024;
  uint32_t queue_timeout_ms = 30'000;
  uint32_t heartbeat_ms = 200;
  std::string helper_sched = "batch";
  uint32_t dead_after_ms = 1'500;
  uint32_t connection_timeout_ms = 2000;
  uint32_t ready_timeout_s = 300;
  int max_restarts = 10;
  bool relaunch_nodes = true;
};

/// Where the router's hung-worker callback finds the node processes (null once they are gone).
struct hung_hook {
  std::mutex mu;
  local_nodes* nodes = nullptr;
};
struct hung_hook_guard {
  hung_hook_guard(std::shared_ptr<hung_hook> h, local_nodes* n) : hook(std::move(h)) {
    std::lock_guard<std::mutex> lock(hook->mu);
    hook->nodes = n;
  }
  ~hung_hook_guard() {
    std::lock_guard<std::mutex> lock(hook->mu);
    hook->nodes = nullptr;
  }
  hung_hook_guard(const hung_hook_guard&) = delete;
  hung_hook_guard& operator=(const hung_hook_guard&) = delete;
  std::shared_ptr<hung_hook> hook;
};

int run_serve(const serve_cli& cli) {
  enter_helper_class(cli.helper_sched);  // before any thread starts: they inherit it
  stop_latch::instance().catch_signals();
  const bool disaggregated = cli.prefill > 0 || cli.decode > 0;
  if (cli.cache_shards > 0 && cli.segment_tokens % cli.block_size != 0) {
    spdlog::error("--segment-tokens {} must be a multiple of --block-size {}", cli.segment_tokens,
                  cli.block_size);
    return 2;
  }
  if (disaggregated && (cli.prefill < 1 || cli.decode < 1)) {
    spdlog::error(
        "disaggregated serving needs at least one prefill and one decode worker "
        "(--prefill P --decode D), got --prefill {} --decode {}",
        cli.prefill, cli.decode);
    return 2;
  }
  if (cli.device != "cpu") {
    if (disaggregated || cli.cache_shards > 0) {
      // KV blocks leave a worker over UCX from host memory; moving them from GPU memory is not
      // built (docs/serving.md).
      spdlog::error("--device {}: disaggregated serving and cache shards run on the CPU only",
                    cli.device);
      return 2;
    }
    // Fail here with the device's own message rather than in every worker.
    if (auto d = gpu::device_registry::instance().open(cli.device, 1); !d) {
      spdlog::error("{}", d.error().message());
      return 2;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  serve::model_host_options mo;
  mo.path = cli.model.empty() ? serve::default_model_path() : std::filesystem::path{cli.model};
  mo.load_weights = false;
  mo.chat_template_file = cli.chat_template;
  auto host = serve::load_model_host(mo);
  if (!host) {
    spdlog::error("{}", host.error().message);
    return 2;
  }
  const std::string model_path = std::filesystem::absolute(mo.path).string();
  if (cli.ctx_size > 0 && (**host).n_ctx > 0 && cli.ctx_size > (**host).n_ctx) {
    spdlog::error("--ctx-size {} is beyond the model's context of {} tokens", cli.ctx_size,
                  (**host).n_ctx);
    return 2;
  }

  // This process: the head of a private cluster (fresh secret), the router and the api; engine
  // workers go to the worker node processes.
  auto private_cluster =
      start_private_head("serve-head", cli.heartbeat_ms, cli.connection_timeout_ms, "127.0.0.1", 0,
                         {}, cli.dead_after_ms);
  if (!private_cluster) {
    spdlog::error("cannot start the head: {}", private_cluster.error().to_string());
    return 1;
  }
  const std::string& secret_hex = private_cluster->secret_hex;
  const actors::cluster_secret* secret = &private_cluster->secret;
  auto* node = &private_cluster->node;
  auto& sys = (*node)->system();
  auto metrics = std::make_shared<serve::metrics_registry>();
  serve::router_config rc;
  rc.secret = *secret;
  rc.max_outstanding = cli.max_outstanding;
  rc.ttft_slo_ms = cli.ttft_slo_ms;
  rc.queue_timeout_ms = cli.queue_timeout_ms;
  rc.route = cli.route;
  rc.cache_replicas = cli.cache_replicas;
  rc.pool_generated = cli.pool_generated;
  rc.metrics = metrics;
  rc.stall_ms = cli.stall_ms;
  // A hung worker's requests migrate in the router; its process is SIGKILLed here and relaunched
  // like a crashed one. The hook points at `nodes` only while it exists.
  auto hook = std::make_shared<hung_hook>();
  rc.on_hung = [hook](const std::string& name, uint32_t pid) {
    std::lock_guard<std::mutex> lock(hook->mu);
    if (hook->nodes != nullptr && hook->nodes->kill(pid)) {
      spdlog::warn("killed the process of hung worker {} (pid {}); it will be relaunched", name,
                   pid);
    }
  };
  caf::actor router = serve::spawn_router(sys, rc);
  auto router_port = actors::publish_actor(sys, router, 0, "127.0.0.1");
  if (!router_port) {
    spdlog::error("cannot publish the router: {}", router_port.error().to_string());
    return 1;
  }
  spdlog::info("router published on 127.0.0.1:{} (mutual TLS, keyed by this run's secret)",
               *router_port);

  const int n_workers = disaggregated ? cli.prefill + cli.decode : cli.workers;
  const int threads =
      cli.threads > 0
          ? cli.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n_workers);
  // The HTTP api answers (health 503) while the workers load.
  serve::api_config ac;
  ac.host = cli.host;
  ac.port = cli.port;
  ac.api_key = cli.api_key;
  ac.http_threads = cli.http_threads;
  ac.http_queue = cli.http_queue;
  ac.served_model_name = cli.served_model_name;
  ac.allowed_origins = cli.allowed_origins;
  ac.ctx_size = cli.ctx_size;
  ac.pooling = *serve::parse_pooling(cli.pooling);
  if (cli.tool_call_parser == "auto") {
    ac.limits.tool_calls_format =
        (*host)->tmpl ? serve::tool_format_of(*(*host)->tmpl) : serve::tool_format::tagged;
  } else {
    ac.limits.tool_calls_format = *serve::parse_tool_format(cli.tool_call_parser);
  }
  ac.limits.priority_scheduling = cli.policy == "priority";
  spdlog::info("tool calls: {} format{}", serve::tool_format_name(ac.limits.tool_calls_format),
               cli.tool_call_parser == "auto" ? " (from the chat template)" : "");
  ac.cluster_json = [&sys, head = (*node)->head()]() -> std::string {
    auto st = actors::cluster_status(sys, head, 2000);
    return st ? actors::cluster_status_json(*st) : std::string{"null"};
  };
  auto api = serve::api_server::start(sys, router, **host, ac, metrics);
  if (!api) {
    spdlog::error("{}", api.error().message);
    return 1;
  }

  const int n_shards = cli.cache_shards;
  // Nodes i < n_workers host an engine worker, the others a cache shard. A dead one is relaunched:
  // its worker is re-placed by the supervisor at once; the new process adds capacity back once
  // it joined.
  local_nodes nodes(
      secret_hex, (*node)->head_port(),
      [n_workers](int i) -> local_node_spec {
        if (i < n_workers) return {"worker-node-" + std::to_string(i), {"engine_worker"}};
        return {"cache-node-" + std::to_string(i - n_workers), {"cache_shard"}};
      },
      {"--heartbeat-ms", std::to_string(cli.heartbeat_ms), "--connection-timeout-ms",
       std::to_string(cli.connection_timeout_ms), "--helper-sched", cli.helper_sched},
      cli.relaunch_nodes, cli.max_restarts);
  hung_hook_guard hook_guard(hook, &nodes);
  for (int i = 0; i < n_workers + n_shards; ++i) {
    if (auto s = nodes.launch(i); !s.ok()) {
      spdlog::error("{}", s.to_string());
      nodes.stop_all();
      return 1;
    }
  }
  serve::worker_config wc;
  wc.model = model_path;
  wc.router_host = "127.0.0.1";
  wc.router_port = *router_port;
  wc.threads = threads;
  wc.device = cli.device;
  wc.weights_memory = cli.weights_memory;
  wc.kv_blocks = cli.kv_blocks;
  wc.block_size = cli.block_size;
  wc.max_batch_tokens = cli.max_batch_tokens;
  wc.idle_batch_tokens = cli.idle_batch_tokens;
  wc.max_running = cli.max_running;
  wc.policy = cli.policy;
  wc.mlfq_prefill_cost = cli.mlfq_prefill_cost;
  wc.mlfq_starvation_steps = cli.mlfq_starvation_steps;
  wc.prefix_cache = !cli.no_prefix_cache;
  if (n_shards > 0) wc.segment_tokens = cli.segment_tokens;
  std::vector<actors::child_spec> children;
  for (int i = 0; i < n_workers && !disaggregated; ++i) {
    children.push_back({"worker-" + std::to_string(i), "engine_worker", wc.to_json(),
                        actors::restart_type::permanent});
  }
  if (disaggregated) {
    serve::worker_config pc = wc;
    pc.role = "prefill";
    pc.kv_lease_ms = cli.kv_lease_ms;
    serve::worker_config dc = wc;
    dc.role = "decode";
    for (int i = 0; i < cli.prefill; ++i) {
      children.push_back({"prefill-" + std::to_string(i), "engine_worker", pc.to_json(),
                          actors::restart_type::permanent});
    }
    for (int i = 0; i < cli.decode; ++i) {
      children.push_back({"decode-" + std::to_string(i), "engine_worker", dc.to_json(),
                          actors::restart_type::permanent});
    }
  }
  for (int i = 0; i < n_shards; ++i) {
    cache::shard_config sc;
    sc.router_host = "127.0.0.1";
    sc.router_port = *router_port;
    sc.segment_bytes = cli.segment_tokens * (**host).kv_bytes_per_token;
    // Staging slots carry every segment in flight (lookups, publishes, copies): a worker's death
    // has the survivor look up all of its sequences' checkpointed segments at once. An eighth of
    // the shard's memory (32 to 1024 slots), taken from --cache-mem-gb.
    const auto mem = static_cast<int64_t>(cli.cache_mem_gb * double(int64_t{1} << 30));
    sc.staging_slots = static_cast<int32_t>(
        std::clamp<int64_t>(mem / sc.segment_bytes / 8, int64_t{32}, int64_t{1024}));
    sc.capacity_bytes =
        std::max<int64_t>(mem - int64_t{sc.staging_slots} * sc.segment_bytes, sc.segment_bytes);
    children.push_back({"cache-shard-" + std::to_string(i), "cache_shard", sc.to_json(),
                        actors::restart_type::permanent});
  }
  actors::restart_intensity intensity{static_cast<uint32_t>(cli.max_restarts), 60'000};
  actors::backoff_policy backoff{500, 5000, 2.0, 30000};
  // A killed worker's requests migrate at once; its restart waits for the relaunched node process
  // (about 0.3 s), so that two engines do not end up sharing one process's cores.
  backoff.first_delay_ms = 1500;
  auto sup = actors::supervise_on_cluster(sys, (*node)->head(), *secret, "serve-workers",
                                          actors::restart_strategy::one_for_one, intensity, backoff,
                                          children, 60'000);
  if (!sup) {
    spdlog::error("cannot start the engine workers: {}", sup.error().to_string());
    nodes.stop_all();
    return 1;
  }
  // Wait until every worker has loaded its weights and said hello.
  const auto ready_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(cli.ready_timeout_s);
  int ready = 0;
  while (!stop_latch::instance().requested()) {
    caf::scoped_actor s{sys};
    s->request(router, std::chrono::seconds(2), serve::status_atom::value)
        .receive(
            [&](const std::string& json) {
              auto j = nlohmann::json::parse(json, nullptr, false);
              ready =
                  j.is_discarded() ? 0 : static_cast<int>(j["workers"].size() + j["shards"].size());
            },
            [&](caf::error&) {});
    if (ready >= n_workers + n_shards) break;
    if (std::chrono::steady_clock::now() > ready_deadline) {
      spdlog::error("only {} of {} engine workers became ready within {} s", ready, n_workers,
                    cli.ready_timeout_s);
      nodes.stop_all();
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (stop_latch::instance().requested()) {
    nodes.stop_all();
    return stop_latch::instance().wait();
  }
  const std::string url = "http://" + cli.host + ":" + std::to_string((*api)->port());
  const std::string served = cli.served_model_name.empty() ? (**host).id : cli.served_model_name;
  std::printf("weft-serve-ready url=%s model=%s workers=%d\n", url.c_str(), served.c_str(),
              n_workers);
  std::fflush(stdout);
  spdlog::info(
      "serving {} at {} with {} engine worker(s) ({} thread(s) each, policy {}) in {:.1f} s — try: "
      "curl {}/v1/completions "
      "-H 'Content-Type: application/json' -d '{{\"prompt\": \"Hello\", \"max_tokens\": 16}}'",
      served, url, n_workers, threads, cli.policy,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), url);
  std::thread watcher([&nodes] {
    while (!stop_latch::instance().requested()) {
      nodes.watch();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const int code = stop_latch::instance().wait();
  spdlog::info("stopping");
  watcher.join();
  (*api)->stop();
  // A clean stop is not a failure: the supervisor and the router go first (and are waited for),
  // so that neither restarts nor migrates anything when the worker processes then end.
  stop_in_order(sys, {*sup, router});
  nodes.stop_all();
  return code;
}

}  // namespace

void add_serve_command(CLI::App& app, const global_options&) {
  auto cli = std::make_shared<serve_cli>();
  auto* cmd = app.add_subcommand("serve",
                                 "Serve a GGUF model over an OpenAI-compatible HTTP API, engine "
                                 "workers in their own node processes");
  cmd->add_option("--config", cli->config_file,
                  "TOML/INI file with any of these options, e.g. `port = 8100` or `max_outstanding "
                  "= 64`, at the top level or under [serve] (command-line flags win)")
      ->check(CLI::ExistingFile);
  cmd->add_option(
      "--model,-m", cli->model,
      "GGUF model (default: $WEFT_MODEL, else $WEFT_CACHE_DIR or ~/.cache/weft: models/" +
          std::string{serve::default_model_file} + ")");
  cmd->add_option("--host", cli->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", cli->port, "HTTP port (0 = any free port)")->capture_default_str();
  cmd->add_option("--workers", cli->workers, "Engine worker processes (colocated prefill + decode)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option(
         "--prefill", cli->prefill,
         "Prefill workers: disaggregated mode (DistServe), with --decode; replaces --workers")
      ->check(CLI::Range(1, 64));
  cmd->add_option(
         "--kv-lease-ms", cli->kv_lease_ms,
         "Disaggregated mode: how long a prefill worker holds an offered KV for the decode side")
      ->capture_default_str()
      ->check(CLI::Range(100, 600000));
  cmd->add_option(
         "--decode", cli->decode,
         "Decode workers: pull each prompt's KV from a prefill worker over UCX (with --prefill)")
      ->check(CLI::Range(1, 64));
  cmd->add_option(
         "--route", cli->route,
         "Worker choice: least-ttft (predicted TTFT with cache and pool hits, Mooncake-style), "
         "cache-affinity (longest cached prefix, SGLang/Dynamo-style), least-load (TTFT ignoring "
         "caches), "
         "round-robin")
      ->capture_default_str()
      ->check(CLI::IsMember({"least-ttft", "cache-affinity", "least-load", "round-robin"}));
  cmd->add_option("--cache-shards", cli->cache_shards,
                  "Prefix-cache pool (TokenLake): shard processes holding KV segments in host "
                  "memory (0 = none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  cmd->add_option("--cache-mem-gb", cli->cache_mem_gb, "Host memory of each cache shard, GiB")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 4096.0));
  cmd->add_option("--segment-tokens", cli->segment_tokens,
                  "Tokens per pool segment (a multiple of --block-size)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd->add_option("--cache-replicas", cli->cache_replicas,
                  "Shards that may hold one hot pool segment, its home included (1 = no replicas)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 16u));
  cmd->add_flag("!--no-pool-generated", cli->pool_generated,
                "With --cache-shards: publish only prompt segments to the pool. By default running "
                "sequences also publish their generated tokens' KV, a segment at a time, so a "
                "sequence whose worker dies resumes from the pool instead of recomputing");
  cmd->add_option("--policy", cli->policy,
                  "Iteration scheduling policy: fcfs, mlfq (FastServe skip-join MLFQ) or priority "
                  "(each request's 'priority' field, lower first, preemptive; vLLM's)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fcfs", "mlfq", "priority"}));
  cmd->add_option(
         "--mlfq-prefill-cost", cli->mlfq_prefill_cost,
         "MLFQ: cost of one prompt token in decode iterations (skip-join placement; ~0.4 on CPU)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--mlfq-starvation-steps", cli->mlfq_starvation_steps,
                  "MLFQ: promote a request not run for this many iterations to the top queue")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--threads", cli->threads, "Compute threads per worker (0 = cores / workers)")
      ->check(non_negative_number);
  cmd->add_option("--tool-call-parser", cli->tool_call_parser,
                  "How the model writes tool calls: auto (from its chat template), hermes "
                  "(<tool_call> blocks), llama3_json (bare JSON, Llama 3.1), mistral "
                  "([TOOL_CALLS] arrays)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "mistral"}));
  cmd->add_option("--pooling", cli->pooling,
                  "/v1/embeddings: pool the prompt's final hidden states by their mean or take "
                  "the last token's")
      ->capture_default_str()
      ->check(CLI::IsMember({"mean", "last"}));
  cmd->add_option("--device", cli->device,
                  "Where the workers compute: cpu, cuda or cuda:N (every worker on that device, "
                  "each with its own weights and KV cache; colocated serving without cache "
                  "shards)")
      ->capture_default_str();
  add_weights_memory_option(cmd, cli->weights_memory);
  add_cpu_matmul_option(cmd, cli->cpu_matmul);
  cmd->add_option("--kv-blocks", cli->kv_blocks, "KV cache blocks per worker")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--block-size", cli->block_size, "Tokens per KV block")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-batch-tokens", cli->max_batch_tokens,
                  "Token budget of one forward pass (prompt chunks share it with decodes; small "
                  "budgets bound TPOT under load; sized for the CPU backend, raise it on GPUs)")
      ->capture_default_str()
      ->check(CLI::Range(2, 65536));
  cmd->add_option("--idle-batch-tokens", cli->idle_batch_tokens,
                  "Token budget of a pass with no decode in it (only prompt chunks: a lone long "
                  "prompt takes fewer, larger chunks); 0 = --max-batch-tokens")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  cmd->add_option("--max-running", cli->max_running, "Sequences decoding concurrently per worker")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--no-prefix-cache", cli->no_prefix_cache, "Do not reuse cached prompt blocks");
  cmd->add_option("--http-threads", cli->http_threads,
                  "HTTP threads: requests served at once (a stream holds one while it runs)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--http-queue", cli->http_queue,
                  "Connections that may wait for an HTTP thread; beyond them a request gets 503 "
                  "with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--api-key", cli->api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize and "
                  "/admin/* (or WEFT_API_KEY)")
      ->envname("WEFT_API_KEY");
  cmd->add_option("--served-model-name", cli->served_model_name,
                  "Model id clients use (default: the file name)");
  cmd->add_option("--ctx-size,-c", cli->ctx_size,
                  "Context per sequence in tokens (prompt + completion), at most the model's; 0: "
                  "the model's own (SmolLM2: 8192)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--chat-template", cli->chat_template,
                  "Jinja chat template file to use instead of the model's own "
                  "tokenizer.chat_template (Hugging Face's syntax)");
  cmd->add_option("--allowed-origins", cli->allowed_origins,
                  "Browser origins allowed to call the API (CORS), comma-separated, e.g. "
                  "http://localhost:3000, or * for any (default: none, no CORS headers)")
      ->delimiter(',');
  cmd->add_option(
      "--ttft-slo-ms", cli->ttft_slo_ms,
      "Refuse (HTTP 429) requests whose predicted time to first token exceeds this (0 = off)");
  cmd->add_option("--max-outstanding", cli->max_outstanding,
                  "Accepted, unfinished sequences before HTTP 429")
      ->capture_default_str();
  cmd->add_option("--queue-timeout-ms", cli->queue_timeout_ms,
                  "Fail a request that finds no live worker for this long")
      ->capture_default_str();
  cmd->add_option("--heartbeat-ms", cli->heartbeat_ms, "Heartbeat between processes")
      ->capture_default_str();
  cmd->add_option("--dead-after-ms", cli->dead_after_ms,
                  "A node process silent (no heartbeat) for this long is dead: its workers are "
                  "restarted and their requests migrate")
      ->capture_default_str()
      ->check(CLI::Range(100u, 3'600'000u));
  cmd->add_option(
         "--stall-ms", cli->stall_ms,
         "A worker with work and no engine step (or no load report) for this long is hung: "
         "its requests migrate and its process is killed and relaunched. The floor: the limit "
         "is 4x the longest step the workers measured they may take when that is longer")
      ->capture_default_str()
      ->check(CLI::Range(500u, 600'000u));
  cmd->add_option("--connection-timeout-ms", cli->connection_timeout_ms,
                  "A silent connection is dropped after this")
      ->capture_default_str();
  cmd->add_option("--ready-timeout-s", cli->ready_timeout_s,
                  "Give up if the workers are not ready by then")
      ->capture_default_str();
  add_helper_sched_option(cmd, cli->helper_sched);
  cmd->add_option("--max-restarts", cli->max_restarts,
                  "Worker restarts (and node relaunches) allowed per minute")
      ->capture_default_str();
  cmd->callback([cli, cmd] {
    if (!cli->config_file.empty()) {
      if (auto st = apply_config_file(cmd, cli->config_file); !st.ok()) {
        spdlog::error("--config: {}", st.message);
        std::exit(2);
      }
    }
    // --workers sizes colocated serving; --prefill/--decode replace it: refuse both at once
    // (from flags or the config file) rather than drop one silently.
    auto given = [cmd](const char* name) { return cmd->get_option(name)->count() > 0; };
    if (given("--workers") && (given("--prefill") || given("--decode"))) {
      spdlog::error(
          "--workers (colocated) and --prefill/--decode (disaggregated) exclude each other");
      std::exit(2);
    }
    if (given("--no-pool-generated") && cli->cache_shards == 0) {
      spdlog::error("--no-pool-generated needs a pool (--cache-shards K)");
      std::exit(2);
    }
    std::exit(run_serve(*cli));
  });
}

}  // namespace weft::apps
