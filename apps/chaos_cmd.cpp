// `weft chaos`: a fault runner for users' own deployments (docs/chaos.md). Faults — SIGKILL, or
// SIGSTOP for a while then SIGCONT — hit processes by role on a schedule or at random from a seed
// while a workload runs; afterwards invariants are checked, a JSON report and a PNG timeline are
// written, and the exit status is 1 when an invariant breaks. Two targets:
// - a running `weft serve` (--url): the workload is an open-loop load (the generator of `weft
//   bench serve`), the processes are its engine workers and cache shards (GET /admin/cluster);
//   invariants: every accepted request completed or got an explicit error, every completed stream
//   carries exactly the tokens it asked for, no KV block stays referenced, recovery within a bound;
// - a cluster (--head HOST:PORT + its secret): the processes are nodes chosen by the roles of the
//   actors they run (the head's ClusterStatus), the workload is the user's command (--workload);
//   invariants: every killed node detected, its actors running again elsewhere within the bound,
//   the workload's exit status 0.

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "actors/child_process.hpp"
#include "actors/signed_requests.hpp"
#include "apps/cluster_options.hpp"
#include "apps/commands.hpp"
#include "apps/loadgen/openai_client.hpp"
#include "apps/loadgen/runner.hpp"
#include "apps/loadgen/workload.hpp"
#include "apps/train_report.hpp"
#include "schema/status.hpp"

namespace weft::apps {

namespace {

namespace lg = loadgen;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct chaos_options {
  // The target: a weft serve (--url), or a cluster (--head and its credentials).
  std::string url = "http://127.0.0.1:8000";
  std::string head;
  cluster_cli cluster;
  std::string workload;
  std::string api_key;
  double duration_s = 30.0;
  double rate_rps = 2.0;
  int64_t prompt_tokens = 32;
  int64_t max_tokens = 32;
  uint64_t seed = 0;
  std::vector<std::string> faults;
  int random_faults = 0;
  std::string random_kinds = "kill";
  std::string random_role = "any";
  double stop_s = 3.0;
  int min_inflight = 1;
  actors::transport_faults xfer;  ///< what an xfer fault injects
  double max_recovery_s = 60.0;
  double settle_s = 30.0;
  double request_timeout_s = 300.0;
  std::string report;
  std::string plot;
};

/// One planned fault: `kind` on the busiest worker of `role`, `at_s` after the load starts.
struct fault_spec {
  std::string kind;  ///< "kill" or "stop"
  std::string role;  ///< "any", "both", "prefill", "decode", "cache_shard"
  double at_s = 0.0;
  double hold_s = 0.0;  ///< stop: how long the process stays stopped
};

/// "kill:ROLE@T", "stop:ROLE@T+HOLD" or (cluster only) "cut:ROLE@T+HOLD", "xfer:ROLE@T+HOLD"
/// (seconds). ROLE: for a
/// weft serve one of any, both, prefill, decode, cache_shard; for a cluster any actor role (or
/// any).
weft::result<fault_spec> parse_fault(const std::string& s, double default_hold_s, bool cluster) {
  const auto bad = [&](const std::string& why) {
    return make_error(
        errc::invalid_argument,
        "--fault '" + s + "': " + why +
            " (expected kill:ROLE@SECONDS or stop:ROLE@SECONDS[+HOLD_SECONDS], ROLE " +
            (cluster ? "an actor role or any" : "one of any, both, prefill, decode, cache_shard") +
            ")");
  };
  const auto colon = s.find(':');
  const auto at = s.find('@');
  if (colon == std::string::npos || at == std::string::npos || at < colon) return bad("malformed");
  fault_spec f;
  f.kind = s.substr(0, colon);
  f.role = s.substr(colon + 1, at - colon - 1);
  if (f.kind != "kill" && f.kind != "stop" && f.kind != "cut" && f.kind != "xfer") {
    return bad("unknown fault kind '" + f.kind + "'");
  }
  if ((f.kind == "cut" || f.kind == "xfer") && !cluster) {
    return bad(f.kind + " needs a cluster target (--head)");
  }
  const bool serve_role = f.role == "any" || f.role == "both" || f.role == "prefill" ||
                          f.role == "decode" || f.role == "cache_shard";
  const bool role_name = !f.role.empty() && f.role.find_first_not_of(
                                                "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                                                "VWXYZ0123456789_-.") == std::string::npos;
  if (cluster ? !role_name : !serve_role) return bad("unknown role '" + f.role + "'");
  std::string when = s.substr(at + 1);
  f.hold_s = default_hold_s;
  if (auto plus = when.find('+'); plus != std::string::npos) {
    if (f.kind == "kill") return bad("kill takes no +HOLD");
    try {
      f.hold_s = std::stod(when.substr(plus + 1));
    } catch (const std::exception&) {
      return bad("bad hold time");
    }
    when = when.substr(0, plus);
  }
  try {
    f.at_s = std::stod(when);
  } catch (const std::exception&) {
    return bad("bad time");
  }
  if (f.at_s < 0 || f.hold_s <= 0) return bad("times must be positive");
  return f;
}

/// `n` faults at uniform random times in [0.15, 0.7] of the run, kinds drawn from `kinds`.
std::vector<fault_spec> random_faults(int n, const std::vector<std::string>& kinds,
                                      const std::string& role, double duration_s, double hold_s,
                                      uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::uniform_real_distribution<double> when(0.15 * duration_s, 0.7 * duration_s);
  std::vector<fault_spec> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({kinds[rng() % kinds.size()], role, when(rng), hold_s});
  }
  std::sort(out.begin(), out.end(),
            [](const fault_spec& a, const fault_spec& b) { return a.at_s < b.at_s; });
  return out;
}

/// What happened to one fault.
struct fault_event {
  fault_spec spec;
  std::string target;  ///< worker or shard name ("" when no process had the role)
  int pid = 0;
  size_t inflight = 0;
  double fired_s = -1.0;
  double resumed_s = -1.0;    ///< stop: when SIGCONT was sent
  double detected_s = -1.0;   ///< the router stopped counting it as serving (dead or stalled)
  double recovered_s = -1.0;  ///< serving again (a new process, or the same one resumed)
  std::string error;
  std::vector<std::string> actors;  ///< cluster: the actors the node ran when it was hit
};

/// A process a fault can hit: an engine worker or shard as the router lists it (serve), or a
/// node as the head lists it (cluster).
struct member {
  std::string name, role, state;
  int pid = 0;
  size_t inflight = 0;
  int64_t kv_used = 0;
  int64_t last_report_ms_ago = 0;
  bool up = false;                       ///< serving (serve) / alive (cluster)
  std::vector<std::string> actors;       ///< cluster: its running actors
  std::vector<std::string> actor_roles;  ///< cluster: their roles
  std::string host;                      ///< cluster: where its node agent is published
  uint16_t port = 0;
};

/// Reads GET /admin/cluster.
class admin_client {
 public:
  admin_client(const lg::server_endpoint& ep, const std::string& api_key)
      : cli_(ep.scheme_host_port), prefix_(ep.path_prefix), key_(api_key) {
    cli_.set_connection_timeout(2, 0);
    cli_.set_read_timeout(5, 0);
  }
  std::optional<std::vector<member>> members() {
    httplib::Headers h;
    if (!key_.empty()) h.emplace("Authorization", "Bearer " + key_);
    auto res = cli_.Get(prefix_ + "/admin/cluster", h);
    if (!res || res->status != 200) return std::nullopt;
    auto j = json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.contains("router") || !j["router"].is_object()) return std::nullopt;
    std::vector<member> out;
    for (const auto& w : j["router"].value("workers", json::array())) {
      member m;
      m.name = w.value("name", "");
      m.role = w.value("role", "");
      m.state = w.value("state", "");
      m.pid = w.value("pid", 0);
      m.inflight = w.value("inflight", size_t{0});
      m.kv_used = w.value("kv_blocks_used", int64_t{0});
      m.last_report_ms_ago = w.value("last_report_ms_ago", int64_t{0});
      m.up = m.state == "idle" || m.state == "busy";
      out.push_back(std::move(m));
    }
    for (const auto& s : j["router"].value("shards", json::array())) {
      member m;
      m.name = s.value("name", "");
      m.role = "cache_shard";
      m.state = "idle";
      m.pid = s.value("pid", 0);
      m.up = true;
      out.push_back(std::move(m));
    }
    return out;
  }

