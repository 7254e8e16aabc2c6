# Smoke test of `cohort-sim sweep`: a short sweep end to end (CSV, and the
# plots when Debian's python3-matplotlib is there). Used by sim.sweep_smoke.
file(REMOVE_RECURSE ${OUT})
execute_process(COMMAND ${SIM} sweep --what n,eta,relay --seeds 2 --duration-s 20 --out ${OUT}
                        --plot-script ${PLOT}
                OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cohort-sim sweep exited with ${_rc}\n${_out}\n${_err}")
endif()
file(STRINGS ${OUT}/sweep.csv _rows)
list(LENGTH _rows _n)
# header + (2 traces x 5 n x 3 schemes + 5 eta x 2 schemes + 4 x 2 relay) x 2 seeds
if(NOT _n EQUAL 97)
  message(FATAL_ERROR "sweep.csv has ${_n} lines, expected 97")
endif()
execute_process(COMMAND /usr/bin/python3 -c "import matplotlib, numpy" RESULT_VARIABLE _py)
if(_py EQUAL 0)
  foreach(f fig05_cnn_n.png fig06_transformer_n.png fig07_wasted.png fig09_eta.png relay.png
            summary.csv headline.md)
    if(NOT EXISTS ${OUT}/${f})
      message(FATAL_ERROR "sweep did not write ${f}\n${_err}")
    endif()
  endforeach()
else()
  message(STATUS "python3-matplotlib not found: plots not checked")
endif()
