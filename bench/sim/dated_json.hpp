#pragma once
/// Where the simulators write their results: DIR/STEM-YYYYMMDD.json (UTC date), the directory
/// created if needed. Returns the path written.

#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

namespace weft::bench::sim {

inline std::filesystem::path write_dated_json(const std::string& dir, const std::string& stem,
                                              const nlohmann::json& doc) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y%m%d", std::gmtime(&now));
  auto path = std::filesystem::path(dir) / (stem + "-" + date + ".json");
  std::ofstream(path) << doc.dump(1) << '\n';
  return path;
}

}  // namespace weft::bench::sim
