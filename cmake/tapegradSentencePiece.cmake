# SentencePiece (optional): SubwordTokenizer's training and encoding (train/tokenizer.cpp, the
# one file that includes its headers). Debian: libsentencepiece-dev. Without it the library
# builds train/tokenizer_unavailable.cpp instead, whose SubwordTokenizer throws, and the tests
# of the tokenizer are left out. Found by header and library, as oneDNN and OpenBLAS are; a
# static tapegrad then links both libraries by their full paths, which the export carries.
# TAPEGRAD_SENTENCEPIECE=OFF builds the stand-in even where SentencePiece is installed.
option(TAPEGRAD_SENTENCEPIECE "Build SubwordTokenizer on SentencePiece when it is found" ON)
if(TAPEGRAD_SENTENCEPIECE)
  find_path(TAPEGRAD_SENTENCEPIECE_INCLUDE_DIR sentencepiece_trainer.h)
  find_library(TAPEGRAD_SENTENCEPIECE_LIBRARY sentencepiece)
  find_library(TAPEGRAD_SENTENCEPIECE_TRAIN_LIBRARY sentencepiece_train)
endif()
if(TAPEGRAD_SENTENCEPIECE AND TAPEGRAD_SENTENCEPIECE_INCLUDE_DIR AND TAPEGRAD_SENTENCEPIECE_LIBRARY
   AND TAPEGRAD_SENTENCEPIECE_TRAIN_LIBRARY)
  set(TAPEGRAD_SENTENCEPIECE_FOUND TRUE)
  message(STATUS "SentencePiece: found (${TAPEGRAD_SENTENCEPIECE_LIBRARY}); SubwordTokenizer is built, with its tests")
  target_sources(tapegrad PRIVATE train/tokenizer.cpp)
  target_include_directories(tapegrad SYSTEM PRIVATE ${TAPEGRAD_SENTENCEPIECE_INCLUDE_DIR})
  target_link_libraries(tapegrad PRIVATE ${TAPEGRAD_SENTENCEPIECE_TRAIN_LIBRARY} ${TAPEGRAD_SENTENCEPIECE_LIBRARY})
else()
  set(TAPEGRAD_SENTENCEPIECE_FOUND FALSE)
  set(_why "NOT found (Debian: libsentencepiece-dev)")
  if(NOT TAPEGRAD_SENTENCEPIECE)
    set(_why "left out (TAPEGRAD_SENTENCEPIECE=OFF)")
  endif()
  message(STATUS "SentencePiece: ${_why}; SubwordTokenizer throws when used (train_chars --tokenizer bpe|unigram too), "
                 "and its tests are left out")
  target_sources(tapegrad PRIVATE train/tokenizer_unavailable.cpp)
endif()
