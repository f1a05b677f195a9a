"""A CPU happens-before checker for sglang's FutureMap relay buffers.

Simulated CUDA streams and events feed the vector clocks of PyTorch's CUDA
sanitizer (torch.cuda._sanitizer); a dispatch mode reports every aten read
and write of the watched buffers, one access per row, on the simulated
current stream. The scenarios drive the real sglang code of a tree through
this machinery and collect what the sanitizer calls unsynchronized.
"""
