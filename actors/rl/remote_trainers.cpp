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
#include "actors/roles.hpp"
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
                        {"beta1", adamw.beta1},
                        {"beta2", adamw.beta2},
                        {"eps", adamw.eps},
                        {"weight_decay", adamw.weight_decay},
                        {"allreduce_timeout_ms", allreduce_timeout_ms},
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
    c.adamw.beta1 = j.value("beta1", c.adamw.beta1);
    c.adamw.beta2 = j.value("beta2", c.adamw.beta2);
    c.adamw.eps = j.value("eps", c.adamw.eps);
    c.adamw.weight_decay = j.value("weight_decay", c.adamw.weight_decay);
    c.allreduce_timeout_ms = j.value("allreduce_timeout_ms", c.allreduce_timeout_ms);
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
      c.controller_port == 0 || c.allreduce_timeout_ms < 100 || c.model_path.empty()) {
    return make_error(errc::invalid_argument, "rl trainer: rank " + std::to_string(c.rank) +
                                                  " of " + std::to_string(c.world) +
                                                  ", threads, shares, temperature or "
                                                  "controller port out of range (or no model)");
  }
  return c;
}

namespace {

// -- what both sides of the group do
// ---------------------------------------------------------------

/// The gradient sum: every tensor, then the scalars (the same calls in the same order on every
/// rank).
gpu::status group_sum(transport::peer_group& g, std::span<const std::span<float>> grads,
                      std::span<double> scalars) {
  if (auto s = g.all_reduce_sum(grads); !s.ok()) {
    return {gpu::status_code::internal, "gradient all-reduce: " + s.to_string()};
  }
  if (auto s = g.all_reduce_sum(scalars); !s.ok()) {
    return {gpu::status_code::internal, "loss all-reduce: " + s.to_string()};
  }
  return {};
}

/// Rank 0's `state` to every rank, as a sum to which the other ranks add −0.0 (x + (−0.0) = x
/// for every x, −0.0 included), in pieces of at most 64 MiB (the group's buffer stays the size
/// of the gradients).
transport::status broadcast_state(transport::peer_group& g,
                                  std::span<const std::span<float>> state) {
  constexpr size_t piece_floats = (64u << 20) / sizeof(float);
  for (size_t i = 0; i < state.size();) {
    size_t j = i, floats = 0;
    while (j < state.size() && (j == i || floats + state[j].size() <= piece_floats)) {
      floats += state[j].size();
      ++j;
    }
    if (auto s = g.all_reduce_sum(state.subspan(i, j - i)); !s.ok()) return s;
    i = j;
  }
  return {};
}

template <class List, class V>
void put(List list, const V& values) {
  for (size_t i = 0; i < values.size(); ++i) list.set(static_cast<unsigned>(i), values[i]);
}

void write_batch(wire::TrainBatch::Builder b, const train_batch& x) {
  const auto n = static_cast<unsigned>(x.tokens.size());
  put(b.initTokens(n), x.tokens);
  put(b.initTargets(n), x.targets);
  put(b.initStarts(static_cast<unsigned>(x.seqs.starts.size())), x.seqs.starts);
  put(b.initPrefix(static_cast<unsigned>(x.seqs.prefix.size())), x.seqs.prefix);
  const auto p = static_cast<unsigned>(x.policy.size());
  auto lp = b.initBehaviourLogp(p);
  auto adv = b.initAdvantage(p);
  auto w = b.initWeight(p);
  auto s = b.initSample(p);
  auto ref = b.initRefLogp(p);
  for (unsigned i = 0; i < p; ++i) {
    lp.set(i, x.policy[i].behaviour_logp);
    adv.set(i, x.policy[i].advantage);
    w.set(i, x.policy[i].weight);
    s.set(i, x.policy[i].sample);
    ref.set(i, x.policy[i].ref_logp);
  }
}

/// A batch from the wire, checked so that the trainer can never index out of bounds.
result<train_batch> read_batch(wire::TrainBatch::Reader r, int64_t vocab) {
  auto bad = [](const std::string& why) {
    return make_error(errc::malformed, "a TrainBatch " + why);
  };
  train_batch x;
  const auto tokens = r.getTokens();
  const auto targets = r.getTargets();
  const size_t n = tokens.size();
  if (targets.size() != n) return bad("has targets and tokens of different lengths");
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab) return bad("has a token outside the vocabulary");
    x.tokens.push_back(t);
  }
  for (int32_t t : targets) {
    if (t < -1 || t >= vocab) return bad("has a target outside the vocabulary");
    x.targets.push_back(t);
  }
  auto starts = r.getStarts();
  if (starts.size() < 1 || starts[0] != 0 || starts[starts.size() - 1] != static_cast<int64_t>(n)) {
    return bad("has sequence starts that do not cover its tokens");
  }
  x.seqs.starts.clear();
  for (unsigned i = 0; i < starts.size(); ++i) {
    if (i > 0 && starts[i] <= starts[i - 1]) return bad("has an empty or reversed sequence");
    x.seqs.starts.push_back(starts[i]);
  }
  const auto n_seqs = static_cast<int64_t>(starts.size()) - 1;
  auto prefix = r.getPrefix();
  if (prefix.size() != 0 && static_cast<int64_t>(prefix.size()) != n_seqs) {
    return bad("has a prefix list of the wrong length");
  }
  for (unsigned s = 0; s < prefix.size(); ++s) {
    const int64_t p = prefix[s];
    if (p < -1 || p >= static_cast<int64_t>(s) ||
        (p >= 0 && prefix[static_cast<unsigned>(p)] != -1)) {
      return bad("has a sequence continuing a prefix that is not an earlier prefix");
    }
    x.seqs.prefix.push_back(p);
  }
  // Each list once: every get of a list counts against the message's traversal limit.
  const auto lp = r.getBehaviourLogp();
  const auto adv = r.getAdvantage();
  const auto w = r.getWeight();
  const auto smp = r.getSample();
  const auto ref = r.getRefLogp();
  const size_t p = lp.size();
  if ((p != 0 && p != n) || adv.size() != p || w.size() != p || smp.size() != p ||
      ref.size() != p) {
    return bad("has policy inputs that do not match its tokens");
  }
  x.policy.resize(p);
  for (unsigned i = 0; i < p; ++i) {
    x.policy[i].behaviour_logp = lp[i];
    x.policy[i].advantage = adv[i];
    x.policy[i].weight = w[i];
    x.policy[i].sample = smp[i];
    x.policy[i].ref_logp = ref[i];
  }
  return x;
}

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
    auto m = gpu::train::trainable_model<float>::load(*opened);
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
    auto t = gpu::rl::update_iteration(
        *model_, opt_, decay_, cfg_.grpo, in, cfg_.shares, lists,
        [this](std::span<const std::span<float>> grads, std::span<double> scalars) {
          return group_sum(*peers_, grads, scalars);
        });
    if (!t) return make_error(errc::unavailable, t.error().message());
    return {};
  }

  rl_trainer_config cfg_;
  std::string name_;
  std::shared_ptr<transport::engine> engine_;
  std::shared_ptr<rl_rank_shared> shared_;
  caf::actor self_;
  caf::actor controller_;
  std::unique_ptr<gpu::train::trainable_model<float>> model_;
  gpu::train::adamw opt_;
  std::vector<uint8_t> decay_;
  int64_t vocab_ = 0;
  std::unique_ptr<transport::peer_group> peers_;
  uint16_t generation_ = 0;
  bool fatal_ = false;
};

caf::behavior rl_trainer_actor(caf::event_based_actor* self, std::string name,
                               rl_trainer_config cfg, std::shared_ptr<transport::engine> engine) {
  // Detached: connecting blocks only this actor's own thread.
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

  status form(std::span<const std::span<float>> state) {
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
    if (auto s = broadcast_state(*peers, state); !s.ok()) {
      return make_error(errc::unavailable, "sending the trainer state: " + s.to_string());
    }
    spdlog::info(
        "trainer group {} formed ({} ranks; rank 0's weights and moments sent in {:.2f} s)",
        generation, cfg.world, std::chrono::duration<double>(clock_type::now() - t0).count());
    refresh_status();
    return {};
  }

  void refresh_status() {
    nlohmann::json j;
    j["generation"] = generation;
    j["groups_formed"] = groups;
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

gpu::status remote_trainers::ready(std::span<const std::span<float>> state) {
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
  auto st = group_sum(*d.peers, grads, scalars);
  d.reduce_s += std::chrono::duration<double>(clock_type::now() - t0).count();
  if (!st) d.lose(st.message());
  return st;
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
