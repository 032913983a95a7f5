#include "actors/train/trainer.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "actors/cache_dir.hpp"
#include "actors/private_messages.hpp"
#include "actors/roles.hpp"
#include "actors/runtime.hpp"
#include "actors/train/bucket_reducer.hpp"
#include "actors/train/device_sum.hpp"
#include "actors/train/local_rank.hpp"
#include "actors/train/rank_group.hpp"
#include "actors/train/shared_files.hpp"
#include "actors/train/train_atoms.hpp"
#include "gpu/cpu/thread_class.hpp"
#include "gpu/device.hpp"
#include "gpu/ggml_types.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/export.hpp"
#include "schema/caf_bridge.hpp"
#include "transport/engine.hpp"
#include "transport/peer_group.hpp"

namespace weft::train {

using schema::envelope;
namespace wire = schema::wire;
using namespace gpu::train;

std::string trainer_config::to_json() const {
  return nlohmann::json{{"run", gpu::train::to_json(run)},
                        {"rank", rank},
                        {"world", world},
                        {"coordinator_host", coordinator_host},
                        {"coordinator_port", coordinator_port},
                        {"allreduce_timeout_ms", allreduce_timeout_ms}}
      .dump();
}

result<trainer_config> trainer_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("run")) {
    return make_error(errc::invalid_argument, "trainer: config is not a JSON object with 'run'");
  }
  trainer_config c;
  auto run = sft_run_options_from_json(j["run"]);
  if (!run) return make_error(errc::invalid_argument, "trainer: " + run.error().message());
  c.run = std::move(*run);
  try {
    c.rank = j.value("rank", c.rank);
    c.world = j.value("world", c.world);
    c.coordinator_host = j.value("coordinator_host", c.coordinator_host);
    c.coordinator_port = j.value("coordinator_port", c.coordinator_port);
    c.allreduce_timeout_ms = j.value("allreduce_timeout_ms", c.allreduce_timeout_ms);
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument, std::string{"trainer: "} + e.what());
  }
  if (c.world < 1 || c.world > 2047 || c.rank < 0 || c.rank >= c.world || c.coordinator_port == 0 ||
      c.allreduce_timeout_ms < 100) {
    return make_error(errc::invalid_argument, "trainer: rank " + std::to_string(c.rank) + " of " +
                                                  std::to_string(c.world) + ", coordinator port " +
                                                  std::to_string(c.coordinator_port) +
                                                  " out of range");
  }
  return c;
}

namespace {

/// What the actor and its training thread share.
struct trainer_shared : rank_shared {
  std::atomic<bool> stop_requested{false};
};

/// The training thread of one rank.
class rank_loop {
 public:
  rank_loop(trainer_config cfg, std::string name, std::shared_ptr<transport::engine> engine,
            std::shared_ptr<trainer_shared> shared, caf::actor self, caf::actor coordinator)
      : cfg_(std::move(cfg)),
        name_(std::move(name)),
        engine_(std::move(engine)),
        shared_(std::move(shared)),
        self_(std::move(self)),
        coordinator_(std::move(coordinator)) {}

  ~rank_loop() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->peers = nullptr;
  }
  rank_loop(const rank_loop&) = delete;
  rank_loop& operator=(const rank_loop&) = delete;

  void run() {
    auto st = train();
    if (aborted()) return;
    if (!st.ok()) fail(st.message, fatal_);
  }

 private:
  bool aborted() { return shared_->aborted(); }

  /// Tells the coordinator; a non-fatal failure also ends the actor abnormally (gang restart).
  void fail(const std::string& why, bool fatal) {
    spdlog::error("trainer {}: {}{}", name_, why, fatal ? " (fatal: the run stops)" : "");
    caf::send_as(self_, coordinator_, t_done_atom::value,
                 envelope::build<wire::TrainerDone>([&](wire::TrainerDone::Builder b) {
                   b.setGeneration(generation_);
                   b.setRank(static_cast<uint32_t>(cfg_.rank));
                   b.setStep(trainer_ ? trainer_->steps_done() : 0);
                   b.setError(why);
                   b.setFatal(fatal);
                   b.setFirstStep(first_step_);
                 }));
    if (!fatal) caf::send_as(self_, self_, t_failed_atom::value, why);
  }

