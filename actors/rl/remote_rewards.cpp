#include "actors/rl/remote_rewards.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "actors/private_messages.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/rl_workers.hpp"
#include "actors/roles.hpp"
#include "actors/runtime.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::rl {

using schema::envelope;
namespace wire = schema::wire;
using clock_type = std::chrono::steady_clock;

std::string reward_worker_config::to_json() const {
  return nlohmann::json{{"worker", worker},
                        {"command", command},
                        {"procs", procs},
                        {"timeout_s", timeout_s},
                        {"max_restarts", max_restarts},
                        {"controller_host", controller_host},
                        {"controller_port", controller_port}}
      .dump();
}

result<reward_worker_config> reward_worker_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(errc::invalid_argument, "reward worker: config is not a JSON object");
  }
  reward_worker_config c;
  try {
    c.worker = j.value("worker", c.worker);
    c.command = j.at("command").get<std::string>();
    c.procs = j.value("procs", c.procs);
    c.timeout_s = j.value("timeout_s", c.timeout_s);
    c.max_restarts = j.value("max_restarts", c.max_restarts);
    c.controller_host = j.value("controller_host", c.controller_host);
    c.controller_port = j.value("controller_port", c.controller_port);
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument, std::string{"reward worker: "} + e.what());
  }
  if (c.worker < 0 || c.worker > 4095 || c.command.empty() || !(c.timeout_s > 0.0) ||
      c.timeout_s > 86400.0 || c.max_restarts < 0 || c.max_restarts > 1000 || c.procs < 1 ||
      c.procs > 64 || c.controller_port == 0) {
    return make_error(errc::invalid_argument,
                      "reward worker: worker " + std::to_string(c.worker) + ", " +
                          std::to_string(c.procs) + " copies, timeout " +
                          std::to_string(c.timeout_s) + " s, controller port " +
                          std::to_string(c.controller_port) + " out of range (or no command)");
  }
  return c;
}

namespace {

// -- the worker
// ------------------------------------------------------------------------------------

/// Says hello, then scores batches one after the other on its own thread (the reward program may
/// take seconds), each split over the program's copies.
void worker_loop(reward_worker_config cfg, std::shared_ptr<worker_inbox> shared, caf::actor self,
                 caf::actor controller) {
  gpu::rl::reward_process_pool rewards(
      gpu::rl::reward_process_config{cfg.command, cfg.timeout_s, cfg.max_restarts}, cfg.procs);
  std::random_device rd;
  const uint64_t incarnation = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  caf::send_as(self, controller, w_hello_atom::value,
               envelope::build<wire::RewardWorkerHello>([&](wire::RewardWorkerHello::Builder b) {
                 b.setWorker(static_cast<uint32_t>(cfg.worker));
                 b.setPid(static_cast<uint32_t>(::getpid()));
                 b.setIncarnation(incarnation);
               }));
  spdlog::info("reward worker {}: runs `{}`{}", cfg.worker, cfg.command,
               cfg.procs > 1 ? " (" + std::to_string(cfg.procs) + " copies)" : std::string{});
  for (;;) {
    auto env = shared->next();
    if (!env) return;
    auto b = env->read<wire::RewardBatch>();
    if (!b) continue;  // validated by the actor already
    std::vector<gpu::rl::reward_request> items;
    for (auto it : b->get().getItems()) {
      auto text = [](capnp::Data::Reader d) {
        return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
      };
      items.push_back({text(it.getPrompt()), text(it.getCompletion()), text(it.getAnswer())});
    }
    auto scored = rewards.score_split(items);
    const uint64_t batch = b->get().getBatch();
    auto out = envelope::build<wire::RewardResult>([&](wire::RewardResult::Builder r) {
      r.setBatch(batch);
      if (!scored) {
        const std::string m = scored.error().message();
        r.setError(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(m.data()), m.size()));
        return;
      }
      auto list = r.initRewards(static_cast<unsigned>(scored->size()));
      for (size_t i = 0; i < scored->size(); ++i) list.set(static_cast<unsigned>(i), (*scored)[i]);
    });
    if (!scored) spdlog::warn("reward worker {}: {}", cfg.worker, scored.error().message());
    caf::send_as(self, controller, w_result_atom::value, std::move(out));
  }
}

// -- the controller -------------------------------------------------------------------------------

using event = worker_event;
using events = worker_events;

