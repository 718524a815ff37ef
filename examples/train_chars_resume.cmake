# train_chars --resume: a checkpoint resumes, and a model and an optimizer file from different
# steps (a run stopped between the two saves) are refused with a message that says so.
#   cmake -DEXE=path/to/train_chars -DOUT=dir -P train_chars_resume.cmake
set(small --batch 2 --context 16 --dim 16 --heads 2 --layers 1 --tokens 4 --threads 1 --out ${OUT})

function(run expect_success)
  execute_process(COMMAND ${EXE} ${small} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_success AND NOT rc EQUAL 0)
    message(FATAL_ERROR "train_chars ${ARGN} failed (${rc}):\n${out}\n${err}")
  elseif(NOT expect_success AND rc EQUAL 0)
    message(FATAL_ERROR "train_chars ${ARGN} succeeded; it should have refused:\n${out}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${OUT})
run(TRUE --steps 2)
file(COPY_FILE ${OUT}/optimizer.safetensors ${OUT}/optimizer_at_2.safetensors)
run(TRUE --resume --steps 1)
if(NOT out MATCHES "steps 2 to 3")
  message(FATAL_ERROR "the resumed run did not continue from step 2:\n${out}")
endif()

# What a run stopped between the two saves leaves (the model is saved first): the model of
# step 3 beside the optimizer of step 2.
file(COPY_FILE ${OUT}/optimizer_at_2.safetensors ${OUT}/optimizer.safetensors)
run(FALSE --resume --steps 1)
if(NOT err MATCHES "is from step 3 but [^\n]*optimizer.safetensors from step 2: a save was interrupted")
  message(FATAL_ERROR "mismatched files refused without saying why:\n${err}")
endif()
