"""OpenAI's online routes (/v1/completions, /v1/chat/completions, /v1/models), a job underneath."""
