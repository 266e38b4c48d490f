# One CTest test per GoogleTest suite, where gtest_discover_tests makes one
# per test.
#
# Each CTest test is a process, and a process that links LibTorch spends about
# a second of CPU loading it (its static registrations) before a test runs:
# with one process per test that was a third of the test command's CPU time,
# and a suite's SetUpTestSuite (a Python script writing fixture models) ran
# once per test instead of once. A suite's tests run in one process, in the
# order they are written; CTest names the suite (`Recovery`,
# `SamplesFaults/Verdicts`) and its output names each test that failed.
# Run one test with the program itself: `tests/core_tests --gtest_filter=Suite.Test`.
#
# nanscope_gtest_suites(TARGET [LABELS label] [TIMEOUT s] [RESOURCE_LOCK name] [COSTS Suite=s ...])
#   TIMEOUT: one test's limit; a suite of n tests gets it plus 30 s for each
#   test after the first. COST (CTest's order before it has timings of its
#   own, as in a fresh clone: the costliest start first) is the number of
#   tests, or the seconds COSTS gives a suite whose tests are few and long,
#   so that it does not start late and run alone at the end with a core idle.
#   The suites are listed when CTest runs (the program's --gtest_list_tests,
#   again only after it is rebuilt).
function(nanscope_gtest_suites target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "LABELS;TIMEOUT;RESOURCE_LOCK" "COSTS")
  set(properties "WORKING_DIRECTORY;${CMAKE_CURRENT_BINARY_DIR}")
  foreach(property LABELS RESOURCE_LOCK)
    if(ARG_${property})
      list(APPEND properties ${property} ${ARG_${property}})
    endif()
  endforeach()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  file(GENERATE OUTPUT "${include_file}" CONTENT
"set(NANSCOPE_GTEST_TARGET [==[${target}]==])
set(NANSCOPE_GTEST_EXE [==[$<TARGET_FILE:${target}>]==])
set(NANSCOPE_GTEST_LISTING [==[${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.txt]==])
set(NANSCOPE_GTEST_TIMEOUT ${ARG_TIMEOUT})
set(NANSCOPE_GTEST_PROPERTIES [==[${properties}]==])
set(NANSCOPE_GTEST_COSTS [==[${ARG_COSTS}]==])
include([==[${PROJECT_SOURCE_DIR}/cmake/GTestSuitesAdd.cmake]==])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
