"""The parameter rules the adapters share: OpenAI's and vLLM's tables, vLLM's checks."""
