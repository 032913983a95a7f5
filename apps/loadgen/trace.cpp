#include "apps/loadgen/trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>

namespace weft::apps::loadgen {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <class T>
bool parse_number(std::string_view text, T& out) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r'))
    text.remove_suffix(1);
  if (text.empty()) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && ptr == text.data() + text.size();
}

// Days from 1970-01-01 to the given civil date (proleptic Gregorian; Howard Hinnant's algorithm).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// Value at percentile p (0..100) of sorted values, linear interpolation.
double percentile_of(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double pos = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return static_cast<double>(sorted[lo]) * (1 - frac) + static_cast<double>(sorted[hi]) * frac;
}

result<trace> load_azure(const std::string& path, std::ifstream& in) {
  trace t;
  t.format = trace_format::azure;
  t.path = path;
  std::string line;
  size_t line_no = 0;
  double t0 = 0.0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line_no == 1 && line.rfind("TIMESTAMP", 0) == 0) continue;  // header
    const auto c1 = line.find(',');
    const auto c2 = c1 == std::string::npos ? c1 : line.find(',', c1 + 1);
    if (c2 == std::string::npos) {
      return result<trace>::failure(path + ":" + std::to_string(line_no) +
                                    ": expected 3 comma-separated fields");
    }
    auto ts = parse_azure_timestamp(line.substr(0, c1));
    trace_entry e;
    if (!ts || !parse_number(std::string_view{line}.substr(c1 + 1, c2 - c1 - 1), e.input_tokens) ||
        !parse_number(std::string_view{line}.substr(c2 + 1), e.output_tokens) ||
        e.input_tokens < 0 || e.output_tokens < 0) {
      return result<trace>::failure(path + ":" + std::to_string(line_no) + ": malformed line '" +
                                    line + "'" + (ts ? "" : " (" + ts.error() + ")"));
    }
    if (t.entries.empty()) t0 = ts.value();
    e.timestamp_s = ts.value() - t0;
    t.entries.push_back(std::move(e));
  }
  return t;
}

result<trace> load_mooncake(const std::string& path, std::ifstream& in) {
  trace t;
  t.format = trace_format::mooncake;
  t.path = path;
  std::string line;
  size_t line_no = 0;
  double t0 = 0.0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto where = path + ":" + std::to_string(line_no) + ": ";
    if (j.is_discarded() || !j.is_object())
      return result<trace>::failure(where + "not a JSON object");
    const auto ts = j.find("timestamp");
    const auto in_len = j.find("input_length");
    const auto out_len = j.find("output_length");
    const auto ids = j.find("hash_ids");
    if (ts == j.end() || !ts->is_number() || in_len == j.end() || !in_len->is_number_integer() ||
        out_len == j.end() || !out_len->is_number_integer()) {
      return result<trace>::failure(where + "needs numeric timestamp, input_length, output_length");
    }
    trace_entry e;
    e.input_tokens = in_len->get<int64_t>();
    e.output_tokens = out_len->get<int64_t>();
    if (e.input_tokens < 0 || e.output_tokens < 0)
      return result<trace>::failure(where + "negative length");
    if (ids != j.end()) {
      if (!ids->is_array()) return result<trace>::failure(where + "hash_ids is not an array");
      for (const auto& id : *ids) {
        if (!id.is_number_integer())
          return result<trace>::failure(where + "hash_ids holds a non-integer");
        e.hash_ids.push_back(id.get<int64_t>());
      }
    }
    const double ts_s = ts->get<double>() / 1000.0;
    if (t.entries.empty()) t0 = ts_s;
    e.timestamp_s = ts_s - t0;
    t.entries.push_back(std::move(e));
  }
  return t;
}

}  // namespace

const char* to_string(trace_format format) {
  return format == trace_format::azure ? "azure" : "mooncake";
}

result<trace_format> detect_trace_format(const std::string& path) {
  if (ends_with(path, ".csv")) return trace_format::azure;
  if (ends_with(path, ".jsonl") || ends_with(path, ".json")) return trace_format::mooncake;
  return result<trace_format>::failure(
      "cannot tell the trace format of '" + path +
      "' from its extension (.csv = azure, .jsonl = mooncake); pass --trace-format");
}

result<double> parse_azure_timestamp(const std::string& text) {
  // "YYYY-MM-DD hh:mm:ss[.fraction]"
  int64_t y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  std::string_view v{text};
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  if (v.size() < 19 || v[4] != '-' || v[7] != '-' || (v[10] != ' ' && v[10] != 'T') ||
      v[13] != ':' || v[16] != ':' || !parse_number(v.substr(0, 4), y) ||
      !parse_number(v.substr(5, 2), mo) || !parse_number(v.substr(8, 2), d) ||
      !parse_number(v.substr(11, 2), h) || !parse_number(v.substr(14, 2), mi) ||
      !parse_number(v.substr(17, 2), s) || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 ||
      mi > 59 || s > 60) {
    return result<double>::failure("bad timestamp '" + text + "'");
  }
  double frac = 0.0;
  auto rest = v.substr(19);
  while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\r')) rest.remove_suffix(1);
  if (!rest.empty()) {
    if (rest.front() != '.' || rest.size() < 2)
      return result<double>::failure("bad timestamp '" + text + "'");
    double scale = 0.1;
    for (char c : rest.substr(1)) {
      if (c < '0' || c > '9') return result<double>::failure("bad timestamp '" + text + "'");
      frac += (c - '0') * scale;
      scale /= 10;
    }
  }
  return static_cast<double>(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s) + frac;
}

