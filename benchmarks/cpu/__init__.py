"""CPU step benchmarks: what a decode or verify step costs on this CPU and where its time goes
(the weight-read floor, the int8 arithmetic beside float32 and llama.cpp, the projections, attention,
prefill, the host work around the kernels)."""
