# train_chars --resume: a run stopped after step 3 of 6 and resumed in a second process prints
# the losses the run never stopped prints and ends with the same checkpoint, byte for byte;
# metadata that cannot be read is refused naming the file, the field and the value. EXTRA (a
# list) adds options to the run, another model or vocabulary; the metadata checks run without it.
#   cmake -DEXE=path/to/train_chars -DOUT=dir [-DEXTRA="--arch;llama"] -P train_chars_resume.cmake
set(small --batch 2 --context 16 --dim 16 --heads 2 --layers 1 --tokens 4 --threads 1 --log-every 1)

function(run expect_success out_dir)
  execute_process(COMMAND ${EXE} ${small} --out ${out_dir} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_success AND NOT rc EQUAL 0)
    message(FATAL_ERROR "train_chars ${ARGN} failed (${rc}):\n${out}\n${err}")
  elseif(NOT expect_success AND rc EQUAL 0)
    message(FATAL_ERROR "train_chars ${ARGN} succeeded; it should have refused:\n${out}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

# The printed losses: "step i/6  loss x" and, at the last step, the validation loss; the
# throughput and time left on the same lines differ from run to run.
function(losses text result)
  string(REGEX MATCHALL "step [0-9]+/[0-9]+  loss [0-9.]+(  val [0-9.]+)?|validation loss [0-9.]+ nats" found "${text}")
  set(${result} "${found}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${OUT})
run(TRUE ${OUT}/straight --steps 6 --dropout 0.2 ${EXTRA})
losses("${out}" straight)
run(TRUE ${OUT}/resumed --steps 6 --dropout 0.2 --stop-at 3 ${EXTRA})
losses("${out}" first)
list(FILTER first EXCLUDE REGEX "^validation")  # the stopped run's own score, at step 3
run(TRUE ${OUT}/resumed --resume)
if(NOT out MATCHES "steps 3 to 6 of 6")
  message(FATAL_ERROR "the resumed run did not continue from step 3:\n${out}")
endif()
losses("${out}" second)
list(LENGTH straight n)
if(NOT n EQUAL 7)
  message(FATAL_ERROR "expected 6 step losses and a validation loss, found ${n}: ${straight}")
endif()
if(NOT "${first};${second}" STREQUAL "${straight}")
  message(FATAL_ERROR "the stopped and resumed run printed other losses:\n  ${first};${second}\nthan the run straight through:\n  ${straight}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT}/straight/checkpoint.safetensors ${OUT}/resumed/checkpoint.safetensors
                RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "the resumed run's checkpoint differs from the straight run's (parameters, optimizer or random streams)")
endif()

if(EXTRA)
  return()
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
  run(FALSE ${OUT}/straight ${ARGN})
  if(NOT err MATCHES "${expected}")
    message(FATAL_ERROR "${what}: the message does not name the file, field and value (expected /${expected}/):\n${err}")
  endif()
endfunction()
set(file ${OUT}/straight/checkpoint.safetensors)
file(COPY_FILE ${file} ${OUT}/good.safetensors)
# bad_value(FROM TO WHAT EXPECTED ARGS...): the good file with FROM edited into TO is refused.
function(bad_value from to what expected)
  file(COPY_FILE ${OUT}/good.safetensors ${file})
  edit(${file} "${from}" "${to}")
  refused("${what}" "${expected}" ${ARGN})
endfunction()
bad_value("\"dim\":\"16\"" "\"dim\":\"1x\"" "dim" "checkpoint.safetensors: metadata field 'dim': '1x' is not an integer" --generate)
refused("dim on resume" "checkpoint.safetensors: metadata field 'dim': '1x' is not an integer" --resume)
bad_value("\"positions\":\"sinusoidal\"" "\"positions\":\"sinusoidaX\"" "positions"
          "checkpoint.safetensors: metadata field 'positions': 'sinusoidaX' is not a kind of positions" --generate)
bad_value("\"arch\":\"gpt\"" "\"arch\":\"gpX\"" "arch" "checkpoint.safetensors: metadata field 'arch': 'gpX' is not an arch" --resume)
bad_value("\"heads\":\"2\"" "\"heads\":\"0\"" "heads 0" "checkpoint.safetensors: the metadata describe no model[^\n]*config.heads" --generate)
bad_value("\"lr\":\"0.002\"" "\"lr\":\"0.00z\"" "lr" "checkpoint.safetensors: metadata field 'lr': '0.00z' is not a number" --resume)
bad_value("\"tapegrad.step\":\"6\"" "\"tapegrad.step\":\"-\"" "step"
          "load_training_state: [^\n]*checkpoint.safetensors': metadata 'tapegrad.step'[^\n]*got '-'" --resume)
