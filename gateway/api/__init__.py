"""The HTTP surface: the ASGI app, its routes and handlers, the metrics listener."""
