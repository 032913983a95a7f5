#include "gpu/internal/gguf_mapping.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace weft::gpu::internal {

bool gguf_image::map_file(const std::filesystem::path& path, std::string& error) {
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
  mapped_ = addr;
  data_ = static_cast<const std::byte*>(addr);
  size_ = size;
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
  if (mapped_ != nullptr) ::munmap(mapped_, size_);
  if (owned_ != nullptr) ::operator delete (owned_, std::align_val_t{4096});
}

}  // namespace weft::gpu::internal
