#include "actors/rl/remote_reference.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "actors/private_messages.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/rl_workers.hpp"
#include "actors/rl/trainer_wire.hpp"
#include "actors/roles.hpp"
#include "gpu/gguf.hpp"
#include "gpu/train/sft_run.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::rl {

using schema::envelope;
namespace wire = schema::wire;
using clock_type = std::chrono::steady_clock;
using gpu::train::train_batch;

std::string reference_worker_config::to_json() const {
  return nlohmann::json{{"worker", worker},
                        {"model_path", model_path},
                        {"threads", threads},
                        {"temperature", temperature},
                        {"device", device},
                        {"controller_host", controller_host},
                        {"controller_port", controller_port}}
      .dump();
}

result<reference_worker_config> reference_worker_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(errc::invalid_argument, "reference worker: config is not a JSON object");
  }
  reference_worker_config c;
  try {
    c.worker = j.value("worker", c.worker);
    c.model_path = j.at("model_path").get<std::string>();
    c.threads = j.value("threads", c.threads);
    c.temperature = j.value("temperature", c.temperature);
    c.device = j.value("device", c.device);
    c.controller_host = j.value("controller_host", c.controller_host);
    c.controller_port = j.value("controller_port", c.controller_port);
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument, std::string{"reference worker: "} + e.what());
  }
  if (c.worker < 0 || c.worker > 4095 || c.model_path.empty() || c.threads < 1 ||
      c.threads > 4096 || !(c.temperature > 0.0f) || c.controller_port == 0 || c.device.empty() ||
      c.device.size() > 64) {
    return make_error(errc::invalid_argument,
                      "reference worker: worker " + std::to_string(c.worker) + ", threads " +
                          std::to_string(c.threads) + ", controller port " +
                          std::to_string(c.controller_port) +
                          " out of range (or no model or device, or a temperature <= 0)");
  }
  return c;
}

namespace {

/// What a ReferenceWork may hold: a whole group's packed tokens (up to the envelope's size).
schema::decode_limits work_limits() {
  schema::decode_limits l;
  l.max_size_bytes = schema::max_wire_envelope_bytes;
  l.traversal_limit_words = schema::max_wire_envelope_bytes / 8;
  l.max_list_elements = schema::max_wire_envelope_bytes / 4;
  return l;
}

// -- the worker -----------------------------------------------------------------------------------

/// Loads the model, says hello, then computes the batches in arrival order on its own thread.
void worker_loop(reference_worker_config cfg, std::shared_ptr<worker_inbox> shared, caf::actor self,
                 caf::actor controller) {
  gpu::train::use_threads(cfg.threads);
  std::unique_ptr<gpu::device> dev;  // declared first: outlives the model that uses it
  std::unique_ptr<gpu::train::trainable_model<float>> model;
  int64_t vocab = 0;
  std::string error;
  auto opened_dev = gpu::train::open_training_device(cfg.device);
  if (!opened_dev) {
    error = opened_dev.error().message();
  } else if (auto opened = gpu::gguf_file::open(cfg.model_path); !opened) {
    error = cfg.model_path + ": " + opened.error().message();
  } else if (auto m = gpu::train::trainable_model<float>::load(*opened); !m) {
    error = cfg.model_path + ": " + m.error().message();
  } else {
    dev = std::move(*opened_dev);
    model = std::move(*m);
    model->set_logit_temperature(cfg.temperature);
    // On a device as the in-process reference is (gpu/rl/reference.cpp): weights uploaded,
    // forward there, log-probs back.
    if (auto st = dev ? model->use_device(dev.get()) : gpu::status{}; !st)
      error = "--device " + cfg.device + ": " + st.message();
    for (const auto& p : std::as_const(*model).parameters()) {
      if (p.name == "token_embd.weight") vocab = p.ne[1];
    }
    if (vocab <= 0) error = cfg.model_path + ": no token_embd.weight";
  }
  std::random_device rd;
  const uint64_t incarnation = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  caf::send_as(self, controller, rf_hello_atom::value,
               envelope::build<wire::ReferenceHello>([&](wire::ReferenceHello::Builder b) {
                 b.setWorker(static_cast<uint32_t>(cfg.worker));
                 b.setPid(static_cast<uint32_t>(::getpid()));
                 b.setIncarnation(incarnation);
                 b.setError(error);
               }));
  if (!error.empty()) {
    spdlog::error("reference worker {}: {}", cfg.worker, error);
    return;  // the controller ends the run with the error; nothing to restart
  }
  spdlog::info("reference worker {}: {} loaded ({} threads, on {})", cfg.worker, cfg.model_path,
               cfg.threads, dev ? cfg.device : std::string{"the host"});
  for (;;) {
    auto env = shared->next();
    if (!env) return;
    auto w = env->read<wire::ReferenceWork>(work_limits());
    if (!w) continue;  // validated by the actor already
    const uint64_t id = w->get().getId();
    std::string why;
    std::vector<float> lp;
    try {
      auto b = read_batch(w->get().getBatch(), vocab);
      if (!b) {
        why = b.error().message;
      } else if (auto r = model->target_logprobs(*b); !r) {
        why = r.error().message();
      } else {
        lp = std::move(*r);
      }
    } catch (const kj::Exception& e) {
      why = std::string{"a malformed batch: "} + e.getDescription().cStr();
    }
    auto out = envelope::build<wire::ReferenceResult>([&](wire::ReferenceResult::Builder r) {
      r.setId(id);
      if (!why.empty()) {
        r.setError(why);
        return;
      }
      auto list = r.initLogp(static_cast<unsigned>(lp.size()));
      for (size_t i = 0; i < lp.size(); ++i) list.set(static_cast<unsigned>(i), lp[i]);
    });
    if (!why.empty()) spdlog::warn("reference worker {}: batch {}: {}", cfg.worker, id, why);
    caf::send_as(self, controller, rf_result_atom::value, std::move(out));
  }
}

// -- the controller -------------------------------------------------------------------------------

using event = worker_event;
using events = worker_events;

/// One batch of a call: sent to one worker at a time.
struct job {
  const train_batch* batch = nullptr;
  size_t targets = 0;  ///< log-probs expected
  int worker = -1;     ///< -1: waiting for a worker; -2: done
  uint64_t id = 0;     ///< the ReferenceWork id it was last sent as
  clock_type::time_point deadline;
};

}  // namespace

