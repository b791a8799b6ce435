"""The Llama-family model: its config, layers, forward pass and weight loading."""
