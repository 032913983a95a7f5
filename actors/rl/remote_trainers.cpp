// Rank 0's side of `weft rl --trainers K`: the group's controller (actors/rl/remote_trainers.hpp).
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

namespace {

// -- the controller (rank 0)
// -----------------------------------------------------------------------

struct event {
  enum class type { hello, down, fatal, supervisor_down } what;
  caf::actor who;        // hello
  caf::actor_addr from;  // down
  envelope env;
};

using events = event_queue<event>;

/// What the controller actor shares with rank 0's thread: a member going down cancels the
/// group's transfers at once (rather than at their deadline).
struct abort_hook {
  std::mutex mu;
  transport::peer_group* peers = nullptr;
  std::set<caf::actor_addr> members;
  caf::actor_addr supervisor;  ///< the ranks' supervisor (watch_supervisor)
};

caf::behavior trainer_controller_actor(caf::event_based_actor* self, std::shared_ptr<events> q,
                                       std::shared_ptr<abort_hook> hook) {
  self->set_down_handler([q, hook](const caf::down_msg& dm) {
    {
      std::lock_guard<std::mutex> lock(hook->mu);
      if (dm.source == hook->supervisor) {
        q->push(event{event::type::supervisor_down, {}, {}, {}});
        return;
      }
      if (hook->members.count(dm.source) != 0 && hook->peers != nullptr) hook->peers->abort();
    }
    q->push(event{event::type::down, {}, dm.source, {}});
  });
  return {
      [self, q](t_hello_atom, const envelope& env) {
        const auto& s = self->current_sender();
        if (!s) return;
        if (auto h = env.read<wire::TrainerHello>(); !h) {
          spdlog::warn("rl trainer controller: bad hello: {}", h.error().message);
          return;
        }
        auto who = caf::actor_cast<caf::actor>(s);
        self->monitor(who);
        q->push(event{event::type::hello, who, {}, env});
      },
      [self, hook](t_watch_atom, const caf::actor& sup) {
        const auto& s = self->current_sender();
        if (!s || s->node() != self->node() || !sup) return;
        {
          std::lock_guard<std::mutex> lock(hook->mu);
          hook->supervisor = sup.address();
        }
        self->monitor(sup);
      },
      [self, q](t_done_atom, const envelope& env) {
        const auto& s = self->current_sender();
        auto d = env.read<wire::TrainerDone>();
        if (!s || !d || !d->get().getFatal()) return;
        q->push(event{event::type::fatal, {}, s->address(), env});
      },
  };
}

struct member {
  caf::actor who;
  transport::bytes address;
  uint32_t pid = 0;
};

}  // namespace

struct remote_trainers::impl {
  remote_trainers_config cfg;
  caf::actor_system* sys = nullptr;
  std::shared_ptr<events> queue = std::make_shared<events>();
  std::shared_ptr<abort_hook> hook = std::make_shared<abort_hook>();
  caf::actor controller;
  std::unique_ptr<transport::engine> engine;
  std::map<int, member> pending;   ///< ranks waiting for a group, by rank (1 .. world − 1)
  std::set<caf::actor_addr> used;  ///< actors that were in a group (never again)
  std::vector<member> members;     ///< the current group, rank r at r − 1 (empty: none)
  std::unique_ptr<transport::peer_group> peers;
  /// The current group's overlapped all-reduce (--bucket-mb), made for `peers`; reset before it.
  std::unique_ptr<train::bucket_reducer> buckets;
  /// The current group's NCCL communicator when it sums on the GPUs (--dist-backend); reset
  /// before `peers`.
  std::unique_ptr<transport::device_group> device_group;
  uint16_t generation = 0;
  int64_t groups = 0;
  bool broken = false;  ///< the current group lost a rank
  bool lost = false;
  bool supervisor_down = false;
  std::string fatal;  ///< a rank's error that a restart cannot fix
  double reduce_s = 0.0;
  mutable std::mutex status_mu;
  std::string status_text;

