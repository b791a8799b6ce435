"""A prompt or chat rendered, tokenized and checked against the context: for jobs, OpenAI routes, batches."""
