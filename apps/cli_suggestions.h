// "Did you mean": Debian's CLI11 2.1 suggests nothing for a misspelled subcommand, option or job
// file key, so ferry ranks the registered names by edit distance itself.
//
// Stateless functions; thread-compatible.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace ferry {

// Optimal-string-alignment distance (insertions, deletions, substitutions and adjacent
// transpositions cost 1).
size_t EditDistance(const std::string& a, const std::string& b);

// The name in `names` closest to `word`, when close enough to be a misspelling of it (at most
// max(2, |word| / 3) edits); empty otherwise.
std::string ClosestName(const std::string& word, const std::vector<std::string>& names);

// The long option names of `app` ("--lora-rank"), with those of its parents.
std::vector<std::string> OptionNames(const CLI::App& app);

// For a failed parse of `argv`: " (did you mean ...?)" advice for the first unknown subcommand or
// option, or "" when there is none. `selected`: the subcommand that was parsed, or nullptr.
std::string SuggestForArguments(const CLI::App& app, const CLI::App* selected, int argc,
                                const char* const* argv);

}  // namespace ferry
