"""The one check of a refused request, for the declarations' tests: a 400 in OpenAI's
`invalid_request_error` shape that names the field at fault."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.errors import InvalidRequest


def refused(param: str, call: Callable[..., Any], **fields: Any) -> InvalidRequest:
    """`call(**fields)` refused with a 400 naming `param`; the error, for more checks."""
    with pytest.raises(InvalidRequest) as info:
        call(**fields)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"
    return info.value
