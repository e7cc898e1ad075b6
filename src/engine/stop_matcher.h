// Stop strings on decoded text, across token boundaries: text that might be the start of a stop string is
// held back until it is known not to be; a completed stop string ends generation and is not emitted.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace lathe {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds newly decoded text; returns the text that is safe to emit now.
  std::string push(std::string_view text);
  // At the end of generation: whatever was held back (nothing once stopped).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace lathe
