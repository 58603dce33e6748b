// The built-in dataset's text (`ferry train` with no --data): a few KB of English prose written
// for the project, documents separated by blank lines.
#pragma once

#include <string_view>

namespace ferry {

std::string_view BuiltinText();

}  // namespace ferry
