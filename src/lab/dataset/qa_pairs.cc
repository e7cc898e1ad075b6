#include "lab/dataset/qa_pairs.h"

#include "common/error.h"

namespace lathe::dataset {
namespace dataset_qa_detail {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// "Q:" or "A:" (either case) after optional spaces: the marker's letter, else 0.
char marker(const std::string& line) {
  const size_t b = line.find_first_not_of(" \t");
  if (b == std::string::npos || b + 1 >= line.size() || line[b + 1] != ':') return 0;
  const char c = line[b];
  if (c == 'Q' || c == 'q') return 'Q';
  if (c == 'A' || c == 'a') return 'A';
  return 0;
}

[[noreturn]] void fail(size_t line, const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, "config field 'pairs', line " + std::to_string(line) + ": " + what);
}

}  // namespace dataset_qa_detail

Generated parse_qa_pairs(const std::string& text, const std::string& system_prompt) {
  using namespace dataset_qa_detail;
  Generated g;
  const std::string system = trim(system_prompt);
  std::string question, answer;
  size_t q_line = 0, a_line = 0;  // where the open pair's Q: and A: are (0: none)
  auto close_pair = [&](size_t at) {
    if (q_line == 0) return;
    if (a_line == 0) fail(q_line, "the question has no 'A:' answer before line " + std::to_string(at));
    const std::string q = trim(question), a = trim(answer);
    if (q.empty()) fail(q_line, "the question is empty");
    if (a.empty()) fail(a_line, "the answer is empty");
    if (static_cast<int64_t>(g.rows.size()) >= kMaxDatasetRows)
      fail(q_line, "more than " + std::to_string(kMaxDatasetRows) + " pairs");
    jobs::json messages = jobs::json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    messages.push_back({{"role", "user"}, {"content", q}});
    messages.push_back({{"role", "assistant"}, {"content", a}});
    g.rows.push_back({{"messages", std::move(messages)}});
    question.clear();
    answer.clear();
    q_line = a_line = 0;
  };
  size_t line_no = 0, start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const char m = marker(line);
    if (m == 'Q') {
      close_pair(line_no);
      q_line = line_no;
      question = line.substr(line.find(':') + 1);
    } else if (m == 'A') {
      if (q_line == 0) fail(line_no, "'A:' with no 'Q:' before it");
      if (a_line != 0) fail(line_no, "a second 'A:' for the question on line " + std::to_string(q_line));
      a_line = line_no;
      answer = line.substr(line.find(':') + 1);
    } else if (q_line == 0) {
      if (!trim(line).empty()) fail(line_no, "text before the first 'Q:' (pairs are 'Q: question' then 'A: answer')");
    } else {
      (a_line ? answer : question) += "\n" + line;
    }
    if (nl == text.size()) break;
  }
  close_pair(line_no + 1);
  if (g.rows.empty()) fail(1, "no 'Q:' / 'A:' pair found");
  return g;
}

}  // namespace lathe::dataset
