// The network side of `lathe serve`: an event-driven HTTP/1.1 front on Boost.Beast/Asio. One I/O thread reads
// every connection asynchronously (an idle or slow connection is a socket and a timer, never a thread), with a
// wait, header and body deadline and size limits; only a fully read request takes a worker from a bounded pool.
// Requests and responses are cpp-httplib's plain structs, so the route handlers are written against them; a
// chunked content provider is driven on the worker through a DataSink whose writes carry a stall deadline.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lathe::server {

struct FrontHooks {
  // Runs on the I/O thread once the headers are read and before the body is: true when res is the whole answer
  // (a refusal or a CORS preflight). A refusal that sets "Connection: close" has the body drained first.
  std::function<bool(const httplib::Request&, httplib::Response&)> pre_route;
  // True for a request answered on the I/O thread itself: only trivial routes that never block (/health), so
  // that they answer at once even when every worker is taken.
  std::function<bool(const httplib::Request&)> run_inline;
  // Runs on a worker (or inline, see above) with the body in req.body.
  std::function<void(const httplib::Request&, httplib::Response&)> handle;
  // Fills res with the error body for an answer the front makes itself (400, 431, 503).
  std::function<void(const httplib::Request&, httplib::Response&, int status, const std::string& message)> error;
  // Called once per answered request, after its response was sent (or abandoned).
  std::function<void(const httplib::Request&, const httplib::Response&)> log;
};

struct FrontOptions {
  size_t workers = 64;       // threads that run handlers (--http-threads)
  size_t max_pending = 256;  // fully read requests waiting for a worker before 503
  // Declared body bytes of the requests being read or handled, all connections together; a request that would
  // pass it gets 503 (one alone is always taken).
  uint64_t max_body_bytes_in_flight = uint64_t{256} << 20;
  // A chunked body (no declared length) is cut off with 413 past this many bytes, and reserves this much of the
  // in-flight budget until it has been read (--max-body-bytes).
  uint64_t max_chunked_body_bytes = uint64_t{16} << 20;
};

class HttpFront {
 public:
  HttpFront(FrontOptions options, FrontHooks hooks);
  ~HttpFront();
  // Binds host:port (0 = any free port) and returns the port. Throws Error(Io) on failure.
  int bind(const std::string& host, int port);
  // Serves until stop(); returns once every connection has ended and the workers are joined.
  void run();
  // Stops accepting, closes idle connections and lets the requests in flight finish (each then closes).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lathe::server
