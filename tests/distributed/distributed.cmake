# The distributed room. test_distributed: the micro-batch tree and DataParallel in one process
# (always). With MPI: dp_check trained under mpirun on 1, 2, 3, 4 and 6 processes (12
# micro-batches) and on 2 and 4 (8 micro-batches), and alone, its final parameters compared bit
# for bit, and one rank made to die, throw, stall or differ.
tapegrad_test(test_distributed test_distributed.cpp)
target_include_directories(test_distributed PRIVATE ${PROJECT_SOURCE_DIR})  # the internal tree
add_executable(dp_check distributed/dp_check.cpp)
target_link_libraries(dp_check PRIVATE tapegrad::tapegrad tapegrad_warnings)

set(_dp ${CMAKE_CURRENT_BINARY_DIR}/dp)
file(MAKE_DIRECTORY ${_dp})
# One process accumulating the 12 micro-batches, without a launcher: the reference.
add_test(NAME dp_alone COMMAND dp_check --out ${_dp}/alone.safetensors)
add_test(NAME dp_alone_float64 COMMAND dp_check --float64 --out ${_dp}/alone64.safetensors)
add_test(NAME dp_alone_m8 COMMAND dp_check --micro-batches 8 --out ${_dp}/alone_m8.safetensors)
set_tests_properties(dp_alone dp_alone_float64 dp_alone_m8 PROPERTIES FIXTURES_SETUP dp_reference ENVIRONMENT OMP_NUM_THREADS=1)
if(NOT TAPEGRAD_MPI_FOUND OR NOT MPIEXEC_EXECUTABLE)
  return()
endif()

function(dp_run name np)
  add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${TAPEGRAD_MPIEXEC_FLAGS} $<TARGET_FILE:dp_check> ${ARGN})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${TAPEGRAD_MPIEXEC_ENV}" TIMEOUT 120 RESOURCE_LOCK mpi)
endfunction()

set(_same "")
foreach(np IN ITEMS 1 2 3 4 6)
  dp_run(dp_np${np} ${np} --out ${_dp}/np${np}.safetensors)
  list(APPEND _same dp_np${np} np${np})
endforeach()
dp_run(dp_np2_shard 2 --shard --out ${_dp}/np2_shard.safetensors)
dp_run(dp_np4_shard 4 --shard --out ${_dp}/np4_shard.safetensors)
dp_run(dp_np3_float64 3 --float64 --out ${_dp}/np3_64.safetensors)
dp_run(dp_np4_one_bucket_each 4 --bucket-bytes 1 --out ${_dp}/np4_small.safetensors)
dp_run(dp_np2_fast 2 --fast --out ${_dp}/np2_fast.safetensors)
dp_run(dp_np4_fast_shard 4 --fast --shard --out ${_dp}/np4_fast_shard.safetensors)
list(APPEND _same dp_np2_shard np2_shard dp_np4_shard np4_shard dp_np4_one_bucket_each np4_small)
set_tests_properties(dp_np1 dp_np2 dp_np3 dp_np4 dp_np6 dp_np2_shard dp_np4_shard dp_np3_float64 dp_np4_one_bucket_each dp_np2_fast
                     dp_np4_fast_shard PROPERTIES FIXTURES_SETUP dp_runs)

# Bit for bit: every exact run against the process that ran alone.
while(_same)
  list(POP_FRONT _same run file)
  add_test(NAME ${run}_same_bits COMMAND dp_check --compare ${_dp}/alone.safetensors ${_dp}/${file}.safetensors --tolerance 0)
  set_tests_properties(${run}_same_bits PROPERTIES FIXTURES_REQUIRED "dp_reference;dp_runs")
endwhile()
# 8 micro-batches (a power of two: each process's share is one subtree) on 2 and 4 processes.
foreach(np IN ITEMS 2 4)
  dp_run(dp_m8_np${np} ${np} --micro-batches 8 --out ${_dp}/m8_np${np}.safetensors)
  set_tests_properties(dp_m8_np${np} PROPERTIES FIXTURES_SETUP dp_runs)
  add_test(NAME dp_m8_np${np}_same_bits COMMAND dp_check --compare ${_dp}/alone_m8.safetensors ${_dp}/m8_np${np}.safetensors --tolerance 0)
  set_tests_properties(dp_m8_np${np}_same_bits PROPERTIES FIXTURES_REQUIRED "dp_reference;dp_runs")
