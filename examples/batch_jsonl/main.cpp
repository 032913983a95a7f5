// Example 2 (docs/embedding.md): batch inference over a JSONL file with a pool of engine workers.
//
// Each input line is {"prompt": "...", "max_tokens": N (optional), ...any other fields}. Results
// are written to the output file in input order, one JSON object per line:
//   {"line": i, "prompt": ..., "text": ..., "finish": "stop"|"length", "completion_tokens": n,
//    "worker": ...}
// Progress goes to stderr. Every finished line is appended to <output>.journal as it completes, so
// a run that is killed resumes where it stopped: finished lines are not generated again. The
// output file appears (atomically) once every line is done; the journal is then removed.
//
//   batch_jsonl --input IN.jsonl --output OUT.jsonl [--model PATH] [--workers N]
//               [--concurrency C] [--max-tokens N] [--threads T]

#include <weft/actors/auth.hpp>
#include <weft/actors/node.hpp>
#include <weft/actors/roles.hpp>
#include <weft/actors/serve/engine_pool.hpp>
#include <weft/actors/serve/engine_worker.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string input, output, model;
  int workers = 2;
  int concurrency = 8;
  int max_tokens = 64;
  int threads = 0;
};

int usage_error(const std::string& why) {
  std::fprintf(stderr, "batch_jsonl: %s (see --help)\n", why.c_str());
  return 2;
}

// Reads the input; a line that is not a JSON object with a "prompt" string is an error naming it.
weft::result<std::vector<json>> read_input(const std::string& path) {
  std::ifstream in(path);
  if (!in) return weft::make_error(weft::errc::not_found, "cannot open " + path);
  std::vector<json> rows;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      return weft::make_error(
          weft::errc::invalid_argument,
          path + ":" + std::to_string(n) + ": expected a JSON object with a \"prompt\" string");
    }
    rows.push_back(std::move(j));
  }
  return rows;
}

// The journal of a previous run: finished lines by index. A torn last line (the run was killed
// while writing it) is dropped, and the file cut back to the last whole line.
std::map<size_t, json> read_journal(const std::string& path, size_t n_rows) {
  std::map<size_t, json> done;
  std::ifstream in(path);
  if (!in) return done;
  std::string line;
  std::streamoff good = 0;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: torn
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("line")) break;
    const size_t i = j["line"].get<size_t>();
    if (i < n_rows) done[i] = std::move(j);
    good = in.tellg();
  }
  in.close();
  std::filesystem::resize_file(path, static_cast<uintmax_t>(good));
  return done;
}

