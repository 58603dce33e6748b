// Fuzzes job files through CLI11's config path, as `ferry --config FILE train` and `... plan` read
// them: the input is written to a file and parsed by the job-file reader (apps/job_file.h) into the
// job options (apps/job_options.h). Nothing but a CLI11 parse error may come out, and every error
// names the file: the reader's own start with "FILE:LINE: ", and one CLI11 raises later about a
// value the file set is located by JobFileKeys::Where (as `ferry` prints it).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "apps/job_file.h"
#include "apps/job_options.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

// Parses `path` as the job file of `command` ("train" or "plan").
void ParseJobFile(const std::string& path, const char* command) {
  CLI::App app;
  ferry::JobFileKeys keys;
  ferry::InstallJobFile(app, &keys);
  ferry::JobSpec train_job, plan_job;
  std::string train_targets = "all", plan_targets = "all";
  CLI::App* train = app.add_subcommand("train");
  train->fallthrough();
  ferry::AddJobOptions(*train, train_job, &train_targets);
  train->add_option("--threads", train_job.threads);
  train->add_option("--out", train_job.out);
  train->add_flag("--checkpoint-compress", train_job.checkpoint_compress);
  CLI::App* plan = app.add_subcommand("plan");
  plan->fallthrough();
  ferry::AddJobOptions(*plan, plan_job, &plan_targets);
  ferry::RefuseOutOfRangeIntegers(app);
  const char* argv[] = {"ferry", "--config", path.c_str(), command};
  try {
    app.parse(4, argv);
  } catch (const CLI::ParseError& e) {
    const std::string message = e.what();
    FERRY_FUZZ_CHECK(message.rfind(path + ":", 0) == 0 || !keys.Where(message).empty());
  }
}

}  // namespace

FERRY_FUZZ_TARGET(text) {
  char name[] = "/tmp/ferry_fuzz_job_XXXXXX";
  const int fd = ::mkstemp(name);
  if (fd < 0) return;
  const bool written = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  ::close(fd);
  if (written) {
    ParseJobFile(name, "train");
    ParseJobFile(name, "plan");
  }
  ::unlink(name);
}
