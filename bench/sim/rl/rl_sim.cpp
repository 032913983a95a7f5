#include "bench/sim/rl/rl_sim.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>

#include "gpu/rl/dispatch.hpp"
#include "gpu/rl/rollout_scheduler.hpp"

namespace weft::bench::sim {

namespace {

using gpu::rl::dispatch_item;
using gpu::rl::sample_key;

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double normal(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return sim_normal(seed, a, b, c);
}

int64_t prompt_of(const rl_sim_config& c, int64_t step, int64_t group) {
  return (step * c.prompts_per_step + group) % std::max<int64_t>(1, c.dataset_prompts);
}

double prompt_log_scale(const rl_sim_config& c, int64_t prompt) {
  return std::log(c.mean_len) + c.prompt_sigma * normal(c.seed, 1, static_cast<uint64_t>(prompt));
}

struct seq {
  sample_key key;
  int64_t prompt = 0;
  int64_t length = 0;
  int64_t done = 0;
  int64_t oldest = -1;
  double predicted = 0.0;
};

struct agent {
  std::vector<seq> running;
  std::deque<seq> queue;
  bool stepping = false;
  int64_t step_version = 0;
  double busy_s = 0.0;
};

struct event {
  double time = 0.0;
  int kind = 0;  ///< 0: an agent's decode step ends; 1: the trainer's update and sync end.
  int64_t agent = 0;
  bool operator>(const event& o) const {
    if (time != o.time) return time > o.time;
    if (kind != o.kind) return kind > o.kind;
    return agent > o.agent;
  }
};

}  // namespace

double sim_uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return (static_cast<double>(mix(seed ^ mix(a ^ mix(b ^ mix(c)))) >> 11) + 0.5) /
         9007199254740992.0;
}

