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
add_test(NAME fuzz_corpus_replay COMMAND fuzz_replay "${PROJECT_SOURCE_DIR}/fuzz/corpus")
set_tests_properties(fuzz_corpus_replay PROPERTIES TIMEOUT 600
  ENVIRONMENT "BACKPLANE_PLUGIN_PATH=;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