/// A part of a batch: items [begin, end), scored by one worker.
struct part {
  size_t begin = 0, end = 0;
  int worker = -1;  ///< -1: waiting for a worker
  uint64_t id = 0;  ///< the RewardBatch id it was last sent as
  clock_type::time_point deadline;
};

/// Parts hold at most this many bytes of text, so a message stays far below the envelope limit.
constexpr size_t part_bytes = 256 << 10;

}  // namespace

struct remote_rewards::impl {
  remote_rewards_config cfg;
  std::shared_ptr<events> queue = std::make_shared<events>();
  caf::actor controller;

  worker_table workers;
  /// Written by the thread that scores (the loop's reward thread), read by any.
  std::atomic<int64_t> lost{0}, rescored{0};
  uint64_t next_id = 1;

  mutable std::mutex status_mu;
  std::string status;

  void lose(int i, const std::string& why, std::vector<part>* parts) {
    const int moved = lose_pool_worker(workers, i, parts);
    if (moved < 0) return;
    ++lost;
    rescored += moved;
    spdlog::warn("reward worker {} lost ({}): {} part(s) to be scored again", i, why, moved);
  }

  void stop_worker(int i, const std::string& why, std::vector<part>* parts) {
    caf::anon_send_exit(workers[static_cast<size_t>(i)].who, caf::exit_reason::kill);
    lose(i, why, parts);
  }

  /// Applies hellos and deaths; results are returned for the caller to match.
  std::vector<event> drain(std::vector<part>* parts) {
    std::deque<event> taken = queue->take();
    std::vector<event> results;
    for (auto& e : taken) {
      switch (e.what) {
        case event::type::hello: {
          auto h = e.env.read<wire::RewardWorkerHello>();
          if (!h) break;
          workers.hello(h->get().getWorker(), e.who, h->get().getPid(), "reward worker",
                        [&](int i, const std::string& why) { lose(i, why, parts); });
          break;
        }
        case event::type::down: {
          const int i = workers.slot_of(e.from);
          if (i >= 0) lose(i, "its actor is down", parts);
          break;
        }
        case event::type::result:
          results.push_back(std::move(e));
          break;
      }
    }
    refresh_status();
    return results;
  }

  void wait_a_little() {
    queue->wait_for(std::chrono::milliseconds(100));
    if (cfg.on_idle) cfg.on_idle();
  }

  void refresh_status() {
    nlohmann::json j;
    j["workers_lost"] = lost.load();
    j["parts_rescored"] = rescored.load();
    j["workers"] = workers.to_json("parts");
    std::string text = j.dump();
    std::lock_guard<std::mutex> lock(status_mu);
    status = std::move(text);
  }

  void send(part& p, int w, std::span<const gpu::rl::reward_request> items) {
    p.worker = w;
    p.id = next_id++;
    p.deadline = clock_type::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(cfg.part_timeout_s * 1000.0));
    auto env = envelope::build<wire::RewardBatch>([&](wire::RewardBatch::Builder b) {
      b.setBatch(p.id);
      auto list = b.initItems(static_cast<unsigned>(p.end - p.begin));
      for (size_t i = p.begin; i < p.end; ++i) {
        auto x = list[static_cast<unsigned>(i - p.begin)];
        auto bytes = [](const std::string& s) {
          return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
        };
        x.setPrompt(bytes(items[i].prompt));
        x.setCompletion(bytes(items[i].completion));
        x.setAnswer(bytes(items[i].answer));
      }
    });
    caf::send_as(controller, workers[static_cast<size_t>(w)].who, w_batch_atom::value,
                 std::move(env));
  }
};

remote_rewards::remote_rewards(std::unique_ptr<impl> d) : d_(std::move(d)) {}

remote_rewards::~remote_rewards() {
  shutdown();
}

void remote_rewards::shutdown() {
  if (d_) stop_worker_controller(d_->controller, d_->workers);
}

result<std::unique_ptr<remote_rewards>> remote_rewards::create(caf::actor_system& sys,
                                                               remote_rewards_config cfg) {
  auto d = std::make_unique<impl>();
  d->cfg = std::move(cfg);
  auto controller = spawn_worker_controller<w_hello_atom, w_result_atom, wire::RewardWorkerHello>(
      sys, d->cfg.workers, "reward workers", d->queue, d->workers, "reward controller");
  if (!controller) return controller.error();
  d->controller = std::move(*controller);
  d->refresh_status();
  return std::unique_ptr<remote_rewards>(new remote_rewards(std::move(d)));
}

caf::actor remote_rewards::controller() const {
  return d_->controller;
}

