#include "actors/rl/remote_rollouts.hpp"

#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <deque>

#include "actors/rl/remote_rollouts_impl.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "transport/checksum.hpp"

namespace weft::rl {

using schema::envelope;
namespace wire = schema::wire;
using rollouts_detail::clock_type;

namespace {

using rollouts_detail::event;
using rollouts_detail::events;

caf::behavior controller_actor(caf::event_based_actor* self, std::shared_ptr<events> q) {
  self->set_down_handler([q](const caf::down_msg& dm) {
    q->push(event{event::type::down, {}, dm.source, {}});
  });
  auto sender_addr = [self] {
    const auto& s = self->current_sender();
    return s ? s->address() : caf::actor_addr{};
  };
  return {
      [self, q](r_hello_atom, const envelope& env) {
        const auto& s = self->current_sender();
        if (!s) return;
        if (auto h = env.read<wire::RolloutAgentHello>(); !h) {
          spdlog::warn("rl controller: bad hello: {}", h.error().message);
          return;
        }
        auto who = caf::actor_cast<caf::actor>(s);
        self->monitor(who);
        q->push(event{event::type::hello, who, {}, env});
      },
      [q, sender_addr](r_tokens_atom, const envelope& env) {
        q->push(event{event::type::tokens, {}, sender_addr(), env});
      },
      [q, sender_addr](r_ack_atom, const envelope& env) {
        q->push(event{event::type::ack, {}, sender_addr(), env});
      },
  };
}

uint64_t prompt_key(const std::vector<int32_t>& prompt) {
  return transport::checksum(prompt.data(), prompt.size() * sizeof(int32_t));
}

}  // namespace

int remote_rollouts::impl::slot_of(const caf::actor_addr& a) const {
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i].alive && agents[i].who.address() == a) return static_cast<int>(i);
  }
  return -1;
}

void remote_rollouts::impl::send(const caf::actor& to, caf::atom_value what, envelope env) {
  caf::send_as(controller, to, what, std::move(env));
}

void remote_rollouts::impl::on_hello(const event& e) {
  auto h = e.env.read<wire::RolloutAgentHello>();
  if (!h) return;
  const uint32_t idx = h->get().getAgent();
  if (idx >= agents.size()) {
    spdlog::warn("rl controller: hello of agent {} in a run of {}", idx, agents.size());
    return;
  }
  if (const auto error = h->get().getError(); error.size() != 0) {
    // An agent that could not load: before the run started that ends it (the same model and
    // device on a restart give the same error); later its supervisor restarts it.
    const std::string why = std::string(error.cStr(), error.size());
    if (!started) {
      failure = "rollout agent " + std::to_string(idx) + ": " + why;
    } else {
      spdlog::error("rollout agent {} could not restart: {}", idx, why);
    }
    return;
  }
  if (agents[idx].alive) lose(static_cast<int>(idx), "replaced by a new incarnation");
  agent_slot& a = agents[idx];
  a.who = e.who;
  a.alive = true;
  a.pid = h->get().getPid();
  a.assigned.clear();
  a.load = 0.0;
  a.source_version = -1;
  a.pulling_from = -1;
  a.queued = false;
  a.holding = false;
  // An agent starts with the model file's weights: version 0 until the first publish().
  if (image == nullptr || image->version() == h->get().getVersion()) {
    a.ready = true;
    spdlog::info("rollout agent {} ready (pid {})", idx, a.pid);
  } else {
    spdlog::info("rollout agent {} joined (pid {}); sending weight version {}", idx, a.pid,
                 image->version());
    offer_to(static_cast<int>(idx), true);
  }
}

bool remote_rollouts::impl::routes_fit(capnp::Data::Reader routes) const {
  if (routes.size() == 0) return true;
  const int64_t width = cfg.routes.width();
  if (width <= 0 || routes.size() % static_cast<size_t>(width) != 0) return false;
  const std::vector<int16_t> ids(routes.begin(), routes.end());
  return gpu::train::first_invalid_route(ids.data(), static_cast<int64_t>(ids.size()) / width,
                                         cfg.routes) < 0;
}

