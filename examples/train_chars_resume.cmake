# train_chars --resume: a checkpoint resumes, a model and an optimizer file from different steps
# (a run stopped between the two saves) are refused with a message that says so, and metadata
# that cannot be read is refused naming the file, the field and the value.
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

# Metadata that cannot be read is named with its file, its field and its value. Each edit keeps
# the header's length, so the file stays well-formed and only the value is wrong.
function(edit file from to)
  execute_process(COMMAND sed -i "s/${from}/${to}/" ${file} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "sed on ${file} failed")
  endif()
endfunction()
function(refused what expected)
  run(FALSE ${ARGN})
  if(NOT err MATCHES "${expected}")
    message(FATAL_ERROR "${what}: the message does not name the file, field and value (expected /${expected}/):\n${err}")
  endif()
endfunction()
file(REMOVE_RECURSE ${OUT})
run(TRUE --steps 1)
file(COPY_FILE ${OUT}/model.safetensors ${OUT}/model_good.safetensors)
edit(${OUT}/model.safetensors "\"dim\":\"16\"" "\"dim\":\"1x\"")
refused("dim" "model.safetensors: metadata field 'dim': '1x' is not an integer" --generate)
refused("dim on resume" "model.safetensors: metadata field 'dim': '1x' is not an integer" --resume --steps 1)
file(COPY_FILE ${OUT}/model_good.safetensors ${OUT}/model.safetensors)
edit(${OUT}/model.safetensors "\"positions\":\"sinusoidal\"" "\"positions\":\"sinusoidaX\"")
refused("positions" "model.safetensors: metadata field 'positions': 'sinusoidaX' is not a kind of positions" --generate)
file(COPY_FILE ${OUT}/model_good.safetensors ${OUT}/model.safetensors)
edit(${OUT}/model.safetensors "\"heads\":\"2\"" "\"heads\":\"0\"")
refused("heads 0" "model.safetensors: the metadata describe no model[^\n]*config.heads" --generate)
file(COPY_FILE ${OUT}/model_good.safetensors ${OUT}/model.safetensors)
edit(${OUT}/model.safetensors "\"steps\":\"1\"" "\"steps\":\"-\"")
edit(${OUT}/optimizer.safetensors "\"steps\":\"1\"" "\"steps\":\"-\"")
refused("steps" "optimizer.safetensors: metadata field 'steps': '-' is not an integer" --resume --steps 1)
