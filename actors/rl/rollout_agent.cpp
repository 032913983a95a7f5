#include "actors/rl/rollout_agent.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "actors/private_messages.hpp"
#include "actors/rl/remote_reference.hpp"
#include "actors/rl/remote_rewards.hpp"
#include "actors/rl/remote_tools.hpp"
#include "actors/rl/remote_trainers.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/weight_image.hpp"
#include "actors/roles.hpp"
#include "actors/runtime.hpp"
#include "gpu/cpu/thread_class.hpp"
#include "gpu/ggml_types.hpp"
#include "gpu/rl/rollout_backend.hpp"
#include "gpu/tokenizer.hpp"
#include "schema/caf_bridge.hpp"
#include "transport/engine.hpp"

namespace weft::rl {

using schema::envelope;
namespace wire = schema::wire;

namespace test_hooks {
std::atomic<int> corrupt_routes{0};
}  // namespace test_hooks

std::string rollout_agent_config::to_json() const {
  return nlohmann::json{{"model_path", model_path},
                        {"agent", agent},
                        {"weight_type", weight_type},
                        {"device", device},
                        {"threads", threads},
                        {"max_sequences", max_sequences},
                        {"max_new_tokens", max_new_tokens},
                        {"max_running", max_running},
                        {"priority", priority},
                        {"record_routes", record_routes},
                        {"controller_host", controller_host},
                        {"controller_port", controller_port}}
      .dump();
}

result<rollout_agent_config> rollout_agent_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(errc::invalid_argument, "rollout agent: config is not a JSON object");
  }
  rollout_agent_config c;
  try {
    c.model_path = j.at("model_path").get<std::string>();
    c.agent = j.value("agent", c.agent);
    c.weight_type = j.value("weight_type", c.weight_type);
    c.device = j.value("device", c.device);
    c.threads = j.value("threads", c.threads);
    c.max_sequences = j.value("max_sequences", c.max_sequences);
    c.max_new_tokens = j.value("max_new_tokens", c.max_new_tokens);
    c.max_running = j.value("max_running", c.max_running);
    c.priority = j.value("priority", c.priority);
    c.record_routes = j.value("record_routes", c.record_routes);
    c.controller_host = j.value("controller_host", c.controller_host);
    c.controller_port = j.value("controller_port", c.controller_port);
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument, std::string{"rollout agent: "} + e.what());
  }
  const auto type = gpu::parse_type_name(c.weight_type);
  if (c.agent < 0 || c.agent > 4095 || c.threads < 1 || c.threads > 1024 || c.max_sequences < 1 ||
      c.max_sequences > 1 << 20 || c.max_running < 0 || c.max_running > 1 << 20 ||
      c.max_new_tokens < 1 || c.controller_port == 0 || !type ||
      !gpu::rl::is_rollout_weight_type(*type)) {
    return make_error(errc::invalid_argument,
                      "rollout agent: agent " + std::to_string(c.agent) + ", " +
                          std::to_string(c.threads) + " threads, weight type " + c.weight_type +
                          ", controller port " + std::to_string(c.controller_port) +
                          " out of range");
  }
  return c;
}

namespace {

/// What the actor and its engine thread share.
struct agent_shared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<caf::atom_value, envelope>> inbox;  ///< from the controller, in order
  bool abort = false;
};

/// The engine thread of one agent.
class agent_loop {
 public:
  agent_loop(rollout_agent_config cfg, std::string name,
             std::shared_ptr<transport::engine> transport, std::shared_ptr<agent_shared> shared,
             caf::actor self, caf::actor controller)
      : cfg_(std::move(cfg)),
        name_(std::move(name)),
        transport_(std::move(transport)),
        shared_(std::move(shared)),
        self_(std::move(self)),
        controller_(std::move(controller)),
        receiver_(*transport_) {}

  void run() {
    auto st = serve();
    if (aborted() || st.ok()) return;
    spdlog::error("rollout agent {}: {}", name_, st.message);
    caf::send_as(self_, self_, r_failed_atom::value, st.message);
  }