double sim_normal(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t h1 = mix(seed ^ mix(a ^ mix(b ^ mix(c))));
  const uint64_t h2 = mix(h1);
  const double u1 = (static_cast<double>(h1 >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = static_cast<double>(h2 >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

const char* rl_sim_mode_name(rl_sim_mode m) {
  switch (m) {
    case rl_sim_mode::sync_colocated:
      return "sync";
    case rl_sim_mode::async_round_robin:
      return "async";
    case rl_sim_mode::async_length_aware:
      return "async+length-aware";
    case rl_sim_mode::sync_fused:
      return "sync+fusion";
  }
  return "?";
}

int64_t sim_prompt_tokens(const rl_sim_config& c, int64_t prompt) {
  // Longer problems come with longer answers: half the prompt's log-scale deviation shows in its
  // length, plus noise of its own.
  const double dev = prompt_log_scale(c, prompt) - std::log(c.mean_len);
  const double noise = 0.3 * normal(c.seed, 2, static_cast<uint64_t>(prompt));
  return std::max<int64_t>(8, std::llround(96.0 * std::exp(0.5 * dev + noise)));
}

int64_t sim_output_length(const rl_sim_config& c, int64_t step, int64_t group, int64_t j) {
  const double mu = prompt_log_scale(c, prompt_of(c, step, group));
  const double z = normal(c.seed, 3, static_cast<uint64_t>(step * c.prompts_per_step + group),
                          static_cast<uint64_t>(j));
  const double len = std::exp(mu + c.sample_sigma * z - 0.5 * c.sample_sigma * c.sample_sigma);
  return std::clamp<int64_t>(std::llround(len), 1, c.max_len);
}

namespace {

rl_sim_result simulate_split(const rl_sim_config& c, rl_sim_mode mode, int64_t max_staleness) {
  rl_sim_result out;
  out.mode = mode;
  const bool fused = mode == rl_sim_mode::sync_fused;
  const bool sync = mode == rl_sim_mode::sync_colocated || fused;
  out.max_staleness = sync ? 0 : max_staleness;
  const int64_t trainers =
      sync ? c.gpus
           : std::clamp<int64_t>(std::llround(static_cast<double>(c.gpus) * c.train_fraction), 1,
                                 c.gpus - 1);
  const int64_t n_agents = sync ? c.gpus : c.gpus - trainers;
  gpu::rl::rollout_scheduler sched(
      gpu::rl::scheduler_config{c.prompts_per_step, c.group_size, out.max_staleness, c.steps});
  gpu::rl::length_ranker ranker(c.mean_len);
  std::vector<agent> agents(static_cast<size_t>(n_agents));
  std::priority_queue<event, std::vector<event>, std::greater<>> events;
  std::vector<int64_t> step_tokens(static_cast<size_t>(c.steps), 0);
  double now = 0.0, trainer_busy = 0.0, batch_sum = 0.0, batch_steps = 0.0;
  bool training = false;
  int64_t rr = 0;
  // sync + fusion: GPUs freed from the step's tail train its finished samples meanwhile.
  std::vector<uint8_t> draining(agents.size(), 0), freed(agents.size(), 0);
  std::vector<double> replay_ms(agents.size(), 0.0);
  std::vector<int> targets;
  int64_t n_freed = 0;
  double finished_tokens = 0.0, fused_trained = 0.0, fused_total = 0.0, last_t = 0.0;
  auto advance = [&](double t) {
    if (n_freed > 0) {
      fused_trained =
          std::min(finished_tokens, fused_trained + static_cast<double>(n_freed) * (t - last_t) *
                                                        1000.0 / c.train_ms_per_token);
    }
    last_t = t;
  };

  auto start = [&](size_t a) {
    agent& ag = agents[a];
    if (ag.stepping || freed[a] != 0) return;
    while (static_cast<int64_t>(ag.running.size()) < c.max_running && !ag.queue.empty()) {
      ag.running.push_back(ag.queue.front());
      ag.queue.pop_front();
    }
    if (ag.running.empty()) return;
    const auto b = static_cast<double>(ag.running.size());
    const double dt = (c.step_base_ms + c.step_per_seq_ms * b + replay_ms[a]) / 1000.0;
    replay_ms[a] = 0.0;
    ag.stepping = true;
    ag.step_version = sched.version();
    ag.busy_s += dt;
    batch_sum += b;
    batch_steps += 1.0;
    events.push(event{now + dt, 0, static_cast<int64_t>(a)});
  };
  auto dispatch = [&](int64_t m) {
    std::vector<seq> seqs;
    std::vector<dispatch_item> items;
    for (int64_t g = 0; g < c.prompts_per_step; ++g) {
      const int64_t p = prompt_of(c, m, g);
      const double pred = ranker.predict(static_cast<uint64_t>(p), sim_prompt_tokens(c, p));
      for (int64_t j = 0; j < c.group_size; ++j) {
        seq s{{m, g, j}, p, sim_output_length(c, m, g, j), 0, -1, pred};
        step_tokens[static_cast<size_t>(m)] += s.length;
        items.push_back(dispatch_item{static_cast<int64_t>(seqs.size()), pred});
        seqs.push_back(s);
      }
    }
    std::vector<int> where;
    if (mode == rl_sim_mode::async_length_aware) {
      std::vector<double> load(agents.size(), 0.0);
      for (size_t a = 0; a < agents.size(); ++a) {
        for (const seq& s : agents[a].running) load[a] += std::max(1.0, s.predicted - s.done);
        for (const seq& s : agents[a].queue) load[a] += s.predicted;
      }
      where = gpu::rl::place_longest_first(items, load);
      for (size_t i : gpu::rl::longest_first_order(items)) {
        agents[static_cast<size_t>(where[i])].queue.push_back(seqs[i]);
      }
    } else {
      where =
          gpu::rl::place_round_robin(seqs.size(), static_cast<int>(agents.size()),
                                     static_cast<int>(rr % static_cast<int64_t>(agents.size())));
      rr += static_cast<int64_t>(seqs.size());
      for (size_t i = 0; i < seqs.size(); ++i) {
        agents[static_cast<size_t>(where[i])].queue.push_back(seqs[i]);
      }
    }
  };
  auto admit = [&] {
    for (int64_t m : sched.admit()) dispatch(m);
    for (size_t a = 0; a < agents.size(); ++a) start(a);
  };
  // Moves agent a's unfinished samples onto the targets (the least loaded first); a is freed.
  auto drain = [&](size_t a) {
    agent& ag = agents[a];
    std::vector<seq> moving(ag.running.begin(), ag.running.end());
    moving.insert(moving.end(), ag.queue.begin(), ag.queue.end());
    ag.running.clear();
    ag.queue.clear();
    for (const seq& s : moving) {
      size_t to = static_cast<size_t>(targets.front());
      for (int t : targets) {
        const auto& x = agents[static_cast<size_t>(t)];
        const auto& y = agents[to];
        if (x.running.size() + x.queue.size() < y.running.size() + y.queue.size()) {
          to = static_cast<size_t>(t);
        }
      }
      replay_ms[to] += static_cast<double>(s.done) * c.prefill_ms_per_token;
      agents[to].queue.push_back(s);
      ++out.migrated;
    }
    draining[a] = 0;
    freed[a] = 1;
    ++n_freed;
    for (int t : targets) start(static_cast<size_t>(t));
  };
  auto consolidate = [&] {
    std::vector<int64_t> unfinished(agents.size(), 0);
    for (size_t a = 0; a < agents.size(); ++a) {
      if (freed[a] == 0) {
        unfinished[a] = static_cast<int64_t>(agents[a].running.size() + agents[a].queue.size());
      }
    }
    auto t =
        gpu::rl::consolidation_targets(unfinished, std::min(c.max_running, c.fusion_max_batch));
    if (t.empty()) return;
    targets = std::move(t);
    for (int x : targets) draining[static_cast<size_t>(x)] = 0;  // an earlier round's: it stays
    for (size_t a = 0; a < agents.size(); ++a) {
      if (unfinished[a] == 0 ||
          std::binary_search(targets.begin(), targets.end(), static_cast<int>(a))) {
        continue;
      }
      draining[a] = 1;
      if (!agents[a].stepping) drain(a);
    }
  };
  auto try_train = [&] {
    if (training || !sched.ready()) return;
    training = true;
    const double tokens =
        static_cast<double>(step_tokens[static_cast<size_t>(sched.version())]) - fused_trained;
    fused_total += fused_trained;
    const double dt =
        tokens * c.train_ms_per_token / 1000.0 / static_cast<double>(trainers) + c.sync_s;
    trainer_busy += dt;
    events.push(event{now + dt, 1, 0});
  };

  admit();
  while (sched.version() < c.steps && !events.empty()) {
    const event e = events.top();
    events.pop();
    advance(e.time);
    now = e.time;
    if (e.kind == 1) {
      auto t = sched.train();
      if (!t) {
        out.error = t.error().message();
        return out;
      }
      training = false;
      std::fill(freed.begin(), freed.end(), 0);
      std::fill(draining.begin(), draining.end(), 0);
      n_freed = 0;
      finished_tokens = fused_trained = 0.0;
      admit();
      try_train();
      continue;
    }
    agent& ag = agents[static_cast<size_t>(e.agent)];
    ag.stepping = false;
    for (size_t i = 0; i < ag.running.size();) {
      seq& s = ag.running[i];
      if (s.oldest < 0) s.oldest = ag.step_version;
      if (++s.done < s.length) {
        ++i;
        continue;
      }
      if (auto st = sched.finish(s.key, s.oldest, ag.step_version); !st) {
        out.error = st.message();
        return out;
      }
      ranker.observe(static_cast<uint64_t>(s.prompt), sim_prompt_tokens(c, s.prompt), s.length);
      finished_tokens += static_cast<double>(s.length);
      ag.running[i] = ag.running.back();
      ag.running.pop_back();
    }
    if (draining[static_cast<size_t>(e.agent)] != 0) {
      drain(static_cast<size_t>(e.agent));
    } else {
      start(static_cast<size_t>(e.agent));
    }
    if (fused && n_freed < static_cast<int64_t>(agents.size()) - 1) consolidate();
    try_train();
  }
  if (sched.version() < c.steps && out.error.empty()) out.error = "the simulation stalled";
  out.seconds = now;
  out.samples = sched.trained_samples();
  out.samples_per_s = now > 0 ? static_cast<double>(out.samples) / now : 0.0;
  double busy = 0.0;
  for (const agent& a : agents) busy += a.busy_s;
  out.rollout_busy = now > 0 ? busy / (static_cast<double>(agents.size()) * now) : 0.0;
  out.trainer_busy = now > 0 ? trainer_busy / now : 0.0;
  out.mean_batch = batch_steps > 0 ? batch_sum / batch_steps : 0.0;
  out.staleness_histogram = sched.staleness_histogram();
  out.train_fraction = sync ? 1.0 : static_cast<double>(trainers) / static_cast<double>(c.gpus);
  double all_tokens = 0.0;
  for (int64_t t : step_tokens) all_tokens += static_cast<double>(t);
  out.fused_train_share = all_tokens > 0.0 ? fused_total / all_tokens : 0.0;
  return out;
}

}  // namespace

rl_sim_result simulate_rl(const rl_sim_config& c, rl_sim_mode mode, int64_t max_staleness) {
  if (mode == rl_sim_mode::sync_colocated || mode == rl_sim_mode::sync_fused ||
      c.train_fraction > 0.0) {
    return simulate_split(c, mode, max_staleness);
  }
  rl_sim_result best;
  for (int eighths = 1; eighths <= 6; ++eighths) {
    rl_sim_config t = c;
    t.train_fraction = eighths / 8.0;
    rl_sim_result r = simulate_split(t, mode, max_staleness);
    if (!r.error.empty()) return r;
    if (eighths == 1 || r.samples_per_s > best.samples_per_s) best = std::move(r);
  }
  return best;
}

}  // namespace weft::bench::sim
