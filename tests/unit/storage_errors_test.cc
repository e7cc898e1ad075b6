// Storage faults as a client sees them: a full disk or quota is 507 Insufficient Storage, a read-only or
// forbidden one a 500 that says so, any other I/O error a 500 in its own words (not "internal error"), on both
// surfaces; checked on the mapping and on real failing writes (/dev/full, a file-size limit under SQLite and
// under a KV file, folders of mode 0555 under KV files, adapters and quantize outputs): each carries its errno
// (OsError), which is all the mapping reads.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "cache/kv_file.h"
#include "common/error.h"
#include "common/fixture_reference.h"
#include "common/os_error.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "jobs/event_log.h"
#include "jobs/job_store.h"
#include "lab/quantize/quantize_options.h"
#include "lab/train/adapter_writer.h"
#include "model/model.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "support/kv_test_util.h"

namespace lathe::server {
namespace {

namespace fs = std::filesystem;

// The ApiError the server answers for what `f` throws.
template <typename F>
ApiError storage_answer_of(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return api_error_from(e);
  }
  return ApiError(0, "nothing thrown");
}

bool storage_msg_starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(StorageErrors, FullIs507ReadOnlyAndDeniedSaySoOtherIoIsNotInternal) {
  for (int err : {ENOSPC, EDQUOT, EFBIG}) {
    const ApiError a = api_error_from(OsError("cannot append to job log jobs/job_1.ndjson", err));
    EXPECT_EQ(a.status(), 507) << err;
    EXPECT_EQ(a.code(), "insufficient_storage");
    EXPECT_TRUE(storage_msg_starts_with(a.what(), "insufficient storage")) << a.what();
    EXPECT_NE(std::string(a.what()).find(std::strerror(err)), std::string::npos) << a.what();
  }
  const ApiError ro = api_error_from(OsError("x.tmp", EROFS));
  EXPECT_EQ(ro.status(), 500);
  EXPECT_EQ(ro.code(), "storage_read_only");
  EXPECT_NE(std::string(ro.what()).find("read-only"), std::string::npos) << ro.what();
  const ApiError denied = api_error_from(OsError("x.tmp", EACCES));
  EXPECT_EQ(denied.status(), 500);
  EXPECT_EQ(denied.code(), "storage_permission_denied");
  EXPECT_NE(std::string(denied.what()).find("permission denied"), std::string::npos) << denied.what();

  // The errno decides, never the wording: an Io error without one is a plain io_error whatever it says, and an
  // OsError whose errno is no storage fault stays one even if its text reads like one.
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "KV file write: No space left on device")).code(), "io_error");
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "job store: attempt to write a readonly database")).code(), "io_error");
  EXPECT_EQ(api_error_from(OsError(EIO, "cannot create d: Disk quota exceeded")).code(), "io_error");
  EXPECT_EQ(storage_fault_of(Error(ErrorKind::Io, "x: Permission denied")), StorageFault::None);
  EXPECT_EQ(api_error_from(OsError(ENOSPC, "job store: database or disk is full")).status(), 507);
  EXPECT_EQ(api_error_from(OsError(EROFS, "job store: attempt to write a readonly database")).code(),
            "storage_read_only");
  // std::filesystem's errors carry their code.
  const fs::filesystem_error fe("cannot create directories", fs::path("d"),
                                std::error_code(ENOSPC, std::generic_category()));
  EXPECT_EQ(api_error_from(fe).status(), 507);

  // Other I/O: a 500 in its own words; a bug is still an internal error; the text of a client's error is not read.
  const ApiError io = api_error_from(OsError("model.safetensors", EIO));
  EXPECT_EQ(io.status(), 500);
  EXPECT_TRUE(storage_msg_starts_with(io.what(), "I/O error: model.safetensors: ")) << io.what();
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "out of host memory allocating 8 bytes")).code(), "io_error");
  EXPECT_TRUE(storage_msg_starts_with(api_error_from(Error(ErrorKind::Internal, "bug")).what(), "internal error: "));
  EXPECT_EQ(api_error_from(Error(ErrorKind::InvalidArgument, "name: Permission denied")).status(), 400);

  // Both surfaces' bodies.
  const ApiError full = api_error_from(OsError("w", ENOSPC));
  EXPECT_EQ(openai_error_body(full)["error"]["type"], "server_error");
  EXPECT_EQ(openai_error_body(full)["error"]["code"], "insufficient_storage");
  EXPECT_EQ(anthropic_error_body(full)["error"]["type"], "api_error");
}

