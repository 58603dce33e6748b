# Helpers for the include lints' self-tests (json_includes_selftest.cmake,
# engine_layers_selftest.cmake), which write a small source tree under WORK and run a lint on it.
#
# lint_write(<rel> <lines...>): writes WORK/<rel> from its lines (no ";" in a line: CMake would
#   split it).
# lint_expect_failure(<lint> <extra -D args> <expected file:lines...>): runs the lint on WORK and
#   fails unless the lint fails naming exactly those file:lines; sets LINT_LOG in the caller.
# lint_expect_pass(<lint> <extra -D args>): runs the lint on WORK and fails unless it passes.
# <extra -D args> is one argument, "" when none.
function(lint_write rel)
  list(JOIN ARGN "\n" text)
  file(WRITE "${WORK}/${rel}" "${text}\n")
endfunction()

function(lint_run lint extra out_rc out_log)
  execute_process(COMMAND "${CMAKE_COMMAND}" -DROOT=${WORK} ${extra} -P "${lint}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} "${rc}" PARENT_SCOPE)
  set(${out_log} "${out}${err}" PARENT_SCOPE)
endfunction()

function(lint_expect_failure lint extra)
  set(expected ${ARGN})
  lint_run("${lint}" "${extra}" rc log)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the lint passed a tree with offenders:\n${log}")
  endif()
  string(REGEX MATCHALL "[A-Za-z_./]+:[0-9]+: #" found "${log}")
  list(TRANSFORM found REPLACE ": #$" "")
  list(SORT found)
  list(SORT expected)
  if(NOT found STREQUAL expected)
    message(FATAL_ERROR "the lint reported [${found}], expected [${expected}]:\n${log}")
  endif()
  set(LINT_LOG "${log}" PARENT_SCOPE)
endfunction()

function(lint_expect_pass lint extra)
  lint_run("${lint}" "${extra}" rc log)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the lint failed a clean tree:\n${log}")
  endif()
endfunction()