void remote_rollouts::impl::on_tokens(const event& e) {
  const int i = slot_of(e.from);
  if (i < 0) return;  // a lost agent's late outputs
  auto p = e.env.read<wire::RolloutProgress>();
  if (!p) {
    spdlog::warn("rollout agent {} sent a malformed progress report ({}); restarting it", i,
                 p.error().message);
    stop_agent(i);
    return;
  }
  const int64_t v = p->get().getVersion();
  for (auto o : p->get().getOutputs()) {
    auto it = live.find(o.getId());
    if (it == live.end() || it->second.agent != i) continue;
    tracked& t = it->second;
    const char* bad =
        o.getFinish() > static_cast<uint8_t>(gpu::finish_reason::error) ? "unknown finish reason"
        : o.getLogprobs().size() != o.getTokens().size() ? "log-probs do not match its tokens"
        : !routes_fit(o.getRoutes()) ? "routes are not whole positions of valid expert ids"
                                     : nullptr;
    if (bad != nullptr) {
      spdlog::warn("rollout agent {} sent a malformed output for rollout {} ({}); restarting it", i,
                   o.getId(), bad);
      stop_agent(i);
      return;
    }
    gpu::rl::rollout_output out;
    out.version = v;
    out.out.id = o.getId();
    for (size_t k = 0; k < o.getTokens().size(); ++k) {
      out.out.new_tokens.push_back(o.getTokens()[static_cast<unsigned>(k)]);
      gpu::sample_result s;
      s.token = out.out.new_tokens.back();
      s.logprob = o.getLogprobs()[static_cast<unsigned>(k)];
      out.out.samples.push_back(std::move(s));
    }
    out.out.text_delta.assign(reinterpret_cast<const char*>(o.getText().begin()),
                              o.getText().size());
    out.out.finish = static_cast<gpu::finish_reason>(o.getFinish());
    out.out.stop_sample.token = o.getStopToken();
    out.out.stop_sample.logprob = o.getStopLogprob();
    out.out.error = o.getError().cStr();
    out.out.cached_prompt_tokens = o.getCachedPromptTokens();
    out.out.routes.assign(o.getRoutes().begin(), o.getRoutes().end());
    t.generated.insert(t.generated.end(), out.out.new_tokens.begin(), out.out.new_tokens.end());
    if (out.out.finish != gpu::finish_reason::none) {
      agent_slot& a = agents[static_cast<size_t>(i)];
      if (auto at = a.assigned.find(o.getId()); at != a.assigned.end()) {
        a.load -= at->second;
        a.assigned.erase(at);
      }
      const auto n_prompt = static_cast<int64_t>(t.req.prompt.size());
      ranker.observe(t.key, n_prompt, static_cast<int64_t>(t.generated.size()));
      live.erase(it);
    }
    ready.push_back(std::move(out));
  }
}

void remote_rollouts::impl::lose(int i, const std::string& why) {
  agent_slot& a = agents[static_cast<size_t>(i)];
  if (!a.alive) return;
  a.alive = false;
  a.ready = false;
  a.queued = false;
  a.holding = false;
  a.source_version = -1;
  ++st.agents_lost;
  int64_t moved = 0;
  for (const auto& [id, cost] : a.assigned) {
    auto it = live.find(id);
    if (it == live.end()) continue;
    it->second.agent = -1;
    waiting.push_back(id);
    ++moved;
  }
  a.assigned.clear();
  a.load = 0.0;
  std::sort(waiting.begin(), waiting.end());
  st.rollouts_moved += moved;
  spdlog::warn("rollout agent {} lost ({}): {} rollouts move to the other agents", i, why, moved);
}

void remote_rollouts::impl::stop_agent(int i) {
  caf::anon_send_exit(agents[static_cast<size_t>(i)].who, caf::exit_reason::kill);
  lose(i, "stopped");
}

void remote_rollouts::impl::on_down(const event& e) {
  const int i = slot_of(e.from);
  if (i >= 0) lose(i, "its actor is down");
}

