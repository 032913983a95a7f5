#pragma once
/// A small thread-safe Prometheus registry: counters, gauges and histograms with labels, rendered
/// in the text exposition format (version 0.0.4) for GET /metrics. No CAF.

#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::serve {

/// Label pairs of one series, e.g. {{"level", "0"}}. Order is kept as given.
using metric_labels = std::vector<std::pair<std::string, std::string>>;

class metrics_registry {
 public:
  enum class kind { counter, gauge, histogram };

  /// Declares a family. Names follow Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*); a counter's
  /// name should end in _total. Declaring the same name twice with the same kind is a no-op.
  /// A counter's `zero_series` are shown at 0 from the start (a scraper then sees the first
  /// increment as one); by default the unlabelled series — pass the known label sets of a labelled
  /// family, or none when they are open-ended.
  void declare_counter(std::string_view name, std::string_view help,
                       const std::vector<metric_labels>& zero_series = {metric_labels{}});
  void declare_gauge(std::string_view name, std::string_view help);
  /// `upper_bounds` ascending; +Inf is implicit.
  void declare_histogram(std::string_view name, std::string_view help,
                         std::vector<double> upper_bounds);

  /// Counter += v (v >= 0). Undeclared names are ignored with a debug log.
  void inc(std::string_view name, const metric_labels& labels = {}, double v = 1.0);
  /// Counter = v, for a count kept elsewhere and mirrored here (a worker's own counter): it only
  /// drops when that source restarted, which Prometheus's rate() reads as a counter reset.
  void set_total(std::string_view name, const metric_labels& labels, double v);
  /// Gauge = v.
  void set(std::string_view name, const metric_labels& labels, double v);
  void set(std::string_view name, double v) { set(name, {}, v); }
  /// Histogram observation.
  void observe(std::string_view name, const metric_labels& labels, double v);
  void observe(std::string_view name, double v) { observe(name, {}, v); }

  /// Current value of a counter or gauge series (0 when absent); for tests and /admin views.
  double value(std::string_view name, const metric_labels& labels = {}) const;
  /// Observation count of a histogram series.
  uint64_t count(std::string_view name, const metric_labels& labels = {}) const;

  /// Text exposition: "# HELP", "# TYPE", then one line per series (histograms: _bucket{le=...},
  /// _sum, _count), label values escaped (\\, \", \n).
  std::string render() const;

  /// Latency buckets in seconds suited to TTFT/TPOT/E2E on this class of machine.
  static std::vector<double> latency_buckets_s();

 private:
  struct series {
    double value = 0.0;
    std::vector<uint64_t> buckets;  // histogram: per bound (not cumulative), + one for +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  struct family {
    kind k = kind::counter;
    std::string help;
    std::vector<double> bounds;
    std::map<metric_labels, series> by_labels;
  };
  mutable std::mutex mu_;
  std::map<std::string, family, std::less<>> families_;
};

}  // namespace weft::serve
