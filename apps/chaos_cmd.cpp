// `weft chaos`: a fault runner for users' own deployments (docs/chaos.md). Against a running
// `weft serve` it drives an open-loop load (the generator of `weft bench serve`), fires faults at
// the worker processes by role — SIGKILL, or SIGSTOP for a while then SIGCONT — on a schedule or at
// random from a seed, watches the router through GET /admin/cluster, and at the end checks
// invariants: every accepted request completed or got an explicit error, every completed stream
// carries exactly the tokens it asked for (none missing, none repeated), no KV block stays
// referenced, every fault was detected and recovered from within a bound. It writes a JSON report
// and a PNG timeline; the exit status is 1 when an invariant breaks.

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

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
  std::string url = "http://127.0.0.1:8000";
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

/// "kill:ROLE@T" or "stop:ROLE@T+HOLD" (T and HOLD in seconds).
weft::result<fault_spec> parse_fault(const std::string& s, double default_hold_s) {
  const auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument,
                      "--fault '" + s + "': " + why +
                          " (expected kill:ROLE@SECONDS or stop:ROLE@SECONDS[+HOLD_SECONDS], ROLE "
                          "one of any, both, prefill, decode, cache_shard)");
  };
  const auto colon = s.find(':');
  const auto at = s.find('@');
  if (colon == std::string::npos || at == std::string::npos || at < colon) return bad("malformed");
  fault_spec f;
  f.kind = s.substr(0, colon);
  f.role = s.substr(colon + 1, at - colon - 1);
  if (f.kind != "kill" && f.kind != "stop") return bad("unknown fault kind '" + f.kind + "'");
  if (f.role != "any" && f.role != "both" && f.role != "prefill" && f.role != "decode" &&
      f.role != "cache_shard") {
    return bad("unknown role '" + f.role + "'");
  }
  std::string when = s.substr(at + 1);
  f.hold_s = default_hold_s;
  if (auto plus = when.find('+'); plus != std::string::npos) {
    if (f.kind != "stop") return bad("only stop takes +HOLD");
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
};

/// A member (worker or shard) as the router lists it.
struct member {
  std::string name, role, state;
  int pid = 0;
  size_t inflight = 0;
  int64_t kv_used = 0;
  int64_t last_report_ms_ago = 0;
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
      out.push_back({w.value("name", ""), w.value("role", ""), w.value("state", ""),
                     w.value("pid", 0), w.value("inflight", size_t{0}),
                     w.value("kv_blocks_used", int64_t{0}),
                     w.value("last_report_ms_ago", int64_t{0})});
    }
    for (const auto& s : j["router"].value("shards", json::array())) {
      out.push_back({s.value("name", ""), "cache_shard", "idle", s.value("pid", 0), 0, 0, 0});
    }
    return out;
  }

 private:
  httplib::Client cli_;
  std::string prefix_, key_;
};

bool serving(const member& m) {
  return m.state == "idle" || m.state == "busy";
}

bool role_matches(const std::string& want, const member& m) {
  if (want == "any") return m.role != "cache_shard";
  return m.role == want;
}

/// Samples of the router's view over time (for the timeline and the fault bookkeeping).
struct sample {
  double t_s;
  int serving;
  int members;
};

class chaos_run {
 public:
  chaos_run(const chaos_options& o, const lg::server_endpoint& ep, std::vector<fault_spec> plan)
      : o_(o), admin_(ep, o.api_key) {
    for (auto& f : plan) {
      fault_event e;
      e.spec = f;
      events_.push_back(std::move(e));
    }
  }

  int run(const lg::run_config& rc, const std::vector<lg::request_spec>& requests) {
    start_ = clock_type::now();
    std::thread monitor([this] { monitor_loop(); });
    std::thread faults([this] { fault_loop(); });
    auto records = lg::run_open_loop(rc, requests);
    load_done_ = true;
    faults.join();
    wait_recoveries();
    const int64_t kv_after = wait_kv_free();
    stop_ = true;
    monitor.join();
    return report(records, kv_after);
  }

 private:
  double now_s() const { return std::chrono::duration<double>(clock_type::now() - start_).count(); }

