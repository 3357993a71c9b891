"""Our drafters inside other serving engines. Each integration is its own module and imports its
engine only when used: `specdraft.integrations.vllm` (vLLM's custom proposer hook), on top of
`specdraft.integrations.rows` (per-request drafter state for engines that pass batch rows)."""
