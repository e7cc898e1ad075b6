// previous_response_id: the conversations /v1/responses answered, kept in process for an hour, least recently
// used first out once they hold more than 32 MiB (JSON size of input + output).
#pragma once
#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace lathe::server {

struct StoredResponse {
  nlohmann::ordered_json messages;  // the effective chat messages: input (after splicing) + the reply
  std::string instructions;
};

class ResponsesStore {
 public:
  static constexpr size_t kMaxBytes = 32u << 20;
  static constexpr std::chrono::seconds kTtl{3600};

  void put(const std::string& id, StoredResponse r);
  std::optional<StoredResponse> get(const std::string& id);

 private:
  struct Entry {
    StoredResponse value;
    size_t bytes;
    std::chrono::steady_clock::time_point at;
    std::list<std::string>::iterator lru;
  };
  std::mutex mu_;
  std::unordered_map<std::string, Entry> map_;
  std::list<std::string> lru_;  // most recent first
  size_t bytes_ = 0;
};

}  // namespace lathe::server
