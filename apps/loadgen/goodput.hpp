#pragma once
// Goodput search: the highest request rate whose SLO attainment reaches a target (DistServe).

#include <functional>
#include <string>
#include <vector>

namespace weft::apps::loadgen {

/// Range and precision of the search.
struct bisection_config {
  double rate_min_rps = 0.5;
  double rate_max_rps = 8.0;
  int steps = 5;                   ///< probes between the two ends after both were probed
  double attainment_target = 0.9;  ///< a rate passes when attainment >= this
};

/// One probed rate.
struct goodput_probe {
  double rate_rps = 0.0;
  double attainment = 0.0;
  bool pass = false;
};

/// How the search ended.
enum class goodput_status {
  found,        ///< rate_min passes, rate_max fails: goodput bracketed within (max-min)/2^steps
  below_min,    ///< even rate_min fails: goodput < rate_min (reported as 0)
  at_least_max  ///< rate_max passes: goodput >= rate_max (reported as rate_max)
};
const char* to_string(goodput_status status);

/// Result of a search; probes in the order they were run.
struct goodput_result {
  double goodput_rps = 0.0;
  double upper_bound_rps = 0.0;  ///< lowest failing rate probed (0 when none failed)
  goodput_status status = goodput_status::found;
  std::vector<goodput_probe> probes;
};

/// Empty when the config is usable, else what is wrong with it.
std::string validate(const bisection_config& config);

/// Probes rate_min, then rate_max, then bisects `steps` times between the highest passing and the
/// lowest failing rate. `attainment_at(rate)` runs one full probe and returns its attainment in
/// [0, 1]. Assumes attainment does not increase with the rate. Precondition: validate() passed.
goodput_result bisect_goodput(const bisection_config& config,
                              const std::function<double(double rate_rps)>& attainment_at);

}  // namespace weft::apps::loadgen