 private:
  httplib::Client cli_;
  std::string prefix_, key_;
};

/// Brings every network interface of process `pid`'s network namespace but loopback down (a cut
/// link) or up again. The process must live in a namespace of its own (weft cluster up --netns);
/// needs root (nsenter, iproute2).
weft::status set_node_links(int pid, bool up) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto theirs = fs::read_symlink("/proc/" + std::to_string(pid) + "/ns/net", ec);
  const auto ours = fs::read_symlink("/proc/self/ns/net", ec);
  if (ec || theirs.empty()) {
    return make_error(errc::unavailable,
                      "cannot read the network namespace of pid " + std::to_string(pid));
  }
  if (theirs == ours) {
    return make_error(errc::invalid_argument,
                      "pid " + std::to_string(pid) +
                          " shares this host's network namespace: a link cut needs a cluster in "
                          "network namespaces (weft cluster up --netns)");
  }
  const std::string enter = "nsenter --net=/proc/" + std::to_string(pid) + "/ns/net ";
  std::FILE* p = ::popen((enter + "ip -o link show 2>/dev/null").c_str(), "r");
  if (p == nullptr) return make_error(errc::unavailable, "cannot run nsenter");
  std::vector<std::string> links;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    // "2: eth0@if7: <...>": the name ends at '@' or ':'.
    std::string l = line;
    const auto a = l.find(": ");
    if (a == std::string::npos) continue;
    const auto b = l.find_first_of("@:", a + 2);
    std::string name = l.substr(a + 2, b - a - 2);
    if (name != "lo" && !name.empty()) links.push_back(name);
  }
  const int rc = ::pclose(p);
  if (rc != 0 || links.empty()) {
    return make_error(errc::unavailable, "cannot list the links of pid " + std::to_string(pid) +
                                             " (link cuts need root, nsenter and iproute2)");
  }
  for (const auto& l : links) {
    const std::string cmd = enter + "ip link set " + l + (up ? " up" : " down");
    if (std::system(cmd.c_str()) != 0) {
      return make_error(errc::unavailable, "'" + cmd + "' failed");
    }
  }
  return {};
}

// -- targets --------------------------------------------------------------------------------------

