// ferry: one binary, CLI11 subcommands.
//
// Exit codes: 0 success; 1 bad input or a run-time failure (one line on stderr says what to
// change); 2 the requested work is not available in this build yet; 3 `ferry plan`: nothing fits;
// 128 + signal (130 SIGINT, 143 SIGTERM): `ferry train` stopped by a signal, checkpoint saved.
#include <CLI/CLI.hpp>

#include "apps/demo_command.h"
#include "apps/eval_command.h"
#include "apps/generate_command.h"
#include "apps/plan_command.h"
#include "apps/probe_command.h"
#include "apps/tokenize_command.h"
#include "apps/train_command.h"

int main(int argc, char** argv) {
  CLI::App app{"ferry — fine-tune large language models on consumer GPUs"};
  app.require_subcommand(1);
  ferry::TrainCommand train;
  ferry::AddTrainCommand(app, &train);
  ferry::PlanCommand plan;
  ferry::AddPlanCommand(app, &plan);
  ferry::ProbeCommand probe;
  ferry::AddProbeCommand(app, &probe);
  ferry::AddDemoCommand(app);
  ferry::EvalCommand eval;
  ferry::AddEvalCommand(app, &eval);
  ferry::GenerateCommand generate;
  ferry::AddGenerateCommand(app, &generate);
  ferry::TokenizeCommand tokenize;
  ferry::AddTokenizeCommand(app, &tokenize);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand's own failure, already reported
  } catch (const CLI::ParseError& e) {
    // One line: what is wrong, and where to look.
    std::fprintf(stderr, "ferry: %s (see ferry %s--help)\n", e.what(),
                 train.app->parsed()      ? "train "
                 : plan.app->parsed()     ? "plan "
                 : generate.app->parsed() ? "generate "
                                          : "");
    return 1;
  }
  if (train.app->parsed()) return ferry::RunTrainCommand(train);
  if (plan.app->parsed()) return ferry::RunPlanCommand(plan);
  if (probe.app->parsed()) return ferry::RunProbeCommand(probe);
  if (eval.app->parsed()) return ferry::RunEvalCommand(eval);
  if (generate.app->parsed()) return ferry::RunGenerateCommand(generate);
  if (tokenize.app->parsed()) return ferry::RunTokenizeCommand(tokenize);
  return 0;
}
