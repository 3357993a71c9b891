"""GPU benchmarks: the verify step at Llama-3.2-1B/3B shapes against Hugging Face's forward and the
weight-read floor, and the batch-invariant linear's tilings alone (run on a lent GPU machine by
`scripts/gpu_run.py`)."""
