// Running one submitted generation for an HTTP response, shared by the OpenAI and Anthropic routes: as a
// server-sent event stream framed by the surface (StreamFramer), or to the end for a JSON reply. Either way a
// client that goes away cancels the job at the next token.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/generation_flow.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lathe::server {

// One submitted generation: its job, the prepared request, the response id and creation time.
struct Generation {
  std::shared_ptr<GenerationJob> job;
  std::shared_ptr<PreparedGeneration> prepared;
  std::string id;
  int64_t created = 0;
};

// Queues `prepared` on the engine under a fresh id "<id_prefix><24 hex digits>".
Generation start_generation(ServerContext& ctx, PreparedGeneration prepared, const std::string& id_prefix);

// How one API surface frames a stream. An instance frames one stream and may keep state (Anthropic's open
// content block).
class StreamFramer {
 public:
  virtual ~StreamFramer() = default;
  // Frames before the first token (OpenAI chat: the role chunk; Anthropic: message_start).
  virtual std::vector<std::string> opening(const Generation& g) = 0;
  virtual std::vector<std::string> delta(const Generation& g, const OutputDelta& d) = 0;
  // Frames after the last token (final chunk with usage; Anthropic's block stops, message_delta/stop).
  virtual std::vector<std::string> finish(const Generation& g, const GenerationOutcome& o) = 0;
  // The frame sent when generation fails mid-stream (the stream then ends).
  virtual std::string error(const ApiError& e) = 0;
  // Sent after a completed stream's last frames (OpenAI: "data: [DONE]"); empty for none.
  virtual std::string trailer() { return {}; }
};

// Answers with a chunked text/event-stream response that runs the generation as the client reads it.
void stream_generation(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, Generation g,
                       std::shared_ptr<StreamFramer> framer);
// Frames sent after the last choice's own frames (OpenAI with n > 1: the one usage chunk), before the trailer.
using ClosingFrames = std::function<std::vector<std::string>(const std::vector<GenerationOutcome>&)>;
// Several choices of one request (OpenAI `n`), one framer each, streamed one after the other: the engine runs
// them side by side as rows of its batch, so a later choice's tokens are waiting when its turn comes. The first
// framer's trailer ends the stream; a client that leaves cancels every choice.
void stream_choices(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, std::vector<Generation> gs,
                    std::vector<std::shared_ptr<StreamFramer>> framers, ClosingFrames closing);
// Runs the generation to the end (for a JSON reply).
GenerationOutcome run_blocking(ServerContext& ctx, const httplib::Request& req, Generation& g);

}  // namespace lathe::server
