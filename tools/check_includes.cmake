# The house's include rules (docs/architecture.md), checked over every source of the library,
# its public headers and the examples. A file that includes what its room may not fails, with
# the file, the line and the rule.
#   cmake -DROOT=<source dir> -P tools/check_includes.cmake
#
# Rooms, bottom up, and the project headers each may include ("room/" is any header there):
#   runtime    runtime/, its public headers and the error types (tapegrad/autodiff/error.hpp)
#   autodiff   autodiff/ and runtime's entry points
#   kernels    kernels/, autodiff/ and runtime's entry points
#   ops        ops/, kernels/ (not kernels' own private headers), autodiff/, runtime's entry points
#              but runtime/cpu.hpp (a loop built for several CPUs is a kernel, in kernels/)
#   layers     layers/, the public headers, autodiff/check.hpp (errors)
#   train      train/, the public headers, autodiff/check.hpp
#   distributed  distributed/, the public headers, autodiff/check.hpp
#   public headers (include/tapegrad/<room>/): public headers of their own room and those below
#   examples   the public headers (<tapegrad/...>) and examples/support/
# Outside headers: oneDNN in kernels/matmul_dnnl.cpp alone, OpenBLAS in kernels/matmul_f64.cpp alone,
# nlohmann-json in train/ alone, SentencePiece in train/tokenizer.cpp alone, MPI in
# distributed/communicator_mpi.cpp alone.
cmake_minimum_required(VERSION 3.25)
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_includes.cmake")
endif()

set(entry_runtime "runtime/parallel.hpp" "runtime/block_cache.hpp" "runtime/cpu.hpp")
set(private_kernels "kernels/attention_products.hpp" "kernels/attention_operands.hpp")
set(allowed_runtime "runtime/" "tapegrad/runtime/" "tapegrad/autodiff/error.hpp")
set(allowed_autodiff "autodiff/" ${entry_runtime} "tapegrad/autodiff/" "tapegrad/runtime/")
set(allowed_kernels "kernels/" "autodiff/" ${entry_runtime} "tapegrad/autodiff/" "tapegrad/runtime/")
set(entry_runtime_ops ${entry_runtime})
list(REMOVE_ITEM entry_runtime_ops "runtime/cpu.hpp")
set(allowed_ops "ops/" "kernels/" "autodiff/" ${entry_runtime_ops} "tapegrad/autodiff/" "tapegrad/ops/" "tapegrad/runtime/")
set(allowed_layers "layers/" "tapegrad/" "autodiff/check.hpp")
set(allowed_train "train/" "tapegrad/" "autodiff/check.hpp")
set(allowed_distributed "distributed/" "tapegrad/" "autodiff/check.hpp")
set(allowed_public_autodiff "tapegrad/autodiff/")
set(allowed_public_runtime "tapegrad/runtime/")
set(allowed_public_ops "tapegrad/autodiff/" "tapegrad/ops/")
set(allowed_public_layers "tapegrad/autodiff/" "tapegrad/ops/" "tapegrad/layers/" "tapegrad/runtime/")
set(allowed_public_train "tapegrad/autodiff/" "tapegrad/ops/" "tapegrad/layers/" "tapegrad/train/")
set(allowed_public_distributed "tapegrad/autodiff/" "tapegrad/ops/" "tapegrad/layers/" "tapegrad/train/" "tapegrad/distributed/")
set(allowed_examples "tapegrad/" "support/" "examples/support/")

set(problems "")
set(checked 0)

# Outside libraries with a home: the headers, where they may be included, what the error says.
set(outside_headers "^(oneapi/dnnl/|dnnl)" "^(cblas|openblas_config)\\.h$" "^nlohmann/" "^sentencepiece_" "^mpi\\.h$")
set(outside_homes "^kernels/matmul_dnnl\\.cpp$" "^kernels/matmul_f64\\.cpp$" "^train/" "^train/tokenizer\\.cpp$"
    "^distributed/communicator_mpi\\.cpp$")
set(outside_messages "oneDNN is called from kernels/matmul_dnnl.cpp alone" "OpenBLAS is called from kernels/matmul_f64.cpp alone"
    "nlohmann-json is train/'s alone" "SentencePiece is called from train/tokenizer.cpp alone"
    "MPI is called from distributed/communicator_mpi.cpp alone")

# check(<room key> <files...>): every quoted or bracketed include of each file against the room.
# allowed(<room> <header> <out>): whether the room's list admits the header.
function(admitted room header out)
  set(ok FALSE)
  foreach(prefix IN LISTS allowed_${room})
    string(LENGTH "${prefix}" n)
    string(SUBSTRING "${header}" 0 ${n} head)
    if(head STREQUAL prefix)
      set(ok TRUE)
    endif()
  endforeach()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

