// The ranks 1..K-1 of `weft rl --trainers K` (role "rl_trainer"): actors/rl/remote_trainers.hpp.
#include "actors/rl/remote_trainers.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "actors/private_messages.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/trainer_wire.hpp"
#include "actors/roles.hpp"
#include "actors/train/bucket_reducer.hpp"
#include "actors/train/device_sum.hpp"
#include "actors/train/local_rank.hpp"
#include "actors/train/rank_group.hpp"
#include "actors/train/train_atoms.hpp"
#include "gpu/cpu/thread_class.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/train/sft_run.hpp"
#include "schema/caf_bridge.hpp"
#include "transport/engine.hpp"
#include "transport/peer_group.hpp"
#include "transport/registry.hpp"

namespace weft::rl {

using schema::envelope;
namespace wire = schema::wire;
using clock_type = std::chrono::steady_clock;
using gpu::train::train_batch;
using train::t_done_atom;
using train::t_failed_atom;
using train::t_group_atom;
using train::t_hello_atom;

std::string rl_trainer_config::to_json() const {
  return nlohmann::json{{"model_path", model_path},
                        {"rank", rank},
                        {"world", world},
                        {"threads", threads},
                        {"shares", shares},
                        {"temperature", temperature},
                        {"clip_low", grpo.clip_low},
                        {"clip_high", grpo.clip_high},
                        {"correction", gpu::rl::off_policy_correction_name(grpo.correction)},
                        {"is_cap", grpo.is_cap},
                        {"kl_coef", grpo.kl_coef},
                        {"router_aux_loss_coef", grpo.router_aux_loss_coef},
                        {"beta1", adamw.beta1},
                        {"beta2", adamw.beta2},
                        {"eps", adamw.eps},
                        {"weight_decay", adamw.weight_decay},
                        {"allreduce_timeout_ms", allreduce_timeout_ms},
                        {"bucket_mb", bucket_mb},
                        {"device", device},
                        {"dist_backend", dist_backend},
                        {"collectives_engine", collectives_engine},
                        {"controller_host", controller_host},
                        {"controller_port", controller_port}}
      .dump();
}

result<rl_trainer_config> rl_trainer_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(errc::invalid_argument, "rl trainer: config is not a JSON object");
  }
  rl_trainer_config c;
  std::string correction = gpu::rl::off_policy_correction_name(c.grpo.correction);
  try {
    c.model_path = j.at("model_path").get<std::string>();
    c.rank = j.value("rank", c.rank);
    c.world = j.value("world", c.world);
    c.threads = j.value("threads", c.threads);
    c.shares = j.value("shares", c.shares);
    c.temperature = j.value("temperature", c.temperature);
    c.grpo.clip_low = j.value("clip_low", c.grpo.clip_low);
    c.grpo.clip_high = j.value("clip_high", c.grpo.clip_high);
    correction = j.value("correction", correction);
    c.grpo.is_cap = j.value("is_cap", c.grpo.is_cap);
    c.grpo.kl_coef = j.value("kl_coef", c.grpo.kl_coef);
    c.grpo.router_aux_loss_coef = j.value("router_aux_loss_coef", c.grpo.router_aux_loss_coef);
    c.adamw.beta1 = j.value("beta1", c.adamw.beta1);
    c.adamw.beta2 = j.value("beta2", c.adamw.beta2);
    c.adamw.eps = j.value("eps", c.adamw.eps);
    c.adamw.weight_decay = j.value("weight_decay", c.adamw.weight_decay);
    c.allreduce_timeout_ms = j.value("allreduce_timeout_ms", c.allreduce_timeout_ms);
    c.bucket_mb = j.value("bucket_mb", c.bucket_mb);
    c.device = j.value("device", c.device);
    c.dist_backend = j.value("dist_backend", c.dist_backend);
    c.collectives_engine = j.value("collectives_engine", c.collectives_engine);
    c.controller_host = j.value("controller_host", c.controller_host);
    c.controller_port = j.value("controller_port", c.controller_port);
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument, std::string{"rl trainer: "} + e.what());
  }
  if (!gpu::rl::parse_off_policy_correction(correction, c.grpo.correction)) {
    return make_error(errc::invalid_argument, "rl trainer: correction '" + correction + "'");
  }
  if (c.world < 2 || c.world > 256 || c.rank < 1 || c.rank >= c.world || c.threads < 1 ||
      c.threads > 4096 || c.shares < 1 || c.shares > 4096 || !(c.temperature > 0.0f) ||
      c.controller_port == 0 || c.allreduce_timeout_ms < 100 || c.model_path.empty() ||
      !(c.bucket_mb >= 0.0 && c.bucket_mb <= 1e6) || c.device.empty() || c.device.size() > 64 ||
      (c.device != "cpu" && c.bucket_mb > 0.0) ||
      (c.dist_backend != "auto" && c.dist_backend != "nccl" && c.dist_backend != "ucx") ||
      c.collectives_engine.empty() || c.collectives_engine.size() > 64) {
    return make_error(errc::invalid_argument, "rl trainer: rank " + std::to_string(c.rank) +
                                                  " of " + std::to_string(c.world) +
                                                  ", threads, shares, temperature, bucket_mb, "
                                                  "device, dist_backend or controller port out of "
                                                  "range (or no model; buckets need the host)");
  }
  return c;
}

