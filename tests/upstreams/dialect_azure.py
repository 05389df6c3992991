"""The scripted Azure OpenAI upstream, as Microsoft documents its REST API (data plane,
inference): OpenAI's requests and answers (dialect_openai.py) at Azure's addresses, with Azure's
key header, errors and content filter.

* Routes: `POST /openai/deployments/{deployment}/completions` (and `…/chat/completions`,
  `…/embeddings`) with `?api-version=…`, which is required (none: 404 `Resource not found`; one
  Azure does not have: 400 `API version not supported`); the request goes to the deployment,
  whatever the body's `model` says. The v1 API, `POST /openai/v1/completions` (and the others),
  takes no api-version (or `preview`, `latest`) and the deployment's name as the body's `model`.
  Any other path: 404. With `--models`, those are the deployments (others: 404
  `DeploymentNotFound`); without, every deployment exists.
* Auth: the key in the `api-key` header (an `Authorization` header is no key): 401
  `{"error": {"code": "401", "message": "Access denied due to invalid subscription key …"}}`.
* Answers: OpenAI's, plus the content filter's verdicts: `prompt_filter_results` (one per prompt)
  on the answer and `content_filter_results` on each choice. A stream first sends an event of
  its own, `choices: []` with the `prompt_filter_results`, then OpenAI's chunks, each choice's
  with its `content_filter_results` (`{}` on a chunk without text).
* Markers: `__content_filter__` in a prompt is Azure's refusal, 400 `code: content_filter`
  (`param: prompt`, `innererror` `ResponsibleAIPolicyViolation` with the verdicts);
  `__filtered_output__` lets the model answer but the filter cuts it: each choice of that prompt
  ends with `finish_reason: "content_filter"`, its verdicts `filtered: true`.
* Other errors in Azure's shape, `{"error": {"code", "message"}}` (429 with `retry-after: 7`).

Order: route (path, api-version) → auth → the rest as for OpenAI (README.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from .dialect import Json
from .dialect_openai import OpenAIDialect
from .errors import RETRY_AFTER_S, UpstreamError
from .magic import FILTERED_OUTPUT
from .render import ChoiceOut, Result
from .validate import Params

API_VERSIONS = (
    "2024-02-01",
    "2024-06-01",
    "2024-10-21",
    "2024-12-01-preview",
    "2025-01-01-preview",
    "2025-03-01-preview",
    "2025-04-01-preview",
)
V1_VERSIONS = (None, "preview", "latest")
ENDPOINTS = "completions|chat/completions|embeddings"
DEPLOYMENT_PATH = re.compile(rf"/openai/deployments/([^/]+)/(?:{ENDPOINTS})")
V1_PATH = re.compile(rf"/openai/v1/(?:{ENDPOINTS})")
CATEGORIES = ("hate", "self_harm", "sexual", "violence")
DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide "
    "a valid key for an active subscription and use a correct regional API endpoint for your "
    "resource."
)
FILTERED = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content management "
    "policy. Please modify your prompt and retry. To learn more about our content filtering "
    "policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766"
)
STATUS_MESSAGES = {
    400: "Scripted error 400.",
    404: "Resource not found",
    429: (
        "Requests to the Completions_Create Operation under Azure OpenAI API version 2024-10-21 "
        f"have exceeded call rate limit of your current OpenAI S0 pricing tier. Please retry "
        f"after {RETRY_AFTER_S} seconds."
    ),
}
SERVER_MESSAGE = "The service is temporarily unable to process your request. Please try again."


def azure_error(http_status: int, code: str, message: str, **extra: Any) -> UpstreamError:
    """Azure's error body; `extra`: more of the error object's fields."""
    headers = {"retry-after": str(RETRY_AFTER_S)} if http_status == 429 else {}
    error = {"code": code, "message": message, **extra}
    return UpstreamError(http_status, {"error": error}, headers)


def verdicts(filtered: bool = False) -> Json:
    """The content filter's results for one text: every category safe, or hate filtered."""
    out: Json = {c: {"filtered": False, "severity": "safe"} for c in CATEGORIES}
    if filtered:
        out["hate"] = {"filtered": True, "severity": "high"}
    return out