class progress_bar {
 public:
  progress_bar(size_t total, size_t resumed)
      : total_(total), resumed_(resumed), start_(clock_type::now()), tty_(isatty(2) != 0) {}
  void update(size_t done) {
    const double s = std::chrono::duration<double>(clock_type::now() - start_).count();
    const size_t fresh = done - resumed_;
    const double rate = s > 0 ? static_cast<double>(fresh) / s : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
    const int width = 30;
    const int filled = total_ ? static_cast<int>(width * done / total_) : width;
    if (!tty_ && done != total_ && done * 10 / total_ == last_decile_) return;
    last_decile_ = done * 10 / std::max<size_t>(total_, 1);
    std::fprintf(stderr, "%s[%s%s] %zu/%zu lines (%zu resumed)  %.2f lines/s  ETA %.0f s%s",
                 tty_ ? "\r" : "", std::string(filled, '=').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total_, resumed_, rate, eta,
                 tty_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  size_t total_, resumed_;
  clock_type::time_point start_;
  bool tty_;
  size_t last_decile_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "batch_jsonl: batch inference over a JSONL file with a pool of weft engine workers; "
          "resumable.\n"
          "  --input PATH       JSONL, one {\"prompt\": ...} per line (required)\n"
          "  --output PATH      results in input order (required); PATH.journal while running\n"
          "  --model PATH       GGUF model (default: weft's default model)\n"
          "  --workers N        engine workers (default 2)\n"
          "  --concurrency C    lines in flight at once (default 8)\n"
          "  --max-tokens N     per line unless the line sets \"max_tokens\" (default 64)\n"
          "  --threads T        compute threads per worker (default: cores / workers)\n");
      return 0;
    }
    if (i + 1 >= argc) return usage_error("option " + a + " needs a value");
    std::string v = argv[++i];
    try {
      if (a == "--input")
        o.input = v;
      else if (a == "--output")
        o.output = v;
      else if (a == "--model")
        o.model = v;
      else if (a == "--workers")
        o.workers = std::stoi(v);
      else if (a == "--concurrency")
        o.concurrency = std::stoi(v);
      else if (a == "--max-tokens")
        o.max_tokens = std::stoi(v);
      else if (a == "--threads")
        o.threads = std::stoi(v);
      else
        return usage_error("unknown option " + a);
    } catch (const std::exception&) {
      return usage_error(a + " needs a number, got '" + v + "'");
    }
  }
  if (o.input.empty() || o.output.empty()) return usage_error("--input and --output are required");
  if (o.workers < 1 || o.concurrency < 1 || o.max_tokens < 1) {
    return usage_error("--workers, --concurrency and --max-tokens must be at least 1");
  }
  auto rows = read_input(o.input);
  if (!rows) return usage_error(rows.error().message);
  const std::string journal_path = o.output + ".journal";
  auto done = read_journal(journal_path, rows->size());
  const size_t resumed = done.size();
  if (resumed > 0) {
    std::fprintf(stderr, "batch_jsonl: resuming: %zu of %zu lines already done (%s)\n", resumed,
                 rows->size(), journal_path.c_str());
  }

  // A local cluster of one process: this node accepts the engine worker role.
  auto secret = weft::actors::load_secret(weft::actors::generate_secret_hex(), "");
  if (!secret) return usage_error(secret.error().message);
  auto roles = std::make_shared<weft::actors::role_registry>();
  weft::actors::add_builtin_roles(*roles);
  weft::serve::add_serve_roles(*roles);
  weft::actors::node_options no;
  no.node_id = "batch-jsonl";
  no.is_head = true;
  no.head_port = 0;
  no.secret = *secret;
  no.transport = "none";
  auto node = weft::actors::node::start(no, roles);
  if (!node) return std::fprintf(stderr, "%s\n", node.error().to_string().c_str()), 1;
  weft::serve::engine_pool_options po;
  po.model = o.model;
  po.workers = o.workers;
  po.threads = o.threads;
  auto pool = weft::serve::engine_pool::start(**node, po);
  if (!pool) return std::fprintf(stderr, "%s\n", pool.error().to_string().c_str()), 1;

  std::FILE* journal = std::fopen(journal_path.c_str(), "a");
  if (journal == nullptr) return usage_error("cannot write " + journal_path);
  std::vector<size_t> pending;
  for (size_t i = 0; i < rows->size(); ++i) {
    if (done.count(i) == 0) pending.push_back(i);
  }
  std::mutex mu;  // guards done, journal, bar, failures
  std::atomic<size_t> next{0};
  int failures = 0;
  progress_bar bar(rows->size(), resumed);
  bar.update(done.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < o.concurrency; ++t) {
    threads.emplace_back([&] {
      for (size_t k = next++; k < pending.size(); k = next++) {
        const size_t i = pending[k];
        const json& row = (*rows)[i];
        weft::gpu::sampling_params params;  // greedy
        params.max_tokens = row.value("max_tokens", o.max_tokens);
        auto out = (*pool)->generate_text(row["prompt"].get<std::string>(), params, 300'000);
        std::lock_guard<std::mutex> lock(mu);
        if (!out) {
          std::fprintf(stderr, "\nbatch_jsonl: line %zu failed: %s\n", i + 1,
                       out.error().to_string().c_str());
          ++failures;
          continue;
        }
        json r{{"line", i},
               {"prompt", row["prompt"]},
               {"text", out->second},
               {"finish", out->first.finish},
               {"completion_tokens", out->first.tokens.size()},
               {"worker", out->first.worker}};
        const std::string text = r.dump() + "\n";
        std::fwrite(text.data(), 1, text.size(), journal);
        std::fflush(journal);  // survives a kill of this process from here on
        done[i] = std::move(r);
        bar.update(done.size());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::fclose(journal);
  std::fprintf(stderr, "\n");
  (*pool)->stop();
  if (failures > 0) {
    std::fprintf(stderr,
                 "batch_jsonl: %d line(s) failed; %zu done are kept in %s: run again to retry\n",
                 failures, done.size(), journal_path.c_str());
    return 1;
  }
  // Every line is done: the output, in input order, replaces any earlier one atomically.
  const std::string tmp = o.output + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& [i, r] : done) out << r.dump() << "\n";
    if (!out.flush()) return usage_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, o.output);
  std::filesystem::remove(journal_path);
  std::fprintf(stderr, "batch_jsonl: %zu lines (%zu resumed, %zu generated) -> %s\n", rows->size(),
               resumed, pending.size(), o.output.c_str());
  return 0;
}
