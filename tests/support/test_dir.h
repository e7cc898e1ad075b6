// A fresh directory per running test (named after the tag, the process and the test), removed at scope exit.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace lathe::testutil {

struct TestDir {
  std::filesystem::path path;
  explicit TestDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() / ("lathe_" + tag + "_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TestDir() { std::filesystem::remove_all(path); }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;
  std::string str(const std::string& sub = "") const { return sub.empty() ? path.string() : (path / sub).string(); }
};

}  // namespace lathe::testutil