# check(<room key> <files...>): every quoted or bracketed include of each file against the room,
# and, transitively, every include of the project's internal headers it reaches (a header another
# room lets it include must not hand it what its own room may not see). runtime/ is the bottom:
# what its entry points include is its own business.
function(check room)
  list(JOIN allowed_${room} ", " allowed_text)
  foreach(file IN LISTS ARGN)
    file(RELATIVE_PATH rel "${ROOT}" "${file}")
    set(queue "${file}")
    set(vias "")
    set(seen "${file}")
    while(queue)
      list(POP_FRONT queue current)
      list(POP_FRONT vias via)
      if(via STREQUAL "-")
        set(via "")
      endif()
      file(STRINGS "${current}" lines REGEX "^[ \t]*#[ \t]*include")
      foreach(line IN LISTS lines)
        string(REGEX MATCH "[\"<]([^\">]+)[\">]" _ "${line}")
        set(header "${CMAKE_MATCH_1}")
        # Outside headers: only the libraries with a home are checked, in the file itself.
        set(outside FALSE)
        list(LENGTH outside_headers n_outside)
        math(EXPR last_outside "${n_outside} - 1")
        foreach(i RANGE ${last_outside})
          list(GET outside_headers ${i} pattern)
          if(header MATCHES "${pattern}")
            set(outside TRUE)
            list(GET outside_homes ${i} home)
            list(GET outside_messages ${i} message)
            if(NOT via AND NOT rel MATCHES "${home}")
              list(APPEND problems "${rel}: includes ${header} (${message})")
            endif()
          endif()
        endforeach()
        if(outside OR NOT header MATCHES "^(runtime|autodiff|kernels|ops|layers|train|distributed|tapegrad|support|examples)/")
          continue()  # the standard library, fmt, Boost, CLI11, PLplot...
        endif()
        admitted(${room} "${header}" ok)
        if(NOT via)
          if(ok AND header IN_LIST private_kernels AND NOT rel MATCHES "^kernels/")
            set(ok FALSE)
          endif()
          if(ok AND header MATCHES "^runtime/" AND NOT header IN_LIST entry_runtime AND NOT rel MATCHES "^runtime/")
            set(ok FALSE)
          endif()
        elseif(via MATCHES "(^| )runtime/[^ ]*$" OR header IN_LIST entry_runtime)
          # runtime's own includes, and its entry points reached through another room (the
          # autodiff loop engine is built for several CPUs; ops may not write such loops themselves)
          set(ok TRUE)
        endif()
        if(NOT ok)
          if(via)
            list(APPEND problems "${rel}: reaches ${header} through ${via}, which ${room} may not (it may: ${allowed_text})")
          else()
            list(APPEND problems "${rel}: includes ${header}, which ${room} may not (it may: ${allowed_text})")
          endif()
        endif()
        # Follow the project's internal headers (public ones are checked as their own files).
        if(header MATCHES "^(runtime|autodiff|kernels|ops|layers|train|distributed)/" AND EXISTS "${ROOT}/${header}")
          set(next "${ROOT}/${header}")
          if(NOT next IN_LIST seen)
            list(APPEND seen "${next}")
            list(APPEND queue "${next}")
            if(via)
              list(APPEND vias "${via} ${header}")
            else()
              list(APPEND vias "${header}")
            endif()
          endif()
        endif()
      endforeach()
    endwhile()
    math(EXPR checked "${checked} + 1")
  endforeach()
  set(problems "${problems}" PARENT_SCOPE)
  set(checked ${checked} PARENT_SCOPE)
endfunction()

foreach(room runtime autodiff kernels ops layers train distributed)
  file(GLOB files "${ROOT}/${room}/*.cpp" "${ROOT}/${room}/*.hpp")
  check(${room} ${files})
endforeach()
foreach(room autodiff runtime ops layers train distributed)
  file(GLOB files "${ROOT}/include/tapegrad/${room}/*.hpp")
  check(public_${room} ${files})
endforeach()
file(GLOB_RECURSE files "${ROOT}/examples/*.cpp" "${ROOT}/examples/*.hpp")
check(examples ${files})

list(LENGTH problems count)
if(count GREATER 0)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "${count} include(s) break the house's rules (docs/architecture.md):\n  ${text}")
endif()
message(STATUS "house_includes: ${checked} files, every include within its room's rules")