  void monitor_loop() {
    while (!stop_) {
      if (auto ms = admin_.members()) {
        std::lock_guard<std::mutex> lock(mu_);
        const double t = now_s();
        int n_serving = 0;
        for (const auto& m : *ms) n_serving += serving(m) ? 1 : 0;
        samples_.push_back({t, n_serving, static_cast<int>(ms->size())});
        for (auto& e : events_) update(e, *ms, t);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // Detection: the router no longer counts the victim as serving under its pid (gone from the
  // list, or stalled / unresponsive). Recovery after a kill: its name serves again under a new pid
  // (the supervisor restarted it). After a stop: once SIGCONT was sent, the same process reports
  // again (a load report younger than a second) — whether or not the router noticed the pause (a
  // stop shorter than the router's stall bound goes undetected: detected_after_s stays null).
  static void update(fault_event& e, const std::vector<member>& ms, double t) {
    if (e.fired_s < 0 || e.target.empty() || e.recovered_s >= 0) return;
    const member* same_name = nullptr;
    for (const auto& m : ms) {
      if (m.name == e.target) same_name = &m;
    }
    const bool victim_serving =
        same_name != nullptr && same_name->pid == e.pid && serving(*same_name);
    if (e.detected_s < 0 && !victim_serving) e.detected_s = t - e.fired_s;
    if (same_name == nullptr || !serving(*same_name)) return;
    if (e.spec.kind == "kill" && e.detected_s >= 0 && same_name->pid != e.pid) {
      e.recovered_s = t - e.fired_s;
    } else if (e.spec.kind == "stop" && e.resumed_s >= 0 && t > e.resumed_s &&
               same_name->last_report_ms_ago < 1000 &&
               t - e.resumed_s > same_name->last_report_ms_ago / 1e3) {
      e.recovered_s = t - e.fired_s;
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
        events_[i].error = "the load ended before this fault's time";
        continue;
      }
      fire(i, spec);
    }
  }

  // The busiest serving process of the fault's role; waits up to 10 s for one with at least
  // --min-inflight requests in flight (a fault that hits an idle process tests little).
  void fire(size_t i, const fault_spec& spec) {
    std::optional<std::vector<member>> ms;
    std::optional<member> victim;
    const auto patience = clock_type::now() + std::chrono::seconds(10);
    for (;;) {
      ms = admin_.members();
      victim.reset();
      if (ms) {
        for (const auto& m : *ms) {
          if (!role_matches(spec.role, m) || !serving(m) || m.pid <= 0) continue;
          if (!victim || m.inflight > victim->inflight) victim = m;
        }
      }
      const bool busy_enough = victim && (victim->role == "cache_shard" ||
                                          victim->inflight >= static_cast<size_t>(o_.min_inflight));
      if (busy_enough || load_done_ || clock_type::now() > patience) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::unique_lock<std::mutex> lock(mu_);
    auto& e = events_[i];
    if (!victim) {
      e.error = ms ? "no serving process with role " + spec.role : "GET /admin/cluster failed";
      spdlog::warn("chaos: {} {}: {}", spec.kind, spec.role, e.error);
      return;
    }
    e.target = victim->name;
    e.pid = victim->pid;
    e.inflight = victim->inflight;
    e.fired_s = now_s();
    const int sig = spec.kind == "kill" ? SIGKILL : SIGSTOP;
    if (::kill(victim->pid, sig) != 0) {
      e.error = fmt::format(
          "cannot signal pid {}: {} (weft chaos must run on the server's host, "
          "as its user)",
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

  // KV blocks still referenced once the load is over (0 expected), waiting up to settle_s.
  int64_t wait_kv_free() {
    const auto deadline = clock_type::now() + std::chrono::duration<double>(o_.settle_s);
    int64_t used = -1;
    while (clock_type::now() < deadline) {
      if (auto ms = admin_.members()) {
        used = 0;
        for (const auto& m : *ms) used += m.kv_used;
        if (used == 0) return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    return used;
  }

  static bool explicit_error(const lg::request_record& r) {
    return r.status == lg::request_status::http_error ||
           (r.status == lg::request_status::stream_error &&
            r.error.rfind("server error in stream", 0) == 0);
  }

  int report(const std::vector<lg::request_record>& records, int64_t kv_after) {
    size_t ok = 0, errors = 0, lost = 0, not_sent = 0, wrong_tokens = 0;
    json reqs = json::array();
    double end_s = 0.0;
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
      const double done_s = r.sent_s + std::max(0.0, r.e2e_ms) / 1e3;
      end_s = std::max(end_s, done_s);
      reqs.push_back({{"index", r.index},
                      {"sent_s", r.sent_s},
                      {"done_s", done_s},
                      {"outcome", outcome},
                      {"status", lg::to_string(r.status)},
                      {"http_status", r.http_status},
                      {"error", r.error},
                      {"e2e_ms", r.e2e_ms},
                      {"completion_tokens", r.completion_tokens},
                      {"max_tokens", r.max_tokens}});
    }
    json faults = json::array();
    size_t unrecovered = 0, unfired = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& e : events_) {
        if (e.target.empty())
          ++unfired;
        else if (e.recovered_s < 0)
          ++unrecovered;
        faults.push_back({{"kind", e.spec.kind},
                          {"role", e.spec.role},
                          {"planned_s", e.spec.at_s},
                          {"hold_s", e.spec.kind == "stop" ? e.spec.hold_s : 0.0},
                          {"target", e.target},
                          {"pid", e.pid},
                          {"inflight", e.inflight},
                          {"fired_s", e.fired_s},
                          {"detected_after_s", e.detected_s >= 0 ? json(e.detected_s) : json()},
                          {"recovered_after_s", e.recovered_s >= 0 ? json(e.recovered_s) : json()},
                          {"error", e.error}});
      }
    }
    json timeline = json::array();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& s : samples_) {
        timeline.push_back({{"t_s", s.t_s}, {"serving", s.serving}, {"members", s.members}});
      }
    }
    json inv = {
        {"every_request_answered", {{"ok", lost == 0}, {"lost", lost}}},
        {"exact_tokens", {{"ok", wrong_tokens == 0}, {"wrong", wrong_tokens}}},
        {"no_leaked_kv", {{"ok", kv_after == 0}, {"kv_blocks_used_after", kv_after}}},
        {"faults_fired", {{"ok", unfired == 0}, {"unfired", unfired}}},
        {"recovered_in_time",
         {{"ok", unrecovered == 0}, {"unrecovered", unrecovered}, {"bound_s", o_.max_recovery_s}}},
    };
    bool all_ok = true;
    for (const auto& [name, v] : inv.items()) all_ok = all_ok && v["ok"].get<bool>();
    char day[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
    json out = {{"tool", "weft chaos"},
                {"finished_at", day},
                {"url", o_.url},
                {"load",
                 {{"rate_rps", o_.rate_rps},
                  {"duration_s", o_.duration_s},
                  {"requests", records.size()},
                  {"prompt_tokens", o_.prompt_tokens},
                  {"max_tokens", o_.max_tokens},
                  {"seed", o_.seed}}},
                {"counts",
                 {{"completed", ok},
                  {"explicit_errors", errors},
                  {"lost", lost},
                  {"not_sent", not_sent},
                  {"wrong_token_count", wrong_tokens}}},
                {"faults", faults},
                {"invariants", inv},
                {"passed", all_ok},
                {"timeline", timeline},
                {"requests", reqs}};
    std::string path = o_.report;
    if (path.empty()) path = "chaos-report.json";
    std::ofstream(path) << out.dump(2) << "\n";
    spdlog::info("chaos: report {}", path);
    if (!o_.plot.empty()) run_plot_script("plot_chaos.py", path, o_.plot);

    std::printf(
        "weft chaos: %zu requests at %.2f req/s over %.0f s: %zu completed, %zu explicit "
        "errors, %zu lost, %zu with a wrong token count, %zu not sent\n",
        records.size(), o_.rate_rps, o_.duration_s, ok, errors, lost, wrong_tokens, not_sent);
    for (const auto& f : faults) {
      std::printf(
          "  %s %s at %.1f s: %s\n", f["kind"].get<std::string>().c_str(),
          f["target"].get<std::string>().empty() ? f["role"].get<std::string>().c_str()
                                                 : f["target"].get<std::string>().c_str(),
          f["fired_s"].get<double>(),
          !f["error"].get<std::string>().empty()
              ? f["error"].get<std::string>().c_str()
              : fmt::format("detected after {}, recovered after {}",
                            f["detected_after_s"].is_null()
                                ? std::string("-")
                                : fmt::format("{:.2f} s", f["detected_after_s"].get<double>()),
                            f["recovered_after_s"].is_null()
                                ? std::string("never")
                                : fmt::format("{:.2f} s", f["recovered_after_s"].get<double>()))
                    .c_str());
    }
    for (const auto& [name, v] : inv.items()) {
      std::printf("  invariant %-24s %s\n", name.c_str(), v["ok"].get<bool>() ? "holds" : "BROKEN");
    }
    std::printf("weft chaos: %s (report %s)\n", all_ok ? "all invariants hold" : "INVARIANT BROKEN",
                path.c_str());
    std::fflush(stdout);
    return all_ok ? 0 : 1;
  }

  const chaos_options& o_;
  admin_client admin_;
  clock_type::time_point start_;
  std::mutex mu_;
  std::vector<fault_event> events_;
  std::vector<sample> samples_;
  std::atomic<bool> load_done_{false};
  std::atomic<bool> stop_{false};
};

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

int run_chaos(const chaos_options& o) {
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
  std::vector<fault_spec> plan;
  for (const auto& s : o.faults) {
    auto f = parse_fault(s, o.stop_s);
    if (!f) {
      spdlog::error("{}", f.error().message);
      return 2;
    }
    if (f->at_s >= o.duration_s) {
      spdlog::error("--fault '{}': at {} s, after the load ends (--duration {})", s, f->at_s,
                    o.duration_s);
      return 2;
    }
    plan.push_back(*f);
  }
  if (o.random_faults > 0) {
    auto kinds = split_commas(o.random_kinds);
    for (const auto& k : kinds) {
      if (k != "kill" && k != "stop") {
        spdlog::error("--random-kinds: unknown kind '{}' (kill, stop)", k);
        return 2;
      }
    }
    if (kinds.empty()) {
      spdlog::error("--random-kinds is empty");
      return 2;
    }
    auto f = parse_fault("kill:" + o.random_role + "@0", o.stop_s);
    if (!f) {
      spdlog::error("--random-role: {}", f.error().message);
      return 2;
    }
    auto r = random_faults(o.random_faults, kinds, o.random_role, o.duration_s, o.stop_s, o.seed);
    plan.insert(plan.end(), r.begin(), r.end());
  }
  std::sort(plan.begin(), plan.end(),
            [](const fault_spec& a, const fault_spec& b) { return a.at_s < b.at_s; });
  if (plan.empty()) spdlog::warn("chaos: no faults planned (--fault or --random): load only");

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
  admin_client probe(ep.value(), o.api_key);
  if (!probe.members()) {
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
  chaos_run run(o, ep.value(), std::move(plan));
  return run.run(rc, w->requests);
}

}  // namespace

void add_chaos_command(CLI::App& app, const global_options&) {
  auto o = std::make_shared<chaos_options>();
  auto* cmd = app.add_subcommand(
      "chaos",
      "Fault runner: SIGKILL/SIGSTOP a running weft serve's worker processes by role, on a "
      "schedule or at random, under load; then check invariants (docs/chaos.md)");
  cmd->add_option("--url", o->url, "Base URL of the weft serve to test (on this host)")
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "The server's --api-key, if it has one");
  cmd->add_option("--duration", o->duration_s, "Seconds of load (requests = rate x duration)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rate", o->rate_rps, "Offered load, requests/s (Poisson arrivals)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Approximate prompt length")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-tokens", o->max_tokens,
                  "Tokens every request asks for (EOS ignored: a completed stream must carry "
                  "exactly this many)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "Seed of the load and of --random faults")
      ->capture_default_str();
  cmd->add_option("--fault", o->faults,
                  "A fault: kill:ROLE@SECONDS or stop:ROLE@SECONDS[+HOLD]; ROLE any, both, "
                  "prefill, decode or cache_shard; the busiest matching process is hit (repeat)");
  cmd->add_option("--random", o->random_faults, "This many faults at random times (from --seed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--random-kinds", o->random_kinds, "Kinds of --random faults: kill, stop")
      ->capture_default_str();
  cmd->add_option("--random-role", o->random_role, "Role --random faults hit")
      ->capture_default_str();
  cmd->add_option("--stop-seconds", o->stop_s, "How long a stop fault keeps a process stopped")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--min-inflight", o->min_inflight,
                  "A fault waits (up to 10 s) for a target with this many requests in flight")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-recovery", o->max_recovery_s,
                  "Seconds within which every fault must be recovered from (invariant)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--settle", o->settle_s,
                  "Seconds to wait after the load for KV blocks to be freed (invariant: none left)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--request-timeout", o->request_timeout_s,
                  "A request without an answer after this long counts as lost")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--report", o->report, "JSON report path (default chaos-report.json)");
  cmd->add_option("--plot", o->plot,
                  "PNG timeline: faults, throughput, errors, recoveries (needs matplotlib)");
  cmd->callback([o] { std::exit(run_chaos(*o)); });
}

}  // namespace weft::apps
