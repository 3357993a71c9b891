"""The per-domain benchmark: every method on the same code, JSON and prose prompts (the prompt sets
live here, in `datasets`), its report, and runs of it compared side by side."""
