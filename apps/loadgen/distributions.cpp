#include "apps/loadgen/distributions.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace weft::apps::loadgen {

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string validate(const arrival_config& config) {
  if (!(config.rate_rps > 0) || !std::isfinite(config.rate_rps))
    return "arrival rate must be > 0 req/s";
  if (config.kind == arrival_kind::gamma &&
      (!(config.burstiness > 0) || !std::isfinite(config.burstiness))) {
    return "burstiness (gamma shape) must be > 0";
  }
  return {};
}

std::vector<double> generate_arrivals(const arrival_config& config, size_t n) {
  std::vector<double> times;
  times.reserve(n);
  std::mt19937_64 rng{mix_seed(config.seed, 0xa771a1)};
  const double shape = config.kind == arrival_kind::gamma ? config.burstiness : 1.0;
  // Mean gap = shape * scale = 1 / rate.
  std::gamma_distribution<double> gap{shape, 1.0 / (config.rate_rps * shape)};
  double t = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) t += gap(rng);
    times.push_back(t);
  }
  return times;
}

std::string validate(const length_config& c) {
  if (c.min_tokens < 1) return "minimum length must be >= 1 token";
  if (c.max_tokens != 0 && c.max_tokens < c.min_tokens)
    return "maximum length is below the minimum";
  switch (c.dist) {
    case length_dist::fixed:
      if (c.mean_tokens < 1) return "fixed length must be >= 1 token";
      break;
    case length_dist::uniform:
      if (c.max_tokens == 0) return "uniform lengths need a maximum (--*-max)";
      break;
    case length_dist::pareto:
      if (c.mean_tokens < 1) return "mean length must be >= 1 token";
      if (!(c.pareto_alpha > 1.0)) return "pareto shape (alpha) must be > 1 for a finite mean";
      break;
    case length_dist::lognormal:
      if (c.mean_tokens < 1) return "mean length must be >= 1 token";
      if (!(c.lognormal_sigma > 0.0)) return "lognormal sigma must be > 0";
      break;
  }
  return {};
}

std::vector<int64_t> sample_lengths(const length_config& c, size_t n, uint64_t seed) {
  std::vector<int64_t> out;
  out.reserve(n);
  std::mt19937_64 rng{mix_seed(seed, 0x1e6)};
  std::uniform_real_distribution<double> unit{0.0, 1.0};
  const auto clip = [&](double x) {
    auto v = static_cast<int64_t>(std::llround(x));
    v = std::max(v, c.min_tokens);
    if (c.max_tokens > 0) v = std::min(v, c.max_tokens);
    return v;
  };
  for (size_t i = 0; i < n; ++i) {
    switch (c.dist) {
      case length_dist::fixed:
        out.push_back(c.mean_tokens);
        break;
      case length_dist::uniform: {
        std::uniform_int_distribution<int64_t> u{c.min_tokens, c.max_tokens};
        out.push_back(u(rng));
        break;
      }
      case length_dist::pareto: {
        // Inverse CDF: x = x_m / U^(1/alpha); mean = alpha x_m / (alpha - 1).
        const double x_m =
            static_cast<double>(c.mean_tokens) * (c.pareto_alpha - 1.0) / c.pareto_alpha;
        const double u = 1.0 - unit(rng);  // in (0, 1]
        out.push_back(clip(x_m / std::pow(u, 1.0 / c.pareto_alpha)));
        break;
      }
      case length_dist::lognormal: {
        const double sigma = c.lognormal_sigma;
        std::lognormal_distribution<double> ln{
            std::log(static_cast<double>(c.mean_tokens)) - sigma * sigma / 2, sigma};
        out.push_back(clip(ln(rng)));
        break;
      }
    }
  }
  return out;
}

bool parse_arrival_kind(const std::string& name, arrival_kind& out) {
  if (name == "poisson")
    out = arrival_kind::poisson;
  else if (name == "gamma")
    out = arrival_kind::gamma;
  else
    return false;
  return true;
}

bool parse_length_dist(const std::string& name, length_dist& out) {
  if (name == "fixed")
    out = length_dist::fixed;
  else if (name == "uniform")
    out = length_dist::uniform;
  else if (name == "pareto")
    out = length_dist::pareto;
  else if (name == "lognormal")
    out = length_dist::lognormal;
  else
    return false;
  return true;
}

const char* to_string(arrival_kind kind) {
  return kind == arrival_kind::gamma ? "gamma" : "poisson";
}

const char* to_string(length_dist dist) {
  switch (dist) {
    case length_dist::fixed:
      return "fixed";
    case length_dist::uniform:
      return "uniform";
    case length_dist::pareto:
      return "pareto";
    case length_dist::lognormal:
      return "lognormal";
  }
  return "?";
}

}  // namespace weft::apps::loadgen
