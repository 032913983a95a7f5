// Large files written past the page cache (gpu/direct_file.hpp): any sequence of appends — bytes
// short of a block, exactly the staging buffer, past it — reads back as written, past the page
// cache or through it; and a GGUF the writer streams to disk is the image it would build in memory,
// byte for byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpu/direct_file.hpp"
#include "gpu/gguf_writer.hpp"

namespace weft::gpu {
namespace {

namespace fs = std::filesystem;

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Writes pieces of these sizes (bytes i % 251 of the whole file) to `dir`; what it reads back.
std::vector<char> round_trip(const fs::path& dir, const std::vector<size_t>& pieces, bool* direct,
                             bool try_direct = true) {
  const fs::path path = dir / ("weft_direct_" + std::to_string(::getpid()) + ".bin");
  std::vector<char> want;
  direct_file f;
  EXPECT_TRUE(f.open(path, try_direct).ok());
  for (size_t n : pieces) {
    std::vector<char> piece(n);
    for (auto& c : piece) c = static_cast<char>(want.size() % 251), want.push_back(c);
    EXPECT_TRUE(f.append(piece.data(), piece.size()).ok());
  }
  *direct = f.direct();
  EXPECT_TRUE(f.finish().ok());
  auto got = read_all(path);
  fs::remove(path);
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  return got;
}

TEST(direct_file, reads_back_what_was_appended_in_pieces_of_any_size) {
  const size_t buf = direct_file::buffer_bytes, blk = direct_file::block_bytes;
  const std::vector<std::vector<size_t>> cases = {
      {},       {1},   {blk - 1},         {blk},
      {blk, 3}, {buf}, {buf - 5, 7, blk}, {3, buf + 1, 2 * buf + blk + 9},
  };
  for (const auto& pieces : cases) {
    bool direct = false;
    round_trip(fs::temp_directory_path(), pieces, &direct);
  }
  // Through the page cache (a file system that refuses O_DIRECT): the same bytes.
  bool direct = true;
  round_trip(fs::temp_directory_path(), {3, buf + 1, blk}, &direct, false);
  EXPECT_FALSE(direct);
}

TEST(direct_file, an_unwritable_path_is_an_error_naming_it) {
  direct_file f;
  auto st = f.open("/nonexistent-dir/x.bin");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/nonexistent-dir/x.bin"), std::string::npos) << st.message();
  EXPECT_FALSE(f.append("x", 1).ok());
}

TEST(direct_file, a_streamed_gguf_is_the_image_built_in_memory) {
  for (uint32_t alignment : {32u, 4096u}) {
    gguf_writer w(gguf_writer_config{alignment});
    w.set("general.architecture", gguf_value{std::string{"llama"}});
    // Odd sizes, one tensor larger than the staging buffer.
    const std::vector<int64_t> sizes = {7, 3 << 20, 1000, 33};
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<float> v(static_cast<size_t>(sizes[i]));
      for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(j % 977) * 0.25f;
      ASSERT_TRUE(w.add_tensor_from_f32("t" + std::to_string(i), ggml_type::f32,
                                        std::vector<int64_t>{sizes[i]}, v));
    }
    auto image = w.to_bytes();
    ASSERT_TRUE(image.ok());
    const fs::path path =
        fs::temp_directory_path() / ("weft_direct_gguf_" + std::to_string(::getpid()) + ".gguf");
    ASSERT_TRUE(w.write_file(path).ok());
    auto got = read_all(path);
    fs::remove(path);
    ASSERT_EQ(got.size(), image->size()) << alignment;
    EXPECT_EQ(std::memcmp(got.data(), image->data(), got.size()), 0) << alignment;
  }
}

}  // namespace
}  // namespace weft::gpu
