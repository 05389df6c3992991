"""Where a request goes: plans, trees, attempts, retries and circuit breakers."""