def prompt_filter_results(count: int) -> list[Json]:
    return [
        {"prompt_index": i, "content_filter_results": {**verdicts(), "jailbreak": _undetected()}}
        for i in range(count)
    ]


def _undetected() -> Json:
    return {"filtered": False, "detected": False}


def content_filter_error() -> UpstreamError:
    """Azure's refusal of a prompt its content filter flags."""
    results = {**verdicts(filtered=True), "jailbreak": _undetected()}
    inner = {"code": "ResponsibleAIPolicyViolation", "content_filter_result": results}
    return azure_error(
        400, "content_filter", FILTERED, param="prompt", status=400, innererror=inner
    )


def route(path: str, query: Mapping[str, str], body: Any) -> Any:
    """The body as the route serves it (a deployment's name as its model), or Azure's error for
    a path or api-version it does not have."""
    version = query.get("api-version")
    deployment = DEPLOYMENT_PATH.fullmatch(path)
    if deployment is not None:
        if version is None:
            raise azure_error(404, "404", "Resource not found")
        if version not in API_VERSIONS:
            raise azure_error(400, "BadRequest", "API version not supported")
        return {**body, "model": deployment.group(1)} if isinstance(body, dict) else body
    if V1_PATH.fullmatch(path) is None:
        raise azure_error(404, "404", "Resource not found")
    if version not in V1_VERSIONS:
        raise azure_error(400, "BadRequest", "API version not supported")
    return body


class AzureDialect(OpenAIDialect):
    name = "azure"
    default_models: ClassVar[tuple[str, ...]] = ()  # any deployment, unless --models names some

    def route(self, path: str, query: Mapping[str, str], body: Any) -> Any:
        return route(path, query, body)

    def check_key(self, headers: Mapping[str, str], key: str) -> None:
        if headers.get("api-key") != key:
            raise azure_error(401, "401", DENIED)

    def auth_error(self, authorization: str | None) -> UpstreamError:
        return azure_error(401, "401", DENIED)

    def status_error(self, status: int, quota: bool) -> UpstreamError:
        message = STATUS_MESSAGES.get(status, SERVER_MESSAGE if status >= 500 else "Bad request.")
        return azure_error(status, str(status), message)

    def model_not_found(self, model: str) -> UpstreamError:
        message = (
            "The API deployment for this resource does not exist. If you created the deployment "
            "within the last 5 minutes, please wait a moment and try again."
        )
        return azure_error(404, "DeploymentNotFound", message)

    def content_filter_error(self) -> UpstreamError | None:
        return content_filter_error()

    def headers(self, params: Params, result: Result) -> dict[str, str]:
        return {
            "apim-request-id": "00000000-0000-4000-8000-000000000000",
            "x-ms-region": "Sweden Central",
            "x-ratelimit-remaining-requests": "99",
            "x-ratelimit-remaining-tokens": "99000",
        }

    def body(self, params: Params, result: Result) -> Json:
        out = super().body(params, result)
        return {**out, "prompt_filter_results": prompt_filter_results(len(params.prompts))}

    def full_choice(self, params: Params, c: ChoiceOut) -> Json:
        out = super().full_choice(params, c)
        filtered = FILTERED_OUTPUT in c.prompt.text
        out["content_filter_results"] = verdicts(filtered)
        if filtered:
            out["finish_reason"] = "content_filter"
        return out

    def stream_events(self, params: Params, result: Result) -> list[Json]:
        filtered = {c.index for c in result.choices if FILTERED_OUTPUT in c.prompt.text}
        events = super().stream_events(params, result)
        for event in events:
            for choice in event["choices"]:
                filtered_here = choice["index"] in filtered
                choice["content_filter_results"] = verdicts(filtered_here) if choice["text"] else {}
                if filtered_here and choice["finish_reason"] is not None:
                    choice["finish_reason"] = "content_filter"
        return [prompt_event(len(params.prompts)), *events]


def prompt_event(prompts: int) -> Json:
    """A stream's first event: the verdicts on the prompts, before any choice."""
    return {
        "id": "",
        "object": "",
        "created": 0,
        "model": "",
        "choices": [],
        "prompt_filter_results": prompt_filter_results(prompts),
    }
