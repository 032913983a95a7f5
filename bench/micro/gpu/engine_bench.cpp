// weft engine benchmark: prefill and decode tokens/s at batch 1, 8, 32 for weft's CPU backend and
// for llama.cpp (llama-cpp-python) on the same GGUF, same threads, same workload, in the same run;
// plus the machine's memory-bandwidth ceiling for decode and a compute ceiling for prefill.
// Writes bench/results/engine-<date>.json and prints one summary line per figure.
//
//   gpu_engine_bench [--model PATH] [--threads N] [--prompt-len P] [--decode-steps D]
//                    [--batches 1,8,32] [--repeat R] [--out DIR] [--no-llama]
//
// With --repeat R the two engines run R times alternately (llama.cpp, weft, llama.cpp, ...) and
// every figure is the median of its R runs (the JSON keeps each run): both engines' tok/s move by
// up to 10-20 % between runs on a shared VM, and one pair of runs can land on either side of 1.0.

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cblas.h>

#include "gpu/cpu/blas_kernels.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/cpu/quant_dot.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"

namespace {

using namespace weft::gpu;
using clk = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// Best-of-5 memcpy of a 256 MiB buffer, counted as STREAM "copy" does: bytes read + bytes written
// per second (a decode step only reads its weights, so this is the traffic the memory sustains).
double copy_bandwidth_bytes_s() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t = clk::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, seconds_since(t));
    a[static_cast<size_t>(i)] = b[static_cast<size_t>(i) * 7];
  }
  return 2.0 * static_cast<double>(n) / best;
}

// What a decode step does with its weights: stream them in once, on every compute thread. Each
// thread sums its own contiguous half (third, ...) of a 512 MiB buffer of 64-bit words; best of 5;
// bytes read per second. Next to the copy figure (one thread, read + write, the ceiling).
double read_bandwidth_bytes_s(int threads) {
  const size_t words = (size_t{512} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> a(words);
  for (size_t i = 0; i < words; ++i) a[i] = i;
  std::vector<uint64_t> sums(static_cast<size_t>(threads) * 8, 0);  // a cache line per thread
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<std::thread> pool;
    const auto t = clk::now();
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&, k] {
        const size_t b = words * static_cast<size_t>(k) / static_cast<size_t>(threads);
        const size_t e = words * static_cast<size_t>(k + 1) / static_cast<size_t>(threads);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        size_t i = b;
        for (; i + 4 <= e; i += 4) {
          s0 += a[i];
          s1 += a[i + 1];
          s2 += a[i + 2];
          s3 += a[i + 3];
        }
        for (; i < e; ++i) s0 += a[i];
        sums[static_cast<size_t>(k) * 8] += s0 + s1 + s2 + s3;
      });
    }
    for (auto& th : pool) th.join();
    best = std::min(best, seconds_since(t));
  }
  uint64_t total = 0;
  for (uint64_t x : sums) total += x;
  if (total == 42) std::fprintf(stderr, " ");  // keeps the sums alive
  return static_cast<double>(words * sizeof(uint64_t)) / best;
}

// Whether decode's 4-row kernel reads the weights packed in groups of 4 rows here.
bool decode_reads_packed_groups() {
#ifdef WEFT_QUANT_PACKED4
  return cpu::pack_weights_enabled();
#else
  return false;
#endif
}

// In-cache throughput of the 4-row Q4_1 x Q8_1 kernel decode uses (from a packed group where the
// model packs its weights) on all threads: multiply-accumulates/s.
double q4_1_macs_per_s(int threads) {
  std::vector<block_q4_1> w(4 * 18);
  std::vector<block_q8_1> a(18);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i].d = fp32_to_fp16(0.01f);
    w[i].m = fp32_to_fp16(-0.05f);
    for (int j = 0; j < 16; ++j) w[i].qs[j] = static_cast<uint8_t>(i * 16 + j);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    a[i].d = fp32_to_fp16(0.02f);
    a[i].s = fp32_to_fp16(0.1f);
    for (int j = 0; j < 32; ++j) a[i].qs[j] = static_cast<int8_t>(j - 16);
  }
  std::vector<block_q4_1> packed(w.size());
#ifdef WEFT_QUANT_PACKED4
  cpu::pack4_rows(ggml_type::q4_1, w.data(), 18 * sizeof(block_q4_1), 18, packed.data());
