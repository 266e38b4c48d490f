# Run by CTest as it reads the tests (GTestSuites.cmake writes the variables):
# adds one test per GoogleTest suite of NANSCOPE_GTEST_EXE.
if(NOT EXISTS "${NANSCOPE_GTEST_EXE}")
  # Not built: one test that fails saying so, as gtest_discover_tests does.
  add_test("${NANSCOPE_GTEST_TARGET}_NOT_BUILT" "${NANSCOPE_GTEST_TARGET}_NOT_BUILT")
  return()
endif()
if(NOT EXISTS "${NANSCOPE_GTEST_LISTING}" OR "${NANSCOPE_GTEST_EXE}" IS_NEWER_THAN "${NANSCOPE_GTEST_LISTING}")
  execute_process(COMMAND "${NANSCOPE_GTEST_EXE}" --gtest_list_tests OUTPUT_VARIABLE listing
                  ERROR_VARIABLE errors RESULT_VARIABLE status TIMEOUT 120)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${NANSCOPE_GTEST_EXE} --gtest_list_tests failed (${status}):\n${listing}${errors}")
  endif()
  file(WRITE "${NANSCOPE_GTEST_LISTING}" "${listing}")
endif()

# The listing: a suite's line ("Suite." or "Prefix/Suite.  # TypeParam = ...")
# at the margin, its tests' lines indented below it.
file(STRINGS "${NANSCOPE_GTEST_LISTING}" lines)
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #]+)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
  elseif(suite AND line MATCHES "^  [^ ]")
    if(NOT DEFINED tests_in_${NANSCOPE_GTEST_TARGET}_${suite})
      list(APPEND suites "${suite}")
      set(tests_in_${NANSCOPE_GTEST_TARGET}_${suite} 0)
    endif()
    math(EXPR tests_in_${NANSCOPE_GTEST_TARGET}_${suite} "${tests_in_${NANSCOPE_GTEST_TARGET}_${suite}} + 1")
  endif()
endforeach()

foreach(given IN LISTS NANSCOPE_GTEST_COSTS)
  if(NOT given MATCHES "^([^=]+)=([0-9]+)$")
    message(FATAL_ERROR "${NANSCOPE_GTEST_TARGET}: COSTS takes Suite=seconds, not '${given}'")
  endif()
  if(NOT DEFINED tests_in_${NANSCOPE_GTEST_TARGET}_${CMAKE_MATCH_1})
    message(FATAL_ERROR "${NANSCOPE_GTEST_TARGET}: COSTS names '${CMAKE_MATCH_1}', which is not one of its suites")
  endif()
  set(cost_of_${NANSCOPE_GTEST_TARGET}_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
endforeach()

foreach(suite IN LISTS suites)
  # The suite is the test's name, so no two programs may share one.
  if(DEFINED NANSCOPE_GTEST_SUITE_IN_${suite})
    message(FATAL_ERROR "GoogleTest suite '${suite}' is in both ${NANSCOPE_GTEST_SUITE_IN_${suite}} and "
                        "${NANSCOPE_GTEST_TARGET}: rename one (CTest runs each suite as one test named after it)")
  endif()
  set(NANSCOPE_GTEST_SUITE_IN_${suite} "${NANSCOPE_GTEST_TARGET}")
  set(n ${tests_in_${NANSCOPE_GTEST_TARGET}_${suite}})
  math(EXPR timeout "${NANSCOPE_GTEST_TIMEOUT} + 30 * (${n} - 1)")
  set(cost ${n})
  if(DEFINED cost_of_${NANSCOPE_GTEST_TARGET}_${suite})
    set(cost ${cost_of_${NANSCOPE_GTEST_TARGET}_${suite}})
  endif()
  add_test("${suite}" "${NANSCOPE_GTEST_EXE}" "--gtest_filter=${suite}.*")
  # A suite whose every test skipped itself (a capability this build lacks) is skipped.
  set_tests_properties("${suite}" PROPERTIES ${NANSCOPE_GTEST_PROPERTIES} TIMEOUT ${timeout} COST ${cost}
                       SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests\\.")
endforeach()
