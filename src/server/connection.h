// Whether the client of the request being handled on this thread has gone away. cpp-httplib does not expose a
// request's socket, so it is found once by its peer address and then polled: a closed peer shows as POLLRDHUP
// or a zero-byte peek.
#pragma once
#include <string>

namespace lathe::server {

class ConnectionWatch {
 public:
  ConnectionWatch(const std::string& remote_addr, int remote_port);
  // True once the peer has closed or reset the connection (false when the socket could not be found).
  bool closed();
  // Reads and discards what the client is still sending (up to max_bytes, until it pauses for idle_ms or
  // closes), so a response sent before its body was read reaches it instead of being lost to a TCP reset.
  void drain(size_t max_bytes, int idle_ms);

 private:
  int fd_ = -1;
};

}  // namespace lathe::server
