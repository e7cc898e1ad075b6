// DNS rebinding: a page on evil.example can make its own name resolve to 127.0.0.1 and then talk to a loopback
// server as its own origin (no Origin header is sent for same-origin GETs, and CORS does not apply). The only
// sign left is the Host header, which still names evil.example. So a server bound to a loopback address answers
// only Host headers naming a loopback host (localhost, 127.x.x.x, [::1], any port) or one given with
// --allowed-host ("*" = any). A server bound elsewhere was exposed on purpose and checks no Host.
#pragma once
#include <string>
#include <vector>

namespace lathe::server {

// A bind address or Host name (no port; IPv6 with or without brackets) that is loopback: localhost,
// 127.0.0.0/8, ::1, ::ffff:127.x.x.x.
bool is_loopback_host(const std::string& host);

struct HostPolicy {
  bool check = false;                // the server is bound to loopback
  std::vector<std::string> allowed;  // --allowed-host names (a port is ignored), or "*"

  // Empty when the Host header value `host` (possibly with a port; empty = none sent) may be answered, else
  // the reason for the refusal.
  std::string refusal(const std::string& host) const;
};

}  // namespace lathe::server
