# train_chars --distributed: 12 micro-batches a step, trained by one process without a launcher,
# then under mpirun by 2, 3 and 4 processes, and stopped by 3 processes with sharded optimizer
# state and resumed by 2 without: every run ends with the same checkpoint, byte for byte. Under
# a launcher, train_chars without --distributed is refused.
#   cmake -DEXE=path/to/train_chars -DMPIEXEC=mpiexec "-DFLAGS=--oversubscribe;--bind-to;none" -DOUT=dir -P train_chars_distributed.cmake
set(small --batch 12 --micro-batches 12 --context 16 --dim 16 --heads 2 --layers 1 --tokens 4 --threads 1 --log-every 4 --steps 8
    --dropout 0.2 --distributed)

function(run out_dir np)
  set(launch "")
  if(np GREATER 0)
    set(launch ${MPIEXEC} -n ${np} ${FLAGS})
  endif()
  execute_process(COMMAND ${launch} ${EXE} --out ${out_dir} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "train_chars on ${np} process(es) ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

function(same_checkpoint what dir)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT}/alone/checkpoint.safetensors ${dir}/checkpoint.safetensors
                  RESULT_VARIABLE differ)
  if(NOT differ EQUAL 0)
    message(FATAL_ERROR "${what}: the checkpoint differs from the one process's")
  endif()
  message(STATUS "${what}: the same checkpoint, byte for byte")
endfunction()

file(REMOVE_RECURSE ${OUT})
run(${OUT}/alone 0 ${small})
foreach(np IN ITEMS 2 3 4)
  run(${OUT}/np${np} ${np} ${small})
  if(NOT out MATCHES "data-parallel: ${np} process")
    message(FATAL_ERROR "the run on ${np} processes did not say so:\n${out}")
  endif()
  same_checkpoint("${np} processes" ${OUT}/np${np})
endforeach()
run(${OUT}/resumed 3 ${small} --shard-optimizer --stop-at 4)
run(${OUT}/resumed 2 --resume --threads 1 --tokens 4)
if(NOT out MATCHES "steps 4 to 8 of 8")
  message(FATAL_ERROR "the resumed run did not continue from step 4:\n${out}")
endif()
same_checkpoint("3 processes with sharded state, stopped at step 4, resumed by 2" ${OUT}/resumed)

execute_process(COMMAND ${MPIEXEC} -n 2 ${FLAGS} ${EXE} --out ${OUT}/refused --steps 1 RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out
                TIMEOUT 120)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "an MPI launcher started 2 processes; add --distributed")
  message(FATAL_ERROR "train_chars under mpirun without --distributed was not refused as expected (${rc}):\n${out}\n${err}")
endif()
