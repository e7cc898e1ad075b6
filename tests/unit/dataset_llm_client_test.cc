// The dataset job's loopback HTTP client (lab/dataset/llm_client.h) against scripted sockets: a chat completion
// request carries the key, thinking off and the sampling fields; an error answer is named; a server that never
// answers times out; an answer over the size cap and a refused connection are Io errors; URLs are checked.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "common/error.h"
#include "lab/dataset/llm_client.h"

namespace lathe::dataset {
namespace dataset_client_test {

// One listening socket on loopback; `serve` gets each accepted connection's fd in turn (closed after it returns).
struct ScriptedServer {
  int fd = -1;
  int port = 0;
  std::thread thread;
  explicit ScriptedServer(std::function<void(int)> serve) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd, 4);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread([this, serve] {
      while (true) {
        const int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) return;
        serve(c);
        ::close(c);
      }
    });
  }
  ~ScriptedServer() {
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    thread.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

// Reads one request (headers and a Content-Length body).
std::string read_request(int c) {
  std::string req;
  char buf[4096];
  while (true) {
    const size_t end = req.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t cl = req.find("Content-Length: ");
      const size_t want = cl == std::string::npos ? 0 : std::stoul(req.substr(cl + 16));
      if (req.size() >= end + 4 + want) return req;
    }
    const ssize_t n = ::read(c, buf, sizeof buf);
    if (n <= 0) return req;
    req.append(buf, static_cast<size_t>(n));
  }
}

void write_all(int c, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(c, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string response(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

std::string io_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(error_kind_name(e.kind())) + ": " + e.what();
  }
  return "";
}

TEST(DatasetLlmClient, SendsAChatCompletionAndReadsTheReply) {
  std::string seen;
  {
    ScriptedServer s([&](int c) {
      seen = read_request(c);
      write_all(c, response(200, R"({"choices":[{"message":{"role":"assistant","content":"HI"}}]})"));
    });
    LlmClient client({s.url(), "k3y"});
    EXPECT_EQ(client.chat(jobs::json::array({{{"role", "user"}, {"content", "hi"}}}), {100, 0.25}), "HI");
  }
  EXPECT_TRUE(seen.starts_with("POST /v1/chat/completions HTTP/1.1\r\n")) << seen;
  EXPECT_NE(seen.find("Authorization: Bearer k3y\r\n"), std::string::npos) << seen;
  const jobs::json body = jobs::json::parse(seen.substr(seen.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["max_tokens"], 100);
  EXPECT_EQ(body["temperature"], 0.25);
  EXPECT_EQ(body["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_EQ(body["messages"][0]["content"], "hi");
}

TEST(DatasetLlmClient, ABusyServerIsAskedAgain) {
  int calls = 0;
  ScriptedServer s([&](int c) {
    read_request(c);
    if (++calls < 3)
      write_all(c, response(429, R"({"error":{"message":"queue full"}})"));
    else
      write_all(c, response(200, R"({"choices":[{"message":{"content":"OK"}}]})"));
  });
  LlmClientLimits l;
  l.busy_pause = std::chrono::milliseconds(5);
  EXPECT_EQ(LlmClient({s.url(), ""}, l).chat(jobs::json::array(), {}), "OK");
  EXPECT_EQ(calls, 3);
  l.busy_retries = 1;
  calls = -10;  // busy for longer than one retry
  const std::string e = io_error([&] { LlmClient({s.url(), ""}, l).chat(jobs::json::array(), {}); });
  EXPECT_NE(e.find("HTTP 429: queue full"), std::string::npos) << e;
}

TEST(DatasetLlmClient, ErrorsTimeoutsCapsAndRefusals) {
  {
    ScriptedServer s([](int c) {
      read_request(c);
      write_all(c, response(400, R"({"error":{"message":"prompt too long","type":"invalid_request_error"}})"));
    });
    const std::string e = io_error([&] { LlmClient({s.url(), ""}).chat(jobs::json::array(), {}); });
    EXPECT_NE(e.find("HTTP 400: prompt too long"), std::string::npos) << e;
  }
  {
    ScriptedServer s([](int c) {
      read_request(c);
      std::this_thread::sleep_for(std::chrono::milliseconds(800));  // never answers in time
    });
    LlmClientLimits l;
    l.exchange_timeout = std::chrono::milliseconds(200);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = io_error([&] { LlmClient({s.url(), ""}, l).post("/v1/chat/completions", "{}"); });
    EXPECT_NE(e.find("io: "), std::string::npos) << e;
    EXPECT_NE(e.find("no full answer within the timeout"), std::string::npos) << e;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(700));
  }
  {
    ScriptedServer s([](int c) {
      read_request(c);
      write_all(c, response(200, std::string(4096, 'x')));
    });
    LlmClientLimits l;
    l.max_response_bytes = 1024;
    const std::string e = io_error([&] { LlmClient({s.url(), ""}, l).post("/x", "{}"); });
    EXPECT_NE(e.find("larger than 1024 bytes"), std::string::npos) << e;
  }
  int free_port;
  {
    ScriptedServer s([](int) {});
    free_port = s.port;  // closed when s goes
  }
  const std::string refused = io_error([&] {
    LlmClient({"http://127.0.0.1:" + std::to_string(free_port), ""}).post("/x", "{}");
  });
  EXPECT_NE(refused.find("io: "), std::string::npos) << refused;
  EXPECT_NE(io_error([] { LlmClient({"https://example.com", ""}); }).find("invalid_argument"), std::string::npos);
  EXPECT_NE(io_error([] { LlmClient({"http://:80", ""}); }).find("invalid_argument"), std::string::npos);
}

}  // namespace dataset_client_test
}  // namespace lathe::dataset