struct remote_reference::impl {
  remote_reference_config cfg;
  std::shared_ptr<events> queue = std::make_shared<events>();
  caf::actor controller;

  worker_table workers;
  int64_t lost = 0, resent = 0;
  uint64_t next_id = 1;
  std::string fatal;  ///< a worker's model did not load

  mutable std::mutex status_mu;
  std::string status;

  void lose(int i, const std::string& why, std::vector<job>* jobs) {
    const int moved = lose_pool_worker(workers, i, jobs);
    if (moved < 0) return;
    ++lost;
    resent += moved;
    spdlog::warn("reference worker {} lost ({}): {} batch(es) to be sent again", i, why, moved);
  }

  void stop_worker(int i, const std::string& why, std::vector<job>* jobs) {
    caf::anon_send_exit(workers[static_cast<size_t>(i)].who, caf::exit_reason::kill);
    lose(i, why, jobs);
  }

  /// Applies hellos and deaths; results are returned for the caller to match.
  std::vector<event> drain(std::vector<job>* jobs) {
    std::deque<event> taken = queue->take();
    std::vector<event> results;
    for (auto& e : taken) {
      switch (e.what) {
        case event::type::hello: {
          auto h = e.env.read<wire::ReferenceHello>();
          if (!h) break;
          const uint32_t idx = h->get().getWorker();
          if (h->get().getError().size() > 0) {
            fatal = "reference worker " + std::to_string(idx) + ": " + h->get().getError().cStr();
            break;
          }
          workers.hello(idx, e.who, h->get().getPid(), "reference worker",
                        [&](int i, const std::string& why) { lose(i, why, jobs); });
          break;
        }
        case event::type::down: {
          const int i = workers.slot_of(e.from);
          if (i >= 0) lose(i, "its actor is down", jobs);
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
    j["workers_lost"] = lost;
    j["batches_resent"] = resent;
    j["workers"] = workers.to_json("batches");
    std::string text = j.dump();
    std::lock_guard<std::mutex> lock(status_mu);
    status = std::move(text);
  }

  void send(job& j, int w, const envelope& body) {
    j.worker = w;
    j.deadline = clock_type::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(cfg.batch_timeout_s * 1000.0));
    caf::send_as(controller, workers[static_cast<size_t>(w)].who, rf_work_atom::value, body);
  }
};

remote_reference::remote_reference(std::unique_ptr<impl> d) : d_(std::move(d)) {}

remote_reference::~remote_reference() {
  shutdown();
}

void remote_reference::shutdown() {
  if (d_) stop_worker_controller(d_->controller, d_->workers);
}

result<std::unique_ptr<remote_reference>> remote_reference::create(caf::actor_system& sys,
                                                                   remote_reference_config cfg) {
  auto d = std::make_unique<impl>();
  d->cfg = std::move(cfg);
  auto controller = spawn_worker_controller<rf_hello_atom, rf_result_atom, wire::ReferenceHello>(
      sys, d->cfg.workers, "reference workers", d->queue, d->workers, "reference controller");
  if (!controller) return controller.error();
  d->controller = std::move(*controller);
  d->refresh_status();
  return std::unique_ptr<remote_reference>(new remote_reference(std::move(d)));
}

caf::actor remote_reference::controller() const {
  return d_->controller;
}

status remote_reference::wait_ready(uint32_t timeout_ms) {
  return wait_workers_ready(
      d_->workers, "reference workers", timeout_ms,
      [&] {
        (void)d_->drain(nullptr);
        return d_->fatal;
      },
      [&] { d_->wait_a_little(); });
}

gpu::result<std::vector<std::vector<float>>> remote_reference::logprobs(
    std::span<const train_batch* const> batches) {
  std::vector<std::vector<float>> out(batches.size());
  if (batches.empty()) return out;
  impl& d = *d_;
  (void)d.drain(nullptr);
  // Each batch's message is built once and sent again as it is when its worker is lost.
  std::vector<job> jobs(batches.size());
  std::vector<envelope> bodies(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    jobs[i].batch = batches[i];
    jobs[i].targets = static_cast<size_t>(std::count_if(
        batches[i]->targets.begin(), batches[i]->targets.end(), [](int32_t t) { return t >= 0; }));
    jobs[i].id = d.next_id++;
    bodies[i] = envelope::build<wire::ReferenceWork>([&](wire::ReferenceWork::Builder w) {
      w.setId(jobs[i].id);
      write_batch(w.initBatch(), *batches[i], /*policy=*/false);
    });
    if (bodies[i].size_bytes() > schema::max_wire_envelope_bytes) {
      return gpu::status{gpu::status_code::invalid_argument,
                         "a reference batch of " + std::to_string(batches[i]->tokens.size()) +
                             " tokens does not fit a message (" +
                             std::to_string(schema::max_wire_envelope_bytes >> 20) +
                             " MiB): lower --micro-batch-tokens or --group-size"};
    }
  }
  size_t done = 0;
  pool_dispatch dispatch;
  while (done < jobs.size()) {
    for (auto& r : d.drain(&jobs)) {
      const int w = d.workers.slot_of(r.from);
      if (w < 0) continue;  // a lost worker's late answer
      auto res = r.env.read<wire::ReferenceResult>(work_limits());
      if (!res) {
        d.stop_worker(w, "a malformed result: " + res.error().message, &jobs);
        continue;
      }
      auto it = std::find_if(jobs.begin(), jobs.end(), [&](const job& j) {
        return j.worker == w && j.id == res->get().getId();
      });
      if (it == jobs.end()) continue;
      job& j = *it;
      const size_t at = static_cast<size_t>(it - jobs.begin());
      if (res->get().getError().size() > 0) {
        return gpu::status{gpu::status_code::internal, "reference worker " + std::to_string(w) +
                                                           " (batch " + std::to_string(at) +
                                                           " of " + std::to_string(jobs.size()) +
                                                           "): " + res->get().getError().cStr()};
      }
      auto lp = res->get().getLogp();
      if (lp.size() != j.targets) {
        d.stop_worker(w,
                      "answered " + std::to_string(lp.size()) + " log-probs for " +
                          std::to_string(j.targets) + " targets",
                      &jobs);
        continue;
      }
      out[at].resize(lp.size());
      for (unsigned i = 0; i < lp.size(); ++i) out[at][i] = lp[i];
      j.worker = -2;
      ++d.workers[static_cast<size_t>(w)].done;
      ++done;
    }
    if (!d.fatal.empty()) return gpu::status{gpu::status_code::invalid_argument, d.fatal};
    const std::string none = dispatch.round(
        jobs, d.workers, d.cfg.no_worker_timeout_ms, "reference worker",
        [&](int w) { d.stop_worker(w, "no answer within its deadline", &jobs); },
        [&](size_t i, int w) { d.send(jobs[i], w, bodies[i]); });
    if (!none.empty()) return gpu::status{gpu::status_code::internal, none};
    if (done < jobs.size()) d.wait_a_little();
  }
  d.refresh_status();
  return out;
}

int64_t remote_reference::workers_lost() const {
  return d_->lost;
}

int64_t remote_reference::batches_resent() const {
  return d_->resent;
}

std::string remote_reference::status_json() const {
  std::lock_guard<std::mutex> lock(d_->status_mu);
  return d_->status;
}

void add_reference_worker_role(actors::role_registry& roles) {
  roles.add("rl_reference",
            [](caf::actor_system& sys, const actors::role_context& ctx) -> result<caf::actor> {
              auto cfg = reference_worker_config::from_json(ctx.config_json);
              if (!cfg) return cfg.error();
              const reference_worker_config c = *cfg;
              return sys.spawn<caf::detached>(
                  worker_actor<rf_work_atom, wire::ReferenceWork>, "reference worker", ctx.name,
                  c.controller_host, c.controller_port, work_limits(),
                  [c](std::shared_ptr<worker_inbox> in, caf::actor self, caf::actor ctrl) {
                    worker_loop(c, std::move(in), std::move(self), std::move(ctrl));
                  });
            });
}

}  // namespace weft::rl
