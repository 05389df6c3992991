"""The response cache's store: entries (an answer, and the stream it was first written as) kept
in memory or in Redis, and the in-process flights that collapse identical misses. What a key is
and when a request uses the cache is the pipeline's (gateway.pipeline.caching)."""
