"""User-facing edges: the CLI and the OpenAI-compatible HTTP server. Parse, validate, format."""
