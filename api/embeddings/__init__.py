"""Embeddings: `POST /v1/embeddings` (OpenAI's shape), each request one light job of its model; inputs
tokenized and checked per model at submission."""
