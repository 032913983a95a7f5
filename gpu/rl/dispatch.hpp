#pragma once
/// Skewness-aware dispatch of rollouts (docs/rl.md, "Length-aware dispatch"; StreamRL's output-
/// length ranker): an online predictor of each prompt's output length, and the assignment of a
/// step's groups to rollout agents that starts the predicted-long ones first and spreads them so
/// that no agent is left with the whole tail. Plain classes, no CAF and no engine: the cluster
/// simulator (bench/sim/rl) runs them today, the RL controller's agents will.

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace weft::gpu::rl {

/// Predicts a prompt's output length (tokens) from what its earlier samples did; a prompt never
/// seen is predicted from prompts of exactly its length (once two samples had it), else of
/// similar length (log2 buckets of the prompt's tokens), and with no history at all from the
/// prior.
class length_ranker {
 public:
  explicit length_ranker(double prior = 64.0, int64_t max_prompts = 1 << 20)
      : prior_(prior), max_prompts_(max_prompts) {}

  double predict(uint64_t prompt_key, int64_t prompt_tokens) const;
  /// One finished sample of the prompt. Beyond `max_prompts` distinct prompts, new prompts only
  /// feed their bucket (the table stays bounded).
  void observe(uint64_t prompt_key, int64_t prompt_tokens, int64_t output_tokens);
  int64_t prompts_known() const { return static_cast<int64_t>(by_prompt_.size()); }

 private:
  struct mean {
    double sum = 0.0;
    int64_t n = 0;
    double value() const { return sum / static_cast<double>(n); }
  };
  static size_t bucket(int64_t prompt_tokens);
  double prior_;
  int64_t max_prompts_;
  std::unordered_map<uint64_t, mean> by_prompt_;
  std::unordered_map<int64_t, mean> by_length_;
  std::array<mean, 24> by_bucket_{};
};

/// The engine priority (gpu::priority_policy: lower first) of a trajectory's next request under
/// `weft rl --trajectory-priority`: minus its predicted total of generated tokens — `predicted`
/// (the length ranker's, from the prompt's earlier samples) until it outgrows that, then what it
/// generated so far plus the mean of its turns (it called a tool, so at least one more turn
/// comes). A trajectory's priority only rises as it runs past its prediction (progressive
/// priority): the long tail is never left queueing behind the short ones.
int32_t trajectory_priority_of(double predicted, int64_t generated, int64_t turns_done);

/// A unit of work to place (a group of samples of one prompt) and its predicted cost.
struct dispatch_item {
  int64_t id = 0;
  double predicted = 0.0;  ///< e.g. predicted output tokens × samples
};

/// Longest-processing-time-first placement: items in decreasing predicted cost (ties by id), each
/// onto the agent whose load (its current `load` plus what was placed) is least (ties: the lowest
/// index). Returns the agent of each item, in the order of `items`; `load` gets the placed costs.
/// Deterministic.
std::vector<int> place_longest_first(std::span<const dispatch_item> items, std::span<double> load);

/// Round-robin placement (the baseline): item i onto agent (start + i) mod agents.
std::vector<int> place_round_robin(size_t items, int agents, int start = 0);

/// The order in which to start items on one agent: predicted-longest first (ties by id).
std::vector<size_t> longest_first_order(std::span<const dispatch_item> items);

/// Tail consolidation (RLHFuse's inter-stage fusion): once a step's unfinished sequences fit on at
/// most half of the agents that hold them (`unfinished[a]`: agent a's, running and queued;
/// `capacity`: the sequences an agent may take from the tail — small enough that its decode step
/// stays near its fixed cost, since the tail is the step's critical path), the agents that keep
/// them — those holding
/// the most, ties by the lowest index, as few as can run them all at once. The others move theirs
/// there (by replaying prompt and tokens so far) and are free for other work (in a colocated
/// cluster: training the step's finished samples). Empty: not worth it yet (fewer than half of
/// the busy agents would be freed, or nothing is unfinished). Deterministic.
std::vector<int> consolidation_targets(std::span<const int64_t> unfinished, int64_t capacity);

}  // namespace weft::gpu::rl
