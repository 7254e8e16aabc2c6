# Run `cohort-sim replay CSV --events ARGS` and compare its output with
# EXPECTED (hand-computed). Used by the sim.* tests (tests/unit/CMakeLists.txt).
separate_arguments(_args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${SIM} replay ${CSV} --events ${_args}
                OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
file(READ ${EXPECTED} _want)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cohort-sim exited with ${_rc}\n${_err}")
endif()
if(NOT _out STREQUAL _want)
  message(FATAL_ERROR "output differs from ${EXPECTED}\n--- expected\n${_want}--- got\n${_out}${_err}")
endif()
