// What the ranks of a trainer group settle on joining, on inproc engines (members on their own
// threads like processes would be): shared_files (the model and the data reach ranks that lack
// them, byte for byte) and local_rank (which ranks share a host).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "actors/train/local_rank.hpp"
#include "actors/train/shared_files.hpp"
#include "transport/registry.hpp"

namespace weft::train {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class shared_files_test : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::temp_directory_path() /
        ("weft-shared-files-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    for (int r = 0; r < k_; ++r) {
      auto e = transport::make_engine("inproc", {});
      ASSERT_TRUE(e.ok()) << e.error().to_string();
      auto a = (*e)->local_address();
      ASSERT_TRUE(a.ok());
      addresses_.push_back(*a);
      engines_.push_back(std::move(*e));
    }
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path host(int r) const { return root_ / ("host" + std::to_string(r)); }

  /// `fn(group, rank)` on every rank, each on its own thread.
  template <class T>
  std::vector<T> on_every_rank(std::function<T(transport::peer_group&, int)> fn, T failed) {
    std::vector<T> out(k_, failed);
    std::vector<std::thread> threads;
    for (int r = 0; r < k_; ++r) {
      threads.emplace_back([&, r] {
        auto g = transport::peer_group::connect(*engines_[static_cast<size_t>(r)], r, addresses_,
                                                {.timeout_ms = 20'000});
        if (g) out[static_cast<size_t>(r)] = fn(**g, r);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  /// share_file on every rank, its own path under host(r), pieces of 1000 bytes.
  std::vector<result<std::string>> share(const std::string& name) {
    return on_every_rank<result<std::string>>(
        [&](transport::peer_group& g, int r) {
          return share_file(g, (host(r) / "run" / name).string(), "model", host(r) / "cache", 1000);
        },
        make_error(errc::internal, "not run"));
  }

  const int k_ = 3;
  fs::path root_;
  std::vector<std::unique_ptr<transport::engine>> engines_;
  std::vector<transport::bytes> addresses_;
};

TEST_F(shared_files_test, ranks_without_rank_0s_bytes_receive_them_and_keep_the_copy) {
  std::string bytes(4321, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7919 % 251);
  write(host(0) / "run" / "m.gguf", bytes);
  write(host(1) / "run" / "m.gguf", bytes);          // the same file: opened where it is
  write(host(2) / "run" / "m.gguf", bytes + "old");  // another file at that path: not used
  auto got = share("m.gguf");
  for (int r = 0; r < k_; ++r) ASSERT_TRUE(got[static_cast<size_t>(r)]) << "rank " << r;
  EXPECT_EQ(*got[0], (host(0) / "run" / "m.gguf").string());
  EXPECT_EQ(*got[1], (host(1) / "run" / "m.gguf").string());
  const auto fp = fingerprint_file(host(0) / "run" / "m.gguf");
  ASSERT_TRUE(fp);
  EXPECT_EQ(fp->size, bytes.size());
  EXPECT_EQ(*got[2], received_path(host(2) / "cache", *fp, "m.gguf").string());
  EXPECT_EQ(read(*got[2]), bytes);
  EXPECT_FALSE(fs::exists(host(1) / "cache")) << "a rank with the file receives nothing";

  // A later run: the copy is found by content, nothing is sent (a missing file at the path
  // changes nothing); a rank 0 whose file changed sends the new bytes.
  fs::remove(host(2) / "run" / "m.gguf");
  const auto before = fs::last_write_time(*got[2]);
  auto again = share("m.gguf");
  ASSERT_TRUE(again[2]);
  EXPECT_EQ(*again[2], *got[2]);
  EXPECT_EQ(fs::last_write_time(*again[2]), before);
  write(host(0) / "run" / "m.gguf", "new bytes");
  auto changed = share("m.gguf");
  for (int r = 0; r < k_; ++r) ASSERT_TRUE(changed[static_cast<size_t>(r)]) << "rank " << r;
  EXPECT_EQ(read(*changed[1]), "new bytes");
  EXPECT_EQ(read(*changed[2]), "new bytes");
  EXPECT_NE(*changed[2], *got[2]);
}

TEST_F(shared_files_test, an_empty_file_is_shared_too) {
  write(host(0) / "run" / "d.jsonl", "");
  auto got = share("d.jsonl");
  for (int r = 0; r < k_; ++r) ASSERT_TRUE(got[static_cast<size_t>(r)]) << "rank " << r;
  EXPECT_EQ(read(*got[2]), "");
  EXPECT_TRUE(fs::exists(*got[2]));
}

TEST_F(shared_files_test, rank_0_without_the_file_fails_every_rank_naming_it) {
  auto got = share("missing.gguf");
  for (int r = 0; r < k_; ++r) {
    ASSERT_FALSE(got[static_cast<size_t>(r)]) << "rank " << r;
    EXPECT_EQ(got[static_cast<size_t>(r)].error().code, errc::invalid_argument);
    EXPECT_NE(got[static_cast<size_t>(r)].error().message.find("missing.gguf"), std::string::npos)
        << got[static_cast<size_t>(r)].error().message;
  }
}

TEST_F(shared_files_test, local_ranks_count_the_lower_ranks_on_the_same_host) {
  // Ranks 0 and 2 on one host, rank 1 on another.
  const uint64_t hosts[3] = {0x1234567890ABCDEFull, 0xFEDCBA0987654321ull, 0x1234567890ABCDEFull};
  auto got = on_every_rank<result<int>>(
      [&](transport::peer_group& g, int r) { return local_rank(g, hosts[r]); },
      make_error(errc::internal, "not run"));
  for (int r = 0; r < k_; ++r) ASSERT_TRUE(got[static_cast<size_t>(r)]) << "rank " << r;
  EXPECT_EQ(*got[0], 0);
  EXPECT_EQ(*got[1], 0);
  EXPECT_EQ(*got[2], 1);
  // Ranks of one machine (here: one process) find each other by this_host_key (its boot id).
  auto same = on_every_rank<result<int>>(
      [](transport::peer_group& g, int) { return local_rank(g, this_host_key()); },
      make_error(errc::internal, "not run"));
  for (int r = 0; r < k_; ++r) EXPECT_EQ(*same[static_cast<size_t>(r)], r);
}

}  // namespace
}  // namespace weft::train
