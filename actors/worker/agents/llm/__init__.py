"""Model-backed agents: zeroclaw's own agent loop on OpenAI-style and Anthropic APIs."""
