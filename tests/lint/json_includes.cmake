# Lint: no file includes <nlohmann/json.hpp> or <nlohmann/json_fwd.hpp> directly.
#
# engine/json.h declares extern templates for nlohmann::json's heavy instantiations (parser, lexer,
# serializer, containers) and engine/json.cc instantiates them once; a file that includes
# <nlohmann/json.hpp> itself compiles them all again. So every file includes "engine/json.h"
# (or "engine/json_fwd.h" for the forward declarations alone); those two are the only files that
# name nlohmann's headers. kernels/ and offload/ sit below engine/ and use no JSON at all.
#
# Usage: cmake -DROOT=<source tree> -P tests/lint/json_includes.cmake
# Scans ROOT's engine/ kernels/ offload/ apps/ tests/ bench/ (*.h *.cc *.cu *.cuh, recursively); prints
# file:line for each direct include and fails, or prints nothing and succeeds.
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED ROOT OR NOT IS_DIRECTORY "${ROOT}")
  message(FATAL_ERROR "json_includes.cmake: give the source tree: cmake -DROOT=<dir> -P ${CMAKE_CURRENT_LIST_FILE}")
endif()

set(allowed engine/json.h engine/json_fwd.h)
set(include_regex "^[ \t]*#[ \t]*include[ \t]*[<\"]nlohmann/json(_fwd)?\\.hpp[>\"]")

include("${CMAKE_CURRENT_LIST_DIR}/include_scan.cmake")
include_scan_files("${ROOT}" files engine kernels offload apps tests bench)

set(count 0)
foreach(rel IN LISTS files)
  if(rel IN_LIST allowed)
    continue()
  endif()
  include_lines("${ROOT}/${rel}" "${include_regex}" hits)
  foreach(entry IN LISTS hits)
    string(REGEX MATCH "^[0-9]+" line "${entry}")
    string(REGEX REPLACE "^[0-9]+:" "" hit "${entry}")
    if(hit MATCHES "json_fwd")
      set(instead "engine/json_fwd.h")
    else()
      set(instead "engine/json.h")
    endif()
    if(rel MATCHES "^(kernels|offload)/")
      set(fix "kernels/ and offload/ sit below engine/ and must not use nlohmann::json: move the JSON code to engine/ or above")
    else()
      set(fix "include \"${instead}\" instead (engine/json.h explains why)")
    endif()
    string(STRIP "${hit}" shown)
    message(NOTICE "${rel}:${line}: ${shown}: ${fix}")
    math(EXPR count "${count} + 1")
  endforeach()
endforeach()
if(count GREATER 0)
  message(FATAL_ERROR "${count} direct include(s) of nlohmann's headers (listed above)")
endif()
