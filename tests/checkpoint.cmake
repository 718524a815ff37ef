# Safetensors checkpoints.
tapegrad_test(test_checkpoint test_checkpoint.cpp)
