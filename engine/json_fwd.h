// ferry's way in to nlohmann::json's forward declarations: a header that only names
// nlohmann::json (a parameter, a return type) includes "engine/json_fwd.h", never
// <nlohmann/json_fwd.hpp>, and so stays light for its includers. A file that builds, parses or
// dumps JSON values includes "engine/json.h" (its extern templates keep nlohmann::json's heavy
// instantiations in engine/json.cc). These two are the only files that name nlohmann's headers
// (tests/lint/json_includes.cmake checks it).
//
// Thread-safety: declarations only.
#pragma once

#include <nlohmann/json_fwd.hpp>  // IWYU pragma: export
