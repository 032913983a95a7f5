// UCX bandwidth between two processes on this host against memcpy of the same bytes, measured in
// the same run. Usage: transport_bench [--out FILE] [--tls shm,tcp] [--max-mib 64] [--quick]
//
// The process forks before any engine exists; the child owns the target regions and answers
// commands on a pipe. Figures: put into UCX-allocated target memory, the same bytes as a batch
// of 16 blocks, put into ordinary (registered) target memory, tagged send. Each figure is
// sequential transfers (start, wait), as one KV-block move would be. Writes JSON (default
// bench/results/transport-<date>.json) and prints one line per figure with the ratio to memcpy.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "transport/checksum.hpp"
#include "transport/registry.hpp"

using namespace weft::transport;
using bench_clock = std::chrono::steady_clock;

namespace {

struct options {
  std::string out;
  std::vector<std::string> tls = {"shm", "tcp"};
  std::size_t max_bytes = 64 << 20;
  bool quick = false;
};

std::string hex(const bytes& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s.push_back(d[static_cast<unsigned>(x) >> 4]);
    s.push_back(d[static_cast<unsigned>(x) & 15]);
  }
  return s;
}

bytes unhex(const std::string& s) {
  bytes b(s.size() / 2);
  auto n = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::byte>(n(s[2 * i]) * 16 + n(s[2 * i + 1]));
  }
  return b;
}

