#include "lab/dataset/llm_templates.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace lathe::dataset {
namespace dataset_llm_detail {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }
json assistant(const std::string& text) { return {{"role", "assistant"}, {"content", text}}; }
json system(const std::string& text) { return {{"role", "system"}, {"content", text}}; }

// "1. What ...", "- What ...", "Q: What ..." -> "What ...".
std::string strip_list_marker(std::string s) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i > 0 && i < s.size() && (s[i] == '.' || s[i] == ')')) return trim(s.substr(i + 1));
  if (s.starts_with("- ") || s.starts_with("* ")) return trim(s.substr(2));
  if (s.size() > 2 && (s[0] == 'Q' || s[0] == 'q') && s[1] == ':') return trim(s.substr(2));
  return s;
}

// The template's list of inputs (lines or passages), by template.
std::vector<std::string> inputs(const TemplateDef& t, const json& config, std::string* field) {
  if (t.id == "self_instruct") return input_lines(text_field(t, config, *field = "seed_tasks"));
  if (t.id == "style_transfer") return input_passages(text_field(t, config, *field = "passages"));
  if (t.id == "multi_turn_chat") return input_lines(text_field(t, config, *field = "topics"));
  if (t.id == "rag_qa") return input_passages(text_field(t, config, *field = "passages"));
  if (t.id == "cot_synthesis") return input_lines(text_field(t, config, *field = "questions"));
  if (t.id == "prompt_reconstruction") return input_passages(text_field(t, config, *field = "targets"));
  if (t.id == "tool_use_traces") return input_lines(text_field(t, config, *field = "tasks"));
  throw Error(ErrorKind::Internal, "dataset: " + t.id + " is not an LLM template");
}

}  // namespace dataset_llm_detail

std::vector<std::string> input_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = dataset_llm_detail::trim(text.substr(start, nl - start));
    if (!line.empty()) out.push_back(std::move(line));
    start = nl + 1;
  }
  return out;
}

std::vector<std::string> input_passages(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  size_t start = 0;
  auto close = [&] {
    std::string p = dataset_llm_detail::trim(cur);
    if (!p.empty()) out.push_back(std::move(p));
    cur.clear();
  };
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(start, nl - start);
    if (dataset_llm_detail::trim(line).empty())
      close();
    else
      cur += line + "\n";
    start = nl + 1;
  }
  close();
  return out;
}

json parse_tools_field(const TemplateDef& t, const json& config) {
  const std::string text = text_field(t, config, "tools");
  json tools;
  try {
    tools = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(ErrorKind::InvalidArgument, std::string("config field 'tools' is not JSON: ") + e.what());
  }
  if (!tools.is_array() || tools.empty())
    throw Error(ErrorKind::InvalidArgument, "config field 'tools' must be a non-empty JSON array of function tools");
  for (const auto& tool : tools)
    if (!tool.is_object() || tool.value("type", "function") != "function" || !tool.contains("function") ||
        !tool["function"].is_object() || !tool["function"].contains("name") || !tool["function"]["name"].is_string())
      throw Error(ErrorKind::InvalidArgument,
                  "config field 'tools': every tool must be {\"type\": \"function\", \"function\": {\"name\": …, "
                  "\"parameters\": …}}");
  return tools;
}

int64_t llm_row_budget(const TemplateDef& t, const json& config) {
  if (t.id == "tool_use_traces") (void)parse_tools_field(t, config);
  std::string field;
  const auto items = dataset_llm_detail::inputs(t, config, &field);
  if (items.empty()) throw Error(ErrorKind::InvalidArgument, "config field '" + field + "' holds no input");
  int64_t n = static_cast<int64_t>(items.size());
  if (t.id == "self_instruct") n = static_cast<int64_t>(number_field(t, config, "count"));
  if (t.id == "rag_qa") n *= static_cast<int64_t>(number_field(t, config, "questions_per_passage"));
  if (n > kMaxLlmRows)
    throw Error(ErrorKind::InvalidArgument, "config field '" + field + "' asks for " + std::to_string(n) +
                                                " rows; one job makes at most " + std::to_string(kMaxLlmRows));
  return n;
}

