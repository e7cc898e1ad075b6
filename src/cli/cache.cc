// lathe cache ls|verify|clear: inspect, check and empty an SSD prompt-cache directory
// (DIR/<identity>/<namespace>/<uuid>.lkv, cache/ssd_store.h) or single KV files, without loading a model.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/kv_file.h"
#include "cache/ssd_store.h"
#include "cli/verbs.h"
#include "common/error.h"

namespace lathe::cli {
namespace {

namespace fs = std::filesystem;

struct CacheCliOptions {
  std::string dir;
  std::vector<std::string> files;
  std::string identity;  // clear: only this identity's folder
  bool json = false;
  bool delete_invalid = false;
};

bool is_hex32(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

struct Found {
  std::string path, identity, ns;
  bool tmp = false;
};

// The files of the store layout under dir (nothing else is looked at, so nothing else is ever deleted).
std::vector<Found> walk(const std::string& dir) {
  std::vector<Found> out;
  if (!fs::is_directory(dir)) throw Error(ErrorKind::NotFound, dir + ": not a directory");
  for (const auto& id : fs::directory_iterator(dir)) {
    if (!id.is_directory() || !is_hex32(id.path().filename().string())) continue;
    for (const auto& ns : fs::directory_iterator(id.path())) {
      const std::string nsn = ns.path().filename().string();
      if (!ns.is_directory() || (nsn != "base" && !is_hex32(nsn))) continue;
      for (const auto& f : fs::directory_iterator(ns.path())) {
        const std::string p = f.path().string();
        const bool tmp = p.size() > 8 && p.compare(p.size() - 8, 8, ".lkv.tmp") == 0;
        const bool lkv = p.size() > 4 && p.compare(p.size() - 4, 4, ".lkv") == 0;
        if (f.is_regular_file() && (tmp || lkv)) out.push_back({p, id.path().filename().string(), nsn, tmp});
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const Found& a, const Found& b) { return a.path < b.path; });
  return out;
}

std::vector<Found> targets(const CacheCliOptions& o) {
  if (o.dir.empty() == o.files.empty()) throw Error(ErrorKind::InvalidArgument, "give --dir DIR or --file FILE");
  if (!o.dir.empty()) return walk(o.dir);
  std::vector<Found> out;
  for (const std::string& f : o.files) out.push_back({f, "", "", false});
  return out;
}

std::string kinds_of(const KvFileHeader& h) {
  std::map<std::string, int> n;
  for (const auto& c : h.caches) ++n[c.kind];
  std::string s;
  for (const auto& [k, c] : n) s += (s.empty() ? "" : ",") + k + "x" + std::to_string(c);
  return s;
}

std::string iso_time(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json describe(const Found& f, const KvFileHeader& h) {
  return {{"path", f.path},
          {"identity", f.identity},
          {"ns", h.meta.ns},
          {"model_id", h.meta.model_id},
          {"tokens", h.tokens.size()},
          {"caches", kinds_of(h)},
          {"trimmable", h.trimmable()},
          {"file_bytes", h.file_size},
          {"disk_bytes", disk_bytes_of(f.path)},
          {"created", iso_time(h.created_at_ms)}};
}

int list_or_verify(const CacheCliOptions& o, bool verify) {
  int bad = 0;
  nlohmann::json all = nlohmann::json::array();
  uint64_t total = 0;
  size_t count = 0;
  for (const Found& f : targets(o)) {
    ++count;
    nlohmann::json j;
    if (f.tmp) {
      j = {{"path", f.path}, {"status", "orphan"}, {"error", "an unfinished write (.tmp): removed at the next scan"}};
    } else {
      try {
        const KvFileHeader h = verify ? verify_kv_file(f.path) : read_kv_header(f.path);
        j = describe(f, h);
        j["status"] = "ok";
        total += disk_bytes_of(f.path);
      } catch (const Error& e) {
        ++bad;
        j = {{"path", f.path}, {"status", "invalid"}, {"error", e.what()}};
        if (o.delete_invalid) {
          std::error_code ec;
          fs::remove(f.path, ec);
          j["deleted"] = !ec;
        }
      }
    }
    if (o.json) {
      all.push_back(j);
    } else if (j["status"] == "ok") {
      std::printf("%s  %s tokens  %s  %s bytes on disk  model %s  ns %s  created %s\n", f.path.c_str(),
                  j["tokens"].dump().c_str(), j["caches"].get<std::string>().c_str(), j["disk_bytes"].dump().c_str(),
                  j["model_id"].get<std::string>().c_str(),
                  j["ns"].get<std::string>().empty() ? "base" : j["ns"].get<std::string>().c_str(),
                  j["created"].get<std::string>().c_str());
    } else {
      std::printf("%s  %s: %s\n", f.path.c_str(), j["status"].get<std::string>().c_str(),
                  j["error"].get<std::string>().c_str());
    }
  }
  if (o.json)
    std::printf("%s\n", nlohmann::json({{"files", all}, {"invalid", bad}, {"disk_bytes", total}}).dump().c_str());
  else
    std::printf("%zu file(s), %d invalid, %llu bytes on disk\n", count, bad, static_cast<unsigned long long>(total));
  return verify && bad > 0 ? 1 : 0;
}

int clear(const CacheCliOptions& o) {
  if (o.dir.empty()) throw Error(ErrorKind::InvalidArgument, "cache clear needs --dir DIR");
  size_t n = 0;
  uint64_t bytes = 0;
  for (const Found& f : walk(o.dir)) {
    if (!o.identity.empty() && f.identity != o.identity) continue;
    bytes += disk_bytes_of(f.path);
    std::error_code ec;
    if (fs::remove(f.path, ec)) ++n;
  }
  // Folders left empty go too (others' files keep theirs).
  for (const auto& id : fs::directory_iterator(o.dir)) {
    if (!id.is_directory() || !is_hex32(id.path().filename().string())) continue;
    std::error_code ec;
    for (const auto& ns : fs::directory_iterator(id.path(), ec))
      if (ns.is_directory() && fs::is_empty(ns.path(), ec)) fs::remove(ns.path(), ec);
    if (fs::is_empty(id.path(), ec)) fs::remove(id.path(), ec);
  }
  std::printf("removed %zu file(s), %llu bytes\n", n, static_cast<unsigned long long>(bytes));
  return 0;
}

}  // namespace

Verb add_cache(CLI::App& app) {
  auto o = std::make_shared<CacheCliOptions>();
  CLI::App* cmd = app.add_subcommand("cache", "list, verify or clear KV cache files (an --ssd-cache directory)");
  cmd->require_subcommand(1);
  auto where = [&](CLI::App* sub) {
    sub->add_option("--dir", o->dir, "the SSD cache directory");
    sub->add_option("--file", o->files, "a single KV file (repeatable) instead of --dir");
    sub->add_flag("--json", o->json, "print one JSON object");
  };
  CLI::App* ls = cmd->add_subcommand("ls", "list entries: tokens, cache kinds, bytes on disk, model, namespace");
  where(ls);
  CLI::App* verify = cmd->add_subcommand("verify", "check every header and tensor hash; exit 1 if any file fails");
  where(verify);
  verify->add_flag("--delete-invalid", o->delete_invalid, "delete the files that fail");
  CLI::App* clr = cmd->add_subcommand("clear", "delete the stored entries (and unfinished .tmp writes)");
  clr->add_option("--dir", o->dir, "the SSD cache directory")->required();
  clr->add_option("--identity", o->identity, "only this identity's folder (32 hex digits)");
  return {cmd, [o, ls, verify] {
            if (ls->parsed()) return list_or_verify(*o, false);
            if (verify->parsed()) return list_or_verify(*o, true);
            return clear(*o);
          }};
}

}  // namespace lathe::cli
