#pragma once
/// The files of a trainer group's run (the model, the data) on ranks of other hosts, without
/// shared storage (docs/training.md, "Trainer groups across hosts"). Rank 0's file is the run's:
/// every rank compares its own file at the same path with rank 0's (size and XXH3-64). A rank
/// whose file differs or is missing opens the copy it received in an earlier run, kept under
/// <cache>/received named by content; failing that it receives rank 0's bytes over the group
/// (peer_group::broadcast, in pieces) into a temporary file there, checks them and renames it.
/// Plain code: no CAF.

#include <cstdint>
#include <filesystem>
#include <string>

#include "schema/status.hpp"
#include "transport/peer_group.hpp"

namespace weft::train {

struct file_fingerprint {
  uint64_t size = 0;
  uint64_t hash = 0;  ///< XXH3-64 of the bytes
  bool operator==(const file_fingerprint&) const = default;
};

/// Size and XXH3-64 of the file at `path` (read in pieces); not_found when it is missing.
result<file_fingerprint> fingerprint_file(const std::filesystem::path& path);

/// Where a received copy of a file with `fp` and name `name` lives under `cache_dir`.
std::filesystem::path received_path(const std::filesystem::path& cache_dir,
                                    const file_fingerprint& fp, const std::string& name);

/// Every member of `group` calls it with its own `path` (the same option value) and the same
/// `what` ("model", "data"), in the same order. Returns the path this rank opens: `path` when it
/// holds rank 0's bytes, else the copy under `cache_dir`/received. Errors: unavailable when the
/// group's transfers fail (a restart may fix it), invalid_argument for the files themselves
/// (rank 0 cannot read its file; a copy cannot be written or does not match what rank 0 sent).
/// `piece_bytes`: the size of one broadcast.
result<std::string> share_file(transport::peer_group& group, const std::string& path,
                               const std::string& what, const std::filesystem::path& cache_dir,
                               size_t piece_bytes = size_t{16} << 20);

}  // namespace weft::train
