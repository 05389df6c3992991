"""vLLM's exceptions → the gateway's error tree, as vLLM's own server answers them: a request the
engine refuses is a 400 naming the parameter; an overloaded engine a 503 to retry; a dead or
failing engine a 5xx that names the target, never a traceback."""

from __future__ import annotations

from core.errors import GatewayError, InvalidRequest, ServiceUnavailable, UpstreamError


def engine_error(exc: Exception, label: str) -> GatewayError:
    from vllm.exceptions import GracefulHTTPError, VLLMClientError, VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    message = str(exc) or type(exc).__name__
    if isinstance(exc, VLLMValidationError):
        return InvalidRequest(message, param=exc.parameter or None)
    if isinstance(exc, VLLMClientError | ValueError):  # vLLM's server: ValueError is a 400
        return InvalidRequest(message)
    if isinstance(exc, GracefulHTTPError):  # queue full: try again
        return ServiceUnavailable(f"{label}: {message}", headers={"retry-after": "1"})
    if isinstance(exc, EngineDeadError):
        return UpstreamError(
            f"The vLLM engine of {label} has stopped; the gateway needs a restart.",
            target=label,
            status=503,
            code="engine_dead",
        )
    return UpstreamError(
        f"The vLLM engine of {label} failed ({type(exc).__name__}).",
        target=label,
        status=500,
        code="engine_error",
    )