 private:
  bool aborted() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    return shared_->abort;
  }

  status load() {
    const auto t0 = std::chrono::steady_clock::now();
    auto file = gpu::gguf_file::open(cfg_.model_path);
    if (!file) {
      return make_error(errc::invalid_argument,
                        "cannot open " + cfg_.model_path + ": " + file.error().message());
    }
    auto tok = gpu::tokenizer::from_gguf(*file);
    if (!tok) return make_error(errc::invalid_argument, tok.error().message());
    tok_ = std::make_unique<gpu::tokenizer>(std::move(*tok));
    // The trainer starts from the file's weights dequantized to f32; the agent serves exactly
    // those (as the run's rollout type) until the first version arrives.
    auto weights = gpu::train::trainable_model<float>::load(*file);
    if (!weights) return make_error(errc::invalid_argument, weights.error().message());
    gpu::rl::rollout_engine_params p;
    p.max_sequences = cfg_.max_sequences;
    p.max_new_tokens = cfg_.max_new_tokens;
    p.weight_type = *gpu::parse_type_name(cfg_.weight_type);
    p.device = cfg_.device;
    p.threads = cfg_.threads;
    p.max_running = cfg_.max_running;
    p.priority = cfg_.priority;
    p.record_routes = cfg_.record_routes;
    auto dev = gpu::device_registry::instance().open(p.device, p.threads);
    if (!dev) {
      return make_error(errc::invalid_argument,
                        "rollout device " + p.device + ": " + dev.error().message());
    }
    dev_ = std::move(*dev);
    auto m = gpu::rl::load_rollout_model(*file, **weights, p, *dev_);
    if (!m) return make_error(errc::invalid_argument, m.error().message());
    model_ = std::move(*m);
    weights->reset();
    gpu::engine_config ec = gpu::rl::rollout_engine_config(*model_, p);
    const gpu::tokenizer* tk = tok_.get();
    ec.detokenize = [tk](int32_t id) { return tk->token_to_piece(id); };
    auto e = gpu::engine::create(*model_, ec);
    if (!e) return make_error(errc::internal, e.error().message());
    engine_ = std::move(*e);
    spdlog::info("rollout agent {}: {} loaded ({} weights on {}, {} KV blocks) in {:.1f} s", name_,
                 cfg_.model_path, cfg_.weight_type, cfg_.device, ec.kv_blocks,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return {};
  }

  status serve() {
    if (auto st = load(); !st.ok()) {
      // Said to the controller first: a run that cannot start its agents ends with the reason
      // instead of waiting while the supervisor restarts them into the same error.
      caf::send_as(
          self_, controller_, r_hello_atom::value,
          envelope::build<wire::RolloutAgentHello>([&](wire::RolloutAgentHello::Builder b) {
            b.setAgent(static_cast<uint32_t>(cfg_.agent));
            b.setPid(static_cast<uint32_t>(::getpid()));
            b.setError(st.message);
          }));
      return st;
    }
    auto address = transport_->local_address();
    if (!address) return make_error(errc::unavailable, "transport: " + address.error().message);
    std::random_device rd;
    const uint64_t incarnation = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    caf::send_as(self_, controller_, r_hello_atom::value,
                 envelope::build<wire::RolloutAgentHello>([&](wire::RolloutAgentHello::Builder b) {
                   b.setAgent(static_cast<uint32_t>(cfg_.agent));
                   b.setAddress(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(address->data()),
                                             address->size()));
                   b.setVersion(version_);
                   b.setPid(static_cast<uint32_t>(::getpid()));
                   b.setIncarnation(incarnation);
                 }));
    for (;;) {
      std::deque<std::pair<caf::atom_value, envelope>> inbox;
      {
        std::unique_lock<std::mutex> lock(shared_->mu);
        shared_->cv.wait(
            lock, [&] { return shared_->abort || !shared_->inbox.empty() || engine_->has_work(); });
        if (shared_->abort) return {};
        inbox.swap(shared_->inbox);
      }
      for (auto& [what, env] : inbox) {
        if (auto st = handle(what, env); !st.ok()) return st;
      }
      if (engine_->has_work() || !failed_.empty()) {
        if (auto st = step(); !st.ok()) return st;
      }
    }
  }

  status handle(caf::atom_value what, const envelope& env) {
    if (what == r_batch_atom::value) {
      auto b = env.read<wire::RolloutBatch>();
      if (!b) return {};  // validated by the actor already
      for (auto item : b->get().getItems()) {
        gpu::sampling_params sp;
        if (!item.getGreedy()) {
          sp.temperature = item.getTemperature();
          sp.top_p = item.getTopP();
          sp.top_k = item.getTopK();
          sp.tempered_logprobs = true;
        }
        sp.seed = item.getSeed();
        sp.max_tokens = item.getMaxTokens();
        sp.priority = item.getPriority();
        for (int32_t t : item.getStopTokens()) sp.stop_tokens.push_back(t);
        bool stops_ok = item.getStopStrings().size() <= 8;
        for (auto t : item.getStopStrings()) {
          stops_ok = stops_ok && t.size() >= 1 && t.size() <= 64;
          if (stops_ok) sp.stop_strings.emplace_back(t.cStr(), t.size());
        }
        std::vector<int32_t> tokens;
        tokens.reserve(item.getTokens().size());
        for (int32_t t : item.getTokens()) tokens.push_back(t);
        const int64_t replay = item.getReplay();
        const bool sampling_ok =
            item.getGreedy() ||
            (std::isfinite(sp.temperature) && sp.temperature > 0.0f && sp.temperature <= 100.0f &&
             sp.top_p > 0.0f && sp.top_p <= 1.0f && sp.top_k >= 0);
        auto st = !stops_ok      ? gpu::status{gpu::status_code::invalid_argument,
                                          "rollout: at most 8 stop strings of 1 to 64 bytes"}
                  : !sampling_ok ? gpu::status{gpu::status_code::invalid_argument,
                                               "rollout: bad sampling parameters (temperature " +
                                                   std::to_string(sp.temperature) + ", top-p " +
                                                   std::to_string(sp.top_p) + ", top-k " +
                                                   std::to_string(sp.top_k) + ")"}
                  : replay > 0
                      ? engine_->add_resumed_request(item.getId(), std::move(tokens), replay,
                                                     std::move(sp))
                      : engine_->add_request(item.getId(), std::move(tokens), std::move(sp));
        if (!st) {
          // A bad request is the request's error, not the agent's.
          gpu::request_output o;
          o.id = item.getId();
          o.finish = gpu::finish_reason::error;
          o.error = st.message();
          failed_.push_back(std::move(o));
        }
      }
      return {};
    }
    if (what == r_abort_atom::value) {
      auto a = env.read<wire::RolloutAbort>();
      if (!a) return {};
      for (uint64_t id : a->get().getIds()) (void)engine_->abort(id);  // unknown: finished already
      return {};
    }
    if (what == r_offer_atom::value) return apply_offer(env);
    return {};
  }

  status apply_offer(const envelope& env) {
    auto o = env.read<wire::WeightOffer>();
    if (!o) return {};
    const int64_t version = o->get().getVersion();
    const auto t0 = std::chrono::steady_clock::now();
    std::string why;
    double pull_s = 0.0, apply_s = 0.0;
    auto tensors = receiver_.pull(o->get());
    if (!tensors) {
      why = tensors.error().message;
    } else {
      const auto t1 = std::chrono::steady_clock::now();
      pull_s = std::chrono::duration<double>(t1 - t0).count();
      // Pulled and checksummed: peers may pull the version from the buffer while it is applied
      // here (--weight-fanout's tree then moves on at the speed of the pulls).
      send_ack(version, {}, pull_s, 0.0, true);
      auto st = gpu::rl::apply_weights(*model_, *engine_, version, *tensors);
      apply_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      if (!st) {
        // Half-written weights: this engine cannot serve any version any more.
        return make_error(errc::internal, "applying weight version " + std::to_string(version) +
                                              ": " + st.message());
      }
      version_ = version;
      spdlog::debug("rollout agent {}: weight version {} pulled in {:.3f} s, applied in {:.3f} s",
                    name_, version, pull_s, apply_s);
    }
    // Applied: the buffer holds this version until the next pull; peers may pull it from here.
    send_ack(version, why, pull_s, apply_s, false);
    return {};
  }

  /// The acknowledgement of weight `version` (`why`: its error, empty on success); `pulled`: the
  /// version is pulled and verified but not applied yet. On success it says where peers can
  /// pull the version from (this agent's address and buffer).
  void send_ack(int64_t version, const std::string& why, double pull_s, double apply_s,
                bool pulled) {
    transport::bytes address, region;
    if (why.empty()) {
      auto a = transport_->local_address();
      if (a) address = std::move(*a);
      region = receiver_.describe();
    }
    caf::send_as(self_, controller_, r_ack_atom::value,
                 envelope::build<wire::WeightAck>([&](wire::WeightAck::Builder b) {
                   b.setAgent(static_cast<uint32_t>(cfg_.agent));
                   b.setVersion(version);
                   b.setError(why);
                   b.setPullSeconds(pull_s);
                   b.setApplySeconds(apply_s);
                   b.setAddress(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(address.data()),
                                             address.size()));
                   b.setRegion(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(region.data()),
                                            region.size()));
                   b.setPulled(pulled);
                 }));
  }

  status step() {
    gpu::result<std::vector<gpu::request_output>> outputs = std::vector<gpu::request_output>{};
    if (engine_->has_work()) outputs = engine_->step();
    if (!outputs) return make_error(errc::internal, "engine step: " + outputs.error().message());
    for (auto& o : failed_) outputs->push_back(std::move(o));
    failed_.clear();
    if (outputs->empty()) return {};
    auto env = envelope::build<wire::RolloutProgress>([&](wire::RolloutProgress::Builder b) {
      b.setAgent(static_cast<uint32_t>(cfg_.agent));
      b.setVersion(version_ < 0 ? 0 : version_);
      auto list = b.initOutputs(static_cast<unsigned>(outputs->size()));
      for (size_t i = 0; i < outputs->size(); ++i) {
        const gpu::request_output& o = (*outputs)[i];
        auto x = list[static_cast<unsigned>(i)];
        x.setId(o.id);
        auto toks = x.initTokens(static_cast<unsigned>(o.new_tokens.size()));
        auto lps = x.initLogprobs(static_cast<unsigned>(o.new_tokens.size()));
        for (size_t k = 0; k < o.new_tokens.size(); ++k) {
          toks.set(static_cast<unsigned>(k), o.new_tokens[k]);
          lps.set(static_cast<unsigned>(k), k < o.samples.size() ? o.samples[k].logprob : 0.0f);
        }
        x.setText(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(o.text_delta.data()),
                               o.text_delta.size()));
        x.setFinish(static_cast<uint8_t>(o.finish));
        x.setStopToken(o.stop_sample.token);
        x.setStopLogprob(o.stop_sample.logprob);
        x.setError(o.error);
        x.setCachedPromptTokens(
            static_cast<uint32_t>(std::max<int64_t>(0, o.cached_prompt_tokens)));
        if (!o.routes.empty()) {
          auto r = x.initRoutes(static_cast<unsigned>(o.routes.size()));
          std::copy(o.routes.begin(), o.routes.end(), r.begin());
          int left = test_hooks::corrupt_routes.load();
          while (left > 0 && !test_hooks::corrupt_routes.compare_exchange_weak(left, left - 1)) {
          }
          if (left > 0) r[0] = 255;
        }
      }
    });
    caf::send_as(self_, controller_, r_tokens_atom::value, std::move(env));
    return {};
  }

  rollout_agent_config cfg_;
  std::string name_;
  std::shared_ptr<transport::engine> transport_;
  std::shared_ptr<agent_shared> shared_;
  caf::actor self_;
  caf::actor controller_;
  weight_receiver receiver_;
  std::unique_ptr<gpu::tokenizer> tok_;
  std::unique_ptr<gpu::device> dev_;
  std::unique_ptr<gpu::model> model_;
  std::unique_ptr<gpu::engine> engine_;
  std::vector<gpu::request_output> failed_;  ///< requests refused at add, reported next step
  int64_t version_ = -1;                     ///< -1: the model file's weights (the run's version 0)
};

