#pragma once
/// Large files written whole and fast — training checkpoints, exported GGUFs: the bytes go through
/// a staging buffer and out in aligned blocks with O_DIRECT where the file system takes it, past
/// the page cache. On the 2-vCPU VMs this project is built on, buffered writes of a 1.6 GB
/// checkpoint cost ~26 s of kernel time (copying into freshly allocated page-cache pages), direct
/// ones ~1 s (docs/training.md, "Checkpoints"); DeepSpeed's FastPersist writes checkpoints the same
/// way. Where O_DIRECT is refused (tmpfs before Linux 6.6, some network file systems, an alignment
/// the file system does not take) the same bytes go through the page cache, and the writer says so
/// once a file (spdlog info). Plain class, no CAF.

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "gpu/status.hpp"

namespace weft::gpu {

class direct_file {
 public:
  direct_file() = default;
  ~direct_file();  ///< Closes a file not finished (nothing is synced; the caller removes it).
  direct_file(const direct_file&) = delete;
  direct_file& operator=(const direct_file&) = delete;

  /// Creates (or truncates) `path` for writing; `try_direct` false: through the page cache.
  status open(const std::filesystem::path& path, bool try_direct = true);
  /// Appends `n` bytes.
  status append(const void* data, size_t n);
  /// Writes what is still buffered, fsyncs and closes the file.
  status finish();
  /// Whether the blocks written so far went past the page cache.
  bool direct() const { return direct_; }

  /// The staging buffer's size and the blocks' alignment.
  static constexpr size_t buffer_bytes = size_t{8} << 20;
  static constexpr size_t block_bytes = 4096;

 private:
  status write_all(const char* p, size_t n);
  status fail(const char* what);
  void go_buffered(const char* why);

  struct free_deleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::filesystem::path path_;
  int fd_ = -1;
  bool direct_ = false;
  std::unique_ptr<char, free_deleter> buf_;
  size_t used_ = 0;
};

}  // namespace weft::gpu