void remote_rollouts::impl::drain() {
  const std::deque<event> taken = queue->take();
  for (const auto& e : taken) {
    switch (e.what) {
      case event::type::hello:
        on_hello(e);
        break;
      case event::type::tokens:
        on_tokens(e);
        break;
      case event::type::ack:
        on_ack(e);
        break;
      case event::type::down:
        on_down(e);
        break;
    }
  }
  relay();
  dispatch();
  consolidate();
  refresh_status();
}

void remote_rollouts::impl::refresh_status() {
  nlohmann::json j;
  j["weight_version"] = image ? image->version() : 0;
  j["rollouts_live"] = live.size();
  j["rollouts_waiting"] = waiting.size();
  j["agents_lost"] = st.agents_lost;
  j["rollouts_moved"] = st.rollouts_moved;
  j["rollouts_consolidated"] = st.rollouts_consolidated;
  j["peer_weight_pulls"] = st.peer_weight_pulls;
  j["controller_weight_pulls"] = st.controller_weight_pulls;
  auto& list = j["agents"] = nlohmann::json::array();
  for (size_t i = 0; i < agents.size(); ++i) {
    const agent_slot& a = agents[i];
    list.push_back({{"agent", i},
                    {"state", !a.alive  ? "down"
                              : a.ready ? "ready"
                                        : "syncing"},
                    {"pid", a.pid},
                    {"rollouts", a.assigned.size()},
                    {"load", a.load},
                    {"pulled_version", a.source_version}});
  }
  std::string text = j.dump();
  std::lock_guard<std::mutex> lock(status_mu);
  status = std::move(text);
}

void remote_rollouts::impl::wait_a_little() {
  queue->wait_for(std::chrono::milliseconds(100));
  if (cfg.on_idle) cfg.on_idle();
}

std::vector<int> remote_rollouts::impl::ready_agents() const {
  std::vector<int> out;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i].alive && agents[i].ready) out.push_back(static_cast<int>(i));
  }
  return out;
}

void remote_rollouts::impl::dispatch() {
  if (waiting.empty()) return;
  const auto targets = ready_agents();
  if (targets.empty()) return;
  // Units: the waiting samples of one group stay together; a group already placed on a ready
  // agent stays there.
  std::vector<std::vector<gpu::request_id>> units;
  std::map<int64_t, size_t> unit_of_group;
  std::map<int, std::vector<gpu::request_id>> per_agent;
  for (auto id : waiting) {
    tracked& t = live.at(id);
    if (auto g = group_agent.find(t.req.group); t.req.group >= 0 && g != group_agent.end() &&
                                                agents[static_cast<size_t>(g->second)].alive &&
                                                agents[static_cast<size_t>(g->second)].ready) {
      agent_slot& a = agents[static_cast<size_t>(g->second)];
      const double cost =
          std::max(1.0, ranker.predict(t.key, static_cast<int64_t>(t.req.prompt.size())) -
                            static_cast<double>(t.generated.size()));
      per_agent[g->second].push_back(id);
      t.agent = g->second;
      a.assigned[id] = cost;
      a.load += cost;
      continue;
    }
    if (t.req.group >= 0) {
      auto [it, fresh] = unit_of_group.emplace(t.req.group, units.size());
      if (fresh) units.emplace_back();
      units[it->second].push_back(id);
    } else {
      units.push_back({id});
    }
  }
  waiting.clear();
  std::vector<gpu::rl::dispatch_item> items;
  std::vector<double> cost_each;
  for (size_t u = 0; u < units.size(); ++u) {
    const tracked& t = live.at(units[u].front());
    const double predicted = ranker.predict(t.key, static_cast<int64_t>(t.req.prompt.size()));
    const double left = std::max(1.0, predicted - static_cast<double>(t.generated.size()));
    cost_each.push_back(left);
    items.push_back(gpu::rl::dispatch_item{static_cast<int64_t>(u),
                                           left * static_cast<double>(units[u].size())});
  }
  std::vector<int> where;
  if (cfg.length_aware) {
    std::vector<double> load;
    for (int a : targets) load.push_back(agents[static_cast<size_t>(a)].load);
    where = gpu::rl::place_longest_first(items, load);
  } else {
    where = gpu::rl::place_round_robin(items.size(), static_cast<int>(targets.size()), rr_next);
    rr_next = (rr_next + static_cast<int>(items.size())) % static_cast<int>(targets.size());
  }
  // Each agent starts its predicted-longest units first.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (cfg.length_aware) order = gpu::rl::longest_first_order(items);
  if (group_agent.size() > 65536) group_agent.clear();  // old steps' groups
  for (size_t u : order) {
    const int a = targets[static_cast<size_t>(where[u])];
    if (const int64_t g = live.at(units[u].front()).req.group; g >= 0) group_agent[g] = a;
    for (auto id : units[u]) {
      per_agent[a].push_back(id);
      live.at(id).agent = a;
      agents[static_cast<size_t>(a)].assigned[id] = cost_each[u];
      agents[static_cast<size_t>(a)].load += cost_each[u];
    }
  }
  for (auto& [a, ids] : per_agent) send_batch(a, ids);
}

