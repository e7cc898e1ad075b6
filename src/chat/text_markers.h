// Small text scans shared by the streaming splitters in chat/: markup markers may arrive split across pushes.
#pragma once
#include <initializer_list>
#include <string_view>

namespace lathe {

// Length of the longest suffix of `text` that is a proper prefix of one of `markers`: the part a streaming
// splitter must hold back until more text shows whether a marker starts there.
size_t partial_marker_length(std::string_view text, std::initializer_list<std::string_view> markers);

// `text` without leading and trailing ASCII whitespace.
std::string_view trim_space(std::string_view text);

}  // namespace lathe