namespace {

// -- a rank ---------------------------------------------------------------------------------------

/// What the rank's actor and its training thread share.
struct rl_rank_shared : train::rank_shared {
  std::deque<envelope> work;  ///< TrainerWork in arrival order
};

class rank_loop {
 public:
  rank_loop(rl_trainer_config cfg, std::string name, std::shared_ptr<transport::engine> engine,
            std::shared_ptr<rl_rank_shared> shared, caf::actor self, caf::actor controller)
      : cfg_(std::move(cfg)),
        name_(std::move(name)),
        engine_(std::move(engine)),
        shared_(std::move(shared)),
        self_(std::move(self)),
        controller_(std::move(controller)) {}
  ~rank_loop() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->peers = nullptr;
  }
  rank_loop(const rank_loop&) = delete;
  rank_loop& operator=(const rank_loop&) = delete;

  void run() {
    status st;
    try {
      st = train();
    } catch (const kj::Exception& e) {
      st = make_error(errc::malformed,
                      std::string{"a malformed message: "} + e.getDescription().cStr());
    } catch (const std::exception& e) {
      st = make_error(errc::internal, e.what());
    }
    if (aborted() || st.ok()) return;
    spdlog::error("rl trainer {}: {}{}", name_, st.message,
                  fatal_ ? " (fatal: the run stops)" : "");
    if (fatal_) {
      caf::send_as(self_, controller_, t_done_atom::value,
                   envelope::build<wire::TrainerDone>([&](wire::TrainerDone::Builder b) {
                     b.setRank(static_cast<uint32_t>(cfg_.rank));
                     b.setError(st.message);
                     b.setFatal(true);
                   }));
    }
    caf::send_as(self_, self_, t_failed_atom::value, st.message);
  }

 private:
  bool aborted() { return shared_->aborted(); }

  error fatal(std::string why) {
    fatal_ = true;
    return make_error(errc::invalid_argument, std::move(why));
  }

  status load() {
    gpu::train::use_threads(cfg_.threads);
    auto opened = gpu::gguf_file::open(cfg_.model_path);
    if (!opened) return fatal(cfg_.model_path + ": " + opened.error().message());
    gpu::train::trainable_config tc;
    tc.router_aux_loss_coef = cfg_.grpo.router_aux_loss_coef;
    auto m = gpu::train::trainable_model<float>::load(*opened, tc);
    if (!m) return fatal(cfg_.model_path + ": " + m.error().message());
    model_ = std::move(*m);
    model_->set_logit_temperature(cfg_.temperature);
    std::vector<int64_t> sizes;
    for (const auto& p : std::as_const(*model_).parameters()) {
      sizes.push_back(p.size());
      decay_.push_back(p.ne[1] > 1 ? 1 : 0);
      if (p.name == "token_embd.weight") vocab_ = p.ne[1];
    }
    if (vocab_ <= 0) return fatal(cfg_.model_path + ": no token_embd.weight");
    opt_ = gpu::train::adamw(cfg_.adamw);
    opt_.init(sizes);
    return {};
  }

