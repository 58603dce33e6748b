# Self-test of tests/lint/engine_layers.cmake: writes a small source tree with includes that reach
# up in the places the lint must catch (an engine folder including a higher one, engine/ or
# offload/ or kernels/ including anything above, a library file including engine/testing/, an
# engine folder in no layer, odd spacing, two in one file) and the ones it must leave alone
# (includes of the own or a lower layer, comments, *_test.cc files, engine/testing/, tests/,
# system headers), checks that the lint fails naming exactly the offending file:lines, then
# removes the offenders and checks that it passes.
#
# Usage: cmake -DLINT=<engine_layers.cmake> -DWORK=<scratch dir> -P engine_layers_selftest.cmake
cmake_minimum_required(VERSION 3.25)
foreach(var LINT WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "engine_layers_selftest.cmake: -D${var}= is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
include("${CMAKE_CURRENT_LIST_DIR}/lint_selftest.cmake")
set(layers "-DLAYERS=text,model,job,plan,exec,train")
# Allowed: down or level, comments, test code, files the lint does not scan.
lint_write(engine/train/trainer.cc "#include \"engine/train/trainer.h\"" "#include <vector>"
      "#include \"engine/exec/executor.h\"" "#include \"engine/text/tokenizer.h\""
      "#include \"engine/json.h\"" "#include \"offload/file_io.h\"" "#include \"kernels/status.h\"")
lint_write(engine/text/tokenizer.h "// never #include \"engine/model/model.h\" here:"
      "// #include \"engine/train/trainer.h\"" "#include \"engine/json_fwd.h\"")
lint_write(engine/model/model_test.cc "#include \"engine/train/trainer.h\""
      "#include \"engine/testing/golden.h\"")
lint_write(engine/testing/golden.h "#include \"engine/train/trainer.h\"")
lint_write(tests/e2e.cc "#include \"apps/command.h\"" "#include \"engine/testing/golden.h\"")
lint_write(apps/command.cc "#include \"engine/train/trainer.h\"")
lint_write(engine/model/notes.txt "#include \"engine/train/trainer.h\"")
# Offenders. engine/model/deep.cc has two, the first after a commented-out copy of the second.
lint_write(engine/model/deep.cc "#include \"engine/model/deep.h\"" "// #include \"engine/plan/x.h\""
      "#include \"engine/plan/x.h\"" "" "  #  include \"engine/exec/y.h\"")
lint_write(engine/job/spec.h "#include \"engine/testing/golden.h\"")
lint_write(engine/json.cc "#include \"engine/text/tokenizer.h\"")
lint_write(offload/store.cu "#include \"engine/json.h\"")
lint_write(kernels/op.cuh "#include \"offload/host_pool.h\"")
lint_write(engine/probe/probe.cc "#include \"kernels/status.h\"")
lint_write(engine/text/uses_probe.cc "#include \"engine/probe/probe.h\"")
set(expected engine/model/deep.cc:3 engine/model/deep.cc:5 engine/job/spec.h:1 engine/json.cc:1
    offload/store.cu:1 kernels/op.cuh:1 engine/text/uses_probe.cc:1)

lint_expect_failure("${LINT}" "${layers}" ${expected})
foreach(want "engine/model/deep.cc:3: [^\n]*engine/model sits below engine/plan"
             "engine/job/spec.h:1: [^\n]*test helpers"
             "engine/text/uses_probe.cc:1: [^\n]*engine/probe is in no layer"
             "engine/probe/: in no layer")
  if(NOT LINT_LOG MATCHES "${want}")
    message(FATAL_ERROR "the lint's report should match \"${want}\":\n${LINT_LOG}")
  endif()
endforeach()

file(REMOVE "${WORK}/engine/model/deep.cc" "${WORK}/engine/job/spec.h" "${WORK}/engine/json.cc"
     "${WORK}/offload/store.cu" "${WORK}/kernels/op.cuh" "${WORK}/engine/text/uses_probe.cc")
file(REMOVE_RECURSE "${WORK}/engine/probe")
lint_expect_pass("${LINT}" "${layers}")
message(STATUS "engine_layers.cmake: caught ${expected}; passed the clean tree")