  error fatal(std::string why) {
    fatal_ = true;
    return make_error(errc::invalid_argument, std::move(why));
  }

  status train() {
    use_threads(cfg_.run);
    auto sc = make_sft_config(cfg_.run);
    if (!sc) return fatal(sc.error().message());
    auto joined = join_group(*engine_, *shared_, self_, coordinator_, cfg_.rank, cfg_.world,
                             cfg_.allreduce_timeout_ms);
    if (!joined) return joined.error();
    if (!joined->peers) return {};  // aborted
    peers_ = std::move(joined->peers);
    generation_ = joined->generation;
    if (auto s = open_files(); !s.ok()) return s;
    if (auto s = choose_device(); !s.ok()) return s;
    auto loaded = load_sft_run(cfg_.run);
    if (!loaded) return fatal(loaded.error().message());
    run_ = std::move(*loaded);
    spdlog::info("trainer {}: rank {} of {} loaded", name_, cfg_.rank, cfg_.world);
    trainer_ = std::make_unique<sft_trainer>(
        *run_->model, run_->data, *sc,
        [this](std::span<const std::span<float>> grads, double& loss_sum, int64_t& loss_tokens) {
          return reduce(grads, loss_sum, loss_tokens);
        },
        cfg_.rank, cfg_.world);
    if (auto s = choose_backend(); !s.ok()) return s;
    use_buckets();
    if (auto s = start_point(joined->resume); !s.ok()) return s;
    return loop();
  }

  /// The model and the data as rank 0 has them (shared_files.hpp): a rank on a host without
  /// them, or with other bytes at those paths, receives rank 0's over the group.
  status open_files() {
    if (cfg_.world == 1) return {};
    const auto cache = actors::weft_cache_dir();
    for (auto [what, p] :
         {std::pair{"model", &cfg_.run.model_path}, std::pair{"data", &cfg_.run.data_path}}) {
      auto use = share_file(*peers_, *p, what, cache);
      if (!use) {
        if (use.error().code == errc::unavailable) return use.error();
        return fatal(use.error().message);
      }
      *p = std::move(*use);
    }
    return {};
  }

  /// `--device cuda` without an index: this rank's own GPU on its host (local rank mod GPUs).
  status choose_device() {
    auto& dev = cfg_.run.device;
    if (cfg_.world == 1 || dev == "cpu" || dev.find(':') != std::string::npos) return {};
    auto local = local_rank(*peers_, this_host_key());
    if (!local) return local.error();
    const int n = gpu::device_registry::instance().count(dev);
    dev = gpu::train::device_for_local_rank(dev, *local, n);
    spdlog::info("trainer {}: rank {} is local rank {} of its host: {} ({} device{} there)", name_,
                 cfg_.rank, *local, dev, n, n == 1 ? "" : "s");
    return {};
  }

  /// --dist-backend (gradient_backend.hpp): with NCCL, the group's device_group and the
  /// trainer's device reducer; every rank decides the same from every rank's (host, GPU) key.
  status choose_backend() {
    if (cfg_.world == 1) return {};
    int gpu_index = -1;
    if (run_->dev && run_->dev->capabilities().kind == gpu::device_kind::cuda &&
        run_->model->device_resident()) {
      gpu_index = cuda_ordinal(cfg_.run.device);
    }
    auto sum =
        form_device_sum(*peers_, cfg_.run.dist_backend, gpu_index, cfg_.allreduce_timeout_ms);
    if (!sum) {
      if (sum.error().code == errc::invalid_argument) return fatal(sum.error().message);
      return sum.error();
    }
    if (!sum->group) {
      if (sum->join_failed) {
        spdlog::warn(
            "trainer {}: {}; gradients summed through host memory instead (--dist-backend nccl "
            "makes this an error)",
            name_, sum->why);
      } else if (cfg_.rank == 0) {
        spdlog::info("trainer {}: gradients summed over the transport through host memory: {}",
                     name_, sum->why);
      }
      return {};
    }
    device_group_ = std::move(sum->group);
    spdlog::info("trainer {}: rank {} sums its gradients on GPU {} with {} ({} ranks)", name_,
                 cfg_.rank, gpu_index, device_group_->engine_name(), device_group_->size());
    trainer_->set_device_reducer(
        [this](std::span<const std::span<float>> grads, double& loss_sum, int64_t& loss_tokens) {
          const auto t0 = std::chrono::steady_clock::now();
          if (auto s = device_group_->all_reduce_sum(grads); !s.ok()) {
            return gpu::status{gpu::status_code::internal, "gradient all-reduce: " + s.to_string()};
          }
          return reduce_scalars(loss_sum, loss_tokens, t0);
        });
    return {};
  }