  void drain() {
    for (auto& e : queue->take()) {
      switch (e.what) {
        case event::type::hello: {
          auto h = e.env.read<wire::TrainerHello>();
          if (!h) break;
          const int rank = static_cast<int>(h->get().getRank());
          if (static_cast<int>(h->get().getWorld()) != cfg.world || rank < 1 || rank >= cfg.world) {
            spdlog::warn("rl trainer controller: hello of rank {} of {} in a group of {}", rank,
                         h->get().getWorld(), cfg.world);
            break;
          }
          if (used.count(e.who.address()) != 0) break;
          const auto a = h->get().getAddress();
          const auto* p = reinterpret_cast<const std::byte*>(a.begin());
          pending[rank] = member{e.who, {p, p + a.size()}, h->get().getPid()};
          break;
        }
        case event::type::down: {
          for (auto it = pending.begin(); it != pending.end(); ++it) {
            if (it->second.who.address() == e.from) {
              pending.erase(it);
              break;
            }
          }
          for (size_t r = 0; r < members.size(); ++r) {
            if (members[r].who.address() == e.from && !broken) {
              spdlog::warn("trainer group {}: rank {} is gone; the group restarts", generation,
                           r + 1);
              broken = true;
            }
          }
          break;
        }
        case event::type::supervisor_down:
          supervisor_down = true;
          break;
        case event::type::fatal: {
          auto d = e.env.read<wire::TrainerDone>();
          if (d)
            fatal = "trainer rank " + std::to_string(d->get().getRank()) + ": " +
                    d->get().getError().cStr();
          break;
        }
      }
    }
    refresh_status();
  }

  /// Stops what is left of the current group (its supervisor restarts every rank).
  void dissolve() {
    for (auto& m : members) caf::anon_send_exit(m.who, caf::exit_reason::kill);
    {
      std::lock_guard<std::mutex> lock(hook->mu);
      hook->peers = nullptr;
      hook->members.clear();
    }
    buckets.reset();
    device_group.reset();
    peers.reset();
    members.clear();
    broken = false;
    refresh_status();
  }

  void lose(const std::string& why) {
    if (!broken) spdlog::warn("trainer group {}: {}; the group restarts", generation, why);
    broken = true;
    lost = true;
  }

  status form(const gpu::rl::state_source& state) {
    ++generation;
    ++groups;
    auto own = engine->local_address();
    if (!own) return make_error(errc::unavailable, "transport: " + own.error().message);
    std::vector<transport::bytes> addresses{*own};
    for (auto& [rank, m] : pending) {
      members.push_back(m);
      addresses.push_back(m.address);
      used.insert(m.who.address());
    }
    pending.clear();
    auto env = envelope::build<wire::TrainerGroup>([&](wire::TrainerGroup::Builder b) {
      b.setGeneration(generation);
      auto list = b.initAddresses(static_cast<unsigned>(addresses.size()));
      for (size_t i = 0; i < addresses.size(); ++i) {
        list.set(static_cast<unsigned>(i),
                 kj::arrayPtr(reinterpret_cast<const capnp::byte*>(addresses[i].data()),
                              addresses[i].size()));
      }
    });
    {
      std::lock_guard<std::mutex> lock(hook->mu);
      for (auto& m : members) hook->members.insert(m.who.address());
    }
    for (auto& m : members) caf::send_as(controller, m.who, t_group_atom::value, env);
    transport::group_options go;
    go.timeout_ms = cfg.allreduce_timeout_ms;
    go.generation = generation;
    auto p = transport::peer_group::connect(*engine, 0, addresses, go);
    if (!p) return make_error(errc::unavailable, p.error().to_string());
    peers = std::move(*p);
    {
      std::lock_guard<std::mutex> lock(hook->mu);
      hook->peers = peers.get();
    }
    // A member that went down while the group formed has aborted nothing yet: look again.
    drain();
    if (broken) return make_error(errc::unavailable, "a rank went down while the group formed");
    const auto t0 = clock_type::now();
    auto own_state = state();
    if (!own_state) {
      fatal = "rank 0's trainer state: " + own_state.error().message();
      return make_error(errc::internal, fatal);
    }
    if (auto s = broadcast_state(*peers, *own_state); !s.ok()) {
      return make_error(errc::unavailable, "sending the trainer state: " + s.to_string());
    }
    spdlog::info(
        "trainer group {} formed ({} ranks; rank 0's weights and moments sent in {:.2f} s)",
        generation, cfg.world, std::chrono::duration<double>(clock_type::now() - t0).count());
    if (auto st = choose_backend(); !st.ok()) return st;
    refresh_status();
    return {};
  }