#endif
  const bool use_packed = decode_reads_packed_groups();
  const int64_t iters = 400000;
  std::vector<std::thread> pool;
  std::vector<float> sink(static_cast<size_t>(threads));
  const auto t = clk::now();
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      float s = 0;
      float o[4];
      for (int64_t i = 0; i < iters / 4; ++i) {
#ifdef WEFT_QUANT_PACKED4
        if (use_packed) {
          cpu::dot4_packed_q4_1_q8_1(packed.data(), a.data(), 18, o);
        } else {
          cpu::dot4_q4_1_q8_1(w.data(), 18 * sizeof(block_q4_1), a.data(), 18, o);
        }
#else
        (void)use_packed;
        cpu::dot4_q4_1_q8_1(w.data(), 18 * sizeof(block_q4_1), a.data(), 18, o);
#endif
        s += o[0] + o[3];
      }
      sink[static_cast<size_t>(k)] = s;
    });
  }
  for (auto& th : pool) th.join();
  return static_cast<double>(iters) * 18 * 32 * threads / seconds_since(t);
}

// The machine's GEMM peak, FLOP/s: OpenBLAS SGEMM (1024 x 1024 x 1024, single-threaded BLAS) run
// on `threads` threads at once, each on its own matrices, as weft's pool drives BLAS; best of 3.
double sgemm_flops_per_s(int threads) {
  constexpr int n = 1024;
  openblas_set_num_threads(1);
  std::vector<std::vector<float>> a(static_cast<size_t>(threads)), b(a.size()), c(a.size());
  for (size_t k = 0; k < a.size(); ++k) {
    a[k].assign(size_t{n} * n, 0.5f);
    b[k].assign(size_t{n} * n, 0.25f);
    c[k].assign(size_t{n} * n, 0.0f);
  }
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> pool;
    const auto t = clk::now();
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&, k] {
        const auto i = static_cast<size_t>(k);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a[i].data(), n,
                    b[i].data(), n, 0.0f, c[i].data(), n);
      });
    }
    for (auto& th : pool) th.join();
    best = std::min(best, seconds_since(t));
  }
  return 2.0 * n * n * n * threads / best;
}

struct weft_figures {
  double prefill_tok_s = 0;
  double decode_tok_s = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Every forward pass must succeed: a failed one would make the figure measure nothing.
void check(const status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "engine bench: %s failed: %s\n", what, st.to_string().c_str());
    std::exit(1);
  }
}

