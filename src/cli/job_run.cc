// lathe job-run ID: the child process the server starts for one job (see jobs/job_child.h). Not for people.
#include "cli/verbs.h"
#include "jobs/job_child.h"
#include "jobs/job_store.h"

namespace lathe::cli {

Verb add_job_run(CLI::App& app) {
  auto data_dir = std::make_shared<std::string>(jobs::default_data_dir());
  auto id = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("job-run", "run one queued job (started by lathe serve; not for direct use)");
  cmd->group("");  // hidden from --help
  cmd->fallthrough();
  cmd->add_option("--data-dir", *data_dir, "job data directory")->capture_default_str();
  cmd->add_option("id", *id, "job id")->required();
  return {cmd, [data_dir, id] { return jobs::run_job_child(*data_dir, *id); }};
}

}  // namespace lathe::cli
