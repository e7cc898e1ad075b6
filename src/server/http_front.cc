#include "server/http_front.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <optional>
#include <unordered_set>
#include <utility>

#include <httplib.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/error.h"
#include "common/limits.h"
#include "common/log.h"
#include "server/connection.h"
#include "server/worker_pool.h"

namespace lathe::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// A refused upload is drained (not read) before the answer, like a lingering close: at most this much, and
// only while the client keeps sending.
constexpr size_t kDrainLimit = size_t{256} << 20;
constexpr auto kDrainIdle = std::chrono::milliseconds(1000);

// The status line's reason phrase, from Beast's table (codes it does not know get a generic phrase).
std::string reason(int status) {
  const http::status code = http::int_to_status(static_cast<unsigned>(status));
  if (code == http::status::unknown) return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  return std::string(http::obsolete_reason(code));
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX escapes; '+' is a space only in a query (in a path it is itself: stacked adapter ids use it).
std::string url_decode(std::string_view s, bool plus_is_space = true) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+' && plus_is_space) {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

void parse_query(std::string_view q, httplib::Params& params) {
  while (!q.empty()) {
    const size_t amp = q.find('&');
    const std::string_view part = q.substr(0, amp);
    if (!part.empty()) {
      const size_t eq = part.find('=');
      params.emplace(url_decode(part.substr(0, eq)),
                     eq == std::string_view::npos ? std::string() : url_decode(part.substr(eq + 1)));
    }
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
}

// Sends all of [p, p+n) on a non-blocking socket from a worker thread; false when the peer is gone or accepts
// nothing for the stall deadline (a reader that stopped reading frees its worker).
bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      const int r = ::poll(&pf, 1, limits::kWriteStallTimeoutSec * 1000);
      if (r <= 0 || (pf.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

bool peer_gone(int fd) {
  pollfd pf{fd, static_cast<short>(POLLRDHUP), 0};
  return ::poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// The status line and headers: a chunked body, one of `length` bytes, or (neither) one that ends with the
// connection.
std::string head(const httplib::Response& res, int status, bool keep_alive, std::optional<size_t> length,
                 bool chunked = false) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
  for (const auto& [k, v] : res.headers) {
    if (iequals(k, "Connection") || iequals(k, "Content-Length") || iequals(k, "Transfer-Encoding")) continue;
    h += k + ": " + v + "\r\n";
  }
  if (chunked)
    h += "Transfer-Encoding: chunked\r\n";
  else if (length && status >= 200 && status != 204 && status != 304)
    h += "Content-Length: " + std::to_string(*length) + "\r\n";
  // The idle timeout is announced so that clients (undici, requests) retire a connection before the server closes
  // it, instead of sending a request into the close.
  h += keep_alive ? "Connection: keep-alive\r\nKeep-Alive: timeout=" + std::to_string(limits::kKeepAliveIdleSec) +
                        ", max=" + std::to_string(limits::kKeepAliveMaxRequests) + "\r\n"
                  : "Connection: close\r\n";
  h += "\r\n";
  return h;
}

}  // namespace

struct HttpFront::Impl {
  FrontOptions options;
  FrontHooks hooks;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_pause{ioc};  // out of descriptors: accept again after a pause, not in a spin
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  WorkerPool pool;
  bool stopping = false;    // I/O thread only
  uint64_t body_bytes = 0;  // declared body bytes of the requests read or handled now (I/O thread only)
  // Accept failures (out of descriptors) since the last warning, and when it was: one line per 10 s, not per
  // 100 ms pause, however long the shortage lasts (I/O thread only).
  uint64_t accept_failures = 0;
  std::chrono::steady_clock::time_point accept_warned{};
  struct Session;
  std::unordered_set<Session*> sessions;  // I/O thread only

  Impl(FrontOptions o, FrontHooks h)
      : options(o), hooks(std::move(h)), guard(asio::make_work_guard(ioc)), pool(o.workers, o.max_pending) {}

  void accept();
  void session_ended(Session* s) {
    sessions.erase(s);
    maybe_finish();
  }
  void maybe_finish() {
    if (stopping && sessions.empty()) guard.reset();
  }
};

// One connection, driven on the I/O thread except while a worker runs its request (then the I/O thread leaves
// the socket alone until the worker posts back).
struct HttpFront::Impl::Session : std::enable_shared_from_this<Session> {
  Impl& front;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  std::optional<http::request_parser<http::string_body>> parser;
  std::shared_ptr<httplib::Request> req;
  std::shared_ptr<httplib::Response> res;
  std::string remote_addr;
  int remote_port = -1;
  size_t served = 0;
  bool busy = false;  // a worker owns the request (or a response is being written)
  bool closed = false;
  std::string out;             // the bytes of a response being written asynchronously
  uint64_t body_reserved = 0;  // this request's share of front.body_bytes
  asio::steady_timer pause;    // the drain's idle limit

  Session(Impl& f, tcp::socket s) : front(f), stream(std::move(s)), pause(stream.get_executor()) {
    beast::error_code ec;
    const auto ep = stream.socket().remote_endpoint(ec);
    if (!ec) {
      remote_addr = ep.address().is_v6() && ep.address().to_v6().is_v4_mapped()
                        ? asio::ip::make_address_v4(asio::ip::v4_mapped, ep.address().to_v6()).to_string()
                        : ep.address().to_string();
      remote_port = ep.port();
    }
    stream.socket().set_option(tcp::no_delay(true), ec);
  }

  int fd() { return stream.socket().native_handle(); }

  void release_body() {
    front.body_bytes -= body_reserved;
    body_reserved = 0;
  }

  void close() {
    if (closed) return;
    closed = true;
    release_body();
    pause.cancel();
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream.socket().close(ec);
    front.session_ended(this);
  }

  // Called by stop(): an idle connection closes now; one mid-request closes after its answer.
  void stop() {
    if (!busy) close();
  }

  void next_request() {
    if (front.stopping || served >= limits::kKeepAliveMaxRequests) return close();
    req = std::make_shared<httplib::Request>();
    res = std::make_shared<httplib::Response>();
    parser.emplace();
    parser->header_limit(static_cast<std::uint32_t>(limits::kHeaderMaxBytes));
    parser->body_limit(std::numeric_limits<std::uint64_t>::max());  // the pre-route check enforces the limit
    if (buffer.size() > 0) return read_header();
    // Wait for the first byte: a kept-alive connection gets the idle timeout, a new one the header deadline.
    stream.expires_after(std::chrono::seconds(served == 0 ? limits::kHeaderReadTimeoutSec : limits::kKeepAliveIdleSec));
    stream.async_read_some(buffer.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec || self->closed) return self->close();
      self->buffer.commit(n);
      self->read_header();
    });
  }

  void read_header() {
    stream.expires_after(std::chrono::seconds(limits::kHeaderReadTimeoutSec));
    http::async_read_header(stream, buffer, *parser,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (closed) return;
    if (ec == http::error::header_limit) return refuse(431, "request headers are too large");
    if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset)
      return close();
    if (ec) return refuse(400, "bad request");
    const auto& msg = parser->get();
    req->method = std::string(msg.method_string());
    req->target = std::string(msg.target());
    req->version = msg.version() == 10 ? "HTTP/1.0" : "HTTP/1.1";
    const size_t q = req->target.find('?');
    req->path = url_decode(std::string_view(req->target).substr(0, q), false);
    if (q != std::string::npos) parse_query(std::string_view(req->target).substr(q + 1), req->params);
    for (const auto& f : msg) req->headers.emplace(std::string(f.name_string()), std::string(f.value()));
    req->remote_addr = remote_addr;
    req->remote_port = remote_port;
    if (front.hooks.pre_route(*req, *res)) {
      const bool close_after = iequals(res->get_header_value("Connection"), "close") || !parser->is_done();
      if (!close_after) return write_fixed(keep_alive());  // a refusal honours "Connection: close" too
      const auto len = parser->content_length();
      return drain(len ? std::min<uint64_t>(*len, kDrainLimit) : kDrainLimit);
    }
    // The body is held from here until the answer is sent: refused (and drained) when every connection's
    // together would pass the budget. A chunked one declares no length: it may grow to the limit, so it reserves
    // that much until it is read.
    if (parser->chunked()) parser->body_limit(front.options.max_chunked_body_bytes);
    const uint64_t declared = parser->chunked() ? front.options.max_chunked_body_bytes : 0;
    if (const uint64_t len = parser->content_length().value_or(declared); len > 0) {
      if (front.body_bytes > 0 && front.body_bytes + len > front.options.max_body_bytes_in_flight) {
        front.hooks.error(*req, *res, 503, "the server is busy reading other request bodies; retry");
        res->status = 503;
        res->set_header("Retry-After", "1");
        return drain(parser->is_done() ? 0 : std::min<uint64_t>(len, kDrainLimit));
      }
      body_reserved = len;
      front.body_bytes += len;
    }
    if (parser->is_done()) return dispatch();
    if (iequals(req->get_header_value("Expect"), "100-continue")) {
      out = "HTTP/1.1 100 Continue\r\n\r\n";
      stream.expires_after(std::chrono::seconds(limits::kWriteStallTimeoutSec));
      asio::async_write(stream, asio::buffer(out), [self = shared_from_this()](beast::error_code e, size_t) {
        if (e || self->closed) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    stream.expires_after(std::chrono::seconds(limits::kBodyReadTimeoutSec));
    http::async_read(stream, buffer, *parser, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->closed) return;
      if (ec == beast::error::timeout || ec == asio::error::eof || ec == http::error::end_of_stream ||
          ec == http::error::partial_message || ec == asio::error::operation_aborted ||
          ec == asio::error::connection_reset)
        return self->close();
      if (ec == http::error::body_limit) {  // a chunked body past --max-body-bytes: answered, then drained
        self->front.hooks.error(*self->req, *self->res, 413,
                                "request body is too large (the limit is " +
                                    std::to_string(self->front.options.max_chunked_body_bytes) +
                                    " bytes, see --max-body-bytes)");
        self->res->status = 413;
        return self->drain(kDrainLimit);
      }
      if (ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension)
        return self->refuse(400, "malformed chunked request body (" + ec.message() + ")");
      if (ec) return self->refuse(400, "bad request");
      self->req->body = std::move(self->parser->get().body());
      if (self->body_reserved > self->req->body.size()) {  // a chunked body gives back what it did not use
        self->front.body_bytes -= self->body_reserved - self->req->body.size();
        self->body_reserved = self->req->body.size();
      }
      self->dispatch();
    });
  }

  // Reads and discards up to `left` bytes while the client keeps sending, then answers and closes. The pause is
  // timed apart from the stream (a stream timeout closes the socket, and the answer must still go out).
  void drain(uint64_t left) {
    const size_t have = std::min<size_t>(buffer.size(), left);
    buffer.consume(have);
    left -= have;
    if (left == 0) return write_fixed(false);
    stream.expires_never();
    pause.expires_after(kDrainIdle);
    pause.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && !self->closed) self->stream.socket().cancel();
    });
    stream.async_read_some(buffer.prepare(std::min<uint64_t>(left, 65536)),
                           [self = shared_from_this(), left](beast::error_code ec, size_t n) {
                             self->pause.cancel();
                             if (self->closed) return;
                             if (ec) return self->write_fixed(false);
                             self->buffer.commit(n);
                             self->drain(left);
                           });
  }

  // An answer the front makes itself; the connection closes after it.
  void refuse(int status, const std::string& message) {
    res = std::make_shared<httplib::Response>();
    if (!req) req = std::make_shared<httplib::Request>();
    front.hooks.error(*req, *res, status, message);
    res->status = status;
    write_fixed(false);
  }

  bool keep_alive() const {
    return !front.stopping && served + 1 < limits::kKeepAliveMaxRequests && parser && parser->get().keep_alive() &&
           !iequals(res->get_header_value("Connection"), "close");
  }

  void dispatch() {
    if (front.hooks.run_inline && front.hooks.run_inline(*req)) {
      front.hooks.handle(*req, *res);
      if (res->status <= 0) res->status = 200;
      return write_fixed(keep_alive());
    }
    busy = true;
    const bool queued = front.pool.try_submit([self = shared_from_this()] { self->work(); });
    if (!queued) {
      busy = false;
      front.hooks.error(*req, *res, 503, "the server is busy: every worker is taken (see --http-threads)");
      res->status = 503;
      res->set_header("Retry-After", "1");
      write_fixed(keep_alive());
    }
  }

  // On a worker: the handler, then a streamed body is sent from here; a fixed one goes back to the I/O thread.
  void work() {
    set_current_connection_fd(fd());
    try {
      front.hooks.handle(*req, *res);
    } catch (const std::exception& e) {  // the handler hook maps its own errors; this is the last resort
      log::error(std::string("request handler: ") + e.what());
      res = std::make_shared<httplib::Response>();  // the old one's releaser (if any) runs now
      front.hooks.error(*req, *res, 500, "internal error");
      res->status = 500;
    }
    if (res->status <= 0) res->status = 200;
    if (!res->content_provider_) {
      set_current_connection_fd(-1);
      asio::post(stream.get_executor(), [self = shared_from_this()] { self->write_fixed(self->keep_alive()); });
      return;
    }
    const bool ok = stream_body();
    set_current_connection_fd(-1);
    asio::post(stream.get_executor(), [self = shared_from_this(), ok] { self->finished(ok && self->keep_alive()); });
  }

  // Sends a content provider's body; true when the connection may serve another request afterwards.
  bool stream_body() {
    httplib::Response& r = *res;
    // An HTTP/1.0 client cannot take chunks: its body is sent as is and ends with the connection.
    const bool chunked = r.is_chunked_content_provider_ && req->version != "HTTP/1.0";
    const bool sized = !r.is_chunked_content_provider_;
    const bool is_head = req->method == "HEAD";
    const bool keep = chunked || sized;
    const std::string h =
        head(r, r.status, keep, sized ? std::optional<size_t>(r.content_length_) : std::nullopt, chunked);
    const int sock = fd();
    if (!send_all(sock, h.data(), h.size())) return false;
    if (is_head) return keep;
    bool ok = true, done = false;
    size_t offset = 0;
    httplib::DataSink sink;
    sink.write = [&](const char* d, size_t n) {
      if (!ok) return false;
      if (n == 0) return true;
      std::string piece;
      if (chunked) {
        char size[32];
        std::snprintf(size, sizeof size, "%zx\r\n", n);
        piece = size;
      }
      piece.append(d, n);
      if (chunked) piece += "\r\n";
      ok = send_all(sock, piece.data(), piece.size());
      offset += n;
      return ok;
    };
    sink.done = [&] {
      if (done) return;
      done = true;
      if (ok && chunked) ok = send_all(sock, "0\r\n\r\n", 5);
    };
    sink.is_writable = [&] { return ok && !peer_gone(sock); };
    while (ok && !done && !(sized && offset >= r.content_length_)) {
      if (!r.content_provider_(offset, sized ? r.content_length_ - offset : 0, sink)) ok = false;
    }
    r.content_provider_success_ = ok;
    return ok && keep;
  }

  void write_fixed(bool keep) {
    busy = true;
    const bool is_head = req && req->method == "HEAD";
    out = head(*res, res->status, keep, res->body.size());
    // The body goes out from the response itself (alive until finished()), not copied behind the head.
    const std::array<asio::const_buffer, 2> bytes{asio::buffer(out),
                                                  is_head ? asio::const_buffer() : asio::buffer(res->body)};
    stream.expires_after(std::chrono::seconds(limits::kWriteStallTimeoutSec));
    asio::async_write(stream, bytes,
                      [self = shared_from_this(), keep](beast::error_code ec, size_t) { self->finished(keep && !ec); });
  }

  void finished(bool keep) {
    busy = false;
    ++served;
    if (req) front.hooks.log(*req, *res);
    release_body();
    req.reset();
    res.reset();  // a streamed response's releaser runs here, after the last byte
    out.clear();
    if (closed) return;
    if (!keep) {
      // Half-close first, so the answer is not lost to a reset while unread input is still arriving.
      beast::error_code ec;
      stream.socket().shutdown(tcp::socket::shutdown_send, ec);
      return close();
    }
    next_request();
  }
};

