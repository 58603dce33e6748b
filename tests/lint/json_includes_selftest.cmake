# Self-test of tests/lint/json_includes.cmake: writes a small source tree with direct includes of
# nlohmann's headers in the places the lint must catch (any depth, .h/.cc/.cu, odd spacing, quotes,
# two in one file) and in the places it must leave alone (engine/json.h, engine/json_fwd.h,
# comments, other directories and extensions), checks that the lint fails naming exactly the
# offending file:lines, then removes the offenders and checks that it passes.
#
# Usage: cmake -DLINT=<json_includes.cmake> -DWORK=<scratch dir> -P json_includes_selftest.cmake
cmake_minimum_required(VERSION 3.25)
foreach(var LINT WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "json_includes_selftest.cmake: -D${var}= is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
include("${CMAKE_CURRENT_LIST_DIR}/lint_selftest.cmake")
# Allowed: the two wrappers, a comment, a conditional include test, files the lint does not scan.
lint_write(engine/json.h "#pragma once" "#include <nlohmann/json.hpp>  // IWYU pragma: export")
lint_write(engine/json_fwd.h "#pragma once" "#include <nlohmann/json_fwd.hpp>")
lint_write(apps/ok.cc "// never #include <nlohmann/json.hpp> here:"
      "// #include <nlohmann/json.hpp>" "#include \"engine/json.h\""
      "#if __has_include(<nlohmann/json.hpp>)" "#endif")
lint_write(docs/example.cc "#include <nlohmann/json.hpp>")
lint_write(tests/notes.txt "#include <nlohmann/json.hpp>")
lint_write(engine/json.hpp.orig "#include <nlohmann/json.hpp>")
# Offenders. bench/twice.h also has the same line commented out first, and twice.
lint_write(engine/model/deep.cc "#include <string>" "" "#include <nlohmann/json.hpp>")
lint_write(kernels/op.cu "  #  include \"nlohmann/json_fwd.hpp\"")
lint_write(bench/twice.h "// #include <nlohmann/json.hpp>" "#include <nlohmann/json.hpp>" "// more code"
      "" "#include <nlohmann/json.hpp>")
lint_write(offload/store.h "#include <nlohmann/json_fwd.hpp>")
set(expected engine/model/deep.cc:3 kernels/op.cu:1 bench/twice.h:2 bench/twice.h:5 offload/store.h:1)

lint_expect_failure("${LINT}" "" ${expected})
if(NOT LINT_LOG MATCHES "kernels/op.cu:1: [^\n]*must not use nlohmann::json")
  message(FATAL_ERROR "kernels/ should be told it must not use JSON at all:\n${LINT_LOG}")
endif()

file(REMOVE "${WORK}/engine/model/deep.cc" "${WORK}/kernels/op.cu" "${WORK}/bench/twice.h"
     "${WORK}/offload/store.h")
lint_expect_pass("${LINT}" "")
message(STATUS "json_includes.cmake: caught ${expected}; passed the clean tree")
