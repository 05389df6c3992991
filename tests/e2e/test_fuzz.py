"""Fuzzing every endpoint from the gateway's own API document (schemathesis, on Hypothesis):
requests generated from each operation's schema, valid and not, sent to a gateway on the
scripted upstreams and to the in-process engine of the session's vLLM stack. Whatever is sent:
no 5xx, no hang, a status and content type the document lists, and an answer that matches the
document (every 4xx in OpenAI's error shape, a 400 on a body of fields naming one of them).

The generated Portkey headers are dropped (a random `x-portkey-config` is refused before the
body is read) and the body's model is one the target serves, so that the bodies reach the
validation and the providers behind it. Bounded in examples per operation, so `make test`
stays well inside its time."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks
from schemathesis.schemas import APIOperation

from core.openapi import build
from tests.e2e.conftest import Env
from tests.e2e.support import FULL_KEY, FW, GENERIC, OA
from tests.e2e.vllm_stack import KEY as STACK_KEY
from tests.e2e.vllm_stack import MODEL as STACK_MODEL
from tests.e2e.vllm_stack import VIRTUAL_KEY, Stack

EXAMPLES = 20  # per operation and target
STATEFUL_EXAMPLES = 30  # sequences of calls
DROPPED = ("x-portkey-config", "x-portkey-virtual-key", "x-portkey-api-key", "authorization")
DOCUMENT = build()
schema = schemathesis.openapi.from_dict(DOCUMENT)
FIELDS_SENT = ("application/json", "multipart/form-data")  # bodies the gateway reads as fields


@schemathesis.check
def a_400_names_the_parameter_at_fault(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 400 on a body of fields names the parameter at fault: a field the body has, one the
    operation's schema knows (a required one missing), or a header sent. A body that is not
    one of fields (not JSON, not an object) has no field to name."""
    if response.status_code != 400 or not isinstance(case.body, dict):
        return None
    if case.media_type not in FIELDS_SENT:
        return None
    error = response.json()["error"]
    param = error.get("param")
    assert param is not None, f"a 400 naming no field: {error.get('message')!r}"  # "" is one
    root = re.split(r"[.\[]", param, maxsplit=1)[0]
    known = set(case.body) | fields_of(case.operation.path, case.operation.method, case.media_type)
    known |= {name.lower() for name in case.headers or {}}  # a Portkey header at fault
    assert param in known or root in known, f"a 400 naming {param!r}, not a field sent"
    return None


def fields_of(path: str, method: str, media_type: str) -> set[str]:
    """The request's top-level fields in the document."""
    body = DOCUMENT["paths"][path][method.lower()]["requestBody"]["content"][media_type]["schema"]
    if "$ref" in body:
        body = DOCUMENT["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    return set(body.get("properties", {}))


CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    a_400_names_the_parameter_at_fault,
]


@dataclass(frozen=True)
class Target:
    url: str
    headers: dict[str, str]
    models: tuple[str, ...]  # what a body's `model` becomes, in turn
    reset: Callable[[], None]  # the scripted upstreams back to plain answers (the suite's
    # other tests script failures on them; a failing upstream's 502 is not what is fuzzed)


@pytest.fixture(scope="module", params=["scripted", "engine"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "scripted":
        env: Env = request.getfixturevalue("scripted_env")
        auth = {"authorization": f"Bearer {FULL_KEY}"}
        yield Target(env.gateway.url, auth, (OA, FW, GENERIC), env.reset)
    else:
        stack: Stack = request.getfixturevalue("vllm_stack")
        auth = {"authorization": f"Bearer {STACK_KEY}", VIRTUAL_KEY: "engine"}
        yield Target(stack.gateway.url, auth, (STACK_MODEL,), lambda: None)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_breaks_the_gateway_or_its_document(
    case: schemathesis.Case[APIOperation[Any, Any, Any, Any]], target: Target
) -> None:
    target.reset()
    aimed(case, target)
    case.call_and_validate(base_url=target.url, headers=target.headers, checks=CHECKS)


def aimed(case: Any, target: Target) -> None:
    """The generated Portkey and auth headers dropped, the body's model one of the target's."""
    for name in DROPPED:
        if case.headers is not None and name in case.headers:
            del case.headers[name]
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = target.models[len(repr(case.body)) % len(target.models)]
    if isinstance(case.body, dict) and "purpose" in case.body and len(repr(case.body)) % 2:
        case.body["purpose"] = "batch"  # half the uploads can become a batch's input


def test_files_and_batches_in_sequence(target: Target) -> None:
    """Stateful: uploads followed by what their answers lead to (the document's links: the
    file read, downloaded, deleted, made a batch's input; the batch read and cancelled), in
    generated orders, with the same checks at every step."""
    if target.models == (STACK_MODEL,):
        pytest.skip("the files and batches API is the same on every target")

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Any) -> None:
            target.reset()
            aimed(case, target)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": target.url, "headers": target.headers}

        def validate_response(self, response: Any, case: Any, *_: Any, **kw: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    Machine.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
    )