Generated run_llm_template(const TemplateDef& t, const json& config, const ChatFn& chat, const Progress& progress,
                           const ToolChatFn& tool_chat) {
  using namespace dataset_llm_detail;
  std::string field;
  const std::vector<std::string> items = inputs(t, config, &field);
  const int64_t total = llm_row_budget(t, config);
  Generated g;
  int64_t done = 0;
  auto step = [&] {
    ++done;
    if (progress) progress(done, total);
  };
  auto ask = [&](const json& messages) { return trim(chat(messages)); };

  if (t.id == "self_instruct") {
    for (int64_t i = 0; i < total; ++i, step()) {
      std::string examples;
      const size_t shown = std::min<size_t>(3, items.size());
      for (size_t k = 0; k < shown; ++k)
        examples += std::to_string(k + 1) + ". " + items[(static_cast<size_t>(i) + k) % items.size()] + "\n";
      const std::string task = strip_list_marker(ask(json::array(
          {user("Here are example tasks:\n" + examples +
                "\nWrite one new task of the same kind, different from these. Reply with the task only.")})));
      if (task.empty()) {
        ++g.skipped;
        continue;
      }
      const std::string answer = ask(json::array({user(task)}));
      if (answer.empty()) {
        ++g.skipped;
        continue;
      }
      g.rows.push_back({{"messages", json::array({user(task), assistant(answer)})}});
    }
  } else if (t.id == "style_transfer") {
    const std::string style = trim(text_field(t, config, "style"));
    for (const std::string& passage : items) {
      const std::string prompt = "Rewrite the following text in this style: " + style + ".\n\n" + passage;
      const std::string rewrite = ask(json::array({user(prompt)}));
      if (rewrite.empty())
        ++g.skipped;
      else
        g.rows.push_back({{"messages", json::array({user(prompt), assistant(rewrite)})}});
      step();
    }
  } else if (t.id == "multi_turn_chat") {
    const int turns = static_cast<int>(number_field(t, config, "turns"));
    for (const std::string& topic : items) {
      json messages = json::array({user(topic)});
      bool ok = true;
      for (int turn = 0; turn < turns && ok; ++turn) {
        const std::string reply = ask(messages);
        if (reply.empty()) {
          ok = false;
          break;
        }
        messages.push_back(assistant(reply));
        if (turn + 1 == turns) break;
        std::string transcript;
        for (const auto& m : messages)
          transcript += (m["role"] == "user" ? "User: " : "Assistant: ") + m["content"].get<std::string>() + "\n";
        const std::string follow = strip_list_marker(ask(json::array(
            {system("You play the user in a conversation with an AI assistant. Write the user's next message: a "
                    "short follow-up to the assistant's last reply. Reply with that message only."),
             user(transcript)})));
        if (follow.empty()) {
          ok = false;
          break;
        }
        messages.push_back(user(follow));
      }
      if (ok)
        g.rows.push_back({{"messages", messages}});
      else
        ++g.skipped;
      step();
    }
  } else if (t.id == "rag_qa") {
    const int per = static_cast<int>(number_field(t, config, "questions_per_passage"));
    for (const std::string& passage : items) {
      const std::string listed =
          ask(json::array({user("Read this passage and write " + std::to_string(per) +
                                " questions that it answers, one per line, nothing else.\n\nPassage:\n" + passage)}));
      std::vector<std::string> questions;
      for (const std::string& line : input_lines(listed))
        if (static_cast<int>(questions.size()) < per)
          if (std::string q = strip_list_marker(line); !q.empty()) questions.push_back(q);
      for (int k = 0; k < per; ++k) {
        if (k >= static_cast<int>(questions.size())) {
          ++g.skipped;
          step();
          continue;
        }
        const json sys = system("Answer the user's question using only this passage:\n\n" + passage);
        const std::string answer = ask(json::array({sys, user(questions[static_cast<size_t>(k)])}));
        if (answer.empty())
          ++g.skipped;
        else
          g.rows.push_back(
              {{"messages", json::array({sys, user(questions[static_cast<size_t>(k)]), assistant(answer)})}});
        step();
      }
    }
  } else if (t.id == "cot_synthesis") {
    for (const std::string& question : items) {
      const std::string reasoning = ask(json::array(
          {user("Think step by step about this question and write out your reasoning only, without the final "
                "answer.\n\nQuestion: " +
                question)}));
      const std::string answer = reasoning.empty()
                                     ? std::string()
                                     : ask(json::array({user("Question: " + question + "\n\nReasoning:\n" + reasoning +
                                                             "\n\nGive the final answer only.")}));
      if (answer.empty())
        ++g.skipped;
      else
        g.rows.push_back({{"messages", json::array({user(question),
                                                    assistant("<think>\n" + reasoning + "\n</think>\n\n" + answer)})}});
      step();
    }
  } else if (t.id == "tool_use_traces") {
    if (!tool_chat) throw Error(ErrorKind::Internal, "dataset: tool_use_traces needs a tool-calling chat");
    const json tools = parse_tools_field(t, config);
    // One trace: the forced call, each call's result mocked by the model standing in for the tool, the answer
    // from those results. False when a reply came back empty or without a call.
    auto trace = [&](const std::string& task) {
      json messages = json::array({user(task)});
      const json call = tool_chat(messages, tools, true);
      const auto calls = call.find("tool_calls");
      if (calls == call.end() || !calls->is_array() || calls->empty()) return false;
      json turn = {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array()}};
      json results = json::array();
      for (size_t k = 0; k < calls->size(); ++k) {
        const json& c = (*calls)[k];
        const auto fn = c.find("function");
        if (fn == c.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) return false;
        const std::string name = (*fn)["name"];
        const auto a = fn->find("arguments");
        const std::string args = a == fn->end() ? "{}" : a->is_string() ? a->get<std::string>() : a->dump();
        const auto given = c.find("id");
        const std::string id =
            given != c.end() && given->is_string() ? given->get<std::string>() : "call_" + std::to_string(k);
        turn["tool_calls"].push_back(
            {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
        const std::string result =
            ask(json::array({system("You stand in for the tool '" + name +
                                    "'. Reply with the result it would return for these arguments, as JSON, and "
                                    "nothing else."),
                             user(args)}));
        if (result.empty()) return false;
        results.push_back({{"role", "tool"}, {"tool_call_id", id}, {"name", name}, {"content", result}});
      }
      messages.push_back(std::move(turn));
      for (auto& r : results) messages.push_back(std::move(r));
      const json reply = tool_chat(messages, tools, false);
      const auto content = reply.find("content");
      const std::string answer =
          content != reply.end() && content->is_string() ? trim(content->get<std::string>()) : "";
      if (answer.empty()) return false;
      messages.push_back(assistant(answer));
      g.rows.push_back({{"messages", std::move(messages)}, {"tools", tools}});
      return true;
    };
    for (const std::string& task : items) {
      if (!trace(task)) ++g.skipped;
      step();
    }
  } else if (t.id == "prompt_reconstruction") {
    for (const std::string& target : items) {
      const std::string prompt = ask(json::array(
          {user("Here is a text:\n\n" + target +
                "\n\nWrite the request a user would have given an AI assistant to get this text. Reply with the "
                "request only.")}));
      const std::string draft = prompt.empty() ? std::string() : ask(json::array({user(prompt)}));
      if (draft.empty())
        ++g.skipped;
      else
        g.rows.push_back({{"prompt", prompt}, {"chosen", target}, {"rejected", draft}});
      step();
    }
  }
  return g;
}

}  // namespace lathe::dataset