  /// After rank 0's state arrived (remote_trainers' choose_backend makes the same group calls in
  /// the same order): the rank's device — `cuda` without an index is its own GPU on its host, by
  /// local rank — then where the group sums. NCCL: the rank trains device-resident and sums on its
  /// GPU; otherwise the forward and backward run on the device, the gradients are added into
  /// host memory for the group's sum and AdamW runs there (ZeRO-Offload: rank 0's split).
  status open_device() {
    auto local = train::local_rank(*peers_, train::this_host_key());
    if (!local) return local.error();
    const std::string name = gpu::train::device_for_local_rank(
        cfg_.device, *local,
        cfg_.device == "cpu" ? 0 : gpu::device_registry::instance().count(cfg_.device));
    auto dev = gpu::train::open_training_device(name);
    if (!dev) return fatal(dev.error().message());
    dev_ = std::move(*dev);
    int cuda = -1;
    if (dev_) {
      if (auto st = model_->use_device(dev_.get()); !st) {
        return fatal("--device " + name + ": " + st.message());
      }
      if (dev_->capabilities().kind == gpu::device_kind::cuda) cuda = train::cuda_ordinal(name);
      spdlog::info("rl trainer {}: rank {} trains on {}", name_, cfg_.rank, name);
    }
    auto sum = train::form_device_sum(*peers_, cfg_.dist_backend, cuda, cfg_.allreduce_timeout_ms,
                                      cfg_.collectives_engine);
    if (!sum) {
      if (sum.error().code == errc::invalid_argument) return fatal(sum.error().message);
      return sum.error();
    }
    if (!sum->group) return {};  // rank 0 says why; the group sums through host memory
    device_group_ = std::move(sum->group);
    if (auto st = model_->set_device_resident(true); !st) return fatal(st.message());
    model_->host_replaced();
    spdlog::info("rl trainer {}: rank {} sums its gradients on GPU {} with {}", name_, cfg_.rank,
                 cuda, device_group_->engine_name());
    return {};
  }

  status train() {
    if (auto st = load(); !st.ok()) return st;
    spdlog::info("rl trainer {}: rank {} of {} loaded; waiting for the group", name_, cfg_.rank,
                 cfg_.world);
    auto joined = train::join_group(*engine_, *shared_, self_, controller_, cfg_.rank, cfg_.world,
                                    cfg_.allreduce_timeout_ms);
    if (!joined) return joined.error();
    if (!joined->peers) return {};  // aborted
    peers_ = std::move(joined->peers);
    generation_ = joined->generation;
    // Rank 0's weights and moments (this rank adds −0.0 to them).
    auto state = gpu::rl::trainer_state(*model_, opt_);
    for (auto s : state) std::fill(s.begin(), s.end(), -0.0f);
    if (auto s = broadcast_state(*peers_, state); !s.ok()) {
      return make_error(errc::unavailable, "receiving the trainer state: " + s.to_string());
    }
    model_->host_replaced();
    if (auto st = open_device(); !st.ok()) return st;
    if (cfg_.bucket_mb > 0) {
      buckets_ = train::bucket_reducer::gradients_only(*peers_, *model_, cfg_.bucket_mb);
    }
    spdlog::info("rl trainer {}: group {} formed; holds rank 0's weights", name_, generation_);
    for (;;) {
      auto st = iteration();
      if (!st.ok() || aborted()) return st;
    }
  }

  /// Waits for this rank's part of the next iteration and runs it.
  status iteration() {
    std::vector<std::vector<train_batch>> lists;
    gpu::rl::iteration_inputs in;
    uint32_t count = 0, got = 0;
    do {
      envelope env;
      {
        std::unique_lock<std::mutex> lock(shared_->mu);
        shared_->cv.wait(lock, [&] { return shared_->abort || !shared_->work.empty(); });
        if (shared_->abort) return {};
        env = std::move(shared_->work.front());
        shared_->work.pop_front();
      }
      schema::decode_limits limits;
      limits.traversal_limit_words = schema::max_wire_envelope_bytes / 8;
      auto w = env.read<wire::TrainerWork>(limits);
      if (!w) return w.error();
      const auto r = w->get();
      if (r.getGeneration() != generation_) continue;  // never for a new incarnation; harmless
      if (got == 0) {
        in.step = r.getStep();
        in.iteration = r.getIteration();
        in.lr = r.getLr();
        in.opt_step = r.getOptStep();
        in.max_grad_norm = r.getMaxGradNorm();
        count = r.getCount();
        if (count < 1 || count > 1u << 20 || in.opt_step < 1 || !(in.lr >= 0.0) ||
            !(in.max_grad_norm >= 0.0)) {
          return make_error(errc::malformed, "a TrainerWork out of range");
        }
      } else if (r.getStep() != in.step || r.getIteration() != in.iteration ||
                 r.getCount() != count) {
        return make_error(errc::malformed, "TrainerWork of two iterations interleaved");
      }
      ++got;
      if (r.hasBatch()) {
        const uint32_t list = r.getList();
        if (list >= static_cast<uint32_t>(std::max(1, cfg_.shares))) {
          return make_error(errc::malformed, "a TrainerWork for list " + std::to_string(list));
        }
        auto b = read_batch(r.getBatch(), vocab_);
        if (!b) return b.error();
        if (lists.size() <= list) lists.resize(list + 1);
        if (r.getIndex() != lists[list].size()) {
          return make_error(errc::malformed, "TrainerWork batches out of order");
        }
        lists[list].push_back(std::move(*b));
      }
    } while (got < count);
    auto t = device_group_
                 ? gpu::rl::device_update_iteration(
                       *model_, opt_, decay_, cfg_.grpo, in, cfg_.shares, lists,
                       [this](std::span<const std::span<float>> grads, std::span<double> scalars) {
                         return device_group_sum(*device_group_, *peers_, grads, scalars);
                       })
                 : gpu::rl::update_iteration(
                       *model_, opt_, decay_, cfg_.grpo, in, cfg_.shares, lists,
                       [this](std::span<const std::span<float>> grads, std::span<double> scalars) {
                         return group_sum(*peers_, grads, scalars, buckets_.get());
                       },
                       buckets_.get());
    if (!t) return make_error(errc::unavailable, t.error().message());
    return {};
  }

