# Included from tests/CMakeLists.txt: the fuzzing checks the normal build runs.
#
# fuzz_corpus_replay: every checked-in fuzz corpus file (fuzz/corpus) through
# every fuzz harness body (fuzz/harness.cpp), without libFuzzer, so any build
# (gcc, the ASan build) replays them. The plan harness compiles for the test
# plugin "partial" (and the CPU plugin when built).
add_executable(fuzz_replay "${PROJECT_SOURCE_DIR}/fuzz/replay.cpp" "${PROJECT_SOURCE_DIR}/fuzz/harness.cpp")
target_link_libraries(fuzz_replay PRIVATE Backplane::core backplane_warnings)
target_include_directories(fuzz_replay PRIVATE "${PROJECT_SOURCE_DIR}/core/src")
set(fuzz_replay_dirs "${FIXTURE_DIR}/partial")
add_dependencies(fuzz_replay tp_partial)
if(TARGET backplane_cpu)
  string(APPEND fuzz_replay_dirs ":${BACKPLANE_PLUGIN_BUILD_DIR}")
  add_dependencies(fuzz_replay backplane_cpu)
endif()
target_compile_definitions(fuzz_replay PRIVATE BACKPLANE_FUZZ_PLUGIN_DIRS="${fuzz_replay_dirs}")
if(TARGET backplane_remote_server)
  target_sources(fuzz_replay PRIVATE "${PROJECT_SOURCE_DIR}/fuzz/remote_harness.cpp"
                 "${PROJECT_SOURCE_DIR}/fuzz/session_harness.cpp")
  target_link_libraries(fuzz_replay PRIVATE backplane_remote_server)
  target_compile_definitions(fuzz_replay PRIVATE BACKPLANE_HAVE_REMOTE)
endif()
if(TARGET backplane_onnx)
  target_sources(fuzz_replay PRIVATE "${PROJECT_SOURCE_DIR}/fuzz/onnx_harness.cpp")
  target_link_libraries(fuzz_replay PRIVATE backplane_onnx)
  target_compile_definitions(fuzz_replay PRIVATE BACKPLANE_HAVE_ONNX)
endif()
add_test(NAME fuzz_corpus_replay COMMAND fuzz_replay "${PROJECT_SOURCE_DIR}/fuzz/corpus")
set_tests_properties(fuzz_corpus_replay PROPERTIES TIMEOUT 600
  ENVIRONMENT "BACKPLANE_PLUGIN_PATH=;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

# diff_fuzz: random valid graphs on the CPU plugin against vulkan0 (when
# there is one), "vulkan0,cpu" and "partial0,cpu" with pinned nodes. A fixed
# seed and count here; `diff_fuzz --seed N --count M` for longer runs.
if(TARGET backplane_cpu)
  set(diff_fuzz_sources "${PROJECT_SOURCE_DIR}/fuzz/diff_fuzz.cpp" "${PROJECT_SOURCE_DIR}/fuzz/diff_fuzz_generator.cpp"
      "${PROJECT_SOURCE_DIR}/fuzz/diff_fuzz_elementwise.cpp" "${PROJECT_SOURCE_DIR}/fuzz/diff_fuzz_structure.cpp")
  add_executable(diff_fuzz ${diff_fuzz_sources})
  target_link_libraries(diff_fuzz PRIVATE Backplane::core backplane_warnings)
  add_dependencies(diff_fuzz backplane_cpu tp_partial)
  if(TARGET backplane_vulkan)
    add_dependencies(diff_fuzz backplane_vulkan)
  endif()
  add_test(NAME diff_fuzz COMMAND diff_fuzz --seed 1 --count 200 --partial-dir "${FIXTURE_DIR}/partial")
  set_tests_properties(diff_fuzz PROPERTIES TIMEOUT 600
    ENVIRONMENT "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()

# What diff_fuzz found, minimised (fuzz/diff_fuzz_cases/*.json): each graph
# file on the CPU against the other devices, as above.
file(GLOB diff_fuzz_case_files CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/fuzz/diff_fuzz_cases/*.json")
if(TARGET diff_fuzz AND diff_fuzz_case_files)
  set(diff_fuzz_case_args "")
  foreach(f IN LISTS diff_fuzz_case_files)
    list(APPEND diff_fuzz_case_args --graph "${f}")
  endforeach()
  add_test(NAME diff_fuzz_cases COMMAND diff_fuzz --partial-dir "${FIXTURE_DIR}/partial" ${diff_fuzz_case_args})
  set_tests_properties(diff_fuzz_cases PROPERTIES TIMEOUT 300
    ENVIRONMENT "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()