void remote_rollouts::impl::send_batch(int a, const std::vector<gpu::request_id>& ids) {
  auto env = envelope::build<wire::RolloutBatch>([&](wire::RolloutBatch::Builder b) {
    auto list = b.initItems(static_cast<unsigned>(ids.size()));
    for (size_t k = 0; k < ids.size(); ++k) {
      const tracked& t = live.at(ids[k]);
      auto x = list[static_cast<unsigned>(k)];
      x.setId(ids[k]);
      auto toks = x.initTokens(static_cast<unsigned>(t.req.prompt.size() + t.generated.size()));
      unsigned j = 0;
      for (int32_t tok : t.req.prompt) toks.set(j++, tok);
      for (int32_t tok : t.generated) toks.set(j++, tok);
      x.setReplay(static_cast<uint32_t>(t.req.n_replay) +
                  static_cast<uint32_t>(t.generated.size()));
      x.setSeed(t.req.params.seed);
      x.setMaxTokens(t.req.params.max_tokens - static_cast<int32_t>(t.generated.size()));
      x.setGreedy(t.req.params.temperature == 0.0f);
      if (t.req.params.temperature > 0.0f) {
        x.setTemperature(t.req.params.temperature);
        x.setTopP(t.req.params.top_p);
        x.setTopK(t.req.params.top_k);
      }
      auto stops = x.initStopTokens(static_cast<unsigned>(t.req.params.stop_tokens.size()));
      for (size_t s = 0; s < t.req.params.stop_tokens.size(); ++s) {
        stops.set(static_cast<unsigned>(s), t.req.params.stop_tokens[s]);
      }
      const auto& strs = t.req.params.stop_strings;
      auto texts = x.initStopStrings(static_cast<unsigned>(strs.size()));
      for (size_t s = 0; s < strs.size(); ++s) texts.set(static_cast<unsigned>(s), strs[s]);
      x.setPriority(t.req.params.priority);
    }
  });
  spdlog::debug("rl controller: {} rollouts to agent {}", ids.size(), a);
  send(agents[static_cast<size_t>(a)].who, r_batch_atom::value, std::move(env));
}

