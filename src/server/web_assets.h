// The web UI's files (web/ in the source tree), embedded into the binary at build time by
// cmake/EmbedWeb.cmake, so a single `lathe` binary serves its UI without files beside it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace lathe::server {

struct WebAsset {
  const char* path;  // relative to web/, with '/' separators: "index.html", "js/main.js"
  const unsigned char* data;
  size_t size;
};

const std::vector<WebAsset>& web_assets();

}  // namespace lathe::server
