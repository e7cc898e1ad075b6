// serve --job-root: every path a job config names must resolve inside a root, symlinks followed, '..' refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "jobs/job_paths.h"
#include "support/test_dir.h"

namespace lathe::jobs {
namespace {

namespace fs = std::filesystem;

std::string refusal(const JobKind& kind, const json& config, const std::vector<std::string>& roots) {
  try {
    check_job_paths(kind, config, roots);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JobPaths, PathsMustResolveInsideARoot) {
  testutil::TestDir d("job-paths");
  fs::create_directories(d.path / "root" / "models");
  fs::create_directories(d.path / "elsewhere");
  fs::create_symlink(d.path / "elsewhere", d.path / "root" / "escape");
  JobKind kind;
  kind.name = "quantize";
  kind.path_fields = {"model", "out"};
  const std::vector<std::string> roots = {d.str("root")};
  const std::string root = d.str("root");

  EXPECT_EQ(refusal(kind, {{"model", root + "/models"}, {"out", root + "/new/q4"}, {"bits", 4}}, roots), "");
  EXPECT_EQ(refusal(kind, {{"model", d.str("elsewhere")}}, {}), "") << "no roots: anywhere";
  EXPECT_NE(refusal(kind, {{"model", d.str("elsewhere")}}, roots)
                .find("'model': '" + d.str("elsewhere") + "' is outside the job roots"),
            std::string::npos);
  EXPECT_NE(refusal(kind, {{"out", root + "/escape/q4"}}, roots).find("outside the job roots"), std::string::npos)
      << "a symlink inside a root that leads out of it";
  EXPECT_NE(refusal(kind, {{"out", root + "/models/../../elsewhere"}}, roots).find("must not contain '..'"),
            std::string::npos);
  EXPECT_NE(refusal(kind, {{"out", "relative/q4"}}, roots).find("give an absolute path"), std::string::npos);
  EXPECT_NE(refusal(kind, {{"pairs_file", "/etc/passwd"}}, roots).find("'pairs_file'"), std::string::npos)
      << "keys ending in _file are paths for every kind";
  EXPECT_NE(refusal(kind, {{"model", root + "x/models"}}, roots).find("outside"), std::string::npos)
      << "a sibling sharing the root's name as a prefix is not inside it";
  EXPECT_EQ(refusal(kind, {{"model", 3}, {"note", "/etc"}}, roots), "") << "other keys and types are not paths";
}

}  // namespace
}  // namespace lathe::jobs
