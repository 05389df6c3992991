"""The serving process: the CLI, uvicorn's protocol, the supervisor of workers."""
