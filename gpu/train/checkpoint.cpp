#include "gpu/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "gpu/direct_file.hpp"

namespace weft::gpu::train {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;

/// A file written through a running checksum (in aligned blocks past the page cache where the
/// file system takes it: gpu/direct_file.hpp).
class hashed_writer {
 public:
  explicit hashed_writer(direct_file& f) : file_(f), hash_(XXH64_createState()) {
    XXH64_reset(hash_, 0);
  }
  ~hashed_writer() { XXH64_freeState(hash_); }
  hashed_writer(const hashed_writer&) = delete;
  hashed_writer& operator=(const hashed_writer&) = delete;

  bool put(const void* data, size_t n, bool hashed = true) {
    if (hashed) XXH64_update(hash_, data, n);
    if (!error_.ok()) return false;
    error_ = file_.append(data, n);
    return error_.ok();
  }
  uint64_t digest() const { return XXH64_digest(hash_); }
  const status& error() const { return error_; }

 private:
  direct_file& file_;
  XXH64_state_t* hash_;
  status error_;
};

json header_of(const checkpoint_view& s) {
  json h;
  h["step"] = s.step;
  h["epoch"] = s.cursor.epoch;
  h["index"] = s.cursor.index;
  h["seed"] = s.seed;
  h["adam_steps"] = s.adam_steps;
  h["schedule"] = {{"peak", s.schedule.peak},
                   {"warmup_steps", s.schedule.warmup_steps},
                   {"total_steps", s.schedule.total_steps},
                   {"cosine", s.schedule.decay == lr_schedule::shape::cosine},
                   {"min_ratio", s.schedule.min_ratio}};
  json tensors = json::array();
  for (size_t i = 0; i < s.names.size(); ++i) {
    tensors.push_back({{"name", s.names[i]}, {"size", s.values[i].size()}});
  }
  h["tensors"] = tensors;
  json hist = json::array();
  for (const auto& r : s.history) {
    hist.push_back({r.step, r.loss, r.lr, r.grad_norm, r.tokens});
  }
  h["history"] = hist;
  return h;
}

status io_error(const std::string& what, const fs::path& p) {
  return {status_code::internal, what + " " + p.string() + ": " + std::strerror(errno)};
}

}  // namespace

fs::path checkpoint_path(const fs::path& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld.ckpt", static_cast<long long>(step));
  return dir / name;
}

checkpoint_view view_of(const checkpoint_state& s) {
  checkpoint_view v{s.step, s.cursor, s.seed, s.adam_steps, s.schedule, {}, {}, {}, {}, s.history};
  for (size_t i = 0; i < s.names.size(); ++i) {
    v.names.push_back(s.names[i]);
    v.values.push_back(s.values[i]);
    v.m.push_back(s.m[i]);
    v.v.push_back(s.v[i]);
  }
  return v;
}

checkpoint_view borrow_parameters(const checkpoint_state& meta,
                                  const std::vector<parameter<float>>& params, const adamw& opt) {
  checkpoint_view v{meta.step, meta.cursor, meta.seed, opt.steps(), meta.schedule,
                    {},        {},          {},        {},          meta.history};
  for (size_t i = 0; i < params.size(); ++i) {
    v.names.push_back(params[i].name);
    v.values.push_back(params[i].value);
    v.m.push_back(opt.m(i));
    v.v.push_back(opt.v(i));
  }
  return v;
}

status write_checkpoint(const fs::path& dir, const checkpoint_state& s) {
  return write_checkpoint(dir, view_of(s));
}