  /// The ranks' devices and where the group sums (actors/rl/rl_trainer.cpp does the same calls
  /// in the same order): every rank's host, so that a rank given `--device cuda` takes its own
  /// GPU there; then every rank's (host, GPU) key and the --dist-backend choice, the same on
  /// every rank; with NCCL, the group's communicator.
  status choose_backend() {
    if (auto local = train::local_rank(*peers, train::this_host_key()); !local) {
      return local.error();
    }
    auto sum = train::form_device_sum(*peers, cfg.dist_backend, cfg.cuda_device,
                                      cfg.allreduce_timeout_ms, cfg.collectives_engine);
    if (!sum) {
      if (sum.error().code == errc::invalid_argument) fatal = sum.error().message;
      return sum.error();
    }
    if (!sum->group) {
      if (sum->join_failed) {
        spdlog::warn(
            "trainer group {}: {}; gradients summed through host memory instead "
            "(--dist-backend nccl makes this an error)",
            generation, sum->why);
      } else if (generation == 1) {
        spdlog::info("trainer group: gradients summed over UCX through host memory: {}", sum->why);
      }
      return {};
    }
    device_group = std::move(sum->group);
    if (generation == 1) {
      spdlog::info(
          "trainer group: gradients summed on the GPUs with {} ({} ranks); every rank trains "
          "device-resident",
          device_group->engine_name(), device_group->size());
    }
    return {};
  }

  void refresh_status() {
    nlohmann::json j;
    j["generation"] = generation;
    j["groups_formed"] = groups;
    j["gradient_sum"] = device_group ? "gpu" : "host";
    auto& list = j["ranks"] = nlohmann::json::array();
    for (int r = 1; r < cfg.world; ++r) {
      std::string state = "down";
      uint32_t pid = 0;
      if (static_cast<size_t>(r) <= members.size() && !broken) {
        state = "ready";
        pid = members[static_cast<size_t>(r - 1)].pid;
      } else if (auto it = pending.find(r); it != pending.end()) {
        state = "waiting";
        pid = it->second.pid;
      }
      list.push_back({{"rank", r}, {"state", state}, {"pid", pid}});
    }
    std::string text = j.dump();
    std::lock_guard<std::mutex> lock(status_mu);
    status_text = std::move(text);
  }
};

remote_trainers::remote_trainers(std::unique_ptr<impl> d) : d_(std::move(d)) {}

remote_trainers::~remote_trainers() {
  shutdown();
}

void remote_trainers::shutdown() {
  if (!d_ || !d_->controller) return;
  {
    std::lock_guard<std::mutex> lock(d_->hook->mu);
    d_->hook->peers = nullptr;
    d_->hook->members.clear();
  }
  d_->buckets.reset();
  d_->device_group.reset();
  d_->peers.reset();
  caf::anon_send_exit(d_->controller, caf::exit_reason::user_shutdown);
  d_->controller = caf::actor{};
  for (auto& m : d_->members) m.who = caf::actor{};
  d_->members.clear();
  d_->pending.clear();
}

result<std::unique_ptr<remote_trainers>> remote_trainers::create(caf::actor_system& sys,
                                                                 remote_trainers_config cfg) {
  if (cfg.world < 2 || cfg.world > 256) {
    return make_error(errc::invalid_argument, "rl: a trainer group has 2 to 256 ranks");
  }
  auto d = std::make_unique<impl>();
  d->cfg = std::move(cfg);
  d->sys = &sys;
  transport::engine_config ecfg;
  ecfg.params = d->cfg.transport_params;
  auto engine = transport::make_engine("ucx", ecfg);
  if (!engine) {
    return make_error(errc::unavailable,
                      "rl: the trainer group's transport: " + engine.error().to_string());
  }
  if (!(*engine)->caps().tagged) {
    return make_error(errc::unavailable, "rl: the trainer group needs tagged messages (UCX)");
  }
  d->engine = std::move(*engine);
  d->controller = sys.spawn(trainer_controller_actor, d->queue, d->hook);
  d->refresh_status();
  return std::unique_ptr<remote_trainers>(new remote_trainers(std::move(d)));
}

caf::actor remote_trainers::controller() const {
  return d_->controller;
}

void remote_trainers::watch_supervisor(const caf::actor& supervisor) {
  // From a local actor: the controller ignores a watch request that comes over the network.
  caf::scoped_actor self{*d_->sys};
  self->send(d_->controller, t_watch_atom::value, supervisor);
}

std::string remote_trainers::status_json() const {
  std::lock_guard<std::mutex> lock(d_->status_mu);
  return d_->status_text;
}

int remote_trainers::world() const {
  return d_->cfg.world;
}

