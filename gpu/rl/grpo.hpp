#pragma once
/// The GRPO objective (docs/rl.md): group-relative advantages, PPO-clip on the ratio to the
/// behaviour policy's per-token log-probabilities (the rollout engine's), asymmetric clipping
/// (DAPO's clip-higher), the loss aggregations in use (token mean, sequence mean, Dr. GRPO's
/// constant), and dropping groups whose rewards do not vary. Plain functions, no CAF: the RL
/// controller, the tests and the simulator call them alike.

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpu/status.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::rl {

/// How per-token losses become the step's loss.
enum class loss_aggregation {
  token,     ///< Σ ℓ over all tokens of the step / their count (DAPO; TRL's "dapo"/"bnpo").
  sequence,  ///< Mean over sequences of each sequence's token mean (the GRPO paper; TRL "grpo").
  constant,  ///< Σ ℓ / (sequences × max new tokens) (Dr. GRPO: no length bias).
};

/// How tokens sampled by older weights (a stale behaviour policy) are corrected.
enum class off_policy_correction {
  /// PPO-clip on the ratio π_θ/π_behaviour: a token whose ratio leaves the clip range in the
  /// direction its advantage pushes stops contributing.
  ppo_clip,
  /// The decoupled objective (AReaL) with one update per batch: the proximal policy is the
  /// trainer's current one, so the clipped ratio is 1 and each token's gradient is
  /// −A·min(π_θ/π_behaviour, is_cap)·∇log π_θ (truncated importance weight, detached).
  decoupled,
};
bool parse_off_policy_correction(const std::string& name, off_policy_correction& out);
const char* off_policy_correction_name(off_policy_correction c);

/// "token", "sequence", "constant"; false for anything else.
bool parse_loss_aggregation(const std::string& name, loss_aggregation& out);
const char* loss_aggregation_name(loss_aggregation a);

struct grpo_config {
  double clip_low = 0.2;   ///< Ratio floor 1 − clip_low (for negative advantages).
  double clip_high = 0.2;  ///< Ratio ceiling 1 + clip_high (DAPO clip-higher: e.g. 0.28).
  /// Divide each group's centred rewards by the group's standard deviation (GRPO); false: only
  /// centre them (Dr. GRPO).
  bool scale_rewards = true;
  loss_aggregation aggregation = loss_aggregation::token;
  /// Groups whose rewards are all equal (zero advantage everywhere) take no part in the loss or
  /// its normaliser (DAPO's dynamic-sampling filter, without the resampling).
  bool drop_zero_variance = false;
  int64_t max_new_tokens = 0;  ///< The constant of loss_aggregation::constant.
  off_policy_correction correction = off_policy_correction::ppo_clip;
  double is_cap = 2.0;  ///< off_policy_correction::decoupled: the importance weight's cap.
  /// β of the KL penalty to the reference policy (TRL's `beta`; 0: none). Each token adds
  /// β·k3 with k3 = exp(ref − logp) − (ref − logp) − 1 (Schulman's estimator, as TRL and verl's
  /// "low_var_kl"), weighted like its policy term.
  double kl_coef = 0.0;
  /// Mixture of experts: the router's load-balancing loss coefficient (trainable_config::
  /// router_aux_loss_coef; 0: none). Each micro-batch adds coef · aux weighted like its policy
  /// loss (the sum of its tokens' weights), so the step adds coef × the weighted mean of aux.
  double router_aux_loss_coef = 0.0;
};

/// The k3 estimate of KL(π_θ ‖ π_ref) at one token and its derivative in log π_θ.
struct kl_term {
  double kl = 0.0;
  double dkl_dlogp = 0.0;
};
kl_term kl_k3(double logp, double ref_logp);

/// Group-relative advantages of rewards laid out group after group (group g holds
/// rewards[g·size .. g·size + size − 1]): r − mean(group), divided by (std(group) + 1e-4) when
/// `scale` (std with Bessel's correction, as torch.std and TRL).
std::vector<double> group_advantages(std::span<const double> rewards, int64_t group_size,
                                     bool scale);

/// Whether every reward of group g equals the first one.
std::vector<uint8_t> zero_variance_groups(std::span<const double> rewards, int64_t group_size);

/// One token's PPO-clip term: ratio r = exp(logp − behaviour_logp),
/// ℓ = −min(r·A, clip(r, 1 − clip_low, 1 + clip_high)·A), and dℓ/dlogp (0 where the clipped
/// branch is the minimum, −A·r otherwise).
struct ppo_term {
  double loss = 0.0;
  double dloss_dlogp = 0.0;
  bool clipped = false;
  double ratio = 1.0;
};
ppo_term ppo_clip(double logp, double behaviour_logp, double advantage, double clip_low,
                  double clip_high);

/// One token's decoupled term (off_policy_correction::decoupled): w = min(exp(logp −
/// behaviour_logp), cap), ℓ = −w·A, dℓ/dlogp = −w·A; `clipped` when the weight was truncated.
ppo_term decoupled_is(double logp, double behaviour_logp, double advantage, double cap);

/// The loss weight of every token of sample s (completion length lengths[s]; `keep[s]` false:
/// weight 0) so that Σ weight·ℓ is the chosen aggregation over the kept samples.
std::vector<double> sample_token_weights(std::span<const int64_t> lengths,
                                         std::span<const uint8_t> keep, loss_aggregation agg,
                                         int64_t max_new_tokens);

/// Counters the objective fills in while it runs (from several threads).
struct ppo_stats {
  std::atomic<int64_t> tokens{0};
  std::atomic<int64_t> clipped{0};
  /// Σ |r − 1| over the tokens, in units of 1e-9 (atomics of integers stay deterministic).
  std::atomic<int64_t> abs_ratio_dev_nano{0};
  /// Σ k3 over the tokens, in units of 1e-9 (only with a KL term).
  std::atomic<int64_t> kl_nano{0};
  double clip_fraction() const;
  double mean_abs_ratio_deviation() const;
  double mean_kl() const;
};

/// The policy-gradient token objective over train_batch::policy (behaviour log-p, advantage,
/// weight): ℓ_i = weight_i · ppo_clip(...) or weight_i · decoupled_is(...), as config.correction
/// says. `stats` may be null.
train::token_objective<float> ppo_objective(const grpo_config& config, ppo_stats* stats);

}  // namespace weft::gpu::rl
