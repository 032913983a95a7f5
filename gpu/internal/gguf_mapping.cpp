#include "gpu/internal/gguf_mapping.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>

namespace weft::gpu::internal {

namespace {

constexpr size_t huge_page_bytes = size_t{2} << 20;
// Copies and touches in steps of this size, reporting progress between steps.
constexpr size_t load_step_bytes = size_t{32} << 20;

// The kernel's transparent-huge-page mode for anonymous memory: "always", "madvise" or "never"
// (what /sys/kernel/mm/transparent_hugepage/enabled marks with brackets; "never" if unreadable).
std::string transparent_huge_pages_mode() {
  std::ifstream in{"/sys/kernel/mm/transparent_hugepage/enabled"};
  std::string line;
  std::getline(in, line);
  const auto open = line.find('[');
  const auto close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "never";
  return line.substr(open + 1, close - open - 1);
}

void report(const gguf_image::progress_fn& progress, size_t done, size_t total) {
  if (progress) progress(done, total);
}

}  // namespace

bool gguf_image::map_file(const std::filesystem::path& path, bool huge_pages, bool load_now,
                          const progress_fn& progress, std::string& error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    error = "cannot open '" + path.string() + "': " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    error = "cannot stat '" + path.string() + "': " + std::strerror(errno);
    ::close(fd);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    error = "'" + path.string() + "' is not a regular file";
    ::close(fd);
    return false;
  }
  if (st.st_size == 0) {
    error = "'" + path.string() + "' is empty";
    ::close(fd);
    return false;
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (addr == MAP_FAILED) {
    error = "cannot mmap '" + path.string() + "': " + std::strerror(map_errno);
    return false;
  }
  if (huge_pages && transparent_huge_pages_mode() == "never") {
    spdlog::info("gguf: transparent huge pages are disabled on this host; '{}' stays mmapped",
                 path.string());
    huge_pages = false;
  }
  if (huge_pages) {
    // Reserve one huge page more than needed so the copy can start on a 2 MiB boundary.
    const size_t rounded = (size + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
    const size_t reserve = rounded + huge_page_bytes;
    void* anon =
        ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED) {
      error = "cannot allocate " + std::to_string(reserve >> 20) + " MiB for '" + path.string() +
              "': " + std::strerror(errno);
      ::munmap(addr, size);
      return false;
    }
    const auto start = (reinterpret_cast<uintptr_t>(anon) + huge_page_bytes - 1) &
                       ~static_cast<uintptr_t>(huge_page_bytes - 1);
    auto* copy = reinterpret_cast<std::byte*>(start);
    if (::madvise(copy, rounded, MADV_HUGEPAGE) != 0) {
      spdlog::debug("gguf: madvise(MADV_HUGEPAGE) failed: {}", std::strerror(errno));
    }
    const auto* src = static_cast<const std::byte*>(addr);
    for (size_t off = 0; off < size; off += load_step_bytes) {
      report(progress, off, size);
      std::memcpy(copy + off, src + off, std::min(load_step_bytes, size - off));
    }
    report(progress, size, size);
    ::munmap(addr, size);
    ::mprotect(anon, reserve, PROT_READ);
    mapped_ = anon;
    mapped_size_ = reserve;
    data_ = copy;
    size_ = size;
    return true;
  }
  mapped_ = addr;
  mapped_size_ = size;
  data_ = static_cast<const std::byte*>(addr);
  size_ = size;
  if (load_now) {
    volatile unsigned char sink = 0;
    for (size_t off = 0; off < size; off += 4096) {
      if (off % load_step_bytes == 0) report(progress, off, size);
      sink = sink + static_cast<unsigned char>(data_[off]);
    }
    report(progress, size, size);
  }
  return true;
}

void gguf_image::copy_from(std::span<const std::byte> bytes) {
  // Page alignment (like mmap) so that tensor data keeps the alignment the file promises relative
  // to its start (general.alignment is at most what kernels need; mmap gives page alignment).
  const size_t n = bytes.empty() ? 1 : bytes.size();
  owned_ = static_cast<std::byte*>(::operator new (n, std::align_val_t{4096}));
  if (!bytes.empty()) std::memcpy(owned_, bytes.data(), bytes.size());
  data_ = owned_;
  size_ = bytes.size();
}

gguf_image::~gguf_image() {
  if (mapped_ != nullptr) ::munmap(mapped_, mapped_size_);
  if (owned_ != nullptr) ::operator delete (owned_, std::align_val_t{4096});
}

}  // namespace weft::gpu::internal
