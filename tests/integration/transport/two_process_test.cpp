// Two OS processes on loopback: this test and transport_peer exchange addresses and region
// descriptors over pipes, then move 64 MiB with UCX (put, get, tagged send) over tcp and over
// shm, verified by checksum on both sides.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "tests/integration/transport/line_protocol.hpp"
#include "transport/checksum.hpp"
#include "transport/registry.hpp"

namespace weft::transport::testing {
namespace {

constexpr std::size_t kSize = 64 << 20;

// A running transport_peer with pipes to its stdin and stdout.
class peer_process {
 public:
  explicit peer_process(const std::string& tls) {
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::close(to_child[1]);
      ::close(from_child[0]);
      std::string size = std::to_string(kSize);
      ::execl(WEFT_TRANSPORT_PEER, WEFT_TRANSPORT_PEER, tls.c_str(), size.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
  }
  ~peer_process() {
    if (in_ != nullptr) {
      write_line(in_, "quit");
      std::fclose(in_);
    }
    if (out_ != nullptr) std::fclose(out_);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }

  bool ok() const { return pid_ > 0 && in_ != nullptr && out_ != nullptr; }
  void send(const std::string& line) { write_line(in_, line); }
  std::string receive() { return read_line(out_).value_or("<eof>"); }
  // Reads "<key> <hex>" and returns the bytes.
  bytes receive_bytes(const std::string& key) {
    std::string line = receive();
    EXPECT_EQ(line.rfind(key + " ", 0), 0u) << line;
    return from_hex(line.substr(key.size() + 1)).value_or(bytes{});
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

class transport_two_processes : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    peer_ = std::make_unique<peer_process>(GetParam());
    ASSERT_TRUE(peer_->ok());
    engine_config cfg;
    cfg.params = {{"ucx.tls", GetParam()}};
    auto e = make_engine("ucx", cfg);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    eng_ = std::move(*e);
    bytes address = peer_->receive_bytes("address");
    bytes target = peer_->receive_bytes("target");
    bytes source = peer_->receive_bytes("source");
    auto peer = eng_->connect(address);
    ASSERT_TRUE(peer.ok()) << peer.error().to_string();
    peer_handle_ = *peer;
    auto t = eng_->import_remote(peer_handle_, target);
    auto s = eng_->import_remote(peer_handle_, source);
    ASSERT_TRUE(t.ok() && s.ok());
    remote_target_ = *t;
    remote_source_ = *s;
    local_.resize(kSize);
    auto r = eng_->register_memory(local_.data(), kSize);
    ASSERT_TRUE(r.ok());
    local_region_ = *r;
  }

  std::unique_ptr<peer_process> peer_;
  std::unique_ptr<engine> eng_;
  peer_handle peer_handle_;
  remote_region remote_target_, remote_source_;
  std::vector<std::byte> local_;
  region local_region_;
};

TEST_P(transport_two_processes, put_64mib_verified_by_checksum) {
  fill_pattern(local_, 1234);
  auto t = eng_->put(
      {.peer = peer_handle_, .local = local_region_, .remote = remote_target_, .size_bytes = kSize},
      {});
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  completion c = eng_->wait(*t);
  ASSERT_TRUE(c.result.ok()) << c.result.to_string();
  peer_->send("sum");
  EXPECT_EQ(peer_->receive(), "sum " + std::to_string(checksum(local_)));
}

TEST_P(transport_two_processes, get_64mib_verified_by_checksum) {
  auto t = eng_->get(
      {.peer = peer_handle_, .local = local_region_, .remote = remote_source_, .size_bytes = kSize},
      {});
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  completion c = eng_->wait(*t);
  ASSERT_TRUE(c.result.ok()) << c.result.to_string();
  std::vector<std::byte> expected(kSize);
  fill_pattern(expected, kSize);
  EXPECT_EQ(checksum(local_), checksum(expected));
}

TEST_P(transport_two_processes, tagged_send_64mib_verified_by_checksum) {
  fill_pattern(local_, 99);
  peer_->send("recv 77");
  ASSERT_EQ(peer_->receive(), "posted");
  auto t = eng_->send(
      {.peer = peer_handle_, .tag = 77, .local = local_region_, .size_bytes = kSize}, {});
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_TRUE(eng_->wait(*t).result.ok());
  EXPECT_EQ(peer_->receive(),
            "received ok " + std::to_string(kSize) + " 77 " + std::to_string(checksum(local_)));
}

TEST_P(transport_two_processes, killed_peer_ends_transfers_by_error_or_deadline) {
  peer_->kill();
  auto start = clock::now();
  auto t = eng_->put({.peer = peer_handle_,
                      .local = local_region_,
                      .remote = remote_target_,
                      .size_bytes = kSize,
                      .options = {.timeout_ms = 3'000}},
                     {});
  if (t.ok()) {
    completion c = eng_->wait(*t);
    // shm can write into the dead process's mapped memory and still succeed; tcp cannot.
    if (GetParam() == "tcp") {
      EXPECT_FALSE(c.result.ok());
    }
    if (!c.result.ok()) {
      EXPECT_TRUE(c.result.code == status_code::peer_unreachable ||
                  c.result.code == status_code::timeout)
          << c.result.to_string();
    }
  }
  EXPECT_LT(clock::now() - start, std::chrono::seconds(10));
}

INSTANTIATE_TEST_SUITE_P(loopback, transport_two_processes, ::testing::Values("tcp", "shm"));

}  // namespace
}  // namespace weft::transport::testing
