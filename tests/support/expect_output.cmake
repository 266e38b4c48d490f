# Runs COMMAND (a ;-list) and fails unless it exits with EXIT (default 0) and
# its output (stdout and stderr) matches every regular expression in EXPECT.
#   cmake -DCOMMAND="prog;arg" -DEXPECT="re1;re2" [-DEXIT=2] -P expect_output.cmake
if(NOT DEFINED EXIT)
  set(EXIT 0)
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT code STREQUAL "${EXIT}")
  message(FATAL_ERROR "exit code ${code}, expected ${EXIT}:\n${all}")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "output does not match '${re}':\n${all}")
  endif()
endforeach()
message(STATUS "${all}")
