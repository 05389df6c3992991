"""The upstream HTTP transport every HTTP adapter shares: the client, SSE reading, errors."""
