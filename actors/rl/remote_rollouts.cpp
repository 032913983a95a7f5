#include "actors/rl/remote_rollouts.hpp"

#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/weight_image.hpp"
#include "gpu/rl/dispatch.hpp"
#include "schema/caf_bridge.hpp"
#include "transport/checksum.hpp"
#include "transport/registry.hpp"

namespace weft::rl {

using schema::envelope;
namespace wire = schema::wire;
using clock_type = std::chrono::steady_clock;

namespace {

/// What the controller actor hands to the loop's thread.
struct event {
  enum class type { hello, tokens, ack, down } what = type::hello;
  caf::actor who;        ///< hello: the agent
  caf::actor_addr from;  ///< tokens, ack, down: the sender
  envelope env;
};

using events = rl::event_queue<event>;

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

struct remote_rollouts::impl {
  remote_rollouts_config cfg;
  std::shared_ptr<events> queue = std::make_shared<events>();
  caf::actor controller;
  std::unique_ptr<transport::engine> transport;
  std::unique_ptr<weight_image> image;
  int64_t version = 0;

  static constexpr int no_pull = -3;  ///< agent_slot::pulling_from once its pull is done
  struct agent_slot {
    caf::actor who;
    bool alive = false;
    bool ready = false;  ///< holds `version` and takes rollouts
    uint32_t pid = 0;
    std::map<gpu::request_id, double> assigned;  ///< rollouts and their predicted cost
    double load = 0.0;
    /// Where peers can pull the version it holds (its pull buffer), once it pulled one.
    transport::bytes source_address, source_region;
    int64_t source_version = -1;
    int pulling_from = -1;  ///< the peer of its current pull (-1: the controller; no_pull)
    /// --weight-fanout: waits for a source with a free pull slot (the controller or an agent
    /// that holds the version) before it is offered the version.
    bool queued = false;
    /// Holds the current version in its pull buffer, pulled and verified, while it applies it
    /// (its acknowledgement follows): peers may pull it from there already.
    bool holding = false;
  };
  std::vector<agent_slot> agents;

  struct tracked {
    gpu::rl::rollout_request req;
    uint64_t key = 0;
    int agent = -1;                  ///< -1: waiting for an agent
    std::vector<int32_t> generated;  ///< tokens so far (replayed when it moves)
  };
  std::unordered_map<gpu::request_id, tracked> live;
  std::vector<gpu::request_id> waiting;  ///< in arrival order
  std::vector<gpu::rl::rollout_output> ready;
  gpu::rl::length_ranker ranker;
  int rr_next = 0;
  /// The agent each group's samples went to: a later request of the group (an agentic rollout's
  /// continuation after a tool call) goes there too while it lives, to reuse the KV of the turns
  /// before the call (its prefix cache).
  std::unordered_map<int64_t, int> group_agent;
  gpu::rl::rollout_backend_stats st;
  clock_type::time_point no_agent_since = clock_type::now();
  clock_type::time_point offered_at{};
  int controller_offers = 0;  ///< --weight-fanout: the current version's offers from the image
  std::string failure;        ///< set by handlers: poll() reports it
  bool started = false;       ///< wait_ready() saw every agent ready

  int slot_of(const caf::actor_addr& a) const {
    for (size_t i = 0; i < agents.size(); ++i) {
      if (agents[i].alive && agents[i].who.address() == a) return static_cast<int>(i);
    }
    return -1;
  }

  void send(const caf::actor& to, caf::atom_value what, envelope env) {
    caf::send_as(controller, to, what, std::move(env));
  }

  /// Offers the current version to agent i: from a live peer that holds it when `from_peer`
  /// (a joining agent spares the trainer's process), else from the controller's image.
  void offer_to(int i, bool from_peer) {
    int peer = -1;
    for (size_t j = 0; from_peer && j < agents.size(); ++j) {
      if (static_cast<int>(j) != i && holds_current(static_cast<int>(j))) {
        peer = static_cast<int>(j);
        break;
      }
    }
    offer_from(i, peer);
  }

  /// Whether agent j holds the current version where peers can pull it.
  bool holds_current(int j) const {
    const agent_slot& p = agents[static_cast<size_t>(j)];
    return p.alive && (p.ready || p.holding) && image != nullptr &&
           p.source_version == image->version() && !p.source_address.empty() &&
           !p.source_region.empty();
  }

  /// Pulls of the current version now running from `source` (−1: the controller).
  int pulls_from(int source) const {
    int n = 0;
    for (const auto& a : agents) n += a.alive && !a.ready && !a.queued && a.pulling_from == source;
    return n;
  }