gpu::status remote_trainers::ready(const gpu::rl::state_source& state) {
  impl& d = *d_;
  d.lost = false;
  const auto deadline = clock_type::now() + std::chrono::milliseconds(d.cfg.no_group_timeout_ms);
  for (;;) {
    d.drain();
    if (!d.fatal.empty()) return {gpu::status_code::invalid_argument, d.fatal};
    if (d.peers && !d.broken) return {};
    if (d.broken || d.peers) d.dissolve();
    if (d.supervisor_down) {
      return {gpu::status_code::internal,
              "the trainer group failed more often than its supervisor may restart it (10 "
              "times a minute)"};
    }
    if (static_cast<int>(d.pending.size()) == d.cfg.world - 1) {
      auto st = d.form(state);
      if (st.ok()) return {};
      if (!d.fatal.empty()) {
        d.dissolve();
        return {gpu::status_code::invalid_argument, d.fatal};
      }
      d.lose("it did not form: " + st.to_string());
      d.lost = false;
      continue;
    }
    if (clock_type::now() > deadline) {
      return {gpu::status_code::internal, "no complete trainer group within " +
                                              std::to_string(d.cfg.no_group_timeout_ms / 1000) +
                                              " s (" + std::to_string(d.pending.size()) + " of " +
                                              std::to_string(d.cfg.world - 1) + " ranks ready)"};
    }
    d.queue->wait_for(std::chrono::milliseconds(100));
    if (d.cfg.on_idle) d.cfg.on_idle();
  }
}

gpu::status remote_trainers::start(
    const gpu::rl::iteration_inputs& in,
    std::span<const std::vector<std::vector<train_batch>>> per_rank) {
  impl& d = *d_;
  d.lost = false;
  d.drain();
  if (!d.peers || d.broken) {
    d.lose("a rank is gone");
    return {gpu::status_code::internal, "the trainer group lost a rank"};
  }
  for (size_t r = 0; r < d.members.size() && r < per_rank.size(); ++r) {
    const auto& lists = per_rank[r];
    uint32_t count = 0;
    for (const auto& l : lists) count += static_cast<uint32_t>(l.size());
    auto send = [&](uint32_t list, uint32_t index, const train_batch* b) {
      auto env = envelope::build<wire::TrainerWork>([&](wire::TrainerWork::Builder w) {
        w.setGeneration(d.generation);
        w.setStep(in.step);
        w.setIteration(in.iteration);
        w.setLr(in.lr);
        w.setOptStep(in.opt_step);
        w.setMaxGradNorm(in.max_grad_norm);
        w.setCount(std::max<uint32_t>(1, count));
        w.setList(list);
        w.setIndex(index);
        if (b != nullptr) write_batch(w.initBatch(), *b);
      });
      caf::send_as(d.controller, d.members[r].who, t_work_atom::value, std::move(env));
    };
    if (count == 0) send(0, 0, nullptr);
    for (size_t j = 0; j < lists.size(); ++j) {
      for (size_t k = 0; k < lists[j].size(); ++k) {
        send(static_cast<uint32_t>(j), static_cast<uint32_t>(k), &lists[j][k]);
      }
    }
  }
  return {};
}

gpu::status remote_trainers::reduce(std::span<const std::span<float>> grads,
                                    std::span<double> scalars) {
  impl& d = *d_;
  d.lost = false;
  if (!d.peers || d.broken) {
    d.lose("a rank is gone");
    return {gpu::status_code::internal, "the trainer group lost a rank"};
  }
  const auto t0 = clock_type::now();
  auto st = d.device_group ? device_group_sum(*d.device_group, *d.peers, grads, scalars)
                           : group_sum(*d.peers, grads, scalars, d.buckets.get());
  d.reduce_s += std::chrono::duration<double>(clock_type::now() - t0).count();
  if (!st) d.lose(st.message());
  return st;
}

bool remote_trainers::sums_on_device() const {
  return d_->device_group != nullptr && d_->peers != nullptr && !d_->broken;
}

bool remote_trainers::lost() const {
  return d_->lost;
}

int64_t remote_trainers::groups_formed() const {
  return d_->groups;
}

double remote_trainers::take_reduce_seconds() {
  return std::exchange(d_->reduce_s, 0.0);
}

gpu::train::overlapped_reducer* remote_trainers::overlap(
    const gpu::train::trainable_model<float>& model) {
  impl& d = *d_;
  if (!(d.cfg.bucket_mb > 0) || !d.peers || d.broken || d.device_group) return nullptr;
  if (!d.buckets) {
    d.buckets = train::bucket_reducer::gradients_only(*d.peers, model, d.cfg.bucket_mb);
    if (d.generation == 1) {
      spdlog::info(
          "trainer group: gradients summed in {} buckets of ~{} MiB while the backward runs",
          d.buckets->n_buckets(), d.cfg.bucket_mb);
    }
  }
  return d.buckets.get();
}

}  // namespace weft::rl
