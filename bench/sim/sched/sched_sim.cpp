#include "bench/sim/sched/sched_sim.hpp"

#include <algorithm>
#include <cstddef>

namespace weft::bench::sim {

namespace {

struct live_state {
  int64_t computed = 0;   ///< Prompt tokens whose K/V exist.
  int64_t generated = 0;  ///< Tokens sampled.
  bool scheduled_last = false;
  bool done = false;
  int64_t ran_step = -1;  ///< The last pass it had tokens in.
  double first_token_s = -1.0;
};

}  // namespace

sim_run simulate(const std::vector<sim_request>& requests, gpu::schedule_policy& policy,
                 const sim_engine_config& config) {
  const size_t n = requests.size();
  sim_run run;
  run.outcomes.resize(n);
  std::vector<live_state> st(n);
  std::vector<size_t> live;  // arrival order
  std::vector<gpu::sched_request> ranking;
  size_t next = 0, finished = 0;
  double clock = 0.0;
  const auto view = [&](size_t i) {
    gpu::sched_request r;
    r.id = i;
    r.arrival = i;
    r.n_prompt = requests[i].prompt_tokens;
    r.n_generated = st[i].generated;
    r.n_computed = st[i].computed;
    r.state = st[i].computed > 0 ? gpu::sched_state::resident : gpu::sched_state::waiting;
    r.scheduled_last_step = st[i].scheduled_last;
    return r;
  };
  while (finished < n) {
    if (live.empty() && next < n) clock = std::max(clock, requests[next].arrival_s);
    while (next < n && requests[next].arrival_s <= clock) {
      policy.on_add(view(next));
      live.push_back(next++);
    }
    ranking.clear();
    for (size_t i : live) ranking.push_back(view(i));
    policy.rank(ranking, run.steps);
    // The engine's batch: the first max_running of the ranking; their decode tokens first, then
    // prompt chunks in rank order while the token budget lasts.
    const size_t slots = std::min(ranking.size(), static_cast<size_t>(config.max_running));
    int64_t budget = config.max_batch_tokens;
    bool decodes = false;
    for (size_t k = 0; k < slots; ++k)
      decodes |= st[ranking[k].id].computed >= requests[ranking[k].id].prompt_tokens;
    if (!decodes) budget = std::max(budget, config.idle_batch_tokens);
    for (size_t k = 0; k < slots; ++k)
      if (st[ranking[k].id].computed >= requests[ranking[k].id].prompt_tokens) --budget;
    std::vector<std::pair<size_t, int64_t>> chunks;  // (request, prompt tokens this pass)
    int64_t n_sampling = 0, n_prefill = 0;
    for (size_t k = 0; k < slots; ++k) {
      const size_t i = ranking[k].id;
      const int64_t left = requests[i].prompt_tokens - st[i].computed;
      if (left <= 0) {
        chunks.emplace_back(i, 0);
        ++n_sampling;
        continue;
      }
      const int64_t c = std::min(left, budget);
      if (c <= 0) continue;
      budget -= c;
      n_prefill += c;
      if (c == left) ++n_sampling;
      chunks.emplace_back(i, c);
    }
    clock += config.model.step_ms(n_sampling, n_prefill) / 1000.0;
    run.busy_s += config.model.step_ms(n_sampling, n_prefill) / 1000.0;
    for (const auto& [i, c] : chunks) {
      live_state& s = st[i];
      s.ran_step = run.steps;
      int64_t decode = 0;
      if (c > 0) {
        s.computed += c;
        if (s.computed == requests[i].prompt_tokens) ++s.generated;  // the prefill's token
      } else {
        decode = 1;
        ++s.generated;
      }
      policy.on_progress(i, c, decode);
      if (s.generated == 1 && s.first_token_s < 0) s.first_token_s = clock;
      if (s.generated >= requests[i].output_tokens) s.done = true;
    }
    for (size_t i : live) {
      const bool ran = st[i].ran_step == run.steps;
      if (st[i].scheduled_last && !ran && !st[i].done) ++run.outcomes[i].preemptions;
      st[i].scheduled_last = ran;
    }
    std::erase_if(live, [&](size_t i) {
      if (!st[i].done) return false;
      const double overhead = config.model.overhead_ms / 1000.0;
      run.outcomes[i].ttft_s = st[i].first_token_s - requests[i].arrival_s + overhead;
      run.outcomes[i].e2e_s = clock - requests[i].arrival_s + overhead;
      policy.on_finish(i);
      ++finished;
      return true;
    });
    ++run.steps;
  }
  run.makespan_s = clock;
  return run;
}

void srpt_oracle::rank(std::vector<gpu::sched_request>& live, int64_t /*now_step*/) {
  const auto remaining = [&](const gpu::sched_request& r) {
    return requests_[r.id].output_tokens - r.n_generated;
  };
  std::sort(live.begin(), live.end(),
            [&](const gpu::sched_request& a, const gpu::sched_request& b) {
              const int64_t ra = remaining(a), rb = remaining(b);
              return ra != rb ? ra < rb : a.arrival < b.arrival;
            });
}

void las_policy::rank(std::vector<gpu::sched_request>& live, int64_t /*now_step*/) {
  std::sort(live.begin(), live.end(), [](const gpu::sched_request& a, const gpu::sched_request& b) {
    return a.n_generated != b.n_generated ? a.n_generated < b.n_generated : a.arrival < b.arrival;
  });
}

}  // namespace weft::bench::sim