TEST(StorageErrors, OutOfMemoryIs503InsufficientMemoryAndSaysItMayBeRetried) {
  const ApiError a = api_error_from(OsError("x.safetensors: mmap failed", ENOMEM));
  EXPECT_EQ(a.status(), 503);
  EXPECT_EQ(a.code(), "insufficient_memory");
  EXPECT_TRUE(storage_msg_starts_with(a.what(), "the server is out of memory; the request may be retried: "))
      << a.what();
  EXPECT_NE(std::string(a.what()).find("x.safetensors: mmap failed"), std::string::npos) << a.what();
  EXPECT_EQ(storage_fault_of(OsError("x", ENOMEM)), StorageFault::None);
  // A std::system_error's errno counts too; an Io error without one is read by its code, never its words.
  EXPECT_EQ(api_error_from(std::system_error(std::error_code(ENOMEM, std::generic_category()), "x")).status(), 503);
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "x: Cannot allocate memory")).code(), "io_error");
  // A std::bad_alloc (operator new, a container that cannot grow) is a 503 too, not an "internal error" 500.
  const ApiError b = api_error_from(std::bad_alloc());
  EXPECT_EQ(b.status(), 503);
  EXPECT_EQ(b.code(), "insufficient_memory");
  EXPECT_TRUE(storage_msg_starts_with(b.what(), "the server is out of memory; the request may be retried: "))
      << b.what();
  EXPECT_EQ(api_error_from(std::bad_array_new_length()).status(), 503);
  // The allocators' own failures carry ENOMEM (host buffers here; device and pinned host memory in CUDA builds).
  const ApiError host = api_error_from(OsError(ENOMEM, "out of host memory allocating 8 bytes"));
  EXPECT_EQ(host.status(), 503);
  EXPECT_NE(std::string(host.what()).find("out of host memory allocating 8 bytes"), std::string::npos) << host.what();
  EXPECT_EQ(openai_error_body(a)["error"]["type"], "server_error");
  EXPECT_EQ(openai_error_body(a)["error"]["code"], "insufficient_memory");
  EXPECT_EQ(anthropic_error_body(a)["error"]["type"], "api_error");
  // The answer tells a client when to retry; a shutting-down server does not (it is going away).
  httplib::Response res;
  write_error(res, a, Surface::OpenAI);
  EXPECT_EQ(res.status, 503);
  EXPECT_EQ(res.get_header_value("Retry-After"), "5");
  httplib::Response down;
  write_error(down, ApiError(503, "the server is shutting down", std::string(), "shutting_down"), Surface::Anthropic);
  EXPECT_FALSE(down.has_header("Retry-After"));
}

// Open descriptors of this process.
size_t storage_open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST(StorageErrors, AnAtomicWriteThatFailsClosesItsFileAndLeavesNoTemporary) {
  kvtest::TempDir dir;
  // A safetensors fill that throws halfway: the descriptor is closed and the temporary file removed.
  SafetensorsWriter w;
  w.add("a", DType::F32, Shape{4}, [](void* dst) { std::memset(dst, 0, 16); });
  w.add("b", DType::F32, Shape{4}, [](void*) { throw Error(ErrorKind::Internal, "fill failed"); });
  const size_t fds = storage_open_fds();
  EXPECT_THROW(w.write(dir.path + "/m.safetensors"), Error);
  EXPECT_EQ(storage_open_fds(), fds);
  EXPECT_FALSE(fs::exists(dir.path + "/m.safetensors.tmp"));
  EXPECT_FALSE(fs::exists(dir.path + "/m.safetensors"));
  // A rename onto a non-empty folder fails: an OsError with the errno, no temporary file left, no descriptor.
  fs::create_directories(dir.path + "/taken/x");
  const std::string text = "{}";
  try {
    write_file_atomic(dir.path + "/taken", text.data(), text.size());
    ADD_FAILURE() << "nothing thrown";
  } catch (const OsError& e) {
    EXPECT_NE(e.os_errno(), 0) << e.what();
  }
  EXPECT_EQ(storage_open_fds(), fds);
  EXPECT_FALSE(fs::exists(dir.path + "/taken.tmp"));
}

TEST(StorageErrors, AWriteToAFullDeviceIs507) {
  // /dev/full answers every write with ENOSPC, as a full disk does.
  const ApiError a = storage_answer_of([] { jobs::append_event("/dev/full", {{"event", "log"}, {"line", "x"}}); });
  EXPECT_EQ(a.status(), 507) << a.what();
  EXPECT_NE(std::string(a.what()).find("No space left on device"), std::string::npos) << a.what();
}

TEST(StorageErrors, AJobStoreThatCannotGrowIs507) {
  const fs::path dir = fs::temp_directory_path() / ("lathe_storage_errors_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    jobs::JobStore store(dir.string());
    const std::string id = store.create("noop", jobs::json::object()).id;
    ASSERT_TRUE(store.finish(id, jobs::JobStatus::Done, std::nullopt, std::nullopt));
    ApiError a(0, "");
    {
      kvtest::FileSizeLimit none(0);  // every write past 0 bytes fails with EFBIG
      a = storage_answer_of([&] { store.remove(id); });
    }
    EXPECT_EQ(a.status(), 507) << a.what();
    EXPECT_EQ(a.code(), "insufficient_storage");
    EXPECT_TRUE(store.remove(id));  // room again
  }
  fs::remove_all(dir);
}

