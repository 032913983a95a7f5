#include "apps/config_file.hpp"

#include <fstream>

namespace weft::apps {

status apply_config_file(CLI::App* cmd, const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::not_found, "cannot read config file '" + path + "'");
  CLI::ConfigTOML parser;
  std::vector<CLI::ConfigItem> items;
  try {
    items = parser.from_config(in);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, path + ": " + e.what());
  }
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // CLI11's section open/close markers
    const bool top = item.parents.empty();
    const bool own = item.parents.size() == 1 && item.parents.front() == cmd->get_name();
    if (!top && !own) {
      return make_error(errc::invalid_argument, path + ": unknown section [" +
                                                    item.parents.front() + "] (use [" +
                                                    cmd->get_name() + "] or no section)");
    }
    std::string name = item.name;
    for (auto& c : name) c = c == '_' ? '-' : c;
    if (name == "config")
      return make_error(errc::invalid_argument, path + ": 'config' cannot nest");
    CLI::Option* opt = cmd->get_option_no_throw("--" + name);
    if (opt == nullptr) {
      return make_error(errc::invalid_argument, path + ": unknown option '" + item.name +
                                                    "' (see weft " + cmd->get_name() + " --help)");
    }
    if (opt->count() > 0) continue;  // the command line wins
    try {
      opt->add_result(item.inputs);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return make_error(errc::invalid_argument, path + ": " + item.name + ": " + e.what());
    }
  }
  return {};
}

}  // namespace weft::apps
