#pragma once
/// `--config FILE` for a subcommand: CLI11 2.1 reads a config file only for the top-level app and
/// silently ignores one given to a subcommand, so weft applies it itself.

#include <CLI/CLI.hpp>

#include <string>

#include "schema/status.hpp"

namespace weft::apps {

/// Applies the options in TOML/INI file `path` to `cmd` (after cmd was parsed). Keys may sit at the
/// top level or under a section named after the command (`[serve]`), with dashes or underscores
/// (`max-outstanding`, `max_outstanding`); flags take `true`/`false`. An option also given on the
/// command line keeps the command line's value. Errors name the file and the key: unreadable file,
/// unknown section, unknown option, a value the option refuses.
status apply_config_file(CLI::App* cmd, const std::string& path);

}  // namespace weft::apps
