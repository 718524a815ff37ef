# Safetensors checkpoints: the C++ suite, then interoperability with an independent reader and
# writer of the format (tests/data/read_safetensors.py, Python standard library only). The C++
# side writes a file the script checks, and loads a file the script wrote; FIXTURES order each
# pair. Without /usr/bin/python3 the interop tests are not registered.
tapegrad_test(test_checkpoint test_checkpoint.cpp)
tapegrad_test(test_training_state test_training_state.cpp)

find_program(TAPEGRAD_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(TAPEGRAD_PYTHON3)
  set(interop_dir ${CMAKE_CURRENT_BINARY_DIR}/checkpoint_interop)
  file(MAKE_DIRECTORY ${interop_dir})
  set(script ${CMAKE_CURRENT_SOURCE_DIR}/data/read_safetensors.py)
  add_test(NAME checkpoint_cpp_writes
    COMMAND test_checkpoint --run_test=interop/write_for_python --log_level=warning -- ${interop_dir}/from_cpp.safetensors)
  add_test(NAME checkpoint_python_reads COMMAND ${TAPEGRAD_PYTHON3} ${script} check ${interop_dir}/from_cpp.safetensors)
  add_test(NAME checkpoint_python_writes COMMAND ${TAPEGRAD_PYTHON3} ${script} write ${interop_dir}/from_python.safetensors)
  add_test(NAME checkpoint_cpp_reads
    COMMAND test_checkpoint --run_test=interop/read_from_python --log_level=warning -- ${interop_dir}/from_python.safetensors)
  set_tests_properties(checkpoint_cpp_writes PROPERTIES FIXTURES_SETUP checkpoint_from_cpp)
  set_tests_properties(checkpoint_python_reads PROPERTIES FIXTURES_REQUIRED checkpoint_from_cpp)
  set_tests_properties(checkpoint_python_writes PROPERTIES FIXTURES_SETUP checkpoint_from_python)
  set_tests_properties(checkpoint_cpp_reads PROPERTIES FIXTURES_REQUIRED checkpoint_from_python)
else()
  message(STATUS "tapegrad: /usr/bin/python3 not found; the safetensors interop tests are skipped")
endif()
