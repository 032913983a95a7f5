#pragma once
/// The chat page `weft serve` answers GET / with (docs/serving.md, "Chat page").

#include <string_view>

namespace weft::serve {

/// A self-contained HTML page (no external scripts, styles or fonts).
std::string_view chat_page_html();

}  // namespace weft::serve
