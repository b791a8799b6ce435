"""vLLM's classic POST /generate, a job underneath."""
