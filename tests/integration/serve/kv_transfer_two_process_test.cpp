// KV transfer between two OS processes over UCX (tcp and shm): kv_transfer_peer prefills and offers
// a sequence, this process pulls it, and the next decode step must give bit-identical logits on
// both sides; the lease is released over the control pipe and both caches end with zero blocks.
// A killed exporter must fail the pull within the lease deadline and leak nothing.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "tests/integration/serve/kv_transfer_common.hpp"
#include "tests/integration/transport/line_protocol.hpp"
#include "transport/registry.hpp"

namespace weft::serve::testing {
namespace {

using transport::testing::from_hex;
using transport::testing::read_line;
using transport::testing::write_line;

// A running kv_transfer_peer with pipes to its stdin and stdout.
class peer_process {
 public:
  peer_process(const std::string& tls, uint64_t lease_ms) {
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::close(to_child[1]);
      ::close(from_child[0]);
      const std::string lease = std::to_string(lease_ms);
      ::execl(WEFT_KV_TRANSFER_PEER, WEFT_KV_TRANSFER_PEER, tls.c_str(), lease.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
  }
  ~peer_process() {
    if (in_ != nullptr) {
      if (pid_ > 0) write_line(in_, "quit");
      std::fclose(in_);
    }
    if (out_ != nullptr) std::fclose(out_);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  bool ok() const { return pid_ > 0 && in_ != nullptr && out_ != nullptr; }
  void send(const std::string& line) { write_line(in_, line); }
  std::string receive() { return read_line(out_).value_or("<eof>"); }
  transport::bytes receive_bytes(const std::string& key) {
    const std::string line = receive();
    EXPECT_EQ(line.rfind(key + " ", 0), 0u) << line.substr(0, 80);
    return from_hex(line.substr(std::min(line.size(), key.size() + 1)))
        .value_or(transport::bytes{});
  }
  void kill() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
};

std::shared_ptr<transport::engine> make_ucx(const std::string& tls) {
  transport::engine_config cfg;
  cfg.params = {{"ucx.tls", tls}};
  auto e = transport::make_engine("ucx", cfg);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (!e.ok()) return nullptr;
  return std::shared_ptr<transport::engine>(std::move(*e));
}

class kv_transfer_two_processes : public ::testing::TestWithParam<std::string> {};

TEST_P(kv_transfer_two_processes, pulled_sequence_decodes_bit_identically) {
  peer_process peer(GetParam(), 30'000);
  ASSERT_TRUE(peer.ok());
  auto host = model_and_cache::make(40);
  ASSERT_TRUE(host);
  auto eng = make_ucx(GetParam());
  ASSERT_TRUE(eng);
  auto importer = kv_importer::create(*host->kv, eng, test_identity());
  ASSERT_TRUE(importer.ok()) << importer.error().to_string();
  const auto bytes = peer.receive_bytes("descriptor");
  ASSERT_FALSE(bytes.empty());
  const auto desc = schema::envelope::from_bytes(schema::kind::kv_descriptor, bytes);

  const auto t0 = std::chrono::steady_clock::now();
  auto got = (*importer)->pull(desc);
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_TRUE(got->checksum_verified);
  EXPECT_EQ(got->n_tokens, prompt_tokens);
  std::printf("two-process pull over %s: %llu bytes in %.2f ms\n", GetParam().c_str(),
              static_cast<unsigned long long>(got->size_bytes),
              std::chrono::duration<double, std::milli>(t1 - t0).count());

  const int32_t next[1] = {123};
  const auto local = host->run(got->seq, next);
  peer.send("step 123");
  const auto remote = peer.receive_bytes("logits");
  ASSERT_FALSE(local.empty());
  ASSERT_EQ(remote.size(), local.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(remote.data(), local.data(), remote.size()), 0);

  peer.send("release " + std::to_string(got->lease_id));
  EXPECT_EQ(peer.receive(), "released 1 blocks_used 0");
  peer.send("release " + std::to_string(got->lease_id));  // a second release frees nothing
  EXPECT_EQ(peer.receive(), "released 0 blocks_used 0");
  EXPECT_TRUE(host->kv->free_sequence(got->seq).ok());
  EXPECT_EQ(host->kv->stats().n_blocks_used, 0);
  EXPECT_TRUE(host->kv->check_invariants().ok());
}

TEST_P(kv_transfer_two_processes, killed_exporter_fails_the_pull_in_time_and_leaks_nothing) {
  constexpr uint64_t lease_ms = 3'000;
  peer_process peer(GetParam(), lease_ms);
  ASSERT_TRUE(peer.ok());
  auto host = model_and_cache::make(40);
  ASSERT_TRUE(host);
  auto eng = make_ucx(GetParam());
  ASSERT_TRUE(eng);
  auto importer = kv_importer::create(*host->kv, eng, test_identity());
  ASSERT_TRUE(importer.ok());
  const auto desc =
      schema::envelope::from_bytes(schema::kind::kv_descriptor, peer.receive_bytes("descriptor"));
  peer.kill();
  const auto t0 = std::chrono::steady_clock::now();
  auto got = (*importer)->pull(desc);
  const auto waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_LT(waited_ms, static_cast<int64_t>(lease_ms) + 2'000);
  if (GetParam() == "tcp") {
    ASSERT_FALSE(got.ok());
  }
  if (got.ok()) {
    // shm may still read the dead process's mapped pages; then the bytes must be intact.
    EXPECT_TRUE(got->checksum_verified);
    EXPECT_TRUE(host->kv->free_sequence(got->seq).ok());
  } else {
    std::printf("pull from a killed exporter over %s failed after %lld ms: %s\n",
                GetParam().c_str(), static_cast<long long>(waited_ms),
                got.error().to_string().c_str());
  }
  EXPECT_EQ(host->kv->stats().n_blocks_used, 0);
  EXPECT_EQ((*importer)->n_pending(), 0u);
}

TEST_P(kv_transfer_two_processes, exporter_killed_after_connecting_fails_the_next_pull_in_time) {
  constexpr uint64_t lease_ms = 3'000;
  peer_process peer(GetParam(), lease_ms);
  ASSERT_TRUE(peer.ok());
  auto host = model_and_cache::make(40);
  ASSERT_TRUE(host);
  auto eng = make_ucx(GetParam());
  ASSERT_TRUE(eng);
  auto importer = kv_importer::create(*host->kv, eng, test_identity());
  ASSERT_TRUE(importer.ok());
  // A first pull connects (the connection is cached for later pulls from the same exporter).
  auto first = (*importer)->pull(
      schema::envelope::from_bytes(schema::kind::kv_descriptor, peer.receive_bytes("descriptor")));
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  EXPECT_TRUE(host->kv->free_sequence(first->seq).ok());
  peer.send("offer");
  const auto desc =
      schema::envelope::from_bytes(schema::kind::kv_descriptor, peer.receive_bytes("descriptor"));
  peer.kill();
  const auto t0 = std::chrono::steady_clock::now();
  auto got = (*importer)->pull(desc);
  const auto waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_LT(waited_ms, static_cast<int64_t>(lease_ms) + 2'000);
  if (GetParam() == "tcp") {
    ASSERT_FALSE(got.ok());
  }
  if (got.ok()) {
    EXPECT_TRUE(got->checksum_verified);
    EXPECT_TRUE(host->kv->free_sequence(got->seq).ok());
  } else {
    std::printf(
        "pull over a cached connection to a killed exporter (%s) failed after %lld ms: %s\n",
        GetParam().c_str(), static_cast<long long>(waited_ms), got.error().to_string().c_str());
  }
  EXPECT_EQ(host->kv->stats().n_blocks_used, 0);
  EXPECT_EQ((*importer)->n_pending(), 0u);
}

// 512 tokens of SmolLM2-135M KV (11.25 MiB) pulled across processes; prints the time (a
// measurement, not a target) and checks the checksum.
TEST_P(kv_transfer_two_processes, smollm2_sized_pull_across_processes) {
  peer_process peer(GetParam(), 30'000);
  ASSERT_TRUE(peer.ok());
  (void)peer.receive_bytes("descriptor");
  auto dev =
      std::move(gpu::device_registry::instance().create("cpu", gpu::device_config{1, 0}).value());
  gpu::kv_cache_config kc;
  kc.layout = smollm2_layout();
  kc.n_blocks = 40;
  auto kv = std::move(gpu::kv_cache::create(*dev, kc).value());
  auto eng = make_ucx(GetParam());
  ASSERT_TRUE(eng);
  auto cfg = test_identity();
  cfg.model_id = "smollm2";
  auto importer = kv_importer::create(*kv, eng, cfg);
  ASSERT_TRUE(importer.ok());
  std::vector<double> ms;
  for (int rep = 0; rep < 7; ++rep) {
    peer.send("big");
    const auto desc =
        schema::envelope::from_bytes(schema::kind::kv_descriptor, peer.receive_bytes("descriptor"));
    const auto t0 = std::chrono::steady_clock::now();
    auto got = (*importer)->pull(desc);
    const auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    EXPECT_TRUE(got->checksum_verified);
    EXPECT_EQ(got->size_bytes, 2ull * 30 * 3 * 64 * 2 * 512);
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    peer.send("release big:" + std::to_string(got->lease_id));
    EXPECT_EQ(peer.receive(), "released 1 blocks_used 0");
    EXPECT_TRUE(kv->free_sequence(got->seq).ok());
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "two-process pull of 512 SmolLM2-135M tokens (11.25 MiB) over %s, checksum verified: "
      "median %.2f ms (min %.2f, max %.2f), %.2f GiB/s\n",
      GetParam().c_str(), ms[3], ms[0], ms[6], 11.25 / 1024 / (ms[3] / 1000.0));
  importer->reset();
  EXPECT_EQ(kv->stats().n_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(ucx, kv_transfer_two_processes, ::testing::Values("tcp", "shm"));

}  // namespace
}  // namespace weft::serve::testing
