#include "server/host_check.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>

namespace lathe::server {
namespace {

std::string host_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool port_digits(const std::string& s) {
  return !s.empty() && s.size() <= 5 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Splits "name[:port]" or "[v6][:port]" into the name (brackets dropped); false when it is not that shape.
bool split_host_name(const std::string& value, std::string& name) {
  if (value.empty()) return false;
  if (value[0] == '[') {
    const size_t close = value.find(']');
    if (close == std::string::npos) return false;
    const std::string rest = value.substr(close + 1);
    if (!rest.empty() && (rest[0] != ':' || !port_digits(rest.substr(1)))) return false;
    name = value.substr(1, close - 1);
    return !name.empty();
  }
  const size_t colon = value.find(':');
  if (colon != std::string::npos && !port_digits(value.substr(colon + 1))) return false;
  name = value.substr(0, colon);
  return !name.empty();
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  std::string h = host_lower(host);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost") return true;
  // inet_pton takes dotted decimal only, so "0x7f.1" or "2130706433" are names here, not addresses.
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::string HostPolicy::refusal(const std::string& host) const {
  // Browsers always send Host; a client that sends none (HTTP/1.0 tools) is not a rebinding page.
  if (!check || host.empty()) return {};
  std::string name;
  if (!split_host_name(host_lower(host), name))
    return "Host header '" + host + "' is not a host name with an optional port";
  if (is_loopback_host(name)) return {};
  for (const std::string& a : allowed) {
    if (a == "*") return {};
    std::string want;
    if (split_host_name(host_lower(a), want) && want == name) return {};
  }
  return "Host '" + host +
         "' is not allowed: this server listens on a loopback address and answers only requests for localhost, "
         "127.0.0.1 or [::1] (a web page could reach it through DNS rebinding); start it with --allowed-host " +
         name + " to accept that name";
}

}  // namespace lathe::server
