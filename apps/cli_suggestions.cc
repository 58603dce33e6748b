#include "apps/cli_suggestions.h"

#include <algorithm>
#include <limits>

namespace ferry {

size_t EditDistance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string ClosestName(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& name : names) {
    const size_t d = EditDistance(word, name);
    if (d < best_d) {
      best_d = d;
      best = name;
    }
  }
  return best_d <= std::max<size_t>(2, word.size() / 3) ? best : "";
}

std::vector<std::string> OptionNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* a = &app; a != nullptr; a = a->get_parent()) {
    for (const CLI::Option* opt : a->get_options()) {
      for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    }
  }
  return names;
}

std::string SuggestForArguments(const CLI::App& app, const CLI::App* selected, int argc,
                                const char* const* argv) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands.push_back(sub->get_name());
  }
  const CLI::App& scope = selected != nullptr ? *selected : app;
  const std::vector<std::string> options = OptionNames(scope);
  bool value_next = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0) {
      arg = arg.substr(0, arg.find('='));
      if (std::find(options.begin(), options.end(), arg) != options.end()) {
        value_next = arg == "--config";  // the other options' values are never subcommands
        continue;
      }
      const std::string near = ClosestName(arg, options);
      return "unknown option " + arg + (near.empty() ? "" : "; did you mean " + near + "?");
    }
    if (selected == nullptr && !value_next && arg.rfind("-", 0) != 0 &&
        std::find(commands.begin(), commands.end(), arg) == commands.end()) {
      const std::string near = ClosestName(arg, commands);
      std::string all;
      for (const std::string& c : commands) all += (all.empty() ? "" : ", ") + c;
      return "unknown command '" + arg + "'" +
             (near.empty() ? "" : "; did you mean '" + near + "'?") + " (commands: " + all + ")";
    }
    value_next = false;
  }
  return "";
}

}  // namespace ferry
