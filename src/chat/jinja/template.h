// A compiled Jinja2 template: parse once, render many times with different variables.
//
//   jinja::Template t(source);                 // throws on syntax errors, naming the construct and line:col
//   std::string text = t.render(variables);    // throws on runtime errors and raise_exception
#pragma once
#include <string>

#include "chat/jinja/ast.h"
#include "chat/jinja/budget.h"
#include "chat/jinja/value.h"
#include "common/error.h"

namespace lathe::jinja {

struct TemplateOptions {
  bool trim_blocks = true;  // transformers renders chat templates with trim_blocks and lstrip_blocks on
  bool lstrip_blocks = true;
};

// Thrown when a template calls a function that raises on purpose (raise_exception(msg)): what() is exactly
// the template's message, so it can be shown to the client as-is.
class TemplateRaised : public Error {
 public:
  explicit TemplateRaised(const std::string& message) : Error(ErrorKind::InvalidArgument, message) {}
};

class Template {
 public:
  explicit Template(const std::string& source, const TemplateOptions& options = {});
  Template(Template&&) noexcept = default;
  Template& operator=(Template&&) noexcept = default;

  // `variables` is the render context (messages, add_generation_prompt, functions such as strftime_now...).
  // Jinja's own globals (range, namespace, dict) are always available.
  // Every render runs within a budget (steps, string and list sizes, cancellation); exceeding it throws
  // Error(InvalidArgument) naming the limit.
  std::string render(const ValueDict& variables) const { return render(variables, default_render_limits()); }
  std::string render(const ValueDict& variables, const RenderLimits& limits) const;

 private:
  Body body_;
};

}  // namespace lathe::jinja