status write_checkpoint(const fs::path& dir, const checkpoint_view& s) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return {status_code::internal, "cannot create " + dir.string() + ": " + ec.message()};
  const fs::path final_path = checkpoint_path(dir, s.step);
  const fs::path tmp = final_path.string() + ".tmp";
  direct_file file;
  if (auto st = file.open(tmp); !st.ok()) return st;
  hashed_writer w(file);
  const std::string header = header_of(s).dump();
  const uint64_t header_len = header.size();
  bool ok = w.put(kMagic, sizeof kMagic) && w.put(&kVersion, sizeof kVersion) &&
            w.put(&header_len, sizeof header_len) && w.put(header.data(), header.size());
  for (size_t i = 0; ok && i < s.values.size(); ++i) {
    for (const auto* t : {&s.values[i], &s.m[i], &s.v[i]}) {
      ok = ok && w.put(t->data(), t->size() * sizeof(float));
    }
  }
  const uint64_t digest = w.digest();
  ok = ok && w.put(&digest, sizeof digest, false);
  const status st = ok ? file.finish() : w.error();
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) return io_error("cannot rename", tmp);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

result<checkpoint_state> read_checkpoint(const fs::path& file) {
  auto bad = [&](const std::string& why) {
    return status{status_code::bad_model, "checkpoint " + file.string() + " is unusable: " + why};
  };
  std::ifstream in(file, std::ios::binary);
  if (!in) return status{status_code::not_found, "cannot read checkpoint " + file.string()};
  XXH64_state_t* hash = XXH64_createState();
  XXH64_reset(hash, 0);
  struct free_hash {
    XXH64_state_t* h;
    ~free_hash() { XXH64_freeState(h); }
  } guard{hash};
  auto get = [&](void* dst, size_t n) {
    if (!in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n))) return false;
    XXH64_update(hash, dst, n);
    return true;
  };
  char magic[8];
  uint32_t version = 0;
  uint64_t header_len = 0;
  if (!get(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0)
    return bad("not a weft checkpoint (bad magic)");
  if (!get(&version, sizeof version) || version != kVersion)
    return bad("unsupported version " + std::to_string(version));
  if (!get(&header_len, sizeof header_len) || header_len > (64u << 20))
    return bad("truncated header");
  std::string header(header_len, '\0');
  if (!get(header.data(), header.size())) return bad("truncated header");
  const json h = json::parse(header, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return bad("header is not JSON");
  checkpoint_state s;
  try {
    s.step = h.at("step").get<int64_t>();
    s.cursor.epoch = h.at("epoch").get<int64_t>();
    s.cursor.index = h.at("index").get<int64_t>();
    s.seed = h.at("seed").get<uint64_t>();
    s.adam_steps = h.at("adam_steps").get<int64_t>();
    const auto& sc = h.at("schedule");
    s.schedule.peak = sc.at("peak").get<double>();
    s.schedule.warmup_steps = sc.at("warmup_steps").get<int64_t>();
    s.schedule.total_steps = sc.at("total_steps").get<int64_t>();
    s.schedule.decay =
        sc.at("cosine").get<bool>() ? lr_schedule::shape::cosine : lr_schedule::shape::constant;
    s.schedule.min_ratio = sc.at("min_ratio").get<double>();
    for (const auto& r : h.at("history")) {
      s.history.push_back({r.at(0).get<int64_t>(), r.at(1).get<double>(), r.at(2).get<double>(),
                           r.at(3).get<double>(), r.at(4).get<int64_t>()});
    }
    const auto file_size = fs::file_size(file);
    for (const auto& t : h.at("tensors")) {
      const auto size = t.at("size").get<uint64_t>();
      if (size > file_size / sizeof(float)) return bad("tensor size past the end of the file");
      s.names.push_back(t.at("name").get<std::string>());
      for (auto* dst : {&s.values, &s.m, &s.v}) {
        dst->emplace_back(size);
        if (!get(dst->back().data(), size * sizeof(float))) return bad("truncated tensor data");
      }
    }
  } catch (const json::exception& e) {
    return bad(std::string{"malformed header: "} + e.what());
  }
  uint64_t digest = 0;
  if (!in.read(reinterpret_cast<char*>(&digest), sizeof digest))
    return bad("truncated (no checksum)");
  if (digest != XXH64_digest(hash)) return bad("checksum mismatch (corrupt)");
  if (in.peek() != std::char_traits<char>::eof()) return bad("trailing bytes after the checksum");
  return s;
}

namespace {

std::vector<fs::path> checkpoints_newest_first(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("step-") && name.ends_with(".ckpt")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename().string() > b.filename().string();
  });
  return files;
}

}  // namespace

