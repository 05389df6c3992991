"""The in-process vLLM engine provider (`type: vllm`): one AsyncLLM per configured model, in the
gateway's own process. Importing this package does not import vLLM; starting the engine does."""