caf::behavior rollout_agent_actor(caf::event_based_actor* self, std::string name,
                                  rollout_agent_config cfg,
                                  std::shared_ptr<transport::engine> transport) {
  // Detached: connecting blocks only this actor's own thread, which runs the rollouts.
  gpu::cpu::enter_compute_class();
  auto controller = connect_to_controller(self->system(), cfg.controller_host, cfg.controller_port);
  if (!controller) {
    spdlog::error("rollout agent {}: the controller: {}", name, controller.error().message);
    self->quit(caf::make_error(caf::sec::runtime_error, controller.error().message));
    return {};
  }
  caf::actor ctrl = *controller;
  self->monitor(ctrl);
  auto shared = std::make_shared<agent_shared>();
  auto loop = std::make_shared<agent_loop>(cfg, name, std::move(transport), shared,
                                           caf::actor_cast<caf::actor>(self), ctrl);
  auto thread = std::make_shared<std::thread>([loop] { loop->run(); });
  self->attach_functor([shared, thread](const caf::error&) {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->abort = true;
    }
    shared->cv.notify_all();
    if (thread->joinable()) thread->join();
  });
  self->set_down_handler([self, name, ctrl](const caf::down_msg& dm) {
    if (dm.source == ctrl.address()) {
      spdlog::warn("rollout agent {}: the controller is gone; stopping", name);
      self->quit(caf::exit_reason::user_shutdown);
    }
  });
  const auto from_controller = [self, ctrl] {
    const auto& s = self->current_sender();
    return s && s->address() == ctrl.address();
  };
  // Only the controller is obeyed, and only well-formed messages reach the engine thread.
  auto enqueue = [shared](caf::atom_value what, const envelope& env) {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->inbox.emplace_back(what, env);
    }
    shared->cv.notify_all();
  };
  return {
      [from_controller, enqueue, name](r_batch_atom a, const envelope& env) {
        if (!from_controller()) return;
        if (auto b = env.read<wire::RolloutBatch>(); !b) {
          spdlog::warn("rollout agent {}: bad batch: {}", name, b.error().message);
          return;
        }
        enqueue(a, env);
      },
      [from_controller, enqueue](r_abort_atom a, const envelope& env) {
        if (from_controller() && env.read<wire::RolloutAbort>()) enqueue(a, env);
      },
      [from_controller, enqueue, name](r_offer_atom a, const envelope& env) {
        if (!from_controller()) return;
        if (auto o = env.read<wire::WeightOffer>(); !o) {
          spdlog::warn("rollout agent {}: bad weight offer: {}", name, o.error().message);
          return;
        }
        enqueue(a, env);
      },
      [self](r_failed_atom, const std::string& why) {
        if (!actors::from_self(self)) return;
        self->quit(caf::make_error(caf::sec::runtime_error, why));
      },
  };
}

}  // namespace

void add_rl_roles(actors::role_registry& roles) {
  add_reward_worker_role(roles);
  add_rl_trainer_role(roles);
  add_reference_worker_role(roles);
  add_tool_worker_role(roles);
  roles.add("rollout_agent",
            [](caf::actor_system& sys, const actors::role_context& ctx) -> result<caf::actor> {
              auto cfg = rollout_agent_config::from_json(ctx.config_json);
              if (!cfg) return cfg.error();
              if (ctx.engine == nullptr || !ctx.engine->caps().one_sided) {
                return make_error(errc::invalid_argument,
                                  "rollout agent: weight pulls need the node's transport with "
                                  "one-sided gets (start the node with --transport ucx)");
              }
              return sys.spawn<caf::detached>(rollout_agent_actor, ctx.name, std::move(cfg.value()),
                                              ctx.engine);
            });
}

}  // namespace weft::rl
