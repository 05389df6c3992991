"""What the gateway tells about each request beyond its metrics: the request log."""