  /// --weight-fanout F: the queued agents are offered the current version as a tree — F of
  /// them from the controller, then each from an agent that holds it, the one with the fewest
  /// pulls running, at most F at a time each — so a version leaves the trainer's process F times,
  /// not once per agent. With no agent holding it and no pull running (the holders died), the
  /// controller serves again.
  void relay() {
    if (cfg.weight_fanout <= 0 || image == nullptr) return;
    for (size_t i = 0; i < agents.size(); ++i) {
      agent_slot& a = agents[i];
      if (!a.alive || !a.queued) continue;
      int source = -2, busy = 0;
      if (controller_offers < cfg.weight_fanout) {
        source = -1;
      } else {
        for (size_t j = 0; j < agents.size(); ++j) {
          if (j == i || !holds_current(static_cast<int>(j))) continue;
          const int n = pulls_from(static_cast<int>(j));
          if (n < cfg.weight_fanout && (source == -2 || n < busy)) {
            source = static_cast<int>(j);
            busy = n;
          }
        }
        if (source == -2 && !any_pull_running() && !any_holder()) source = -1;
      }
      if (source == -2) return;  // every source busy: the next acknowledgement frees one
      a.queued = false;
      if (source == -1) ++controller_offers;
      offer_from(static_cast<int>(i), source);
      if (!failure.empty()) return;
    }
  }

  bool any_pull_running() const {
    for (const auto& a : agents) {
      if (a.alive && !a.ready && !a.queued) return true;
    }
    return false;
  }

  bool any_holder() const {
    for (size_t j = 0; j < agents.size(); ++j) {
      if (holds_current(static_cast<int>(j))) return true;
    }
    return false;
  }

  /// Offers the current version to agent i from `peer`'s pull buffer (−1: the controller).
  void offer_from(int i, int peer) {
    agent_slot& a = agents[static_cast<size_t>(i)];
    a.holding = false;  // its buffer is about to be overwritten
    auto env = peer >= 0 ? image->offer(cfg.weight_timeout_ms,
                                        &agents[static_cast<size_t>(peer)].source_address,
                                        &agents[static_cast<size_t>(peer)].source_region)
                         : image->offer(cfg.weight_timeout_ms);
    if (!env) {
      failure = "weight offer: " + env.error().message;
      return;
    }
    a.ready = false;
    a.pulling_from = peer;
    if (peer >= 0) {
      ++st.peer_weight_pulls;
      if (cfg.weight_fanout <= 0) {
        spdlog::info("rollout agent {} pulls weight version {} from rollout agent {}", i,
                     image->version(), peer);
      } else {
        spdlog::debug("rollout agent {} pulls weight version {} from rollout agent {}", i,
                      image->version(), peer);
      }
    } else {
      ++st.controller_weight_pulls;
    }
    caf::send_as(controller, a.who, r_offer_atom::value, std::move(*env));
  }

