# Fails unless README contains EXAMPLE's text verbatim (inside its cpp block).
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not show ${EXAMPLE} as it is: copy the file into its example block")
endif()