// What `f` throws as an OsError (a failure if it throws something else or nothing).
template <typename F>
OsError storage_os_error_of(F f) {
  try {
    f();
  } catch (const OsError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an OsError: " << e.what();
    return OsError(0, e.what());
  }
  ADD_FAILURE() << "nothing thrown";
  return OsError(0, "nothing thrown");
}

// A folder of mode 0555 in a fresh temporary one: nothing can be created in it (except by root, which the tests
// that use it skip for). Made writable again on the way out so that it can be removed.
struct StorageReadOnlyDir {
  kvtest::TempDir parent;
  std::string path = parent.path + "/ro";
  StorageReadOnlyDir() {
    fs::create_directory(path);
    fs::permissions(path, fs::perms(0555));
  }
  ~StorageReadOnlyDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms(0755), ec);
  }
};

// The caches of the qwen3 fixture after a 64-token prompt, and the prompt.
struct StorageFilledCaches {
  std::unique_ptr<Model> model = load_model(testing::fixture_dir("qwen3-bf16"));
  CacheList caches = model->make_cache();
  std::vector<int32_t> ids = std::vector<int32_t>(64);
  StorageFilledCaches() {
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i + 1);
    model->forward(ids, caches, false);
  }
};

TEST(StorageErrors, AKvFileSavedIntoAReadOnlyFolderIsAnOsErrorOfEacces) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a folder of mode 0555";
  StorageFilledCaches s;
  StorageReadOnlyDir ro;
  const std::string path = ro.path + "/a.lkv";
  const OsError e = storage_os_error_of([&] { save_kv_file(path, s.ids, s.caches, {}); });
  EXPECT_EQ(e.os_errno(), EACCES) << e.what();
  EXPECT_EQ(e.kind(), ErrorKind::Io);
  EXPECT_EQ(std::string(e.what()), path + ".tmp: " + std::strerror(EACCES));  // the wording it always had
  const ApiError a = api_error_from(e);
  EXPECT_EQ(a.status(), 500);
  EXPECT_EQ(a.code(), "storage_permission_denied") << a.what();
}

TEST(StorageErrors, AKvFileWriteTheDiskCannotTakeIsAnOsErrorAnd507) {
  StorageFilledCaches s;
  kvtest::TempDir dir;
  const std::string path = dir.path + "/a.lkv";
  OsError e(0, "");
  {
    kvtest::FileSizeLimit limit(20000);  // past the header page, inside the first tensor: EFBIG, as a full disk
    e = storage_os_error_of([&] { save_kv_file(path, s.ids, s.caches, {}); });
  }
  EXPECT_EQ(e.os_errno(), EFBIG) << e.what();
  EXPECT_EQ(std::string(e.what()), path + ".tmp: write failed: " + std::strerror(EFBIG));
  const ApiError a = api_error_from(e);
  EXPECT_EQ(a.status(), 507) << a.what();
  EXPECT_EQ(a.code(), "insufficient_storage");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(StorageErrors, AKvFileThatMayNotBeReadIsAnOsErrorNamingIt) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads a file of mode 0000";
  StorageFilledCaches s;
  kvtest::TempDir dir;
  const std::string path = dir.path + "/a.lkv";
  save_kv_file(path, s.ids, s.caches, {});
  fs::permissions(path, fs::perms::none);
  const OsError e = storage_os_error_of([&] { read_kv_header(path); });
  EXPECT_EQ(e.os_errno(), EACCES) << e.what();
  EXPECT_EQ(std::string(e.what()), path + ": " + std::strerror(EACCES));  // the path prefix keeps the errno
  EXPECT_EQ(api_error_from(e).code(), "storage_permission_denied");
  // A file that is not there is still NotFound, not a storage fault.
  try {
    read_kv_header(dir.path + "/none.lkv");
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& nf) {
    EXPECT_EQ(nf.kind(), ErrorKind::NotFound) << nf.what();
    EXPECT_EQ(dynamic_cast<const OsError*>(&nf), nullptr);
  }
}

TEST(StorageErrors, AdapterAndQuantizeOutputsInAReadOnlyFolderAreOsErrorsOfEacces) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a folder of mode 0555";
  StorageReadOnlyDir ro;
  const std::string adapter = ro.path + "/adapter";
  const OsError w = storage_os_error_of([&] { train::write_adapter(adapter, {}, {}); });
  EXPECT_EQ(w.os_errno(), EACCES) << w.what();
  EXPECT_EQ(std::string(w.what()), "cannot create the adapter directory " + adapter + ": " + std::strerror(EACCES));
  EXPECT_EQ(api_error_from(w).code(), "storage_permission_denied");

  lab::QuantizeOptions q;
  q.source = testing::fixture_dir("qwen3-bf16");
  q.output = ro.path + "/q4";
  const OsError v = storage_os_error_of([&] { lab::validate_quantize_paths(q); });
  EXPECT_EQ(v.os_errno(), EACCES) << v.what();
  EXPECT_NE(std::string(v.what()).find("is not writable"), std::string::npos) << v.what();
  EXPECT_EQ(api_error_from(v).code(), "storage_permission_denied");
}

}  // namespace
}  // namespace lathe::server
