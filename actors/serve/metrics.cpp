#include "actors/serve/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>

#include <spdlog/spdlog.h>

namespace weft::serve {

namespace {

bool valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

bool valid_label_name(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

bool valid_labels(const metric_labels& labels) {
  for (const auto& [k, v] : labels) {
    // "__" prefixes are reserved by Prometheus.
    if (!valid_label_name(k) || k.starts_with("__")) return false;
  }
  return true;
}

// A sample value as Prometheus reads it: integers without exponent (3, 1048576), others in the
// shortest form that reads back exactly (0.25, 1e+20), and +Inf / -Inf / NaN.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  constexpr double max_plain = 1e15;  // integers print exactly well below 2^53
  if (std::trunc(v) == v && std::fabs(v) < max_plain) {
    if (v == 0.0) return "0";  // also -0
    return std::to_string(static_cast<int64_t>(v));
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc{} ? std::string(buf, end) : std::string("NaN");
}

// HELP text: backslash and newline escaped.
std::string escape_help(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Label values: backslash, double quote and newline escaped.
std::string escape_label_value(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// "{a="1",b="2"}" (with an optional extra label last, e.g. le), or "" when there are none.
std::string label_block(const metric_labels& labels, std::string_view extra_key = {},
                        std::string_view extra_value = {}) {
  if (labels.empty() && extra_key.empty()) return {};
  std::string out = "{";
  bool first = true;
  auto add = [&](std::string_view k, std::string_view v) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += escape_label_value(v);
    out += '"';
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (!extra_key.empty()) add(extra_key, extra_value);
  out += '}';
  return out;
}

std::string_view kind_name(metrics_registry::kind k) {
  switch (k) {
    case metrics_registry::kind::counter:
      return "counter";
    case metrics_registry::kind::gauge:
      return "gauge";
    case metrics_registry::kind::histogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

void metrics_registry::declare_counter(std::string_view name, std::string_view help,
                                       const std::vector<metric_labels>& zero_series) {
  if (!valid_metric_name(name)) {
    spdlog::error("metrics: invalid metric name '{}'", name);
    return;
  }
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.k != kind::counter)
      spdlog::error("metrics: '{}' is already declared as a {}", name, kind_name(it->second.k));
    return;
  }
  family f;
  f.k = kind::counter;
  f.help = std::string(help);
  for (const auto& labels : zero_series) {
    if (valid_labels(labels)) f.by_labels[labels].value = 0.0;
  }
  families_.emplace(std::string(name), std::move(f));
}

void metrics_registry::declare_gauge(std::string_view name, std::string_view help) {
  if (!valid_metric_name(name)) {
    spdlog::error("metrics: invalid metric name '{}'", name);
    return;
  }
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.k != kind::gauge)
      spdlog::error("metrics: '{}' is already declared as a {}", name, kind_name(it->second.k));
    return;
  }
  family f;
  f.k = kind::gauge;
  f.help = std::string(help);
  families_.emplace(std::string(name), std::move(f));
}

void metrics_registry::declare_histogram(std::string_view name, std::string_view help,
                                         std::vector<double> upper_bounds) {
  if (!valid_metric_name(name)) {
    spdlog::error("metrics: invalid metric name '{}'", name);
    return;
  }
  // Bounds must be finite, ascending and distinct; +Inf is added when rendering.
  std::erase_if(upper_bounds, [](double b) { return !std::isfinite(b); });
  if (!std::is_sorted(upper_bounds.begin(), upper_bounds.end())) {
    spdlog::warn("metrics: bucket bounds of '{}' are not ascending; sorting them", name);
    std::sort(upper_bounds.begin(), upper_bounds.end());
  }
  upper_bounds.erase(std::unique(upper_bounds.begin(), upper_bounds.end()), upper_bounds.end());
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.k != kind::histogram) {
      spdlog::error("metrics: '{}' is already declared as a {}", name, kind_name(it->second.k));
    } else if (it->second.bounds != upper_bounds) {
      spdlog::error("metrics: histogram '{}' declared again with other buckets; keeping the first",
                    name);
    }
    return;
  }
  family f;
  f.k = kind::histogram;
  f.help = std::string(help);
  f.bounds = std::move(upper_bounds);
  families_.emplace(std::string(name), std::move(f));
}

void metrics_registry::inc(std::string_view name, const metric_labels& labels, double v) {
  if (!(v >= 0.0)) {
    spdlog::debug("metrics: counter '{}' incremented by {} (must be >= 0); ignored", name, v);
    return;
  }
  if (!valid_labels(labels)) {
    spdlog::debug("metrics: invalid label name on '{}'; ignored", name);
    return;
  }
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.k == kind::histogram) {
    spdlog::debug("metrics: inc on undeclared counter '{}'; ignored", name);
    return;
  }
  // A gauge may be incremented too (Prometheus allows it); a counter only goes up.
  it->second.by_labels[labels].value += v;
}

