// `ferry demo`: a short built-in demonstration of the device substrate and ops.
#pragma once

#include <CLI/CLI.hpp>

namespace ferry {

// Registers the `demo` subcommand on `app`; it runs when selected.
void AddDemoCommand(CLI::App& app);

}  // namespace ferry
