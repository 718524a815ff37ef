# Runs attention_backprop (EXE) with ARGS (a ;-list) and fails unless it exits 0, prints no
# DISAGREES, ends with its OK line, printed STAGES stages, showed that a wrong softmax backward and
# a missing 1/sqrt(D) would be caught on this very data, and printed every regex of EXPECT (the
# features the configuration is meant to exercise: empty rows, a suppressed query, ...).
execute_process(COMMAND ${EXE} ${ARGS} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "attention_backprop exited with ${rc}")
endif()
string(REGEX MATCHALL "\n     (OK|DISAGREES)\n" verdicts "${out}")
list(LENGTH verdicts stages)
if(NOT stages EQUAL STAGES OR out MATCHES "DISAGREES|NOT caught")
  message(FATAL_ERROR "expected ${STAGES} stages, all OK, and every wrong formula caught; got ${stages} stage verdicts")
endif()
foreach(re "OK: every stage agrees" "rowsum\\(A ⊙ dA\\), would differ from numeric by [^\n]*: caught"
           "without the 1/√D, would differ from numeric by [^\n]*: caught" ${EXPECT})
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "output does not match '${re}'")
  endif()
endforeach()