/// What a fault runner needs of the system under test: its processes, which of them a fault of a
/// role may hit (and which first), and when a fault counts as detected and recovered from.
class chaos_target {
 public:
  virtual ~chaos_target() = default;
  /// The current processes; nullopt when the system cannot be asked right now.
  virtual std::optional<std::vector<member>> members() = 0;
  virtual bool matches(const std::string& role, const member& m) const = 0;
  /// Among matching processes the one with the highest weight is hit.
  virtual size_t weight(const std::string& role, const member& m) const = 0;
  /// Whether `m` has enough going on to be worth hitting now (else wait up to 10 s).
  virtual bool busy_enough(const member& m) const = 0;
  /// Updates detection and recovery of `e` from one sample of the members at time `t`.
  virtual void update(fault_event& e, const std::vector<member>& ms, double t) const = 0;
  /// Sets the transport faults of `m`'s node (xfer faults; all zero heals).
  virtual weft::status set_transport_faults(const member&, const actors::transport_faults&) {
    return make_error(errc::invalid_argument, "transport faults need a cluster target (--head)");
  }
};

/// A running `weft serve`: its engine workers and cache shards, as the router sees them.
class serve_target : public chaos_target {
 public:
  serve_target(const lg::server_endpoint& ep, const std::string& api_key, int min_inflight)
      : admin_(ep, api_key), min_inflight_(min_inflight) {}
  std::optional<std::vector<member>> members() override { return admin_.members(); }
  bool matches(const std::string& role, const member& m) const override {
    if (role == "any") return m.role != "cache_shard";
    return m.role == role;
  }
  size_t weight(const std::string&, const member& m) const override { return m.inflight; }
  bool busy_enough(const member& m) const override {
    return m.role == "cache_shard" || m.inflight >= static_cast<size_t>(min_inflight_);
  }
  // Detection: the router no longer counts the victim as serving under its pid (gone from the
  // list, or stalled / unresponsive). Recovery after a kill: its name serves again under a new
  // pid (the supervisor restarted it). After a stop: once SIGCONT was sent, the same process
  // reports again (a load report younger than a second) — whether or not the router noticed the
  // pause (a stop shorter than the router's stall bound goes undetected).
  void update(fault_event& e, const std::vector<member>& ms, double t) const override {
    const member* same_name = nullptr;
    for (const auto& m : ms) {
      if (m.name == e.target) same_name = &m;
    }
    const bool victim_serving = same_name != nullptr && same_name->pid == e.pid && same_name->up;
    if (e.detected_s < 0 && !victim_serving) e.detected_s = t - e.fired_s;
    if (same_name == nullptr || !same_name->up) return;
    if (e.spec.kind == "kill" && e.detected_s >= 0 && same_name->pid != e.pid) {
      e.recovered_s = t - e.fired_s;
    } else if (e.spec.kind == "stop" && e.resumed_s >= 0 && t > e.resumed_s &&
               same_name->last_report_ms_ago < 1000 &&
               t - e.resumed_s > same_name->last_report_ms_ago / 1e3) {
      e.recovered_s = t - e.fired_s;
    }
  }
  /// KV blocks still referenced on the workers (-1: unknown).
  int64_t kv_used() {
    auto ms = admin_.members();
    if (!ms) return -1;
    int64_t used = 0;
    for (const auto& m : *ms) used += m.kv_used;
    return used;
  }

 private:
  admin_client admin_;
  int min_inflight_;
};

