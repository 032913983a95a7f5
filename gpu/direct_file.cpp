#include "gpu/direct_file.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace weft::gpu {

direct_file::~direct_file() {
  if (fd_ >= 0) ::close(fd_);
}

status direct_file::fail(const char* what) {
  const std::string why = std::strerror(errno);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return {status_code::internal, std::string{what} + " " + path_.string() + ": " + why};
}

void direct_file::go_buffered(const char* why) {
  if (!direct_) return;
  direct_ = false;
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
  spdlog::info("{}: {}; writing it through the page cache", path_.string(), why);
}

status direct_file::open(const std::filesystem::path& path, bool try_direct) {
  path_ = path;
  if (fd_ >= 0) ::close(fd_);
  used_ = 0;
  if (!buf_) {
    buf_.reset(static_cast<char*>(std::aligned_alloc(block_bytes, buffer_bytes)));
    if (!buf_) return {status_code::out_of_memory, "no staging buffer to write " + path.string()};
  }
  constexpr int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  fd_ = try_direct ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
  direct_ = fd_ >= 0;
  if (!try_direct) {
    fd_ = ::open(path.c_str(), flags, 0644);
  } else if (fd_ < 0 && errno == EINVAL) {
    fd_ = ::open(path.c_str(), flags, 0644);
    if (fd_ >= 0) {
      spdlog::info("{}: its file system does not take O_DIRECT; writing it through the page cache",
                   path.string());
    }
  }
  if (fd_ < 0) return fail("cannot create");
  return {};
}

status direct_file::write_all(const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_) {  // an alignment this file system does not take
        go_buffered("a direct write was refused");
        continue;
      }
      return fail("cannot write");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

status direct_file::append(const void* data, size_t n) {
  if (fd_ < 0) return {status_code::internal, "direct_file: " + path_.string() + " is not open"};
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t take = std::min(n, buffer_bytes - used_);
    std::memcpy(buf_.get() + used_, p, take);
    used_ += take;
    p += take;
    n -= take;
    if (used_ == buffer_bytes) {
      if (auto st = write_all(buf_.get(), used_); !st.ok()) return st;
      used_ = 0;
    }
  }
  return {};
}

status direct_file::finish() {
  if (fd_ < 0) return {status_code::internal, "direct_file: " + path_.string() + " is not open"};
  // Whole blocks as they are; the short tail through the page cache (a direct write must be a
  // whole number of blocks).
  const size_t whole = used_ / block_bytes * block_bytes;
  if (auto st = write_all(buf_.get(), whole); !st.ok()) return st;
  if (used_ > whole) {
    if (direct_) {
      const int flags = ::fcntl(fd_, F_GETFL);
      if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) return fail("cannot write");
    }
    if (auto st = write_all(buf_.get() + whole, used_ - whole); !st.ok()) return st;
  }
  used_ = 0;
  if (::fsync(fd_) != 0) return fail("cannot sync");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return fail("cannot close");
  return {};
}

}  // namespace weft::gpu