result<trace> load_trace(const std::string& path, trace_format format) {
  std::ifstream in{path};
  if (!in) return result<trace>::failure("cannot open trace file '" + path + "'");
  auto t = format == trace_format::azure ? load_azure(path, in) : load_mooncake(path, in);
  if (t && t->entries.empty())
    return result<trace>::failure("trace file '" + path + "' holds no requests");
  return t;
}

result<scaled_trace> scale_trace(const trace& source, const trace_scaling_config& config) {
  const size_t n_total = source.entries.size();
  if (config.offset >= n_total) {
    return result<scaled_trace>::failure("trace offset " + std::to_string(config.offset) +
                                         " is past the " + std::to_string(n_total) +
                                         " requests of " + source.path);
  }
  const size_t n =
      config.count == 0 ? n_total - config.offset : std::min(config.count, n_total - config.offset);
  if (config.scale_percentile <= 0 || config.scale_percentile > 100) {
    return result<scaled_trace>::failure("scale percentile must be in (0, 100]");
  }
  const auto first = source.entries.begin() + static_cast<std::ptrdiff_t>(config.offset);
  const auto last = first + static_cast<std::ptrdiff_t>(n);

  scaled_trace out;
  trace_scaling& sc = out.scaling;
  // Time: arrivals keep their gaps up to one factor.
  double t0 = first->timestamp_s, t_end = first->timestamp_s;
  for (auto it = first; it != last; ++it) {
    t0 = std::min(t0, it->timestamp_s);
    t_end = std::max(t_end, it->timestamp_s);
  }
  const double span_s = t_end - t0;
  sc.source_rate_rps = span_s > 0 && n > 1 ? static_cast<double>(n - 1) / span_s : 0.0;
  if (config.time_scale > 0) {
    sc.time_scale = config.time_scale;
  } else if (config.target_rate_rps > 0) {
    if (sc.source_rate_rps <= 0) {
      return result<scaled_trace>::failure(
          "cannot scale the trace to a rate: the " + std::to_string(n) +
          " selected requests all have the same timestamp (replay more with -n, "
          "or give --time-scale)");
    }
    sc.time_scale = sc.source_rate_rps / config.target_rate_rps;
  } else {
    sc.time_scale = 1.0;
  }
  sc.scaled_rate_rps = sc.source_rate_rps / sc.time_scale;

  // Lengths: one linear factor each, chosen so the chosen percentile lands on the maximum.
  std::vector<int64_t> ins, outs;
  for (auto it = first; it != last; ++it) {
    ins.push_back(it->input_tokens);
    outs.push_back(it->output_tokens);
  }
  std::sort(ins.begin(), ins.end());
  std::sort(outs.begin(), outs.end());
  const auto factor = [&](const std::vector<int64_t>& sorted, int64_t max_tokens) {
    if (max_tokens <= 0) return 1.0;
    const double ref = percentile_of(sorted, config.scale_percentile);
    return ref > static_cast<double>(max_tokens) ? static_cast<double>(max_tokens) / ref : 1.0;
  };
  sc.prompt_scale =
      config.prompt_scale > 0 ? config.prompt_scale : factor(ins, config.max_prompt_tokens);
  sc.output_scale = factor(outs, config.max_output_tokens);
  if (source.format == trace_format::mooncake) {
    sc.block_tokens = std::max<int64_t>(
        1, std::llround(static_cast<double>(mooncake_block_tokens) * sc.prompt_scale));
  }

  const auto scale_len = [](int64_t len, double f, int64_t max_tokens, size_t& n_clipped) {
    auto v = std::max<int64_t>(1, std::llround(static_cast<double>(len) * f));
    if (max_tokens > 0 && v > max_tokens) {
      v = max_tokens;
      ++n_clipped;
    }
    return v;
  };
  out.requests.reserve(n);
  for (auto it = first; it != last; ++it) {
    scaled_trace_request r;
    r.send_time_s = (it->timestamp_s - t0) * sc.time_scale;
    r.prompt_tokens =
        scale_len(it->input_tokens, sc.prompt_scale, config.max_prompt_tokens, sc.n_prompt_clipped);
    r.output_tokens = scale_len(it->output_tokens, sc.output_scale, config.max_output_tokens,
                                sc.n_output_clipped);
    if (source.format == trace_format::mooncake && !it->hash_ids.empty()) {
      // Blocks of block_tokens each; the prompt is as many blocks as it needs (at most the
      // trace's).
      const auto b = sc.block_tokens;
      const auto n_blocks = std::min<int64_t>(static_cast<int64_t>(it->hash_ids.size()),
                                              (r.prompt_tokens + b - 1) / b);
      r.hash_ids.assign(it->hash_ids.begin(), it->hash_ids.begin() + n_blocks);
      r.last_block_tokens = std::clamp<int64_t>(r.prompt_tokens - (n_blocks - 1) * b, 1, b);
      r.prompt_tokens = (n_blocks - 1) * b + r.last_block_tokens;
    }
    out.requests.push_back(std::move(r));
  }
  return out;
}

}  // namespace weft::apps::loadgen