/// A cluster reached through its head: the nodes and the actors they run.
class cluster_target : public chaos_target {
 public:
  cluster_target(caf::actor_system& sys, actors::head_actor head, actors::cluster_secret secret)
      : sys_(sys), head_(head), secret_(std::move(secret)) {}
  std::optional<std::vector<member>> members() override {
    auto st = actors::cluster_status(sys_, head_, 2000);
    if (!st) return std::nullopt;
    auto v = st->read<schema::wire::ClusterStatus>();
    if (!v) return std::nullopt;
    head_id_ = v->get().getHeadId().cStr();
    std::vector<member> out;
    for (auto n : v->get().getNodes()) {
      member m;
      m.name = n.getNode().getNodeId().cStr();
      m.pid = static_cast<int>(n.getNode().getPid());
      m.up = n.getState() == schema::wire::NodeState::ALIVE;
      m.state = m.up ? "alive" : "down";
      m.host = n.getNode().getHost().cStr();
      m.port = n.getNode().getPort();
      for (auto a : n.getActors()) {
        if (a.getState() != schema::wire::ActorState::RUNNING) continue;
        m.actors.push_back(a.getName().cStr());
        m.actor_roles.push_back(a.getRole().cStr());
      }
      m.inflight = m.actors.size();
      out.push_back(std::move(m));
    }
    return out;
  }
  // ROLE "any": any node but the head's; otherwise nodes running an actor of that role.
  bool matches(const std::string& role, const member& m) const override {
    if (m.name == head_id_) return false;  // the head is the cluster: a target of its own
    if (role == "any") return true;
    return std::find(m.actor_roles.begin(), m.actor_roles.end(), role) != m.actor_roles.end();
  }
  size_t weight(const std::string& role, const member& m) const override {
    if (role == "any") return m.actors.size();
    return static_cast<size_t>(std::count(m.actor_roles.begin(), m.actor_roles.end(), role));
  }
  bool busy_enough(const member&) const override { return true; }
  weft::status set_transport_faults(const member& m, const actors::transport_faults& f) override {
    auto agent = actors::connect_node_agent(sys_, m.host, m.port);
    if (!agent) {
      return make_error(agent.error().code, "node " + m.name + ": " + agent.error().message);
    }
    weft::status out = make_error(errc::timeout, "node " + m.name + " did not answer in 5 s");
    caf::scoped_actor self{sys_};
    self->request(*agent, std::chrono::seconds(5), actors::fault_atom::value,
                  actors::make_transport_faults(secret_, f, 5'000))
        .receive([&](const schema::envelope& reply) { out = schema::error_from(reply); },
                 [&](caf::error& err) {
                   out =
                       make_error(errc::unavailable, "node " + m.name + ": " + caf::to_string(err));
                 });
    return out;
  }
  // Detection: the head no longer lists the node as alive (after a stop: only if the pause
  // outlasted its heartbeat timeout). Recovery: every actor the node ran when it was hit runs
  // again on a live node — restarted elsewhere by its supervisor, or on the same node once a
  // stopped one is back.
  void update(fault_event& e, const std::vector<member>& ms, double t) const override {
    const member* victim = nullptr;
    for (const auto& m : ms) {
      if (m.name == e.target) victim = &m;
    }
    if (e.detected_s < 0 && (victim == nullptr || !victim->up || victim->pid != e.pid)) {
      e.detected_s = t - e.fired_s;
    }
    if (e.spec.kind == "kill" && e.detected_s < 0) return;
    if (e.spec.kind != "kill" && e.resumed_s < 0) return;  // stop, cut: not before the end
    for (const auto& a : e.actors) {
      bool running = false;
      for (const auto& m : ms) {
        if (!m.up || (e.spec.kind == "kill" && m.name == e.target)) continue;
        running = running || std::find(m.actors.begin(), m.actors.end(), a) != m.actors.end();
      }
      if (!running) return;
    }
    if (e.spec.kind != "kill" && e.actors.empty() && (victim == nullptr || !victim->up)) return;
    e.recovered_s = t - e.fired_s;
  }

 private:
  caf::actor_system& sys_;
  actors::head_actor head_;
  actors::cluster_secret secret_;
  std::string head_id_;
};

/// Samples of the target's view over time (for the timeline and the fault bookkeeping).
struct sample {
  double t_s;
  int serving;
  int members;
};

// -- the run --------------------------------------------------------------------------------------

/// Fires the planned faults at `target` while `workload` runs (it returns when the load is over),
/// and keeps the bookkeeping that the report is made of.
class chaos_run {
 public:
  chaos_run(const chaos_options& o, chaos_target& target, std::vector<fault_spec> plan)
      : o_(o), target_(target) {
    for (auto& f : plan) {
      fault_event e;
      e.spec = f;
      events_.push_back(std::move(e));
    }
  }

  void run(const std::function<void()>& workload) {
    start_ = clock_type::now();
    std::thread monitor([this] { monitor_loop(); });
    std::thread faults([this] { fault_loop(); });
    workload();
    load_done_ = true;
    faults.join();
    wait_recoveries();
    stop_ = true;
    monitor.join();
  }

  double now_s() const { return std::chrono::duration<double>(clock_type::now() - start_).count(); }

  /// The faults as the report lists them, and whether each fired and recovered.
  json faults_json(size_t& unfired, size_t& unrecovered) {
    std::lock_guard<std::mutex> lock(mu_);
    json faults = json::array();
    unfired = unrecovered = 0;
    for (const auto& e : events_) {
      if (e.target.empty())
        ++unfired;
      else if (e.recovered_s < 0)
        ++unrecovered;
      json f = {{"kind", e.spec.kind},
                {"role", e.spec.role},
                {"planned_s", e.spec.at_s},
                {"hold_s", e.spec.kind == "stop" ? e.spec.hold_s : 0.0},
                {"target", e.target},
                {"pid", e.pid},
                {"inflight", e.inflight},
                {"fired_s", e.fired_s},
                {"detected_after_s", e.detected_s >= 0 ? json(e.detected_s) : json()},
                {"recovered_after_s", e.recovered_s >= 0 ? json(e.recovered_s) : json()},
                {"error", e.error}};
      if (!e.actors.empty()) f["actors"] = e.actors;
      faults.push_back(std::move(f));
    }
    return faults;
  }

  json timeline_json() {
    std::lock_guard<std::mutex> lock(mu_);
    json timeline = json::array();
    for (const auto& s : samples_) {
      timeline.push_back({{"t_s", s.t_s}, {"serving", s.serving}, {"members", s.members}});
    }
    return timeline;
  }

 private:
  void monitor_loop() {
    while (!stop_) {
      if (auto ms = target_.members()) {
        std::lock_guard<std::mutex> lock(mu_);
        const double t = now_s();
        int n_up = 0;
        for (const auto& m : *ms) n_up += m.up ? 1 : 0;
        samples_.push_back({t, n_up, static_cast<int>(ms->size())});
        for (auto& e : events_) {
          if (e.fired_s >= 0 && !e.target.empty() && e.recovered_s < 0) target_.update(e, *ms, t);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  void fault_loop() {
    for (size_t i = 0; i < events_.size(); ++i) {
      fault_spec spec;
      {
        std::lock_guard<std::mutex> lock(mu_);
        spec = events_[i].spec;
      }
      while (!load_done_ && now_s() < spec.at_s) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (load_done_) {
        std::lock_guard<std::mutex> lock(mu_);
        events_[i].error = "the workload ended before this fault's time";
        continue;
      }
      fire(i, spec);
    }
  }

  // The matching process with the highest weight; waits up to 10 s for one that is busy enough
  // (a fault that hits an idle process tests little).
  void fire(size_t i, const fault_spec& spec) {
    std::optional<std::vector<member>> ms;
    std::optional<member> victim;
    const auto patience = clock_type::now() + std::chrono::seconds(10);
    for (;;) {
      ms = target_.members();
      victim.reset();
      if (ms) {
        for (const auto& m : *ms) {
          if (!target_.matches(spec.role, m) || !m.up || m.pid <= 0) continue;
          if (!victim || target_.weight(spec.role, m) > target_.weight(spec.role, *victim)) {
            victim = m;
          }
        }
      }
      const bool ready = victim && target_.busy_enough(*victim);
      if (ready || load_done_ || clock_type::now() > patience) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::unique_lock<std::mutex> lock(mu_);
    auto& e = events_[i];
    if (!victim) {
      e.error = ms ? "no live process with role " + spec.role : "the target did not answer";
      spdlog::warn("chaos: {} {}: {}", spec.kind, spec.role, e.error);
      return;
    }
    e.target = victim->name;
    e.pid = victim->pid;
    e.inflight = victim->inflight;
    e.actors = victim->actors;
    e.fired_s = now_s();
    if (spec.kind == "xfer") {
      const member node = *victim;
      if (auto st = target_.set_transport_faults(node, o_.xfer); !st.ok()) {
        e.error = st.message;
        e.target.clear();
        spdlog::error("chaos: {}", e.error);
        return;
      }
      spdlog::info("chaos: transport faults on {} at {:.1f} s", node.name, e.fired_s);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double>(spec.hold_s));
      auto healed = target_.set_transport_faults(node, actors::transport_faults{});
      std::lock_guard<std::mutex> relock(mu_);
      events_[i].resumed_s = now_s();
      if (!healed.ok()) events_[i].error = "healing the transport: " + healed.message;
      spdlog::info("chaos: healed the transport of {} after {:.1f} s", node.name, spec.hold_s);
      return;
    }
    if (spec.kind == "cut") {
      const int pid = victim->pid;
      if (auto st = set_node_links(pid, false); !st.ok()) {
        e.error = st.message;
        e.target.clear();
        spdlog::error("chaos: {}", e.error);
        return;
      }
      spdlog::info("chaos: cut the links of {} (pid {}) at {:.1f} s", victim->name, pid, e.fired_s);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double>(spec.hold_s));
      auto restored = set_node_links(pid, true);
      std::lock_guard<std::mutex> relock(mu_);
      events_[i].resumed_s = now_s();
      if (!restored.ok()) events_[i].error = "restoring the link: " + restored.message;
      spdlog::info("chaos: restored the links of {} after {:.1f} s", victim->name, spec.hold_s);
      return;
    }
    const int sig = spec.kind == "kill" ? SIGKILL : SIGSTOP;
    if (::kill(victim->pid, sig) != 0) {
      e.error = fmt::format(
          "cannot signal pid {}: {} (weft chaos must run on the target's host, as its user)",
          victim->pid, std::strerror(errno));
      e.target.clear();
      spdlog::error("chaos: {}", e.error);
      return;
    }
    spdlog::info("chaos: {} {} (pid {}, {} in flight) at {:.1f} s", spec.kind, victim->name,
                 victim->pid, victim->inflight, e.fired_s);
    if (spec.kind == "stop") {
      const int pid = victim->pid;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double>(spec.hold_s));
      ::kill(pid, SIGCONT);
      {
        std::lock_guard<std::mutex> relock(mu_);
        events_[i].resumed_s = now_s();
      }
      spdlog::info("chaos: SIGCONT {} after {:.1f} s", victim->name, spec.hold_s);
    }
  }

  void wait_recoveries() {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        bool pending = false;
        for (const auto& e : events_) {
          if (!e.target.empty() && e.recovered_s < 0 && now_s() - e.fired_s < o_.max_recovery_s)
            pending = true;
        }
        if (!pending) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  const chaos_options& o_;
  chaos_target& target_;
  clock_type::time_point start_;
  std::mutex mu_;
  std::vector<fault_event> events_;
  std::vector<sample> samples_;
  std::atomic<bool> load_done_{false};
  std::atomic<bool> stop_{false};
};

// -- the report -----------------------------------------------------------------------------------

/// Writes the report (and the plot), prints the summary; returns the exit status.
int finish_report(const chaos_options& o, json out, const json& faults, json inv,
                  const std::string& headline) {
  bool all_ok = true;
  for (const auto& [name, v] : inv.items()) all_ok = all_ok && v["ok"].get<bool>();
  char day[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  out["tool"] = "weft chaos";
  out["finished_at"] = day;
  out["faults"] = faults;
  out["invariants"] = inv;
  out["passed"] = all_ok;
  const std::string path = o.report.empty() ? "chaos-report.json" : o.report;
  std::ofstream(path) << out.dump(2) << "\n";
  spdlog::info("chaos: report {}", path);
  if (!o.plot.empty()) run_plot_script("plot_chaos.py", path, o.plot);

  std::printf("weft chaos: %s\n", headline.c_str());
  const auto secs = [](const json& v, const char* none) {
    return v.is_null() ? std::string(none) : fmt::format("{:.2f} s", v.get<double>());
  };
  for (const auto& f : faults) {
    const std::string who = f["target"].get<std::string>().empty() ? f["role"].get<std::string>()
                                                                   : f["target"].get<std::string>();
    const std::string what = !f["error"].get<std::string>().empty()
                                 ? f["error"].get<std::string>()
                                 : "detected after " + secs(f["detected_after_s"], "-") +
                                       ", recovered after " + secs(f["recovered_after_s"], "never");
    std::printf("  %s %s at %.1f s: %s\n", f["kind"].get<std::string>().c_str(), who.c_str(),
                f["fired_s"].get<double>(), what.c_str());
  }
  for (const auto& [name, v] : inv.items()) {
    std::printf("  invariant %-24s %s\n", name.c_str(), v["ok"].get<bool>() ? "holds" : "BROKEN");
  }
  std::printf("weft chaos: %s (report %s)\n", all_ok ? "all invariants hold" : "INVARIANT BROKEN",
              path.c_str());
  std::fflush(stdout);
  return all_ok ? 0 : 1;
}

bool explicit_error(const lg::request_record& r) {
  return r.status == lg::request_status::http_error ||
         (r.status == lg::request_status::stream_error &&
          r.error.rfind("server error in stream", 0) == 0);
}

/// The serve target's report: requests, KV, faults.
int serve_report(const chaos_options& o, chaos_run& run, serve_target& target,
                 const std::vector<lg::request_record>& records) {
  // KV blocks still referenced once the load is over (0 expected), waiting up to --settle.
  const auto deadline = clock_type::now() + std::chrono::duration<double>(o.settle_s);
  int64_t kv_after = target.kv_used();
  while (kv_after != 0 && clock_type::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kv_after = target.kv_used();
  }
  size_t ok = 0, errors = 0, lost = 0, not_sent = 0, wrong_tokens = 0;
  json reqs = json::array();
  for (const auto& r : records) {
    std::string outcome;
    if (r.ok()) {
      ++ok;
      outcome = "completed";
      if (r.completion_tokens != r.max_tokens) {
        ++wrong_tokens;
        outcome = "wrong_tokens";
      }
    } else if (r.status == lg::request_status::client_overload) {
      ++not_sent;
      outcome = "not_sent";
    } else if (explicit_error(r)) {
      ++errors;
      outcome = "error";
    } else {
      ++lost;
      outcome = "lost";
    }
    reqs.push_back({{"index", r.index},
                    {"sent_s", r.sent_s},
                    {"done_s", r.sent_s + std::max(0.0, r.e2e_ms) / 1e3},
                    {"outcome", outcome},
                    {"status", lg::to_string(r.status)},
                    {"http_status", r.http_status},
                    {"error", r.error},
                    {"e2e_ms", r.e2e_ms},
                    {"completion_tokens", r.completion_tokens},
                    {"max_tokens", r.max_tokens}});
  }
  size_t unfired = 0, unrecovered = 0;
  json faults = run.faults_json(unfired, unrecovered);
  json inv = {
      {"every_request_answered", {{"ok", lost == 0}, {"lost", lost}}},
      {"exact_tokens", {{"ok", wrong_tokens == 0}, {"wrong", wrong_tokens}}},
      {"no_leaked_kv", {{"ok", kv_after == 0}, {"kv_blocks_used_after", kv_after}}},
      {"faults_fired", {{"ok", unfired == 0}, {"unfired", unfired}}},
      {"recovered_in_time",
       {{"ok", unrecovered == 0}, {"unrecovered", unrecovered}, {"bound_s", o.max_recovery_s}}},
  };
  json out = {{"target", "serve"},
              {"url", o.url},
              {"load",
               {{"rate_rps", o.rate_rps},
                {"duration_s", o.duration_s},
                {"requests", records.size()},
                {"prompt_tokens", o.prompt_tokens},
                {"max_tokens", o.max_tokens},
                {"seed", o.seed}}},
              {"counts",
               {{"completed", ok},
                {"explicit_errors", errors},
                {"lost", lost},
                {"not_sent", not_sent},
                {"wrong_token_count", wrong_tokens}}},
              {"timeline", run.timeline_json()},
              {"requests", reqs}};
  return finish_report(o, std::move(out), faults, std::move(inv),
                       fmt::format("{} requests at {:.2f} req/s over {:.0f} s: {} completed, {} "
                                   "explicit errors, {} lost, {} with a wrong token count, {} not "
                                   "sent",
                                   records.size(), o.rate_rps, o.duration_s, ok, errors, lost,
                                   wrong_tokens, not_sent));
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    auto end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

/// The fault plan from --fault and --random; errors name the option.
weft::result<std::vector<fault_spec>> plan_faults(const chaos_options& o, bool cluster) {
  std::vector<fault_spec> plan;
  for (const auto& s : o.faults) {
    auto f = parse_fault(s, o.stop_s, cluster);
    if (!f) return f.error();
    if (f->at_s >= o.duration_s) {
      return make_error(errc::invalid_argument,
                        fmt::format("--fault '{}': at {} s, after the load ends (--duration {})", s,
                                    f->at_s, o.duration_s));
    }
    plan.push_back(*f);
  }
  if (o.random_faults > 0) {
    auto kinds = split_commas(o.random_kinds);
    if (kinds.empty()) return make_error(errc::invalid_argument, "--random-kinds is empty");
    for (const auto& k : kinds) {
      if (k != "kill" && k != "stop" && !(cluster && (k == "cut" || k == "xfer"))) {
        return make_error(errc::invalid_argument, "--random-kinds: unknown kind '" + k +
                                                      "' (kill, stop; cut, xfer with --head)");
      }
    }
    auto f = parse_fault("kill:" + o.random_role + "@0", o.stop_s, cluster);
    if (!f) return make_error(errc::invalid_argument, "--random-role: " + f.error().message);
    auto r = random_faults(o.random_faults, kinds, o.random_role, o.duration_s, o.stop_s, o.seed);
    plan.insert(plan.end(), r.begin(), r.end());
  }
  std::sort(plan.begin(), plan.end(),
            [](const fault_spec& a, const fault_spec& b) { return a.at_s < b.at_s; });
  if (plan.empty()) spdlog::warn("chaos: no faults planned (--fault or --random): workload only");
  return plan;
}

int run_serve_chaos(const chaos_options& o, std::vector<fault_spec> plan) {
  auto ep = lg::parse_base_url(o.url);
  if (!ep) {
    spdlog::error("--url: {}", ep.error());
    return 2;
  }
  std::string host = ep->scheme_host_port.substr(ep->scheme_host_port.find("://") + 3);
  host = host.rfind(':') != std::string::npos && host.front() != '['
             ? host.substr(0, host.rfind(':'))
             : host;
  if (host != "127.0.0.1" && host != "localhost" && host != "[::1]") {
    spdlog::error(
        "--url {}: process faults signal the server's worker processes, so weft chaos "
        "runs on the server's host (use 127.0.0.1 or localhost)",
        o.url);
    return 2;
  }
  lg::client_config client;
  client.server = ep.value();
  client.api_key = o.api_key;
  client.timeout_s = o.request_timeout_s;
  auto info = lg::probe_server(client);
  if (!info) {
    spdlog::error("cannot reach {}: {}", o.url, info.error());
    return 1;
  }
  if (!info->model_ids.empty()) client.request.model = info->model_ids.front();
  serve_target target(ep.value(), o.api_key, o.min_inflight);
  if (!target.members()) {
    spdlog::error(
        "GET {}/admin/cluster failed: weft chaos needs a weft serve (and --api-key when "
        "it has one)",
        o.url);
    return 1;
  }
  lg::workload_config wc;
  wc.num_requests = std::max<size_t>(1, static_cast<size_t>(std::ceil(o.rate_rps * o.duration_s)));
  wc.seed = o.seed;
  wc.synthetic.arrival.rate_rps = o.rate_rps;
  wc.synthetic.arrival.seed = o.seed;
  wc.synthetic.prompt.mean_tokens = o.prompt_tokens;
  wc.synthetic.output.mean_tokens = o.max_tokens;
  auto w = lg::build_workload(wc, o.rate_rps);
  if (!w) {
    spdlog::error("{}", w.error());
    return 2;
  }
  lg::run_config rc;
  rc.client = client;
  rc.progress_label = "chaos";
  spdlog::info("chaos: {} requests at {:.2f} req/s against {}, {} fault(s) planned",
               w->requests.size(), o.rate_rps, o.url, plan.size());
  chaos_run run(o, target, std::move(plan));
  std::vector<lg::request_record> records;
  run.run([&] { records = lg::run_open_loop(rc, w->requests); });
  return serve_report(o, run, target, records);
}

int run_cluster_chaos(const chaos_options& o, std::vector<fault_spec> plan) {
  return with_head(o.head, o.cluster, [&](caf::actor_system& sys, const actors::head_actor& head) {
    auto secret = o.cluster.load_secret();
    if (!secret) {
      spdlog::error("{}", secret.error().message);
      return 2;
    }
    cluster_target target(sys, head, *secret);
    if (!target.members()) {
      spdlog::error("the head at {} does not answer its status", o.head);
      return 1;
    }
    spdlog::info("chaos: cluster at {}, {} fault(s) planned{}", o.head, plan.size(),
                 o.workload.empty() ? "" : ", workload: " + o.workload);
    chaos_run run(o, target, std::move(plan));
    int workload_status = 0;
    std::string workload_tail;
    run.run([&] {
      if (o.workload.empty()) {
        std::this_thread::sleep_for(std::chrono::duration<double>(o.duration_s));
        return;
      }
      // The user's workload, its output passed through; the faults' window is --duration.
      auto c = actors::child_process::start({"/bin/sh", "-c", o.workload + " 2>&1"});
      if (!c) {
        workload_status = -1;
        workload_tail = c.error().to_string();
        return;
      }
      int st = 0;
      for (;;) {
        if (auto line = c->read_line(200)) {
          std::printf("workload: %s\n", line->c_str());
          workload_tail = (workload_tail + *line + "\n");
          if (workload_tail.size() > 4000) workload_tail.erase(0, workload_tail.size() - 4000);
          continue;
        }
        if (c->exited(&st)) break;
      }
      workload_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    });
    size_t unfired = 0, unrecovered = 0;
    json faults = run.faults_json(unfired, unrecovered);
    size_t undetected = 0;
    for (const auto& f : faults) {
      if ((f["kind"] == "kill" || f["kind"] == "cut") && !f["target"].get<std::string>().empty() &&
          f["detected_after_s"].is_null())
        ++undetected;
    }
    json inv = {
        {"faults_fired", {{"ok", unfired == 0}, {"unfired", unfired}}},
        {"losses_detected", {{"ok", undetected == 0}, {"undetected", undetected}}},
        {"recovered_in_time",
         {{"ok", unrecovered == 0}, {"unrecovered", unrecovered}, {"bound_s", o.max_recovery_s}}},
    };
    if (!o.workload.empty()) {
      inv["workload_succeeded"] = {{"ok", workload_status == 0}, {"exit_status", workload_status}};
    }
    json out = {{"target", "cluster"},
                {"url", o.head},
                {"load",
                 {{"workload", o.workload},
                  {"duration_s", o.duration_s},
                  {"rate_rps", 0.0},
                  {"seed", o.seed},
                  {"workload_exit_status", workload_status},
                  {"workload_output_tail", workload_tail}}},
                {"timeline", run.timeline_json()},
                {"requests", json::array()}};
    return finish_report(o, std::move(out), faults, std::move(inv),
                         o.workload.empty()
                             ? fmt::format("cluster at {}: {} fault(s) over {:.0f} s", o.head,
                                           faults.size(), o.duration_s)
                             : fmt::format("cluster at {}: {} fault(s); workload exited {}", o.head,
                                           faults.size(), workload_status));
  });
}

int run_chaos(const chaos_options& o) {
  const bool cluster = !o.head.empty();
  auto plan = plan_faults(o, cluster);
  if (!plan) {
    spdlog::error("{}", plan.error().message);
    return 2;
  }
  if (cluster && !o.workload.empty() && o.faults.empty() && o.random_faults == 0) {
    spdlog::warn("chaos: a workload without faults");
  }
  return cluster ? run_cluster_chaos(o, std::move(*plan)) : run_serve_chaos(o, std::move(*plan));
}

}  // namespace

void add_chaos_command(CLI::App& app, const global_options&) {
  auto o = std::make_shared<chaos_options>();
  auto* cmd = app.add_subcommand(
      "chaos",
      "Fault runner: SIGKILL/SIGSTOP the processes of a running weft serve (or of a cluster) by "
      "role, on a schedule or at random, under load; then check invariants (docs/chaos.md)");
  auto* url =
      cmd->add_option("--url", o->url, "Target: the base URL of a weft serve (on this host)")
          ->capture_default_str();
  cmd->add_option("--head", o->head,
                  "Target: a cluster, by its head's HOST:PORT (with --secret/--secret-file): "
                  "faults hit nodes by the roles of the actors they run")
      ->excludes(url);
  o->cluster.add_credentials_to(cmd);
  cmd->add_option("--workload", o->workload,
                  "With --head: a shell command run while the faults fire; its exit status 0 is "
                  "an invariant");
  cmd->add_option("--api-key", o->api_key, "The server's --api-key, if it has one");
  cmd->add_option("--duration", o->duration_s,
                  "Seconds of load (requests = rate x duration); with --head the window in which "
                  "faults fire (and the run's length without --workload)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--rate", o->rate_rps, "Offered load, requests/s (Poisson arrivals)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Approximate prompt length")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--max-tokens", o->max_tokens,
                  "Tokens every request asks for (EOS ignored: a completed stream must carry "
                  "exactly this many)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--seed", o->seed, "Seed of the load and of --random faults")
      ->capture_default_str();
  cmd->add_option("--fault", o->faults,
                  "A fault: kill:ROLE@SECONDS, stop:ROLE@SECONDS[+HOLD], with --head also "
                  "cut:ROLE@SECONDS[+HOLD] (the node's network links down: a cluster in network "
                  "namespaces) and xfer:ROLE@SECONDS[+HOLD] (the node's data plane drops, delays, "
                  "corrupts or fails transfers as --xfer-* say: nodes with --transport fault:ucx); "
                  "ROLE any, both, prefill, decode or cache_shard (with --head: an "
                  "actor role, or any); the busiest matching process is hit (repeat)");
  cmd->add_option("--random", o->random_faults, "This many faults at random times (from --seed)")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--random-kinds", o->random_kinds,
                  "Kinds of --random faults: kill, stop (and cut with --head)")
      ->capture_default_str();
  cmd->add_option("--random-role", o->random_role, "Role --random faults hit")
      ->capture_default_str();
  cmd->add_option("--xfer-drop", o->xfer.drop_probability,
                  "xfer faults: probability that a transfer is dropped (ends at its deadline)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--xfer-delay-ms", o->xfer.delay_ms, "xfer faults: delay added to every transfer")
      ->capture_default_str();
  cmd->add_option("--xfer-corrupt", o->xfer.corrupt_probability,
                  "xfer faults: probability that a transfer's bytes are corrupted")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--xfer-fail-after", o->xfer.fail_after_n,
                  "xfer faults: transfers after the first N fail (-1: never)")
      ->capture_default_str();
  cmd->add_option("--stop-seconds", o->stop_s,
                  "How long a stop (or cut) fault lasts when it names no +HOLD")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--min-inflight", o->min_inflight,
                  "A fault waits (up to 10 s) for a target with this many requests in flight")
      ->capture_default_str()
      ->check(non_negative_number);
  cmd->add_option("--max-recovery", o->max_recovery_s,
                  "Seconds within which every fault must be recovered from (invariant)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--settle", o->settle_s,
                  "Seconds to wait after the load for KV blocks to be freed (invariant: none left)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--request-timeout", o->request_timeout_s,
                  "A request without an answer after this long counts as lost")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--report", o->report, "JSON report path (default chaos-report.json)");
  cmd->add_option("--plot", o->plot,
                  "PNG timeline: faults, throughput, errors, recoveries (needs matplotlib)");
  cmd->callback([o] { std::exit(run_chaos(*o)); });
}

}  // namespace weft::apps
