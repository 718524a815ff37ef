# Shared by the checks that a house check can fail: runs CHECKER on the scratch tree WORK and
# requires it to refuse (`accepted`: what it should not have accepted) with a report holding every
# one of the expected strings that follow.
function(expect_refusal accepted)
  execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK} -P ${CHECKER} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the check accepted ${accepted}")
  endif()
  foreach(expected IN LISTS ARGN)
    string(FIND "${err}" "${expected}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the check's report lacks '${expected}':\n${err}")
    endif()
  endforeach()
endfunction()