void remote_rollouts::impl::consolidate() {
  if (cfg.consolidate_tail <= 0 || !waiting.empty()) return;
  std::vector<int> slots;
  std::vector<int64_t> unfinished;
  for (size_t i = 0; i < agents.size(); ++i) {
    const agent_slot& a = agents[i];
    if (!a.alive) continue;
    if (!a.ready) {
      if (!a.assigned.empty()) return;  // syncing with rollouts: wait until it holds the version
      continue;
    }
    slots.push_back(static_cast<int>(i));
    unfinished.push_back(static_cast<int64_t>(a.assigned.size()));
  }
  const auto keep = gpu::rl::consolidation_targets(unfinished, cfg.consolidate_tail);
  if (keep.empty()) return;
  std::vector<int> to, from;
  std::vector<gpu::request_id> moving;
  for (size_t k = 0; k < slots.size(); ++k) {
    agent_slot& a = agents[static_cast<size_t>(slots[k])];
    if (std::find(keep.begin(), keep.end(), static_cast<int>(k)) != keep.end()) {
      to.push_back(slots[k]);
      continue;
    }
    if (a.assigned.empty()) continue;
    from.push_back(slots[k]);
    std::vector<gpu::request_id> ids;
    for (const auto& [id, cost] : a.assigned) ids.push_back(id);
    send(a.who, r_abort_atom::value,
         envelope::build<wire::RolloutAbort>([&](wire::RolloutAbort::Builder b) {
           auto list = b.initIds(static_cast<unsigned>(ids.size()));
           for (size_t x = 0; x < ids.size(); ++x) list.set(static_cast<unsigned>(x), ids[x]);
         }));
    moving.insert(moving.end(), ids.begin(), ids.end());
    a.assigned.clear();
    a.load = 0.0;
  }
  // A group's rollouts stay together where they fit; otherwise the least-held agent.
  std::sort(moving.begin(), moving.end(), [&](gpu::request_id x, gpu::request_id y) {
    return std::pair(live.at(x).req.group, x) < std::pair(live.at(y).req.group, y);
  });
  auto held = [&](int a) {
    return static_cast<int64_t>(agents[static_cast<size_t>(a)].assigned.size());
  };
  std::map<int, std::vector<gpu::request_id>> per_agent;
  std::map<int64_t, int> moved_group;
  for (auto id : moving) {
    tracked& t = live.at(id);
    int a =
        *std::min_element(to.begin(), to.end(), [&](int x, int y) { return held(x) < held(y); });
    if (auto g = moved_group.find(t.req.group);
        t.req.group >= 0 && g != moved_group.end() && held(g->second) < cfg.consolidate_tail) {
      a = g->second;
    }
    if (t.req.group >= 0) {
      moved_group[t.req.group] = a;
      group_agent[t.req.group] = a;
    }
    const double cost =
        std::max(1.0, ranker.predict(t.key, static_cast<int64_t>(t.req.prompt.size())) -
                          static_cast<double>(t.generated.size()));
    t.agent = a;
    agents[static_cast<size_t>(a)].assigned[id] = cost;
    agents[static_cast<size_t>(a)].load += cost;
    per_agent[a].push_back(id);
  }
  for (auto& [a, ids] : per_agent) send_batch(a, ids);
  st.rollouts_consolidated += static_cast<int64_t>(moving.size());
  ++st.consolidations;
  spdlog::info("tail consolidation: {} rollouts of agent(s) {} move to agent(s) {}", moving.size(),
               fmt::join(from, ","), fmt::join(to, ","));
}

gpu::status remote_rollouts::impl::check_failure() {
  if (!failure.empty()) return gpu::status{gpu::status_code::internal, failure};
  const bool any_ready = !ready_agents().empty();
  if (any_ready || live.empty()) {
    no_agent_since = clock_type::now();
    return {};
  }
  if (clock_type::now() - no_agent_since > std::chrono::milliseconds(cfg.no_agent_timeout_ms)) {
    return gpu::status{gpu::status_code::internal,
                       std::to_string(live.size()) + " rollouts waited " +
                           std::to_string(cfg.no_agent_timeout_ms / 1000) +
                           " s with no rollout agent ready"};
  }
  return {};
}

remote_rollouts::remote_rollouts(std::unique_ptr<impl> d) : d_(std::move(d)) {}

remote_rollouts::~remote_rollouts() {
  shutdown();
}

void remote_rollouts::shutdown() {
  if (!d_ || !d_->controller) return;
  caf::anon_send_exit(d_->controller, caf::exit_reason::user_shutdown);
  d_->controller = nullptr;
  for (auto& a : d_->agents) {
    a.who = nullptr;
    a.alive = false;
    a.ready = false;
  }
  (void)d_->queue->take();
}

