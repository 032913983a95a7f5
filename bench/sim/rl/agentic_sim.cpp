#include "bench/sim/rl/agentic_sim.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <queue>
#include <unordered_map>
#include <vector>

#include "bench/sim/rl/rl_sim.hpp"
#include "gpu/rl/dispatch.hpp"
#include "gpu/schedule_policy.hpp"

namespace weft::bench::sim {

namespace {

uint64_t sample_id(const agentic_sim_config& c, int64_t step, int64_t group, int64_t j) {
  return static_cast<uint64_t>((step * c.prompts_per_step + group) * 4096 + j);
}

int64_t prompt_of(const agentic_sim_config& c, int64_t step, int64_t group) {
  return (step * c.prompts_per_step + group) % std::max<int64_t>(1, c.dataset_prompts);
}

/// The prompt's deviation from the mean work, in log scale (its turns and its turns' lengths).
double prompt_dev(const agentic_sim_config& c, int64_t prompt) {
  return c.prompt_sigma * sim_normal(c.seed, 11, static_cast<uint64_t>(prompt));
}

int64_t prompt_tokens(const agentic_sim_config& c, int64_t prompt) {
  const double noise = 0.3 * sim_normal(c.seed, 14, static_cast<uint64_t>(prompt));
  return std::max<int64_t>(8, std::llround(96.0 * std::exp(0.5 * prompt_dev(c, prompt) + noise)));
}

double tool_seconds(const agentic_sim_config& c, uint64_t sample, int64_t turn) {
  return -c.tool_mean_s * std::log(sim_uniform(c.seed, 15, sample, static_cast<uint64_t>(turn)));
}

struct trajectory {
  int64_t prompt = 0;
  int64_t prompt_tokens = 0;
  uint64_t sample = 0;
  int64_t step = 0, group = 0, j = 0;
  int64_t turns = 0;
  int64_t turn = 0;       ///< Current turn.
  int64_t left = 0;       ///< Tokens left in the current turn.
  int64_t generated = 0;  ///< Over all turns so far.
};

struct live_request {
  gpu::request_id id = 0;
  size_t traj = 0;
  uint64_t arrival = 0;
  int32_t priority = 0;
  int64_t n_generated = 0;
  bool ran = false;
  bool ran_last = false;
};

struct tool_return {
  double time = 0.0;
  size_t traj = 0;
  bool operator>(const tool_return& o) const {
    return time != o.time ? time > o.time : traj > o.traj;
  }
};

}  // namespace

int64_t agentic_turns(const agentic_sim_config& c, int64_t step, int64_t group, int64_t j) {
  const double z = sim_normal(c.seed, 12, sample_id(c, step, group, j));
  const double t =
      c.mean_turns * std::exp(prompt_dev(c, prompt_of(c, step, group)) + c.sample_sigma * z -
                              0.5 * c.sample_sigma * c.sample_sigma);
  return std::clamp<int64_t>(std::llround(t), 1, std::max<int64_t>(1, c.max_turns));
}

int64_t agentic_turn_tokens(const agentic_sim_config& c, int64_t step, int64_t group, int64_t j,
                            int64_t turn) {
  const double z =
      sim_normal(c.seed, 13, sample_id(c, step, group, j), static_cast<uint64_t>(turn));
  const double len =
      c.mean_turn_tokens * std::exp(0.5 * prompt_dev(c, prompt_of(c, step, group)) +
                                    c.turn_sigma * z - 0.5 * c.turn_sigma * c.turn_sigma);
  return std::max<int64_t>(1, std::llround(len));
}

agentic_sim_result simulate_agentic(const agentic_sim_config& c, bool trajectory_priority) {
  agentic_sim_result out;
  std::unique_ptr<gpu::schedule_policy> policy;
  if (trajectory_priority) {
    policy = std::make_unique<gpu::priority_policy>();
  } else {
    policy = std::make_unique<gpu::fcfs_policy>();
  }
  gpu::rl::length_ranker ranker(c.mean_turns * c.mean_turn_tokens);
  double now = 0.0, queued = 0.0, batch_sum = 0.0;
  int64_t iteration = 0, decode_steps = 0;
  uint64_t arrivals = 0;
  gpu::request_id next_id = 1;
  for (int64_t m = 0; m < c.steps; ++m) {
    const double step_start = now;
    std::vector<trajectory> trajs;
    std::vector<live_request> live;
    std::priority_queue<tool_return, std::vector<tool_return>, std::greater<>> tools;
    // A trajectory's next turn enters the engine with the priority weft rl gives it.
    auto enter = [&](size_t t) {
      const trajectory& x = trajs[t];
      live_request r;
      r.id = next_id++;
      r.traj = t;
      r.arrival = arrivals++;
      if (trajectory_priority) {
        const double predicted = ranker.predict(static_cast<uint64_t>(x.prompt), x.prompt_tokens);
        r.priority = gpu::rl::trajectory_priority_of(predicted, x.generated, x.turn);
      }
      gpu::sched_request s;
      s.id = r.id;
      s.arrival = r.arrival;
      s.n_prompt = x.prompt_tokens + x.generated;
      s.priority = r.priority;
      policy->on_add(s);
      live.push_back(r);
    };
    for (int64_t g = 0; g < c.prompts_per_step; ++g) {
      for (int64_t j = 0; j < c.group_size; ++j) {
        trajectory x;
        x.prompt = prompt_of(c, m, g);
        x.prompt_tokens = prompt_tokens(c, x.prompt);
        x.sample = sample_id(c, m, g, j);
        x.step = m;
        x.group = g;
        x.j = j;
        x.turns = agentic_turns(c, m, g, j);
        x.left = agentic_turn_tokens(c, m, g, j, 0);
        trajs.push_back(x);
        out.turns += x.turns;
      }
    }
    for (size_t t = 0; t < trajs.size(); ++t) enter(t);
    size_t unfinished = trajs.size();
    while (unfinished > 0) {
      if (live.empty()) {
        now = std::max(now, tools.top().time);
      } else {
        std::vector<gpu::sched_request> ranked;
        ranked.reserve(live.size());
        for (const auto& r : live) {
          gpu::sched_request s;
          s.id = r.id;
          s.arrival = r.arrival;
          s.n_prompt = trajs[r.traj].prompt_tokens;
          s.n_generated = r.n_generated;
          s.n_computed = s.n_prompt + r.n_generated;
          s.state = r.ran ? gpu::sched_state::resident : gpu::sched_state::waiting;
          s.scheduled_last_step = r.ran_last;
          s.priority = r.priority;
          ranked.push_back(s);
        }
        policy->rank(ranked, iteration++);
        const size_t batch =
            std::min(ranked.size(), static_cast<size_t>(std::max<int64_t>(1, c.max_running)));
        const double dt =
            (c.step_base_ms + c.step_per_seq_ms * static_cast<double>(batch)) / 1000.0;
        std::unordered_map<gpu::request_id, size_t> at;
        for (size_t i = 0; i < live.size(); ++i) at[live[i].id] = i;
        std::vector<uint8_t> in_batch(live.size(), 0);
        for (size_t k = 0; k < batch; ++k) in_batch[at.at(ranked[k].id)] = 1;
        std::vector<live_request> still;
        still.reserve(live.size());
        for (size_t i = 0; i < live.size(); ++i) {
          live_request& r = live[i];
          if (in_batch[i] == 0) {
            if (r.ran_last) ++out.preemptions;
            r.ran_last = false;
            queued += dt;
            still.push_back(r);
            continue;
          }
          trajectory& x = trajs[r.traj];
          r.ran = r.ran_last = true;
          ++r.n_generated;
          ++x.generated;
          if (--x.left > 0) {
            still.push_back(r);
            continue;
          }
          policy->on_finish(r.id);
          if (++x.turn < x.turns) {  // the turn ends with a tool call
            x.left = agentic_turn_tokens(c, x.step, x.group, x.j, x.turn);
            tools.push(tool_return{now + dt + tool_seconds(c, x.sample, x.turn), r.traj});
          } else {
            ranker.observe(static_cast<uint64_t>(x.prompt), x.prompt_tokens, x.generated);
            --unfinished;
          }
        }
        live.swap(still);
        for (size_t k = 0; k < batch; ++k) policy->on_progress(ranked[k].id, 0, 1);
        now += dt;
        batch_sum += static_cast<double>(batch);
        ++decode_steps;
      }
      while (!tools.empty() && tools.top().time <= now) {
        const size_t t = tools.top().traj;
        tools.pop();
        enter(t);
      }
    }
    out.seconds += now - step_start;
    out.trajectories += static_cast<int64_t>(trajs.size());
  }
  out.samples_per_s = out.seconds > 0.0 ? static_cast<double>(out.trajectories) / out.seconds : 0.0;
  out.mean_step_s = c.steps > 0 ? out.seconds / static_cast<double>(c.steps) : 0.0;
  out.mean_queued_s = out.trajectories > 0 ? queued / static_cast<double>(out.trajectories) : 0.0;
  out.mean_batch = decode_steps > 0 ? batch_sum / static_cast<double>(decode_steps) : 0.0;
  return out;
}

}  // namespace weft::bench::sim
