# The size check can fail: a scratch tree whose docs promise fewer lines than its files hold must
# be refused, naming the row, the count and the bound.
#   cmake -DCHECKER=tools/check_house_size.cmake -DWORK=<scratch dir> -P check_house_size_fails.cmake
file(REMOVE_RECURSE "${WORK}")
file(WRITE "${WORK}/ops/a.cpp" "one\ntwo\nthree\n")
file(WRITE "${WORK}/docs/architecture.md" "| what | files | lines |\n| --- | --- | ---: |\n| the ops | `ops/*.cpp` | 2 |\n")
include(${CMAKE_CURRENT_LIST_DIR}/expect_refusal.cmake)
expect_refusal("3 lines where the docs promise at most 2" "the ops: 3 lines in 1 files, more than the 2 docs/architecture.md states")
