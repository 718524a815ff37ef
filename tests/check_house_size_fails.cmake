# The size check can fail: a scratch tree whose docs promise fewer lines than its files hold must
# be refused, naming the row, the count and the bound.
#   cmake -DCHECKER=tools/check_house_size.cmake -DWORK=<scratch dir> -P check_house_size_fails.cmake
file(REMOVE_RECURSE "${WORK}")
file(WRITE "${WORK}/ops/a.cpp" "one\ntwo\nthree\n")
file(WRITE "${WORK}/docs/architecture.md" "| what | files | lines |\n| --- | --- | ---: |\n| the ops | `ops/*.cpp` | 2 |\n")
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK} -P ${CHECKER} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "the size check accepted 3 lines where the docs promise at most 2")
endif()
string(FIND "${err}" "the ops: 3 lines in 1 files, more than the 2 docs/architecture.md states" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the size check's report lacks the row, the count and the bound:\n${err}")
endif()
