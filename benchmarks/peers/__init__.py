"""The systems specdraft is compared with: Hugging Face `generate` and its prompt lookup (`hf`), and
vLLM with its own n-gram proposer or ours (`vllm_engines`, `vllm_proposer`, run in `.venv-vllm`)."""