endforeach()
add_test(NAME dp_np3_float64_same_bits COMMAND dp_check --compare ${_dp}/alone64.safetensors ${_dp}/np3_64.safetensors --tolerance 0)
# fast: MPI's sum, in its own order; close, not equal.
add_test(NAME dp_np2_fast_close COMMAND dp_check --compare ${_dp}/alone.safetensors ${_dp}/np2_fast.safetensors --tolerance 1e-2)
add_test(NAME dp_np4_fast_shard_close COMMAND dp_check --compare ${_dp}/alone.safetensors ${_dp}/np4_fast_shard.safetensors --tolerance 1e-2)
set_tests_properties(dp_np3_float64_same_bits dp_np2_fast_close dp_np4_fast_shard_close PROPERTIES FIXTURES_REQUIRED "dp_reference;dp_runs")

# A rank that fails ends the job, with a message naming it, instead of hanging (TIMEOUT).
dp_run(dp_killed_rank_ends_the_job 2 --die-rank 1 --at-step 2)
set_tests_properties(dp_killed_rank_ends_the_job PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION "process rank 1 .*exited on signal 9")
# ... and the checkpoint it saved after its last whole step resumes, on one process, exactly.
add_test(NAME dp_killed_rank_leaves_a_checkpoint_that_resumes
         COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:dp_check> -DMPIEXEC=${MPIEXEC_EXECUTABLE} "-DFLAGS=${TAPEGRAD_MPIEXEC_FLAGS}"
                 -DOUT=${_dp}/killed -DREFERENCE=${_dp}/alone.safetensors -P ${CMAKE_CURRENT_SOURCE_DIR}/distributed/killed_rank_checkpoint.cmake)
set_tests_properties(dp_killed_rank_leaves_a_checkpoint_that_resumes PROPERTIES ENVIRONMENT "${TAPEGRAD_MPIEXEC_ENV}" RESOURCE_LOCK mpi
                     FIXTURES_REQUIRED dp_reference TIMEOUT 120)
dp_run(dp_throwing_rank_ends_the_job 3 --throw-rank 1 --at-step 2)
set_tests_properties(dp_throwing_rank_ends_the_job PROPERTIES TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "rank 1 of 3: dp_check: the failure asked for with --throw-rank")
dp_run(dp_stalled_rank_times_out 2 --stall-rank 1 --at-step 2 --timeout 3)
set_tests_properties(dp_stalled_rank_times_out PROPERTIES TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "rank 0 of 2: DataParallel::synchronize: the exchange of bucket 0 in step 2 of this DataParallel did not finish within 3 s")
# Caught, the timeout leaves the group refusing collectives (no job of the caller's left to write
# into freed memory); options that differ are named even when one process would refuse its own.
dp_run(dp_caught_timeout_refuses_collectives 2 --stall-rank 1 --at-step 2 --timeout 3 --catch-timeout)
set_tests_properties(dp_caught_timeout_refuses_collectives PROPERTIES TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "rank 0 of 2: ProcessGroup::barrier: an earlier collective of this process failed or timed out")
dp_run(dp_differing_sizes_are_refused_everywhere 2 --size-mismatch-rank 1)
set_tests_properties(dp_differing_sizes_are_refused_everywhere PROPERTIES TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "broadcast refused: rank 0 of 2: ProcessGroup::broadcast: argument 'tensors' must have the same sizes on every process; rank 1's differ from rank 0's.*all_gather refused: rank 0 of 2: all_gather: argument 'values' must have as many values on every process; rank 0 gives 1, rank 1 gives 2")
dp_run(dp_differing_options_are_named 2 --other-micro-batches-rank 1)
set_tests_properties(dp_differing_options_are_named PROPERTIES TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "rank 1 of 2: DataParallel: this process's model or options differ from rank 0's: rank 0 has 'micro_batches 12', this process has 'micro_batches 3'")
dp_run(dp_mismatched_rank_is_named 2 --mismatch-rank 1)
set_tests_properties(dp_mismatched_rank_is_named PROPERTIES TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "rank 1 of 2: DataParallel: this process's model or options differ from rank 0's")
