#pragma once
// Random inter-arrival times and request lengths for synthetic serving workloads.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::apps::loadgen {

/// How request send times are drawn.
enum class arrival_kind {
  poisson,  ///< exponential gaps (gamma with shape 1)
  gamma,  ///< gamma gaps with shape `burstiness`: cv = 1/sqrt(shape); < 1 is burstier than Poisson
};

/// Parameters of an arrival process.
struct arrival_config {
  arrival_kind kind = arrival_kind::poisson;
  double rate_rps = 1.0;    ///< mean requests per second
  double burstiness = 1.0;  ///< gamma shape (only for arrival_kind::gamma)
  uint64_t seed = 0;
};

/// Returns `n` send times in seconds from the start of the run: the first at 0, then cumulative
/// random gaps of mean 1/rate. Deterministic for a given config. Precondition: validate() passed.
std::vector<double> generate_arrivals(const arrival_config& config, size_t n);

/// Empty when the config is usable, else what is wrong with it.
std::string validate(const arrival_config& config);

/// How request lengths (prompt or output tokens) are drawn.
enum class length_dist {
  fixed,      ///< always mean_tokens
  uniform,    ///< uniform integers in [min_tokens, max_tokens]
  pareto,     ///< Pareto with shape pareto_alpha (> 1) and mean mean_tokens, clipped to [min, max]
  lognormal,  ///< log-normal with sigma lognormal_sigma and mean mean_tokens, clipped to [min, max]
};

/// Parameters of a length distribution (in tokens).
struct length_config {
  length_dist dist = length_dist::fixed;
  int64_t mean_tokens = 128;
  int64_t min_tokens = 1;
  int64_t max_tokens = 0;  ///< upper clip (0 = none; required for uniform)
  double pareto_alpha = 1.5;
  double lognormal_sigma = 1.0;
};

/// Draws `n` lengths, each >= 1. Deterministic for a given (config, seed).
/// Precondition: validate() passed.
std::vector<int64_t> sample_lengths(const length_config& config, size_t n, uint64_t seed);

/// Empty when the config is usable, else what is wrong with it.
std::string validate(const length_config& config);

/// Parses "poisson"/"gamma" and "fixed"/"uniform"/"pareto"/"lognormal"; false when unknown.
bool parse_arrival_kind(const std::string& name, arrival_kind& out);
bool parse_length_dist(const std::string& name, length_dist& out);
const char* to_string(arrival_kind kind);
const char* to_string(length_dist dist);

/// Mixes two 64-bit values into a well-spread seed (splitmix64 finaliser).
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace weft::apps::loadgen
