# A rank killed in step 3 of a 2-process run that saves its training state after every step
# leaves a checkpoint that one process resumes: it continues from step 3 and ends with the
# parameters of the run never stopped, bit for bit (the checkpoint is replaced whole, never
# half-written, and loads on any process count).
#   cmake -DEXE=dp_check -DMPIEXEC=mpiexec "-DFLAGS=..." -DOUT=dir -DREFERENCE=alone.safetensors -P killed_rank_checkpoint.cmake
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
execute_process(COMMAND ${MPIEXEC} -n 2 ${FLAGS} ${EXE} --checkpoint ${OUT}/state.safetensors --die-rank 1 --at-step 3
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "process rank 1 .*exited on signal 9")
  message(FATAL_ERROR "the job with a killed rank did not end as expected (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${EXE} --checkpoint ${OUT}/state.safetensors --resume --out ${OUT}/resumed.safetensors
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0 OR NOT out MATCHES "resumed at step 3")
  message(FATAL_ERROR "the checkpoint left by the killed job did not resume from step 3 (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${EXE} --compare ${REFERENCE} ${OUT}/resumed.safetensors --tolerance 0 RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the resumed run's parameters differ from the run never stopped:\n${out}")
endif()
message(STATUS "${out}")
