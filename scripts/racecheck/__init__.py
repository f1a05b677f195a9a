"""A CPU happens-before checker for sglang's FutureMap relay buffers: simulated CUDA
streams and events feed the vector clocks of PyTorch's CUDA sanitizer, and every aten
read and write of a watched buffer row is checked as the scenarios drive the real
sglang code of a tree."""