  void on_hello(const event& e) {
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

  void on_ack(const event& e) {
    const int i = slot_of(e.from);
    if (i < 0) return;
    auto k = e.env.read<wire::WeightAck>();
    if (!k) {
      spdlog::warn("rollout agent {} sent a malformed weight acknowledgement ({}); restarting it",
                   i, k.error().message);
      stop_agent(i);
      return;
    }
    agent_slot& a = agents[static_cast<size_t>(i)];
    const bool current = image != nullptr && k->get().getVersion() == image->version();
    if (k->get().getError().size() != 0) {
      if (!current) return;  // an older offer failed; the current one is on its way
      if (a.pulling_from >= 0) {
        spdlog::warn(
            "rollout agent {} could not pull weight version {} from rollout agent {} "
            "({}); pulling it from the controller",
            i, k->get().getVersion(), a.pulling_from, k->get().getError().cStr());
        offer_to(i, false);
        return;
      }
      spdlog::warn("rollout agent {} could not take weight version {}: {}; restarting it", i,
                   k->get().getVersion(), k->get().getError().cStr());
      stop_agent(i);
      return;
    }
    a.source_address.assign(reinterpret_cast<const std::byte*>(k->get().getAddress().begin()),
                            reinterpret_cast<const std::byte*>(k->get().getAddress().end()));
    a.source_region.assign(reinterpret_cast<const std::byte*>(k->get().getRegion().begin()),
                           reinterpret_cast<const std::byte*>(k->get().getRegion().end()));
    a.source_version = k->get().getVersion();
    if (!current) return;  // an older offer
    if (k->get().getPulled()) {
      // Pulled and verified, being applied: a source for its peers now, rollouts once applied.
      a.holding = true;
      a.pulling_from = no_pull;
      return;
    }
    a.ready = true;
    a.pulling_from = -1;
    st.last_pull_s = std::max(st.last_pull_s, k->get().getPullSeconds());
  }

  /// Whether an output's routes are whole positions of valid expert ids (routing replay) or
  /// absent.
  bool routes_fit(capnp::Data::Reader routes) const {
    if (routes.size() == 0) return true;
    const int64_t width = cfg.routes.width();
    if (width <= 0 || routes.size() % static_cast<size_t>(width) != 0) return false;
    const std::vector<int16_t> ids(routes.begin(), routes.end());
    return gpu::train::first_invalid_route(ids.data(), static_cast<int64_t>(ids.size()) / width,
                                           cfg.routes) < 0;
  }

  void on_tokens(const event& e) {
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
        spdlog::warn("rollout agent {} sent a malformed output for rollout {} ({}); restarting it",
                     i, o.getId(), bad);
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

  /// The agent's rollouts go back to the waiting list (they resume elsewhere).
  void lose(int i, const std::string& why) {
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

  void stop_agent(int i) {
    caf::anon_send_exit(agents[static_cast<size_t>(i)].who, caf::exit_reason::kill);
    lose(i, "stopped");
  }

  void on_down(const event& e) {
    const int i = slot_of(e.from);
    if (i >= 0) lose(i, "its actor is down");
  }

  void drain() {
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

  /// What status_json() answers (read from other threads: an HTTP endpoint).
  std::mutex status_mu;
  std::string status;

  void refresh_status() {
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

  void wait_a_little() {
    queue->wait_for(std::chrono::milliseconds(100));
    if (cfg.on_idle) cfg.on_idle();
  }

  std::vector<int> ready_agents() const {
    std::vector<int> out;
    for (size_t i = 0; i < agents.size(); ++i) {
      if (agents[i].alive && agents[i].ready) out.push_back(static_cast<int>(i));
    }
    return out;
  }

  /// Places the waiting rollouts on the ready agents.
  void dispatch() {
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

  /// Sends rollouts to agent a: each one's prompt and tokens so far (which it replays).
  void send_batch(int a, const std::vector<gpu::request_id>& ids) {
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

  /// Tail consolidation (cfg.consolidate_tail > 0): once the ready agents' unfinished rollouts fit
  /// on half of the agents holding them, the others' rollouts are aborted where they run and
  /// resumed on the agents that keep theirs — as a lost agent's are (the tokens that arrive in
  /// between from the source are dropped; the seeded replay gives them again).
  void consolidate() {
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
    spdlog::info("tail consolidation: {} rollouts of agent(s) {} move to agent(s) {}",
                 moving.size(), fmt::join(from, ","), fmt::join(to, ","));
  }

  gpu::status check_failure() {
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
};

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

gpu::status remote_rollouts::publish(int64_t version,
                                     std::span<const gpu::rl::named_weights> tensors) {
  const auto t0 = clock_type::now();
  if (d_->image == nullptr) {
    auto img = weight_image::create(*d_->transport, tensors);
    if (!img) return gpu::status{gpu::status_code::internal, img.error().message};
    d_->image = std::move(*img);
  }
  if (auto st = d_->image->fill(version, tensors); !st.ok()) {
    return gpu::status{gpu::status_code::internal, st.message};
  }
  d_->version = version;
  d_->st.last_pull_s = 0.0;
  d_->controller_offers = 0;
  for (size_t i = 0; i < d_->agents.size(); ++i) {
    auto& a = d_->agents[i];
    if (!a.alive) continue;
    if (d_->cfg.weight_fanout > 0) {
      a.ready = false;  // takes no rollout until it holds the version
      a.queued = true;
    } else {
      d_->offer_to(static_cast<int>(i), false);
    }
  }
  d_->relay();
  const auto deadline = t0 + std::chrono::milliseconds(d_->cfg.weight_timeout_ms);
  for (;;) {
    d_->drain();
    if (!d_->failure.empty()) return gpu::status{gpu::status_code::internal, d_->failure};
    bool all = true;
    for (const auto& a : d_->agents) all = all && (!a.alive || a.ready);
    if (all) break;
    if (clock_type::now() > deadline) {
      for (size_t i = 0; i < d_->agents.size(); ++i) {
        auto& a = d_->agents[i];
        if (!a.alive || a.ready) continue;
        spdlog::warn("rollout agent {} did not take weight version {} within {} s; restarting it",
                     i, version, d_->cfg.weight_timeout_ms / 1000);
        d_->stop_agent(static_cast<int>(i));
      }
      break;
    }
    d_->wait_a_little();
  }
  return {};
}

}  // namespace weft::rl