std::string read_line(FILE* f) {
  std::string line;
  int c;
  while ((c = std::fgetc(f)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
  return line;
}

void write_line(FILE* f, const std::string& s) {
  std::fprintf(f, "%s\n", s.c_str());
  std::fflush(f);
}

// -- the target process -----------------------------------------------------------------------

int run_target(const std::string& tls, std::size_t max_bytes, FILE* in, FILE* out) {
  engine_config cfg;
  cfg.params = {{"ucx.tls", tls}};
  auto e = make_engine("ucx", cfg);
  if (!e) {
    write_line(out, "error " + e.error().to_string());
    return 1;
  }
  engine& eng = **e;
  auto allocated = eng.allocate_memory(max_bytes);
  std::vector<std::byte> plain(max_bytes);
  auto registered = eng.register_memory(plain.data(), max_bytes);
  if (!allocated || !registered) {
    write_line(out, "error allocation");
    return 1;
  }
  std::memset(allocated->data, 0, max_bytes);
  write_line(out, hex(*eng.local_address()));
  write_line(out, hex(*eng.describe(*allocated)));
  write_line(out, hex(*eng.describe(*registered)));
  for (;;) {
    std::istringstream cmd(read_line(in));
    std::string op;
    cmd >> op;
    if (op == "recv") {
      std::size_t size = 0, iterations = 0;
      cmd >> size >> iterations;
      bool ok = true;
      for (std::size_t i = 0; i < iterations && ok; ++i) {
        auto t = eng.recv(
            {.tag = 1, .local = *allocated, .size_bytes = size, .options = {.timeout_ms = 60'000}},
            {});
        ok = t.ok() && eng.wait(*t).result.ok();
      }
      write_line(out, ok ? "done" : "failed");
    } else if (op == "sum") {
      std::size_t size = 0;
      cmd >> size;
      write_line(out, std::to_string(checksum(allocated->data, size)));
    } else {
      return 0;  // "quit" or EOF
    }
  }
}

// -- the initiator ----------------------------------------------------------------------------

constexpr int kRounds = 3;

struct figure {
  std::string tls, op;
  std::size_t size_bytes = 0, iterations = 0;
  double gib_per_s = 0, memcpy_gib_per_s = 0;
};

double gib_per_s(std::size_t bytes_moved, bench_clock::duration d) {
  return static_cast<double>(bytes_moved) / (1 << 30) / std::chrono::duration<double>(d).count();
}

std::size_t iterations_for(std::size_t size, const std::string& tls, bool quick) {
  std::size_t budget = (tls == "tcp" ? 256ull : 1024ull) << 20;
  if (quick) budget /= 8;
  return std::clamp<std::size_t>(budget / size, 4, 2000);
}

double memcpy_rate(std::byte* dst, const std::byte* src, std::size_t size, std::size_t iters) {
  std::memcpy(dst, src, size);  // warm-up
  auto start = bench_clock::now();
  for (std::size_t i = 0; i < iters; ++i) {
    std::memcpy(dst, src, size);
    asm volatile("" ::"r"(dst) : "memory");  // keep every copy
  }
  return gib_per_s(size * iters, bench_clock::now() - start);
}

std::string human(std::size_t size) {
  return size >= (1 << 20) ? std::to_string(size >> 20) + " MiB"
                           : std::to_string(size >> 10) + " KiB";
}

bool run_initiator(const std::string& tls, const options& opt, FILE* in, FILE* out,
                   std::vector<figure>& figures) {
  engine_config cfg;
  cfg.params = {{"ucx.tls", tls}};
  auto e = make_engine("ucx", cfg);
  if (!e) {
    spdlog::error("{}", e.error().to_string());
    return false;
  }
  engine& eng = **e;
  std::string address = read_line(in);
  if (address.rfind("error", 0) == 0) {
    spdlog::error("target: {}", address);
    return false;
  }
  auto peer = eng.connect(unhex(address));
  auto allocated = eng.import_remote(*peer, unhex(read_line(in)));
  auto registered = eng.import_remote(*peer, unhex(read_line(in)));
  if (!peer || !allocated || !registered) {
    spdlog::error("connect/import failed");
    return false;
  }
  auto src = eng.allocate_memory(opt.max_bytes);
  std::vector<std::byte> copy_dst(opt.max_bytes);
  fill_pattern({src->data, opt.max_bytes}, 2026);
  std::memset(copy_dst.data(), 0, copy_dst.size());

  for (std::size_t size = 64 << 10; size <= opt.max_bytes; size *= 4) {
    std::size_t iters = iterations_for(size, tls, opt.quick);
    for (const char* op : {"put", "put_batch16", "put_registered_target", "tag_send"}) {
      std::string name = op;
      auto one = [&]() -> bool {
        result<transfer> t = make_status(status_code::internal, "");
        if (name == "tag_send") {
          t = eng.send({.peer = *peer, .tag = 1, .local = *src, .size_bytes = size}, {});
        } else if (name == "put_batch16") {
          // The same bytes as 16 blocks at reversed target offsets: one transfer, one flush.
          rma_batch_request batch{.peer = *peer};
          const std::size_t block = size / 16;
          for (std::size_t i = 0; i < 16; ++i) {
            batch.segments.push_back({.local = *src,
                                      .local_offset_bytes = i * block,
                                      .remote = *allocated,
                                      .remote_offset_bytes = (15 - i) * block,
                                      .size_bytes = block});
          }
          t = eng.put_batch(batch, {});
        } else {
          t = eng.put({.peer = *peer,
                       .local = *src,
                       .remote = name == "put" ? *allocated : *registered,
                       .size_bytes = size},
                      {});
        }
        return t.ok() && eng.wait(*t).result.ok();
      };
      // Best of `rounds`, memcpy and transfer alternating, so both see the same machine load
      // (the VM is shared with other builds).
      bool ok = true;
      double best = 0, copy = 0;
      for (int round = 0; round < kRounds && ok; ++round) {
        copy = std::max(copy, memcpy_rate(copy_dst.data(), src->data, size, iters));
        bench_clock::duration elapsed{};
        if (name == "tag_send") {
          write_line(out, "recv " + std::to_string(size) + " " + std::to_string(iters + 1));
          ok = one();  // warm-up
          auto start = bench_clock::now();
          for (std::size_t i = 0; i < iters && ok; ++i) ok = one();
          ok = read_line(in) == "done" && ok;
          elapsed = bench_clock::now() - start;
        } else {
          ok = one();
          auto start = bench_clock::now();
          for (std::size_t i = 0; i < iters && ok; ++i) ok = one();
          elapsed = bench_clock::now() - start;
        }
        best = std::max(best, gib_per_s(size * iters, elapsed));
      }
      if (!ok) {
        spdlog::error("{} {} of {} failed", tls, name, size);
        return false;
      }
      if (name == "put") {  // the bytes really arrived
        write_line(out, "sum " + std::to_string(size));
        if (read_line(in) != std::to_string(checksum(src->data, size))) {
          spdlog::error("{} put of {}: checksum mismatch at the target", tls, size);
          return false;
        }
      }
      figure f{tls, name, size, iters, best, copy};
      std::printf("transport %-22s %-3s %7s: %6.2f GiB/s = %.2fx memcpy (%.2f GiB/s), %zu iters\n",
                  name.c_str(), tls.c_str(), human(size).c_str(), f.gib_per_s,
                  f.gib_per_s / f.memcpy_gib_per_s, f.memcpy_gib_per_s, iters);
      std::fflush(stdout);
      figures.push_back(f);
    }
  }
  write_line(out, "quit");
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      opt.out = argv[++i];
    } else if (a == "--tls" && i + 1 < argc) {
      opt.tls.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) opt.tls.push_back(t);
    } else if (a == "--max-mib" && i + 1 < argc) {
      opt.max_bytes = std::stoull(argv[++i]) << 20;
    } else if (a == "--quick") {
      opt.quick = true;
    } else {
      std::fprintf(stderr,
                   "usage: transport_bench [--out FILE] [--tls shm,tcp] [--max-mib N] [--quick]\n");
      return 2;
    }
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("transport_bench"));
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  if (opt.out.empty())
    opt.out = std::string(WEFT_ROOT_DIR) + "/bench/results/transport-" + date + ".json";

  std::vector<figure> figures;
  for (const std::string& tls : opt.tls) {
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return 1;
    pid_t pid = ::fork();  // before any engine (and thread) exists in this process
    if (pid == 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      int rc =
          run_target(tls, opt.max_bytes, ::fdopen(to_child[0], "r"), ::fdopen(from_child[1], "w"));
      ::_exit(rc);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    FILE* out = ::fdopen(to_child[1], "w");
    FILE* in = ::fdopen(from_child[0], "r");
    bool ok = run_initiator(tls, opt, in, out, figures);
    std::fclose(out);
    std::fclose(in);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!ok) return 1;
  }

  nlohmann::json j;
  j["benchmark"] = "transport";
  j["date_utc"] = date;
  j["cpus"] = ::sysconf(_SC_NPROCESSORS_ONLN);
  double load[1] = {0};
  if (::getloadavg(load, 1) == 1) j["loadavg_1min_at_end"] = load[0];  // the VM is shared
  j["method"] =
      "two processes on one host, sequential transfers (start + wait), targets allocated with "
      "ucp_mem_map(ALLOCATE) unless op=put_registered_target; put_batch16 = the same bytes as 16 "
      "blocks in one batched transfer; memcpy of the same bytes in the "
      "same run; best of 3 rounds, memcpy and transfer alternating";
  for (const figure& f : figures) {
    j["figures"].push_back({{"transport", f.tls},
                            {"op", f.op},
                            {"size_bytes", f.size_bytes},
                            {"iterations", f.iterations},
                            {"gib_per_s", f.gib_per_s},
                            {"memcpy_gib_per_s", f.memcpy_gib_per_s},
                            {"ratio_to_memcpy", f.gib_per_s / f.memcpy_gib_per_s}});
  }
  std::ofstream file(opt.out);
  file << j.dump(2) << "\n";
  if (!file) {
    std::fprintf(stderr, "cannot write %s\n", opt.out.c_str());
    return 1;
  }
  std::printf("wrote %s\n", opt.out.c_str());
  return 0;
}