  /// --bucket-mb: the host-memory all-reduce in buckets overlapped with the backward
  /// (bucket_reducer.hpp); not with NCCL, which sums on the GPUs after the backward, nor for a
  /// device-resident rank, whose gradients reach the host only after its backward.
  void use_buckets() {
    if (cfg_.world == 1 || device_group_ || run_->model->device_resident() ||
        !(cfg_.run.bucket_mb > 0))
      return;
    buckets_ = std::make_unique<bucket_reducer>(
        *peers_,
        buckets_of(*run_->model, static_cast<int64_t>(cfg_.run.bucket_mb * 1024.0 * 1024.0)),
        [this](double& loss_sum, int64_t& loss_tokens, std::chrono::steady_clock::time_point t0) {
          return reduce_scalars(loss_sum, loss_tokens, t0);
        });
    trainer_->set_overlapped_reducer(buckets_.get());
    if (cfg_.rank == 0)
      spdlog::info("trainer {}: gradients summed in {} buckets of ~{} MiB while the backward runs",
                   name_, buckets_->n_buckets(), cfg_.run.bucket_mb);
  }

  /// The gradient reducer: every tensor summed over the group, then the loss sums and the stop
  /// votes (so that every rank stops after the same step).
  gpu::status reduce(std::span<const std::span<float>> grads, double& loss_sum,
                     int64_t& loss_tokens) {
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = peers_->all_reduce_sum(grads); !s.ok()) {
      return {gpu::status_code::internal, "gradient all-reduce: " + s.to_string()};
    }
    return reduce_scalars(loss_sum, loss_tokens, t0);
  }

  /// --eval-data: every rank evaluates its share of the eval examples (every world-th, from its
  /// rank), the sums go over the group, rank 0 reports the mean (TrainerEval). Every rank calls
  /// it at the same points of the loop, so the all-reduces pair up.
  status evaluate() {
    if (cfg_.run.eval_data_path.empty()) return {};
    const auto t0 = std::chrono::steady_clock::now();
    // This rank's share, copied once per run (the eval set does not change).
    if (!eval_share_) {
      eval_share_.emplace();
      const auto& all = run_->eval_data.examples;
      for (size_t i = static_cast<size_t>(cfg_.rank); i < all.size();
           i += static_cast<size_t>(cfg_.world)) {
        eval_share_->examples.push_back(all[i]);
      }
    }
    const gpu::train::sft_dataset& share = *eval_share_;
    double sums[3] = {0.0, 0.0, static_cast<double>(share.examples.size())};
    if (!share.examples.empty()) {
      auto e = gpu::train::evaluate_loss(*run_->model, share, cfg_.run.micro_batch_tokens);
      if (e) {
        sums[0] = e->nll_sum;
        sums[1] = static_cast<double>(e->tokens);
      } else if (e.error().code() != gpu::status_code::invalid_argument) {
        return fatal("--eval-data: " + e.error().message());
      }
    }
    if (cfg_.world > 1) {
      if (auto s = peers_->all_reduce_sum(std::span<double>(sums, 3)); !s.ok()) {
        return make_error(errc::unavailable, "eval all-reduce: " + s.to_string());
      }
    }
    if (cfg_.rank != 0) return {};
    if (sums[1] <= 0.0) return fatal("--eval-data: no token of the eval set is in the loss");
    caf::send_as(
        self_, coordinator_, t_eval_atom::value,
        envelope::build<wire::TrainerEval>([&](wire::TrainerEval::Builder b) {
          b.setGeneration(generation_);
          b.setStep(trainer_->steps_done());
          b.setLoss(sums[0] / sums[1]);
          b.setTokens(static_cast<int64_t>(sums[1]));
          b.setExamples(static_cast<int64_t>(sums[2]));
          b.setSeconds(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }));
    return {};
  }

  /// The loss sums and the stop votes over the group; the reduction's time since `t0`.
  gpu::status reduce_scalars(double& loss_sum, int64_t& loss_tokens,
                             std::chrono::steady_clock::time_point t0) {
    double scalars[3] = {loss_sum, static_cast<double>(loss_tokens),
                         shared_->stop_requested.load() ? 1.0 : 0.0};
    if (auto s = peers_->all_reduce_sum(std::span<double>(scalars, 3)); !s.ok()) {
      return {gpu::status_code::internal, "loss all-reduce: " + s.to_string()};
    }
    loss_sum = scalars[0];
    loss_tokens = static_cast<int64_t>(scalars[1]);
    stop_votes_ = scalars[2];
    reduce_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {};
  }

  /// Agrees on the checkpoint to continue from: rank 0's newest valid one (when resuming), which
  /// rank 0 then sends to every rank over the group (share_checkpoint) — the other ranks never
  /// read the checkpoint directory, so it need not be shared storage, and what a dying earlier
  /// incarnation may still write there cannot split the group.
  status start_point(bool resume) {
    const std::string& dir = cfg_.run.checkpoint_dir;
    double step[1] = {0.0};
    std::optional<checkpoint_state> state;
    if (resume && !dir.empty() && cfg_.rank == 0) {
      std::vector<std::string> skipped;
      auto s = load_latest_checkpoint(dir, &skipped);
      for (const auto& why : skipped)
        spdlog::warn("trainer {}: {}; trying an older one", name_, why);
      if (s) {
        step[0] = static_cast<double>(s->step);
        state = std::move(*s);
      } else {
        spdlog::warn("trainer {}: no checkpoint in {}; starting at step 0", name_, dir);
      }
    }
    if (auto s = peers_->all_reduce_sum(std::span<double>(step, 1)); !s.ok()) {
      return make_error(errc::unavailable, "agreeing on the checkpoint: " + s.to_string());
    }
    first_step_ = static_cast<int64_t>(step[0]);
    if (first_step_ > 0) {
      if (!state) {
        // This rank's tensors, to be overwritten by rank 0's.
        state.emplace();
        if (auto st = trainer_->snapshot_into(*state); !st) return fatal(st.message());
      }
      if (auto s = share_checkpoint(*state); !s.ok()) {
        return make_error(errc::unavailable, "receiving rank 0's checkpoint of step " +
                                                 std::to_string(first_step_) + ": " +
                                                 s.to_string());
      }
      if (auto st = trainer_->restore(*state); !st) return fatal("cannot resume: " + st.message());
      if (cfg_.rank == 0) {
        spdlog::info("trainer {}: resumed from {} (step {}) and sent it to the group", name_,
                     checkpoint_path(dir, first_step_).string(), first_step_);
      } else {
        spdlog::info("trainer {}: resumed at step {} from rank 0's checkpoint", name_, first_step_);
      }
    }
    if (cfg_.rank == 0) {
      caf::send_as(self_, coordinator_, t_started_atom::value,
                   envelope::build<wire::TrainerStarted>([&](wire::TrainerStarted::Builder b) {
                     b.setGeneration(generation_);
                     b.setFirstStep(first_step_);
                   }));
    }
    return {};
  }

  /// Rank 0's checkpoint state to every rank: the other ranks add −0.0 to each value in the
  /// group's all-reduce (x + −0.0 is x, bit for bit, for every float), one tensor (values and
  /// moments) at a time so the group's buffer stays the size of the gradients'. The loss history
  /// stays rank 0's (it reports); the seed is every rank's own (restore checks it).
  transport::status share_checkpoint(checkpoint_state& s) {
    const bool root = cfg_.rank == 0;
    double scalars[4] = {static_cast<double>(s.step), static_cast<double>(s.cursor.epoch),
                         static_cast<double>(s.cursor.index), static_cast<double>(s.adam_steps)};
    if (!root) std::fill(std::begin(scalars), std::end(scalars), -0.0);
    if (auto st = peers_->all_reduce_sum(std::span<double>(scalars, 4)); !st.ok()) return st;
    s.step = static_cast<int64_t>(scalars[0]);
    s.cursor.epoch = static_cast<int64_t>(scalars[1]);
    s.cursor.index = static_cast<int64_t>(scalars[2]);
    s.adam_steps = static_cast<int64_t>(scalars[3]);
    if (!root) s.history.clear();
    for (size_t i = 0; i < s.values.size(); ++i) {
      const std::span<float> pieces[3] = {s.values[i], s.m[i], s.v[i]};
      if (!root) {
        for (auto p : pieces) std::fill(p.begin(), p.end(), -0.0f);
      }
      if (auto st = peers_->all_reduce_sum(std::span<const std::span<float>>(pieces)); !st.ok())
        return st;
    }
    return transport::ok_status();
  }

  status loop() {
    const auto& o = cfg_.run;
    std::optional<async_checkpointer> ckpt;
    if (cfg_.rank == 0 && !o.checkpoint_dir.empty())
      ckpt.emplace(o.checkpoint_dir, o.keep_checkpoints);
    bool stopped = false;
    if (trainer_->steps_done() < o.steps) {
      if (auto st = evaluate(); !st.ok()) return st;
    }
    while (trainer_->steps_done() < o.steps && !aborted()) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = trainer_->step();
      if (!r) {
        // A failed all-reduce is a lost peer (restartable); anything else is the step's own.
        const bool transport = r.error().message().find("all-reduce") != std::string::npos;
        if (transport) return make_error(errc::unavailable, r.error().message());
        return fatal("step " + std::to_string(trainer_->steps_done() + 1) + ": " +
                     r.error().message());
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (buckets_) {
        spdlog::debug(
            "trainer {}: step {}: the buckets' all-reduce took {:.3f} s, {:.3f} s of it "
            "after the backward",
            name_, r->step, buckets_->busy_seconds(), buckets_->waited_seconds());
      }
      stopped = stop_votes_ > 0.0;
      const bool last = r->step == o.steps || stopped;
      bool checkpointed = false;
      if (ckpt && (r->step % o.checkpoint_every == 0 || last)) {
        // The last one is written from the live tensors (nothing goes on while it is written).
        if (auto st = checkpoint_of(*ckpt, *trainer_, last); !st) {
          return fatal("checkpoint: " + st.message());
        }
        checkpointed = true;
      }
      if (cfg_.rank == 0) {
        caf::send_as(self_, coordinator_, t_step_atom::value,
                     envelope::build<wire::TrainerStep>([&](wire::TrainerStep::Builder b) {
                       b.setGeneration(generation_);
                       b.setStep(r->step);
                       b.setLoss(r->loss);
                       b.setLr(r->lr);
                       b.setGradNorm(r->grad_norm);
                       b.setTokens(r->tokens);
                       b.setSeconds(seconds);
                       b.setCheckpointed(checkpointed);
                       b.setReduceSeconds(reduce_seconds_);
                     }));
      }
      if (stopped) break;
      if (r->step == o.steps || (o.eval_every > 0 && r->step % o.eval_every == 0)) {
        if (auto st = evaluate(); !st.ok()) return st;
      }
    }
    if (aborted()) return {};
    if (ckpt) {
      if (auto st = ckpt->wait(); !st) return fatal("checkpoint: " + st.message());
    }
    if (cfg_.rank == 0 && !stopped && !o.save_path.empty()) {
      if (auto st = trainer_->sync_host(); !st) return fatal("--save: " + st.message());
      if (auto st = export_gguf(run_->file, *run_->model, *gpu::parse_type_name(o.save_type),
                                o.save_path);
          !st) {
        return fatal("--save " + o.save_path + ": " + st.message());
      }
      spdlog::info("trainer {}: saved {} ({})", name_, o.save_path, o.save_type);
    }
    caf::send_as(self_, coordinator_, t_done_atom::value,
                 envelope::build<wire::TrainerDone>([&](wire::TrainerDone::Builder b) {
                   b.setGeneration(generation_);
                   b.setRank(static_cast<uint32_t>(cfg_.rank));
                   b.setStep(trainer_->steps_done());
                   b.setStopped(stopped);
                   b.setFirstStep(first_step_);
                 }));
    return {};
  }

  trainer_config cfg_;
  std::string name_;
  std::shared_ptr<transport::engine> engine_;
  std::shared_ptr<trainer_shared> shared_;
  caf::actor self_;
  caf::actor coordinator_;
  std::optional<sft_run> run_;
  std::optional<gpu::train::sft_dataset> eval_share_;  ///< --eval-data: this rank's examples
  std::unique_ptr<transport::peer_group> peers_;
  std::unique_ptr<sft_trainer> trainer_;
  std::unique_ptr<bucket_reducer> buckets_;                ///< --bucket-mb (trainer_ points to it)
  std::unique_ptr<transport::device_group> device_group_;  ///< --dist-backend nccl
  double reduce_seconds_ = 0.0;
  double stop_votes_ = 0.0;
  uint16_t generation_ = 0;
  int64_t first_step_ = 0;
  bool fatal_ = false;
};