  rl_trainer_config cfg_;
  std::string name_;
  std::shared_ptr<transport::engine> engine_;
  std::shared_ptr<rl_rank_shared> shared_;
  caf::actor self_;
  caf::actor controller_;
  std::unique_ptr<gpu::device> dev_;  // declared before the model: outlives it
  std::unique_ptr<gpu::train::trainable_model<float>> model_;
  gpu::train::adamw opt_;
  std::vector<uint8_t> decay_;
  int64_t vocab_ = 0;
  std::unique_ptr<transport::peer_group> peers_;
  /// --bucket-mb: the all-reduce during the backward, over peers_ (so declared after it).
  std::unique_ptr<train::bucket_reducer> buckets_;
  /// --dist-backend nccl (or auto where every rank has a GPU): the gradient sum on the GPUs.
  std::unique_ptr<transport::device_group> device_group_;
  uint16_t generation_ = 0;
  bool fatal_ = false;
};

caf::behavior rl_trainer_actor(caf::event_based_actor* self, std::string name,
                               rl_trainer_config cfg, std::shared_ptr<transport::engine> engine) {
  // Detached: connecting blocks only this actor's own thread, which runs the training steps.
  gpu::cpu::enter_compute_class();
  auto controller = connect_to_controller(self->system(), cfg.controller_host, cfg.controller_port);
  if (!controller) {
    spdlog::error("rl trainer {}: the controller: {}", name, controller.error().message);
    self->quit(caf::make_error(caf::sec::runtime_error, controller.error().message));
    return {};
  }
  caf::actor ctrl = *controller;
  self->monitor(ctrl);
  auto shared = std::make_shared<rl_rank_shared>();
  auto loop = std::make_shared<rank_loop>(cfg, name, std::move(engine), shared,
                                          caf::actor_cast<caf::actor>(self), ctrl);
  train::run_beside(self, shared, [loop] { loop->run(); });
  self->set_down_handler([self, name, ctrl](const caf::down_msg& dm) {
    if (dm.source == ctrl.address()) {
      spdlog::warn("rl trainer {}: the controller is gone; stopping", name);
      self->quit(caf::exit_reason::user_shutdown);
    }
  });
  const auto from_controller = [self, ctrl] {
    const auto& s = self->current_sender();
    return s && s->address() == ctrl.address();
  };
  return {
      [shared, from_controller](t_group_atom, const envelope& env) {
        if (from_controller() && env.read<wire::TrainerGroup>()) shared->offer_group(env);
      },
      [shared, from_controller](t_work_atom, const envelope& env) {
        if (!from_controller() || env.what() != schema::kind::trainer_work) return;
        {
          std::lock_guard<std::mutex> lock(shared->mu);
          shared->work.push_back(env);
        }
        shared->cv.notify_all();
      },
      [self](t_failed_atom, const std::string& why) {
        if (!actors::from_self(self)) return;
        self->quit(caf::make_error(caf::sec::runtime_error, why));
      },
  };
}

}  // namespace

void add_rl_trainer_role(actors::role_registry& roles) {
  roles.add("rl_trainer",
            [](caf::actor_system& sys, const actors::role_context& ctx) -> result<caf::actor> {
              auto cfg = rl_trainer_config::from_json(ctx.config_json);
              if (!cfg) return cfg.error();
              if (ctx.engine == nullptr || !ctx.engine->caps().tagged) {
                return make_error(errc::invalid_argument,
                                  "rl trainer: the gradient all-reduce needs the node's transport "
                                  "with tagged messages (start the node with --transport ucx)");
              }
              return sys.spawn<caf::detached>(rl_trainer_actor, ctx.name, std::move(cfg.value()),
                                              ctx.engine);
            });
}

}  // namespace weft::rl
