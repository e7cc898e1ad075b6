// AtomicFile (io/atomic_file.h): a committed file has exactly what was written and no .tmp beside it; one that
// goes uncommitted leaves neither a .tmp nor a changed target; failures are OsErrors with their errno.
#include "io/atomic_file.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/os_error.h"
#include "support/kv_test_util.h"

namespace lathe {
namespace {

namespace afs = std::filesystem;

std::string atomic_test_read(const std::string& path) {
  const std::vector<uint8_t> b = kvtest::read_bytes(path);
  return std::string(b.begin(), b.end());
}

TEST(AtomicFile, CommitCreatesTheFileWithExactlyItsContentsAndNoTemporary) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/out.bin";
  {
    AtomicFile f(path);
    EXPECT_EQ(f.tmp_path(), path + ".tmp");
    EXPECT_TRUE(afs::exists(path + ".tmp"));
    EXPECT_FALSE(afs::exists(path));
    f.write("hello ", 6);
    f.write("world", 5);
    EXPECT_EQ(f.position(), 11u);
    f.write_at(0, "J", 1);  // does not move the position
    f.commit();
  }
  EXPECT_EQ(atomic_test_read(path), "Jello world");
  EXPECT_FALSE(afs::exists(path + ".tmp"));
}

TEST(AtomicFile, CommitTruncatesOrExtendsToTheSizeGiven) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/sized.bin";
  {
    AtomicFile f(path);
    f.write_at(4, "tail", 4);  // a hole before it reads as zeros
    f.commit(6);
  }
  EXPECT_EQ(atomic_test_read(path), std::string("\0\0\0\0ta", 6));
}

TEST(AtomicFile, CommitReplacesAnExistingFile) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/replaced.txt";
  kvtest::write_bytes(path, {'o', 'l', 'd', ' ', 'a', 'n', 'd', ' ', 'l', 'o', 'n', 'g'});
  {
    AtomicFile f(path);
    f.write("new", 3);
    f.commit();
  }
  EXPECT_EQ(atomic_test_read(path), "new");
  EXPECT_FALSE(afs::exists(path + ".tmp"));
}

TEST(AtomicFile, UncommittedLeavesNoTemporaryAndNoTarget) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/never.bin";
  {
    AtomicFile f(path);
    f.write("partial", 7);
  }
  EXPECT_FALSE(afs::exists(path + ".tmp"));
  EXPECT_FALSE(afs::exists(path));
}

TEST(AtomicFile, UncommittedLeavesAnExistingTargetIntact) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/kept.txt";
  kvtest::write_bytes(path, {'k', 'e', 'e', 'p'});
  try {
    AtomicFile f(path);
    f.write("replacement", 11);
    throw std::runtime_error("the writer failed halfway");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(atomic_test_read(path), "keep");
  EXPECT_FALSE(afs::exists(path + ".tmp"));
}

TEST(AtomicFile, OpeningInAMissingFolderIsAnOsErrorOfEnoent) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/no/such/folder/x.bin";
  try {
    AtomicFile f(path);
    ADD_FAILURE() << "nothing thrown";
  } catch (const OsError& e) {
    EXPECT_EQ(e.os_errno(), ENOENT) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_EQ(std::string(e.what()), path + ".tmp: " + std::strerror(ENOENT));
  }
}

TEST(AtomicFile, ARenameThatFailsIsAnOsErrorNamingBothPathsAndLeavesNoTemporary) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/taken";
  afs::create_directories(path + "/x");  // a rename onto a non-empty folder fails
  try {
    AtomicFile f(path);
    f.write("{}", 2);
    f.commit();
    ADD_FAILURE() << "nothing thrown";
  } catch (const OsError& e) {
    EXPECT_NE(e.os_errno(), 0) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("rename " + path + ".tmp -> " + path + ": ", 0), 0u) << e.what();
  }
  EXPECT_FALSE(afs::exists(path + ".tmp"));
  EXPECT_TRUE(afs::is_directory(path + "/x"));
}

TEST(AtomicFile, AWriteTheDiskCannotTakeIsAnOsErrorSayingWhatFailed) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/big.bin";
  const std::string block(8192, 'x');
  try {
    kvtest::FileSizeLimit limit(4096);  // writes past 4 KiB fail with EFBIG, as on a full disk
    AtomicFile f(path);
    f.write(block.data(), block.size());
    ADD_FAILURE() << "nothing thrown";
  } catch (const OsError& e) {
    EXPECT_EQ(e.os_errno(), EFBIG) << e.what();
    EXPECT_EQ(std::string(e.what()), path + ".tmp: write failed: " + std::strerror(EFBIG));
  }
  EXPECT_FALSE(afs::exists(path + ".tmp"));
  EXPECT_FALSE(afs::exists(path));
}

}  // namespace
}  // namespace lathe
