"""Messages in roles OpenAI does not have (a chat template's own): vLLM's tables and the generic
one pass them; OpenAI's and Fireworks' refuse them in OpenAI's words, naming the message."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequest
from providers.rules.chat import RULES
from providers.rules.params import apply_rules
from providers.vllm_engine.rules import CHAT_RULES as ENGINE

MESSAGES = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "ipython", "content": "42"},
]


@pytest.mark.parametrize("tag", ["vllm-server", "openai-compatible", "engine"])
def test_vllm_and_generic_tables_pass_any_role(tag: str) -> None:
    rules = ENGINE if tag == "engine" else RULES[tag]
    applied = apply_rules(rules, {"messages": MESSAGES}, target="p/m", policy="reject")
    assert applied.body["messages"] is MESSAGES


@pytest.mark.parametrize("tag", ["openai", "fireworks"])
@pytest.mark.parametrize("policy", ["reject", "drop"])
def test_openai_and_fireworks_refuse_a_role_they_do_not_have(tag: str, policy: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        apply_rules(RULES[tag], {"messages": MESSAGES}, target="p/m", policy=policy)  # type: ignore[arg-type]
    assert caught.value.param == "messages[2].role"
    assert caught.value.message.startswith("Invalid value for 'messages[2].role': expected one of")
    assert '"ipython"' in caught.value.message
    plain = MESSAGES[:2]
    assert apply_rules(RULES[tag], {"messages": plain}, target="p/m", policy="reject").body == {
        "messages": plain
    }