result<checkpoint_state> load_latest_checkpoint(const fs::path& dir,
                                                std::vector<std::string>* skipped) {
  for (const auto& f : checkpoints_newest_first(dir)) {
    auto s = read_checkpoint(f);
    if (s) return s;
    if (skipped != nullptr) skipped->push_back(s.error().message());
  }
  return status{status_code::not_found, "no usable checkpoint in " + dir.string()};
}

void prune_checkpoints(const fs::path& dir, int keep) {
  const auto files = checkpoints_newest_first(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < files.size(); ++i) {
    std::error_code ec;
    fs::remove(files[i], ec);
  }
}

async_checkpointer::async_checkpointer(fs::path dir, int keep)
    : dir_(std::move(dir)), keep_(keep), thread_([this] { run(); }) {}

async_checkpointer::~async_checkpointer() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

status async_checkpointer::save(const std::function<status(checkpoint_state&)>& fill) {
  status previous = wait();  // The writer is idle from here: staging_ is ours.
  if (auto st = fill(staging_); !st) return st;
  {
    std::lock_guard lk(mu_);
    pending_ = true;
    busy_ = true;
  }
  cv_.notify_all();
  return previous;
}

status async_checkpointer::save(checkpoint_state state) {
  return save([&state](checkpoint_state& s) {
    s = std::move(state);
    return status{};
  });
}

status async_checkpointer::write_now(const checkpoint_view& state) {
  status previous = wait();
  status st = write_checkpoint(dir_, state);
  if (st) prune_checkpoints(dir_, keep_);
  return previous ? st : previous;
}

status async_checkpointer::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [this] { return !busy_; });
  status st = last_;
  last_ = {};
  return st;
}

void async_checkpointer::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || pending_; });
    if (!pending_) return;  // stop_ with nothing pending
    pending_ = false;
    lk.unlock();
    status st = write_checkpoint(dir_, staging_);
    if (st) prune_checkpoints(dir_, keep_);
    lk.lock();
    last_ = st;
    busy_ = false;
    cv_.notify_all();
  }
}

void snapshot_parameters(const std::vector<parameter<float>>& params, const adamw& opt,
                         checkpoint_state& s) {
  s.adam_steps = opt.steps();
  s.names.resize(params.size());
  s.values.resize(params.size());
  s.m.resize(params.size());
  s.v.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    s.names[i] = params[i].name;
    s.values[i].assign(params[i].value.begin(), params[i].value.end());
    s.m[i].assign(opt.m(i).begin(), opt.m(i).end());
    s.v[i].assign(opt.v(i).begin(), opt.v(i).end());
  }
}

status restore_parameters(const checkpoint_state& s, std::vector<parameter<float>>& params,
                          adamw& opt) {
  if (s.names.size() != params.size()) {
    return {status_code::invalid_argument, "checkpoint has " + std::to_string(s.names.size()) +
                                               " tensors, the model " +
                                               std::to_string(params.size())};
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (s.names[i] != params[i].name || s.values[i].size() != params[i].value.size() ||
        s.m[i].size() != params[i].value.size() || s.v[i].size() != params[i].value.size()) {
      return {status_code::invalid_argument, "checkpoint tensor '" + s.names[i] +
                                                 "' does not match the model's '" + params[i].name +
                                                 "'"};
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].value = s.values[i];
    opt.m(i) = s.m[i];
    opt.v(i) = s.v[i];
  }
  opt.set_steps(s.adam_steps);
  return {};
}

}  // namespace weft::gpu::train