caf::behavior trainer_actor(caf::event_based_actor* self, std::string name, trainer_config cfg,
                            std::shared_ptr<transport::engine> engine) {
  // Detached: connecting blocks only this actor's own thread, which runs the training steps.
  gpu::cpu::enter_compute_class();
  result<caf::actor> coordinator = make_error(errc::unavailable, "not tried");
  for (int i = 0; i < 50; ++i) {
    coordinator = actors::connect_actor(self->system(), cfg.coordinator_host, cfg.coordinator_port);
    if (coordinator) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!coordinator) {
    spdlog::error("trainer {}: the coordinator: {}", name, coordinator.error().message);
    self->quit(caf::make_error(caf::sec::runtime_error, coordinator.error().message));
    return {};
  }
  caf::actor coord = *coordinator;
  self->monitor(coord);
  auto shared = std::make_shared<trainer_shared>();
  auto loop = std::make_shared<rank_loop>(cfg, name, std::move(engine), shared,
                                          caf::actor_cast<caf::actor>(self), coord);
  // On any exit (the supervisor's, the coordinator gone, a failed step) the loop stops.
  run_beside(self, shared, [loop] { loop->run(); });
  self->set_down_handler([self, name, coord](const caf::down_msg& dm) {
    if (dm.source == coord.address()) {
      spdlog::warn("trainer {}: the coordinator is gone; stopping", name);
      self->quit(caf::exit_reason::user_shutdown);
    }
  });
  const auto from_coordinator = [self, coord] {
    const auto& s = self->current_sender();
    return s && s->address() == coord.address();
  };
  return {
      [shared, from_coordinator](t_group_atom, const envelope& env) {
        if (from_coordinator() && env.read<wire::TrainerGroup>()) shared->offer_group(env);
      },
      [shared, from_coordinator](t_stop_atom) {
        if (from_coordinator()) shared->stop_requested.store(true);
      },
      [self](t_failed_atom, const std::string& why) {
        if (!actors::from_self(self)) return;
        self->quit(caf::make_error(caf::sec::runtime_error, why));
      },
  };
}

}  // namespace

void add_train_roles(actors::role_registry& roles) {
  auto spawn = [](caf::actor_system& sys, const actors::role_context& ctx) -> result<caf::actor> {
    auto cfg = trainer_config::from_json(ctx.config_json);
    if (!cfg) return cfg.error();
    if (ctx.engine == nullptr || (cfg->world > 1 && !ctx.engine->caps().tagged)) {
      return make_error(errc::invalid_argument,
                        "trainer: the gradient all-reduce needs the node's transport with tagged "
                        "messages (start the node with --transport ucx)");
    }
    return sys.spawn<caf::detached>(trainer_actor, ctx.name, std::move(cfg.value()), ctx.engine);
  };
  roles.add("trainer", spawn);
  // Rank 0 (it writes the checkpoints and the export, and reads the checkpoint it sends to the
  // others): `weft train`'s own node processes accept it, other hosts' nodes only "trainer".
  roles.add("trainer-lead", spawn);
}

}  // namespace weft::train
