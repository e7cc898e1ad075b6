// Whether the client of the request being handled on this thread has gone away. The handlers see only
// httplib::Request, so the socket is the one the HTTP front names for this worker thread (or, failing that, the
// one found by its peer address), then polled: a closed peer shows as POLLRDHUP or a zero-byte peek.
#pragma once
#include <string>

namespace lathe::server {

// Set by the HTTP front on the worker thread that runs a request (-1 after it).
void set_current_connection_fd(int fd);

class ConnectionWatch {
 public:
  ConnectionWatch(const std::string& remote_addr, int remote_port);
  // True once the peer has closed or reset the connection (false when the socket could not be found).
  bool closed();

 private:
  int fd_ = -1;
};

}  // namespace lathe::server
