# For the include lints (json_includes.cmake, engine_layers.cmake), which report file:line.
#
# include_scan_files(<root> <out> <dirs...>): the C++ and CUDA sources and headers (*.h *.cc *.cu
#   *.cuh) below <root>/<dir> for each dir, recursively, relative to <root>, sorted.
# include_lines(<file> <regex> <out>): the lines of <file> that match <regex> (a whole-line match,
#   anchored with ^), each as "<line number>:<line>", in order.
function(include_scan_files root out)
  set(globs "")
  foreach(dir IN LISTS ARGN)
    foreach(ext h cc cu cuh)
      list(APPEND globs "${root}/${dir}/*.${ext}")
    endforeach()
  endforeach()
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${root}" ${globs})
  list(SORT files)
  set(${out} "${files}" PARENT_SCOPE)
endfunction()

function(include_lines path regex out)
  file(STRINGS "${path}" hits REGEX "${regex}")
  set(found "")
  if(NOT hits)
    set(${out} "" PARENT_SCOPE)
    return()
  endif()
  # file(STRINGS) drops line numbers: find each hit in the text, after the previous one, and count
  # the newlines before it. `text` is always "\n" + the file from the start of line `line` on, so
  # a hit is found as a whole line, never inside an earlier comment.
  file(READ "${path}" text)
  string(PREPEND text "\n")
  set(line 1)
  foreach(hit IN LISTS hits)
    string(FIND "${text}" "\n${hit}" at)
    string(SUBSTRING "${text}" 0 ${at} before)
    string(REGEX MATCHALL "\n" newlines "${before}")
    list(LENGTH newlines n)
    math(EXPR line "${line} + ${n}")
    string(LENGTH "${hit}" length)
    math(EXPR after "${at} + 1 + ${length}")
    string(SUBSTRING "${text}" ${after} -1 text)
    list(APPEND found "${line}:${hit}")
    math(EXPR line "${line} + 1")
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()
