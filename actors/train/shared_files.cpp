#include "actors/train/shared_files.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <system_error>
#include <vector>

namespace weft::train {

namespace fs = std::filesystem;

namespace {

error transfer_error(const std::string& what, const transport::status& s) {
  return make_error(errc::unavailable, "sharing the " + what + " file: " + s.to_string());
}

error file_error(const std::string& what, const std::string& why) {
  return make_error(errc::invalid_argument, "the " + what + " file: " + why);
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

/// A received copy being written: a temporary file beside its final name, removed unless kept.
class incoming_file {
 public:
  /// Two ranks in one process (or two processes) may receive the same file: each writes its own.
  incoming_file(fs::path final_path, int rank)
      : final_(std::move(final_path)),
        tmp_(final_.string() + ".part." + std::to_string(::getpid()) + "." + std::to_string(rank)) {
  }
  ~incoming_file() {
    if (!kept_) {
      std::error_code ec;
      fs::remove(tmp_, ec);
    }
  }
  incoming_file(const incoming_file&) = delete;
  incoming_file& operator=(const incoming_file&) = delete;

  bool open() {
    std::error_code ec;
    fs::create_directories(final_.parent_path(), ec);
    out_.open(tmp_, std::ios::binary | std::ios::trunc);
    return out_.good();
  }
  bool write(std::span<const std::byte> piece) {
    out_.write(reinterpret_cast<const char*>(piece.data()),
               static_cast<std::streamsize>(piece.size()));
    return out_.good();
  }
  /// Closes it, checks it against `fp` and renames it to its final name.
  status keep(const file_fingerprint& fp, const std::string& what) {
    out_.close();
    if (out_.fail()) return file_error(what, "cannot write " + tmp_.string());
    auto got = fingerprint_file(tmp_);
    if (!got || !(*got == fp)) {
      return file_error(what, "the copy received from rank 0 in " + tmp_.string() +
                                  " does not match its size and checksum");
    }
    std::error_code ec;
    fs::rename(tmp_, final_, ec);
    if (ec) return file_error(what, "cannot rename " + tmp_.string() + ": " + ec.message());
    kept_ = true;
    return {};
  }

 private:
  fs::path final_;
  fs::path tmp_;
  std::ofstream out_;
  bool kept_ = false;
};

}  // namespace

result<file_fingerprint> fingerprint_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    const bool exists = fs::exists(path, ec);
    return make_error(exists ? errc::invalid_argument : errc::not_found,
                      (exists ? "cannot read " : "no file ") + path.string());
  }
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<char> buf(size_t{4} << 20);
  file_fingerprint fp;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(in.gcount());
    XXH3_64bits_update(state.get(), buf.data(), n);
    fp.size += n;
  }
  if (in.bad()) return make_error(errc::invalid_argument, "cannot read " + path.string());
  fp.hash = XXH3_64bits_digest(state.get());
  return fp;
}

fs::path received_path(const fs::path& cache_dir, const file_fingerprint& fp,
                       const std::string& name) {
  char prefix[48];
  std::snprintf(prefix, sizeof prefix, "%016llx-%llu-", static_cast<unsigned long long>(fp.hash),
                static_cast<unsigned long long>(fp.size));
  return cache_dir / "received" / (prefix + name);
}

result<std::string> share_file(transport::peer_group& group, const std::string& path,
                               const std::string& what, const fs::path& cache_dir,
                               size_t piece_bytes) {
  const int rank = group.rank();
  const int k = group.size();
  const bool root = rank == 0;
  // Rank 0's size and checksum to everyone (the others add −0.0: the bits stay rank 0's; a
  // checksum travels as two 32-bit halves, exact in a double). A size of −1: rank 0 cannot read.
  double announced[3] = {-0.0, -0.0, -0.0};
  std::optional<error> root_error;
  if (root) {
    auto fp = fingerprint_file(path);
    if (fp) {
      announced[0] = static_cast<double>(fp->size);
      announced[1] = static_cast<double>(fp->hash >> 32);
      announced[2] = static_cast<double>(fp->hash & 0xFFFFFFFFu);
    } else {
      announced[0] = -1.0;
      root_error = file_error(what, fp.error().message);
    }
  }
  if (auto s = group.all_reduce_sum(std::span<double>(announced, 3)); !s.ok())
    return transfer_error(what, s);
  if (root_error) return *root_error;
  if (announced[0] < 0) return file_error(what, "rank 0 cannot read its " + path);
  const file_fingerprint want{
      static_cast<uint64_t>(announced[0]),
      (static_cast<uint64_t>(announced[1]) << 32) | static_cast<uint64_t>(announced[2])};

  // Which ranks need rank 0's bytes.
  std::string use = path;
  const fs::path copy = received_path(cache_dir, want, fs::path(path).filename().string());
  double needs[2048] = {};
  if (!root) {
    auto matches = [&](const fs::path& p) {
      std::error_code ec;
      if (fs::file_size(p, ec) != want.size || ec) return false;
      auto fp = fingerprint_file(p);
      return fp && *fp == want;
    };
    if (!matches(path)) {
      if (matches(copy)) {
        spdlog::info("{} {}: using {}, received from rank 0 earlier", what, path, copy.string());
      } else {
        needs[rank] = 1.0;
      }
      use = copy.string();
    }
  }
  const auto n = static_cast<size_t>(k);
  if (auto s = group.all_reduce_sum(std::span<double>(needs, n)); !s.ok())
    return transfer_error(what, s);
  std::vector<bool> receivers(n);
  std::string who;
  for (size_t r = 0; r < n; ++r) {
    receivers[r] = needs[r] > 0.5;
    if (receivers[r]) who += (who.empty() ? "" : ", ") + std::to_string(r);
  }
  if (who.empty()) return use;

  // The bytes, piece by piece.
  const bool receiving = receivers[static_cast<size_t>(rank)];
  const auto t0 = std::chrono::steady_clock::now();
  if (root) {
    spdlog::info("sending the {} ({}, {}) to rank(s) {}", what, path, mib(want.size), who);
  } else if (receiving) {
    spdlog::info("the {} at {} is not rank 0's: receiving it ({}) into {}", what, path,
                 mib(want.size), copy.string());
  }
  std::ifstream in;
  if (root) in.open(path, std::ios::binary);
  std::optional<incoming_file> out;
  if (receiving) {
    out.emplace(copy, rank);
    if (!out->open()) return file_error(what, "cannot write into " + copy.parent_path().string());
  }
  std::vector<std::byte> piece(std::min<uint64_t>(piece_bytes, std::max<uint64_t>(want.size, 1)));
  for (uint64_t at = 0; at < want.size; at += piece.size()) {
    const auto len = static_cast<size_t>(std::min<uint64_t>(piece.size(), want.size - at));
    const std::span<std::byte> part(piece.data(), len);
    if (root && !in.read(reinterpret_cast<char*>(part.data()), static_cast<std::streamsize>(len)))
      return file_error(what, path + " changed while it was being sent");
    if (auto s = group.broadcast(part, 0, receivers); !s.ok()) return transfer_error(what, s);
    if (receiving && !out->write(part)) return file_error(what, "cannot write " + copy.string());
  }
  if (receiving) {
    if (auto s = out->keep(want, what); !s.ok()) return s;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (root || receiving) {
    spdlog::info("{} {} {} in {:.2f} s", what, root ? "sent" : "received", mib(want.size), secs);
  }
  return use;
}

}  // namespace weft::train
