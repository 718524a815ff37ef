# Safetensors checkpoints (train/checkpoint.cpp, train/safetensors_header.cpp). nlohmann-json is
# header-only and used by those source files only: linked as a build-time-only dependency, it is neither exported nor needed by
# anyone who links the installed tapegrad (no public header includes it).
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
target_sources(tapegrad PRIVATE train/checkpoint.cpp train/safetensors_header.cpp train/training_state.cpp)
target_link_libraries(tapegrad PRIVATE $<BUILD_INTERFACE:nlohmann_json::nlohmann_json>)