void HttpFront::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (stopping || !acceptor.is_open()) return;
    if (!ec) {
      auto s = std::make_shared<Session>(*this, std::move(socket));
      sessions.insert(s.get());
      s->next_request();
    } else if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space ||
               ec == asio::error::no_memory) {
      // The pending connections wait in the backlog until descriptors are free again (see ulimit -n).
      ++accept_failures;
      const auto now = std::chrono::steady_clock::now();
      if (accept_warned == std::chrono::steady_clock::time_point{} || now - accept_warned >= std::chrono::seconds(10)) {
        log::warn("accept: " + ec.message() + "; new connections wait in the backlog (" +
                  std::to_string(accept_failures) + " pauses of 100 ms since the last warning; see ulimit -n)");
        accept_failures = 0;
        accept_warned = now;
      }
      accept_pause.expires_after(std::chrono::milliseconds(100));
      accept_pause.async_wait([this](beast::error_code e) {
        if (!e && !stopping) accept();
      });
      return;
    }
    accept();
  });
}

HttpFront::HttpFront(FrontOptions options, FrontHooks hooks)
    : impl_(std::make_unique<Impl>(options, std::move(hooks))) {}

HttpFront::~HttpFront() { impl_->pool.shutdown(); }

int HttpFront::bind(const std::string& host, int port) {
  beast::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  const std::string where = host + ":" + std::to_string(port);
  if (ec || found.empty()) throw Error(ErrorKind::Io, "cannot resolve " + host + ": " + ec.message());
  const tcp::endpoint ep = found.begin()->endpoint();
  tcp::acceptor& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);  // no SO_REUSEPORT: never share a port
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error(ErrorKind::Io,
                port == 0 ? "cannot bind " + host + " on any port: " + ec.message()
                          : "cannot bind " + where + " (is another server running there? try --port): " + ec.message());
  }
  return a.local_endpoint().port();
}

void HttpFront::run() {
  asio::post(impl_->ioc, [this] { impl_->accept(); });
  impl_->ioc.run();
  impl_->pool.shutdown();
}

void HttpFront::stop() {
  asio::post(impl_->ioc, [this] {
    Impl& f = *impl_;
    if (f.stopping) return;
    f.stopping = true;
    beast::error_code ec;
    f.acceptor.close(ec);
    f.accept_pause.cancel();
    // Copy: a session that closes removes itself from the set.
    std::vector<std::shared_ptr<Impl::Session>> all;
    for (Impl::Session* s : f.sessions) all.push_back(s->shared_from_this());
    for (auto& s : all) asio::post(s->stream.get_executor(), [s] { s->stop(); });
    f.maybe_finish();
  });
}

}  // namespace lathe::server
