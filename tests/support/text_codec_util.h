// A byte-level stand-in tokenizer and a small chat template (train::TextCodec), for tests of the trainer's data
// path and of what the dataset jobs write for it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "lab/train/train_data.h"

namespace lathe::testutil {

// BOS 0, then each byte as 1 + byte % 31 (ids stay below a 32-token vocabulary); the template renders
// "<tools>name;…|" when there are tools, "<role>content[name(arguments)]…|" per message and "<assistant>" as the
// generation prompt.
inline train::TextCodec test_codec() {
  train::TextCodec c;
  c.bos_id = 0;
  c.encode = [](const std::string& s) {
    std::vector<int32_t> ids{0};
    for (unsigned char ch : s) ids.push_back(1 + ch % 31);
    return ids;
  };
  auto tmpl = std::make_shared<ChatTemplate>(
      "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}|{% endif %}"
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
      "{% for c in m.tool_calls or [] %}[{{ c.function.name }}({{ c.function.arguments | tojson }})]{% endfor %}|"
      "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}");
  c.render = [tmpl](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, bool gen) {
    ChatTemplateInput in;
    in.messages = messages;
    in.tools = tools;
    in.add_generation_prompt = gen;
    return tmpl->render(in);
  };
  return c;
}

}  // namespace lathe::testutil
