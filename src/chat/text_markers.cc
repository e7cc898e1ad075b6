#include "chat/text_markers.h"

#include <algorithm>

namespace lathe {

size_t partial_marker_length(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t longest = 0;
  for (std::string_view marker : markers) {
    if (marker.empty()) continue;
    for (size_t n = std::min(text.size(), marker.size() - 1); n > longest; --n) {
      if (text.substr(text.size() - n) == marker.substr(0, n)) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

std::string_view trim_space(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

}  // namespace lathe
