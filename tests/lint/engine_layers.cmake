# Lint: nothing reaches up the layers (DESIGN.md: data flows down; nothing reaches up).
#
# The layers, lowest first: kernels/, offload/, engine/'s own files (engine/json.*), then engine's
# folders in the order engine/CMakeLists.txt stacks their libraries (FERRY_ENGINE_LAYERS: text,
# model, job, plan, exec, train, probe), then apps/. A file may include headers of its own layer
# and of lower ones only. Test code may use every layer: *_test.cc files, engine/testing/ (test helpers),
# tests/ and bench/ are not checked, but no other file may include engine/testing/. An engine
# folder that is in no layer fails the lint, so a new folder is given its place first.
#
# Usage: cmake -DROOT=<source tree> -DLAYERS=text,model,... -P tests/lint/engine_layers.cmake
# Scans ROOT's kernels/ offload/ engine/ apps/ (*.h *.cc *.cu *.cuh, recursively); prints
# file:line for each include that reaches up and fails, or prints nothing and succeeds.
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED ROOT OR NOT IS_DIRECTORY "${ROOT}" OR NOT DEFINED LAYERS)
  message(FATAL_ERROR "engine_layers.cmake: give the source tree and engine's folders, lowest "
                      "first: cmake -DROOT=<dir> -DLAYERS=text,model,... -P ${CMAKE_CURRENT_LIST_FILE}")
endif()
string(REPLACE "," ";" LAYERS "${LAYERS}")

# Every layer's name, lowest first; a layer's rank is its index here.
set(order kernels offload engine)
foreach(folder IN LISTS LAYERS)
  list(APPEND order engine/${folder})
endforeach()
list(APPEND order apps)
list(JOIN order " < " order_text)

# The layer of a path ("engine/model/x.h" -> engine/model, "engine/json.h" -> engine), or "" when
# it belongs to none (an engine folder missing from LAYERS).
function(layer_of path out)
  if(path MATCHES "^engine/([^/]+)/")
    set(layer "engine/${CMAKE_MATCH_1}")
    if(NOT layer IN_LIST order)
      set(layer "")
    endif()
  elseif(path MATCHES "^(kernels|offload|engine|apps)/")
    set(layer "${CMAKE_MATCH_1}")
  else()
    set(layer "")
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

set(include_regex "^[ \t]*#[ \t]*include[ \t]*\"(kernels|offload|engine|apps)/[^\"]*\"")

include("${CMAKE_CURRENT_LIST_DIR}/include_scan.cmake")
include_scan_files("${ROOT}" files kernels offload engine apps)

set(count 0)
set(unplaced "")
foreach(rel IN LISTS files)
  if(rel MATCHES "_test\\.(cc|cu)$" OR rel MATCHES "^engine/testing/")
    continue()
  endif()
  layer_of("${rel}" mine)
  if(mine STREQUAL "")
    string(REGEX MATCH "^engine/[^/]+" folder "${rel}")
    if(NOT folder IN_LIST unplaced)
      list(APPEND unplaced "${folder}")
    endif()
    continue()
  endif()
  list(FIND order "${mine}" my_rank)
  include_lines("${ROOT}/${rel}" "${include_regex}" hits)
  foreach(entry IN LISTS hits)
    string(REGEX MATCH "^[0-9]+" line "${entry}")
    string(REGEX REPLACE "^[0-9]+:" "" hit "${entry}")
    string(REGEX MATCH "\"[^\"]*\"" target "${hit}")
    string(REPLACE "\"" "" target "${target}")
    string(STRIP "${hit}" shown)
    set(fix "")
    if(target MATCHES "^engine/testing/")
      set(fix "engine/testing/ holds test helpers: only *_test.cc files, tests/ and bench/ use it")
    else()
      layer_of("${target}" theirs)
      if(theirs STREQUAL "")
        string(REGEX MATCH "^engine/[^/]+" folder "${target}")
        set(fix "${folder} is in no layer: give it its place in engine/CMakeLists.txt's FERRY_ENGINE_LAYERS")
      else()
        list(FIND order "${theirs}" their_rank)
        if(their_rank GREATER my_rank)
          set(fix "${mine} sits below ${theirs} (${order_text}): move what both need down to ${mine} or lower")
        endif()
      endif()
    endif()
    if(NOT fix STREQUAL "")
      message(NOTICE "${rel}:${line}: ${shown}: ${fix}")
      math(EXPR count "${count} + 1")
    endif()
  endforeach()
endforeach()
foreach(folder IN LISTS unplaced)
  message(NOTICE "${folder}/: in no layer: give it its place in engine/CMakeLists.txt's FERRY_ENGINE_LAYERS")
  math(EXPR count "${count} + 1")
endforeach()
if(count GREATER 0)
  message(FATAL_ERROR "${count} include(s) or folder(s) against the layers (listed above)")
endif()
