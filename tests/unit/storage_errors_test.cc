// Storage faults as a client sees them: a full disk or quota is 507 Insufficient Storage, a read-only or
// forbidden one a 500 that says so, any other I/O error a 500 in its own words (not "internal error"), on both
// surfaces; checked on the mapping and on real failing writes (/dev/full, a file-size limit under SQLite).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "common/error.h"
#include "common/os_error.h"
#include "jobs/event_log.h"
#include "jobs/job_store.h"
#include "server/api_error.h"
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

  // Errors that kept only their text: SQLite's, and strerror in messages of modules that raise plain Error(Io).
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "job store: database or disk is full")).status(), 507);
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "KV file write: No space left on device")).status(), 507);
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "cannot create d: Disk quota exceeded")).status(), 507);
  EXPECT_EQ(api_error_from(Error(ErrorKind::Io, "job store: attempt to write a readonly database")).code(),
            "storage_read_only");
  EXPECT_EQ(api_error_from(OsError(ENOSPC, "job store: database or disk is full")).status(), 507);
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

}  // namespace
}  // namespace lathe::server
