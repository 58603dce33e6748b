// ferry: one binary, CLI11 subcommands.
#include <CLI/CLI.hpp>

#include "apps/demo_command.h"

int main(int argc, char** argv) {
  CLI::App app{"ferry — fine-tune large language models on consumer GPUs"};
  app.require_subcommand(1);
  ferry::AddDemoCommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