result<std::unique_ptr<remote_rollouts>> remote_rollouts::create(caf::actor_system& sys,
                                                                 remote_rollouts_config cfg) {
  if (cfg.agents < 1 || cfg.agents > 4096) {
    return make_error(errc::invalid_argument, "rl: 1 to 4096 rollout agents");
  }
  auto d = std::make_unique<impl>();
  d->cfg = std::move(cfg);
  d->agents.resize(static_cast<size_t>(d->cfg.agents));
  transport::engine_config ecfg;
  ecfg.params = d->cfg.transport_params;
  auto engine = transport::make_engine("ucx", ecfg);
  if (!engine) {
    return make_error(errc::unavailable,
                      "rl: the weight source's transport: " + engine.error().to_string());
  }
  d->transport = std::move(*engine);
  d->controller = sys.spawn(controller_actor, d->queue);
  return std::unique_ptr<remote_rollouts>(new remote_rollouts(std::move(d)));
}

std::string remote_rollouts::status_json() const {
  std::lock_guard<std::mutex> lock(d_->status_mu);
  return d_->status.empty() ? std::string{"null"} : d_->status;
}

caf::actor remote_rollouts::controller() const {
  return d_->controller;
}

status remote_rollouts::wait_ready(uint32_t timeout_ms) {
  const auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    d_->drain();
    if (!d_->failure.empty()) return make_error(errc::internal, d_->failure);
    if (static_cast<int>(d_->ready_agents().size()) == d_->cfg.agents) {
      d_->started = true;
      return {};
    }
    if (clock_type::now() > deadline) {
      return make_error(errc::timeout, std::to_string(d_->ready_agents().size()) + " of " +
                                           std::to_string(d_->cfg.agents) +
                                           " rollout agents were ready after " +
                                           std::to_string(timeout_ms / 1000) + " s");
    }
    d_->wait_a_little();
  }
}

gpu::rl::rollout_backend_stats remote_rollouts::stats() const {
  gpu::rl::rollout_backend_stats s = d_->st;
  s.ready_agents = static_cast<int>(d_->ready_agents().size());
  return s;
}

gpu::status remote_rollouts::add(std::vector<gpu::rl::rollout_request> requests) {
  for (auto& r : requests) {
    if (r.n_replay < 0 || r.n_replay >= static_cast<int64_t>(r.prompt.size()) ||
        d_->live.count(r.id) != 0) {
      return gpu::status{gpu::status_code::invalid_argument,
                         "rollout " + std::to_string(r.id) +
                             ": a new request with a prompt beyond its replayed tokens"};
    }
    impl::tracked t;
    t.key = prompt_key(r.prompt);
    const auto id = r.id;
    t.req = std::move(r);
    d_->live.emplace(id, std::move(t));
    d_->waiting.push_back(id);
  }
  d_->dispatch();
  return {};
}

gpu::status remote_rollouts::abort(gpu::request_id id) {
  auto it = d_->live.find(id);
  if (it == d_->live.end()) return {};
  if (it->second.agent >= 0) {
    auto& a = d_->agents[static_cast<size_t>(it->second.agent)];
    if (auto at = a.assigned.find(id); at != a.assigned.end()) {
      a.load -= at->second;
      a.assigned.erase(at);
    }
    if (a.alive) {
      d_->send(a.who, r_abort_atom::value,
               envelope::build<wire::RolloutAbort>(
                   [&](wire::RolloutAbort::Builder b) { b.initIds(1).set(0, id); }));
    }
  }
  d_->waiting.erase(std::remove(d_->waiting.begin(), d_->waiting.end(), id), d_->waiting.end());
  d_->live.erase(it);
  gpu::rl::rollout_output out;
  out.out.id = id;
  out.out.finish = gpu::finish_reason::aborted;
  out.version = d_->version;
  d_->ready.push_back(std::move(out));
  return {};
}

gpu::result<std::vector<gpu::rl::rollout_output>> remote_rollouts::poll() {
  for (;;) {
    d_->drain();
    if (auto st = d_->check_failure(); !st) return st;
    if (!d_->ready.empty()) {
      std::vector<gpu::rl::rollout_output> out;
      out.swap(d_->ready);
      return out;
    }
    if (d_->live.empty()) return std::vector<gpu::rl::rollout_output>{};
    d_->wait_a_little();
  }
}

bool remote_rollouts::has_work() const {
  return !d_->live.empty() || !d_->ready.empty();
}

}  // namespace weft::rl
