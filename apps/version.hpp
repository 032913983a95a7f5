#pragma once
namespace weft::apps {
/// "<version> (<short commit>)": the commit checked out when the binary was last built (every
/// build refreshes it: cmake/write_version.cmake).
const char* version_string();
}  // namespace weft::apps