status remote_rewards::wait_ready(uint32_t timeout_ms) {
  return wait_workers_ready(
      d_->workers, "reward workers", timeout_ms,
      [&] {
        (void)d_->drain(nullptr);
        return std::string{};
      },
      [&] { d_->wait_a_little(); });
}

gpu::result<std::vector<double>> remote_rewards::score(
    std::span<const gpu::rl::reward_request> items) {
  std::vector<double> out(items.size(), 0.0);
  if (items.empty()) return out;
  impl& d = *d_;
  (void)d.drain(nullptr);
  // Parts: as many as there are live workers (at least one), each under part_bytes.
  const size_t n_live = std::max<size_t>(1, d.workers.live().size());
  const size_t per = (items.size() + n_live - 1) / n_live;
  std::vector<part> parts;
  for (size_t b = 0; b < items.size();) {
    size_t e = b, bytes = 0;
    while (e < items.size() && e - b < per &&
           (e == b ||
            bytes + items[e].prompt.size() + items[e].completion.size() + items[e].answer.size() <=
                part_bytes)) {
      bytes += items[e].prompt.size() + items[e].completion.size() + items[e].answer.size();
      ++e;
    }
    parts.push_back(part{b, e, -1, 0, {}});
    b = e;
  }
  size_t done = 0;
  pool_dispatch dispatch;
  while (done < parts.size()) {
    for (auto& r : d.drain(&parts)) {
      const int w = d.workers.slot_of(r.from);
      if (w < 0) continue;  // a lost worker's late answer
      auto res = r.env.read<wire::RewardResult>();
      auto it = std::find_if(parts.begin(), parts.end(), [&](const part& p) {
        return res && p.worker == w && p.id == res->get().getBatch();
      });
      if (!res || it == parts.end()) {
        if (!res) d.stop_worker(w, "a malformed result: " + res.error().message, &parts);
        continue;
      }
      part& p = *it;
      if (res->get().hasError() && res->get().getError().size() > 0) {
        return gpu::status{
            gpu::status_code::invalid_argument,
            "reward worker " + std::to_string(w) + " (samples " + std::to_string(p.begin) + ".." +
                std::to_string(p.end - 1) + " of the batch, numbered from 0 below): " +
                std::string(reinterpret_cast<const char*>(res->get().getError().begin()),
                            res->get().getError().size())};
      }
      auto rewards = res->get().getRewards();
      if (rewards.size() != p.end - p.begin) {
        d.stop_worker(w,
                      "answered " + std::to_string(rewards.size()) + " rewards for " +
                          std::to_string(p.end - p.begin) + " samples",
                      &parts);
        continue;
      }
      for (size_t i = p.begin; i < p.end; ++i) out[i] = rewards[static_cast<unsigned>(i - p.begin)];
      p.worker = -2;  // done
      ++d.workers[static_cast<size_t>(w)].done;
      ++done;
    }
    // Deadlines, then (re)assignment of parts without a worker.
    const std::string none = dispatch.round(
        parts, d.workers, d.cfg.no_worker_timeout_ms, "reward worker",
        [&](int w) { d.stop_worker(w, "no answer within its deadline", &parts); },
        [&](size_t i, int w) { d.send(parts[i], w, items); });
    if (!none.empty()) return gpu::status{gpu::status_code::internal, none};
    if (done < parts.size()) d.wait_a_little();
  }
  d.refresh_status();  // the parts just scored
  return out;
}

int64_t remote_rewards::workers_lost() const {
  return d_->lost.load();
}

int64_t remote_rewards::parts_rescored() const {
  return d_->rescored.load();
}

std::string remote_rewards::status_json() const {
  std::lock_guard<std::mutex> lock(d_->status_mu);
  return d_->status;
}

void add_reward_worker_role(actors::role_registry& roles) {
  roles.add("reward_worker",
            [](caf::actor_system& sys, const actors::role_context& ctx) -> result<caf::actor> {
              auto cfg = reward_worker_config::from_json(ctx.config_json);
              if (!cfg) return cfg.error();
              const reward_worker_config c = *cfg;
              return sys.spawn<caf::detached>(
                  worker_actor<w_batch_atom, wire::RewardBatch>, "reward worker", ctx.name,
                  c.controller_host, c.controller_port, schema::decode_limits{},
                  [c](std::shared_ptr<worker_inbox> in, caf::actor self, caf::actor ctrl) {
                    worker_loop(c, std::move(in), std::move(self), std::move(ctrl));
                  });
            });
}

}  // namespace weft::rl
