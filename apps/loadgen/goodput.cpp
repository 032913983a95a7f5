#include "apps/loadgen/goodput.hpp"

#include <cmath>

namespace weft::apps::loadgen {

const char* to_string(goodput_status status) {
  switch (status) {
    case goodput_status::found:
      return "found";
    case goodput_status::below_min:
      return "below_min";
    case goodput_status::at_least_max:
      return "at_least_max";
  }
  return "?";
}

std::string validate(const bisection_config& c) {
  if (!(c.rate_min_rps > 0) || !std::isfinite(c.rate_min_rps)) return "--rate-min must be > 0";
  if (!(c.rate_max_rps > c.rate_min_rps) || !std::isfinite(c.rate_max_rps))
    return "--rate-max must be > --rate-min";
  if (c.steps < 0) return "--bisect-steps must be >= 0";
  if (!(c.attainment_target > 0 && c.attainment_target <= 1))
    return "attainment target must be in (0, 1]";
  return {};
}

goodput_result bisect_goodput(const bisection_config& c,
                              const std::function<double(double)>& attainment_at) {
  goodput_result r;
  const auto probe = [&](double rate) {
    const double a = attainment_at(rate);
    const bool pass = a >= c.attainment_target;
    r.probes.push_back({rate, a, pass});
    return pass;
  };
  if (!probe(c.rate_min_rps)) {
    r.status = goodput_status::below_min;
    r.goodput_rps = 0.0;
    r.upper_bound_rps = c.rate_min_rps;
    return r;
  }
  if (probe(c.rate_max_rps)) {
    r.status = goodput_status::at_least_max;
    r.goodput_rps = c.rate_max_rps;
    return r;
  }
  double lo = c.rate_min_rps, hi = c.rate_max_rps;
  for (int i = 0; i < c.steps; ++i) {
    const double mid = (lo + hi) / 2;
    (probe(mid) ? lo : hi) = mid;
  }
  r.status = goodput_status::found;
  r.goodput_rps = lo;
  r.upper_bound_rps = hi;
  return r;
}

}  // namespace weft::apps::loadgen