weft_figures run_weft(model& m, device& dev, int batch, int plen, int steps) {
  kv_cache_config kc;
  kc.layout = m.kv_layout_for(16);
  kc.n_blocks = static_cast<int64_t>(batch) * ((plen + steps) / 16 + 2);
  auto kv = kv_cache::create(dev, kc);
  if (!kv.ok()) {
    std::fprintf(stderr, "engine bench: kv cache: %s\n", kv.error().to_string().c_str());
    std::exit(1);
  }
  std::vector<seq_id> seqs;
  for (int s = 0; s < batch; ++s) seqs.push_back((*kv)->create_sequence());
  std::vector<int32_t> prompt(static_cast<size_t>(plen));
  for (int i = 0; i < plen; ++i) prompt[static_cast<size_t>(i)] = 100 + (7 * i) % 1000;
  forward_batch b;
  forward_output out;
  weft_figures f;
  // Prefill: the same ubatching as llama.cpp (up to 512 tokens per forward pass).
  auto t = clk::now();
  int in_batch = 0;
  for (int s = 0; s < batch; ++s) {
    for (int off = 0; off < plen;) {
      const int n = std::min(plen - off, 512 - in_batch);
      b.add(seqs[static_cast<size_t>(s)],
            std::span<const int32_t>(prompt.data() + off, static_cast<size_t>(n)), off + n == plen);
      in_batch += n;
      off += n;
      if (in_batch == 512) {
        check(m.forward(b, **kv, out), "prefill forward");
        b.clear();
        in_batch = 0;
      }
    }
  }
  if (in_batch > 0) check(m.forward(b, **kv, out), "prefill forward");
  f.prefill_tok_s = static_cast<double>(batch) * plen / seconds_since(t);
  t = clk::now();
  for (int k = 0; k < steps; ++k) {
    b.clear();
    const int32_t tok = 200 + k;
    for (int s = 0; s < batch; ++s)
      b.add(seqs[static_cast<size_t>(s)], std::span<const int32_t>(&tok, 1), true);
    check(m.forward(b, **kv, out), "decode forward");
  }
  f.decode_tok_s = static_cast<double>(batch) * steps / seconds_since(t);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  cpu::select_blas_kernels(argv);
  std::string model_path;
  int threads = 2, plen = 64, steps = 32, repeat = 1;
  std::string batches_arg = "1,8,32", out_dir = std::string{WEFT_SOURCE_DIR} + "/bench/results";
  bool with_llama = true;
  std::string weights_memory = "huge-pages";
  std::string device_name = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string{argv[++i]} : std::string{}; };
    if (a == "--model")
      model_path = next();
    else if (a == "--threads")
      threads = std::atoi(next().c_str());
    else if (a == "--prompt-len")
      plen = std::atoi(next().c_str());
    else if (a == "--decode-steps")
      steps = std::atoi(next().c_str());
    else if (a == "--batches")
      batches_arg = next();
    else if (a == "--repeat")
      repeat = std::max(1, std::atoi(next().c_str()));
    else if (a == "--out")
      out_dir = next();
    else if (a == "--weights-memory")
      weights_memory = next();
    else if (a == "--no-llama")
      with_llama = false;
    else if (a == "--device")
      device_name = next();
    else if (a == "--help" || a == "-h") {
      std::printf(
          "gpu_engine_bench: weft's CPU engine vs llama.cpp (llama-cpp-python) on one GGUF, same\n"
          "threads and workload, one invocation. Prefills B prompts, then decodes B sequences;\n"
          "prints tok/s and ratios, writes <out>/engine-<date>.json.\n\n"
          "  --model PATH        GGUF (default $WEFT_MODEL, else the default SmolLM2 model)\n"
          "  --threads N         compute threads for both engines (default 2)\n"
          "  --prompt-len N      prompt tokens per sequence (default 64)\n"
          "  --decode-steps N    decode steps per batch size (default 32)\n"
          "  --batches LIST      comma-separated batch sizes (default 1,8,32)\n"
          "  --repeat R          run both engines R times alternately; figures are medians\n"
          "                      (default 1)\n"
          "  --out DIR           where the JSON goes (default bench/results)\n"
          "  --weights-memory M  huge-pages (default, as weft serve) or mmap\n"
          "  --no-llama          weft only (no baseline; ratios are not printed)\n"
          "  --device NAME       weft's backend: cpu (default) or cuda (where a GPU exists;\n"
          "                      the llama.cpp baseline stays on the CPU)\n");
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (model_path.empty()) {
    const char* env = std::getenv("WEFT_MODEL");
    const char* home = std::getenv("HOME");
    model_path = env != nullptr ? env
                                : std::string{home != nullptr ? home : "."} +
                                      "/.cache/weft/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::vector<int> batches;
  std::stringstream ss(batches_arg);
  for (std::string x; std::getline(ss, x, ',');) batches.push_back(std::atoi(x.c_str()));

  auto dev = device_registry::instance().create(device_name, device_config{threads, 0});
  if (!dev) {
    std::fprintf(stderr, "--device %s: %s\n", device_name.c_str(), dev.error().to_string().c_str());
    return 1;
  }
  const auto memory = parse_gguf_memory(weights_memory);
  if (!memory) {
    std::fprintf(stderr, "--weights-memory: huge-pages or mmap, not %s\n", weights_memory.c_str());
    return 2;
  }
  auto file = gguf_file::open(model_path, gguf_open_config{.memory = *memory, .load_now = true});
  if (!file) {
    std::fprintf(stderr, "%s\n", file.error().to_string().c_str());
    return 1;
  }
  model_load_config mc;
  mc.max_batch_tokens = 512;
  auto m = model::load(std::move(file.value()), *dev.value(), mc);
  if (!m) {
    std::fprintf(stderr, "%s\n", m.error().to_string().c_str());
    return 1;
  }
  nlohmann::json j;
  j["machine"] = {
      {"nproc", std::thread::hardware_concurrency()},
      {"cpu",
       shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //' | tr -d '\\n'")},
      {"load_average", shell("cut -d' ' -f1-3 /proc/loadavg | tr -d '\\n'")}};
  j["commit"] = shell("git -C " + std::string{WEFT_SOURCE_DIR} +
                      " rev-parse --short HEAD 2>/dev/null | tr -d '\\n'");
  j["model"] = model_path;
  j["workload"] = {{"device", device_name},
                   {"device_description", dev.value()->capabilities().name},
                   {"threads", threads},
                   {"weights_memory", weights_memory},
                   {"prompt_len", plen},
                   {"decode_steps", steps},
                   {"batches", batches},
                   {"note",
                    "prefill: B prompts in forward passes of <= 512 tokens; decode: B sequences, "
                    "one token each per pass"}};
  const double bw = copy_bandwidth_bytes_s();
  const double read_bw = read_bandwidth_bytes_s(threads);
  const double wbytes = static_cast<double>((*m)->weight_bytes_per_token());
  const double macs_s = q4_1_macs_per_s(threads);
  const double macs_tok = static_cast<double>((*m)->matmul_macs_per_token());
  const double gemm_peak = sgemm_flops_per_s(threads);
  // The compute ceiling of the issue: matmul FLOPs per token (2 x MACs; attention excluded, a few
  // percent at these contexts) against the machine's measured GEMM peak.
  const double compute_ceiling = gemm_peak / (2.0 * macs_tok);
  if (device_name != "cpu")
    j["ceilings_note"] = "the host CPU's ceilings; the weft figures ran on --device " + device_name;
  j["ceilings"] = {{"copy_bandwidth_gb_s_read_plus_write", bw / 1e9},
                   {"weight_bytes_per_decode_step", wbytes},
                   {"decode_batch1_tok_s_bandwidth_limit", bw / wbytes},
                   {"read_bandwidth_gb_s_all_threads", read_bw / 1e9},
                   {"decode_batch1_tok_s_read_bandwidth_limit", read_bw / wbytes},
                   {"q4_1_dot_macs_per_s", macs_s},
                   {"q4_1_dot_packed_groups", decode_reads_packed_groups()},
                   {"matmul_macs_per_token", macs_tok},
                   {"q4_1_row_kernel_tok_s_limit", macs_s / macs_tok},
                   {"sgemm_peak_flops_per_s", gemm_peak},
                   {"tok_s_compute_ceiling_sgemm", compute_ceiling}};
  // Each repetition: llama.cpp (all batch sizes, one subprocess), then weft (all batch sizes).
  struct samples {
    std::vector<double> weft_prefill, weft_decode, llama_prefill, llama_decode;
  };
  std::vector<samples> per_batch(batches.size());
  std::string llama_version;
  for (int rep = 0; rep < repeat; ++rep) {
    if (with_llama) {
      const std::string cmd = "python3 " + std::string{WEFT_SOURCE_DIR} +
                              "/bench/micro/gpu/llama_bench.py '" + model_path + "' " +
                              std::to_string(threads) + " " + std::to_string(plen) + " " +
                              std::to_string(steps) + " " + batches_arg + " 2>/dev/null";
      nlohmann::json llama;
      try {
        llama = nlohmann::json::parse(shell(cmd));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "llama.cpp baseline unavailable (%s)\n", e.what());
        with_llama = false;
      }
      if (llama.contains("version")) llama_version = llama["version"];
      if (llama.contains("results")) {
        for (const auto& x : llama["results"]) {
          for (size_t i = 0; i < batches.size(); ++i) {
            if (x["batch"] != batches[i]) continue;
            per_batch[i].llama_prefill.push_back(x["prefill_tok_s"]);
            per_batch[i].llama_decode.push_back(x["decode_tok_s"]);
          }
        }
      }
    }
    for (size_t i = 0; i < batches.size(); ++i) {
      const weft_figures w = run_weft(**m, *dev.value(), batches[i], plen, steps);
      per_batch[i].weft_prefill.push_back(w.prefill_tok_s);
      per_batch[i].weft_decode.push_back(w.decode_tok_s);
    }
    if (repeat > 1) std::fprintf(stderr, "repetition %d/%d done\n", rep + 1, repeat);
  }
  j["workload"]["repeat"] = repeat;
  std::vector<std::string> lines;
  char line[512];
  std::snprintf(line, sizeof line,
                "copy bandwidth %.1f GB/s (read+write); weights per decode step %.1f MB -> batch-1 "
                "decode ceiling %.0f tok/s",
                bw / 1e9, wbytes / 1e6, bw / wbytes);
  lines.emplace_back(line);
  std::snprintf(line, sizeof line,
                "read bandwidth (%d threads streaming, as decode reads its weights) %.1f GB/s -> "
                "batch-1 decode ceiling %.0f tok/s",
                threads, read_bw / 1e9, read_bw / wbytes);
  lines.emplace_back(line);
  std::snprintf(line, sizeof line,
                "the ggml kernel's q4_1 4-row (decode) dot in cache%s %.1f GMAC/s on %d threads "
                "-> %.0f tok/s on it (prefill's tiles are faster)",
                decode_reads_packed_groups() ? " (packed groups)" : "", macs_s / 1e9, threads,
                macs_s / macs_tok);
  lines.emplace_back(line);
  std::snprintf(line, sizeof line,
                "GEMM peak (OpenBLAS sgemm, %d threads) %.1f GFLOP/s; %.2f GFLOP per token -> "
                "compute ceiling %.0f tok/s",
                threads, gemm_peak / 1e9, 2.0 * macs_tok / 1e9, compute_ceiling);
  lines.emplace_back(line);
  const char* stat = repeat > 1 ? " (medians)" : "";
  double batch1_decode = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const int bsz = batches[i];
    const samples& s = per_batch[i];
    const weft_figures w{median(s.weft_prefill), median(s.weft_decode)};
    const double lp = median(s.llama_prefill), ld = median(s.llama_decode);
    if (bsz == 1) batch1_decode = w.decode_tok_s;
    nlohmann::json r = {{"batch", bsz},
                        {"weft_prefill_tok_s", w.prefill_tok_s},
                        {"weft_decode_tok_s", w.decode_tok_s},
                        {"weft_prefill_runs", s.weft_prefill},
                        {"weft_decode_runs", s.weft_decode}};
    if (!s.llama_prefill.empty()) {
      r["llama_prefill_tok_s"] = lp;
      r["llama_decode_tok_s"] = ld;
      r["llama_prefill_runs"] = s.llama_prefill;
      r["llama_decode_runs"] = s.llama_decode;
    }
    if (lp > 0) {
      std::snprintf(line, sizeof line,
                    "batch %2d prefill%s: weft %.0f tok/s, llama.cpp %.0f tok/s, ratio %.2f", bsz,
                    stat, w.prefill_tok_s, lp, w.prefill_tok_s / lp);
    } else {
      std::snprintf(line, sizeof line, "batch %2d prefill%s: weft %.0f tok/s (no baseline)", bsz,
                    stat, w.prefill_tok_s);
    }
    lines.emplace_back(line);
    // The ceilings are the host CPU's: on another device they say nothing about the figures.
    const bool on_cpu = device_name == "cpu";
    std::string ceiling =
        !on_cpu
            ? std::string{}
            : (bsz == 1
                   ? ", " + std::to_string(static_cast<int>(100 * w.decode_tok_s / (bw / wbytes))) +
                         "% of the bandwidth ceiling (" +
                         std::to_string(
                             static_cast<int>(100 * w.decode_tok_s / (read_bw / wbytes))) +
                         "% of the read-bandwidth one)"
                   : "") +
                  ", " + std::to_string(static_cast<int>(100 * w.decode_tok_s / compute_ceiling)) +
                  "% of the compute ceiling";
    if (bsz != 1 && batch1_decode > 0) {
      char x[64];
      std::snprintf(x, sizeof x, ", %.2fx weft's batch 1", w.decode_tok_s / batch1_decode);
      ceiling += x;
      r["weft_decode_over_batch1"] = w.decode_tok_s / batch1_decode;
    }
    if (on_cpu) {
      r["weft_decode_share_of_compute_ceiling"] = w.decode_tok_s / compute_ceiling;
      r["weft_prefill_share_of_compute_ceiling"] = w.prefill_tok_s / compute_ceiling;
      if (bsz == 1) {
        r["weft_decode_share_of_bandwidth_ceiling"] = w.decode_tok_s / (bw / wbytes);
        r["weft_decode_share_of_read_bandwidth_ceiling"] = w.decode_tok_s / (read_bw / wbytes);
      }
    }
    if (ld > 0) {
      std::snprintf(line, sizeof line,
                    "batch %2d decode%s:  weft %.1f tok/s, llama.cpp %.1f tok/s, ratio %.2f%s", bsz,
                    stat, w.decode_tok_s, ld, w.decode_tok_s / ld, ceiling.c_str());
    } else {
      std::snprintf(line, sizeof line, "batch %2d decode%s:  weft %.1f tok/s (no baseline)%s", bsz,
                    stat, w.decode_tok_s, ceiling.c_str());
    }
    lines.emplace_back(line);
    j["results"].push_back(r);
  }
  if (!llama_version.empty()) j["llama_cpp_python_version"] = llama_version;
  j["summary"] = lines;
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  fs::create_directories(out_dir);
  const fs::path path = fs::path{out_dir} / ("engine-" + std::string{date} + ".json");
  std::ofstream(path) << j.dump(2) << "\n";
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