void metrics_registry::set(std::string_view name, const metric_labels& labels, double v) {
  if (!valid_labels(labels)) {
    spdlog::debug("metrics: invalid label name on '{}'; ignored", name);
    return;
  }
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.k != kind::gauge) {
    spdlog::debug("metrics: set on undeclared gauge '{}'; ignored", name);
    return;
  }
  it->second.by_labels[labels].value = v;
}

void metrics_registry::set_total(std::string_view name, const metric_labels& labels, double v) {
  if (!(v >= 0.0) || !valid_labels(labels)) {
    spdlog::debug("metrics: bad value or label on counter '{}'; ignored", name);
    return;
  }
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.k != kind::counter) {
    spdlog::debug("metrics: set_total on undeclared counter '{}'; ignored", name);
    return;
  }
  it->second.by_labels[labels].value = v;
}

void metrics_registry::observe(std::string_view name, const metric_labels& labels, double v) {
  if (std::isnan(v)) {
    spdlog::debug("metrics: NaN observed on '{}'; ignored", name);
    return;
  }
  if (!valid_labels(labels)) {
    spdlog::debug("metrics: invalid label name on '{}'; ignored", name);
    return;
  }
  for (const auto& [k, unused] : labels) {
    if (k == "le") {
      spdlog::debug("metrics: label 'le' is reserved on histogram '{}'; ignored", name);
      return;
    }
  }
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.k != kind::histogram) {
    spdlog::debug("metrics: observe on undeclared histogram '{}'; ignored", name);
    return;
  }
  const auto& bounds = it->second.bounds;
  series& s = it->second.by_labels[labels];
  if (s.buckets.empty()) s.buckets.assign(bounds.size() + 1, 0);
  // First bound >= v: Prometheus buckets are "less than or equal".
  const auto b =
      static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
  ++s.buckets[b];
  s.sum += v;
  ++s.count;
}

double metrics_registry::value(std::string_view name, const metric_labels& labels) const {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.k == kind::histogram) return 0.0;
  auto s = it->second.by_labels.find(labels);
  return s == it->second.by_labels.end() ? 0.0 : s->second.value;
}

uint64_t metrics_registry::count(std::string_view name, const metric_labels& labels) const {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.k != kind::histogram) return 0;
  auto s = it->second.by_labels.find(labels);
  return s == it->second.by_labels.end() ? 0 : s->second.count;
}

std::string metrics_registry::render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + name + " ";
    out += kind_name(f.k);
    out += "\n";
    for (const auto& [labels, s] : f.by_labels) {
      if (f.k != kind::histogram) {
        out += name + label_block(labels) + " " + format_value(s.value) + "\n";
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < f.bounds.size(); ++i) {
        cumulative += s.buckets[i];
        out += name + "_bucket" + label_block(labels, "le", format_value(f.bounds[i])) + " " +
               std::to_string(cumulative) + "\n";
      }
      out += name + "_bucket" + label_block(labels, "le", "+Inf") + " " + std::to_string(s.count) +
             "\n";
      out += name + "_sum" + label_block(labels) + " " + format_value(s.sum) + "\n";
      out += name + "_count" + label_block(labels) + " " + std::to_string(s.count) + "\n";
    }
  }
  return out;
}

std::vector<double> metrics_registry::latency_buckets_s() {
  // From 1 ms (a decode step of a tiny model) to 5 min (a long CPU generation end to end).
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,   0.25, 0.5,
          1.0,   2.5,    5.0,   10.0, 25.0,  60.0, 120.0, 300.0};
}

}  // namespace weft::serve
