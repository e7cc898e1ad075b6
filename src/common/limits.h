// Every limit lathe puts on outside input, in one place (docs/security.md lists them with the reasons). A limit
// here is a ceiling against hostile or broken input, set well above anything a real model or client needs.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lathe::limits {

// --- JSON (request bodies, config.json, tokenizer.json, tokenizer_config.json, safetensors headers) ---
// Nesting depth: real requests and configs nest < 20 deep; recursive consumers (templates, tojson) stay far
// from the stack's end.
inline constexpr int kJsonMaxDepth = 128;
// Keys in one object: ordered_json checks duplicates linearly, so this also bounds the quadratic cost.
inline constexpr size_t kJsonMaxObjectKeys = 10000;
// Values in one document (every scalar, array and object counts once).
inline constexpr size_t kJsonRequestMaxValues = size_t{1} << 20;
// Model files are larger: a tokenizer.json holds ~150k vocab entries and ~150k merges.
inline constexpr size_t kJsonFileMaxValues = size_t{16} << 20;
inline constexpr size_t kJsonFileMaxObjectKeys = size_t{4} << 20;
inline constexpr size_t kJsonFileMaxDepth = 256;
// Size of a JSON model file read whole (tokenizer.json of the largest vocabularies is ~30 MB).
inline constexpr size_t kJsonFileMaxBytes = size_t{512} << 20;
// A safetensors header (the JSON before the tensor data).
inline constexpr size_t kSafetensorsHeaderMaxBytes = size_t{100} << 20;

// --- requests ---
inline constexpr size_t kLogitBiasMaxEntries = 1024;  // OpenAI documents 300; clients send a handful
inline constexpr size_t kStopSequencesMax = 16;

// --- HTTP ---
inline constexpr int kHeaderReadTimeoutSec = 10;             // a new connection's first byte, and then its whole header
inline constexpr size_t kHeaderMaxBytes = size_t{64} << 10;  // request line + headers (431 above)
inline constexpr int kBodyReadTimeoutSec = 60;               // the whole body, once the header is in
// Request bodies being read or handled, all connections together (declared lengths; at least 4 bodies of
// --max-body-bytes): each is bounded, but a thousand connections each sending 16 MB held 16 GB.
inline constexpr uint64_t kBodiesInFlightMaxBytes = uint64_t{256} << 20;
inline constexpr int kWriteStallTimeoutSec = 30;  // a response write that sends nothing this long ends the connection
inline constexpr size_t kKeepAliveMaxRequests = 1000;
inline constexpr int kKeepAliveIdleSec = 3;  // an idle keep-alive connection is closed after this (and at shutdown)
inline constexpr int kShutdownTimeoutSecDefault = 10;

// --- LoRA adapters mounted over HTTP ---
// Each mount holds its own copy of the factors (one folder under two ids counts twice), so the mounted
// adapters' files together may take a quarter of the memory available at start, and at least this much.
inline constexpr uint64_t kMountedAdaptersMinBudgetBytes = uint64_t{256} << 20;

// --- jobs (/api/jobs) ---
// A job's config is paths and numbers; its row (and a failure message that may echo a path) is kept until
// deleted and returned by every listing of up to 1,000 jobs.
inline constexpr size_t kJobConfigMaxBytes = size_t{16} << 10;
// Jobs waiting to run (they run one at a time): beyond, a submit is a 429.
inline constexpr size_t kJobsMaxQueued = 256;

// --- tokenizer files ---
// Vocabulary ids: the largest real vocabularies are ~260k; ids index dense tables, so they are bounded.
inline constexpr int64_t kTokenizerMaxId = int64_t{1} << 22;

// --- Jinja rendering (per render) ---
inline constexpr uint64_t kJinjaMaxSteps = 5'000'000;             // statements + expressions evaluated
inline constexpr size_t kJinjaMaxOutputBytes = size_t{64} << 20;  // rendered text and any one string
inline constexpr size_t kJinjaMaxListItems = size_t{1} << 20;     // any one list (range() keeps its own 2^20)
inline constexpr int kJinjaMaxParseDepth = 256;                   // nested expressions / blocks in a template
inline constexpr int kJinjaMaxCallDepth = 128;                    // macro recursion
inline constexpr int kJinjaMaxValueDepth = 512;  // lists/dicts nested in a value that repr, ==, tojson walk
inline constexpr size_t kJinjaMaxSourceBytes = size_t{4} << 20;  // a template's source text

// --- model config ---
inline constexpr int64_t kConfigMaxDim = int64_t{1} << 20;        // hidden sizes, head counts, layers
inline constexpr int64_t kConfigMaxPositions = int64_t{1} << 24;  // max_position_embeddings

}  // namespace lathe::limits
