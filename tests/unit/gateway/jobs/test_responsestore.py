"""gateway.jobs.responsestore: stored responses in a temporary directory (and the in-memory
object store): what is kept of a response and how its input items are listed and paged, the
conversation a next turn continues from, deletion, expiry, who owns a response (a team, or a key
without one), and ids that are not the gateway's (404, the store never asked)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from obstore.store import ObjectStore

from core.errors import NotFound
from gateway.auth import Principal
from gateway.jobs.filestore import FileStore
from gateway.jobs.responsestore import DAY_S, ResponseStore, is_response_id, owner
from tests.odd_ids import odd_ids

NOW = 1_800_000_000.0
OWNER = "key/abc"


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def principal(key_id: str, team: str | None = None) -> Principal:
    return Principal(key_id, re.compile("(?!)"), frozenset(), team)


def answer(response_id: str = "resp_1", created_at: float = NOW, **more: Any) -> dict[str, Any]:
    output = [
        {
            "id": "msg_out",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
        }
    ]
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "completed",
        "model": "m",
        "output": output,
        **more,
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> ResponseStore:
    return ResponseStore(FileStore(str(tmp_path / "store"), max_bytes=10), 30, clock)


async def test_keep_and_get(store: ResponseStore, tmp_path: Path) -> None:
    made = answer(instructions="Be brief.")
    await store.keep(OWNER, made, [{"type": "message", "role": "user", "content": "Hi"}], [])
    assert await store.get(OWNER, "resp_1") == made
    kept = list((tmp_path / "store").rglob("*"))
    stored = [p for p in kept if p.is_file()]
    assert stored == [tmp_path / "store" / "responses" / "key" / "abc" / "resp_1.json"]


async def test_input_items_are_listed_as_openai_lists_them(store: ResponseStore) -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "Be kind."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant", "content": "Earlier answer."},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "message", "id": "msg_mine", "role": "user", "content": "x", "status": "x"},
        {"type": "item_reference", "id": "msg_old"},
    ]
    await store.keep(OWNER, answer(), items, [])
    page = await store.input_items(OWNER, "resp_1", order="asc")
    listed = page["data"]
    assert [i["type"] for i in listed] == [i["type"] for i in items]
    developer, user, assistant, output, mine, reference = listed
    assert re.fullmatch(r"msg_[0-9a-f]{32}", developer["id"])
    assert developer["content"] == [{"type": "input_text", "text": "Be kind."}]
    assert user["content"] == items[1]["content"] and user["status"] == "completed"
    assert assistant["content"] == [
        {"type": "output_text", "text": "Earlier answer.", "annotations": []}
    ]
    assert output["id"].startswith("fco_") and output["status"] == "completed"
    assert output["call_id"] == "call_1" and output["output"] == "18C"
    assert (mine["id"], mine["status"]) == ("msg_mine", "x")  # the caller's own are kept
    assert reference == {"type": "item_reference", "id": "msg_old"}  # no status in OpenAI's
    assert len({i["id"] for i in listed}) == len(listed)
    assert items[0]["content"] == "Be kind."  # the caller's items are not changed
    assert (page["object"], page["first_id"], page["last_id"], page["has_more"]) == (
        "list",
        developer["id"],
        reference["id"],
        False,
    )


async def test_input_items_paging(store: ResponseStore) -> None:
    items = [
        {"type": "message", "id": f"msg_{i}", "role": "user", "content": "x"} for i in range(5)
    ]
    await store.keep(OWNER, answer(), items, [])

    async def ids(**query: Any) -> tuple[list[str], bool]:
        page = await store.input_items(OWNER, "resp_1", **query)
        return [i["id"] for i in page["data"]], page["has_more"]

    assert await ids() == (["msg_4", "msg_3", "msg_2", "msg_1", "msg_0"], False)  # desc
    assert await ids(limit=2) == (["msg_4", "msg_3"], True)
    assert await ids(limit=2, after="msg_3") == (["msg_2", "msg_1"], True)
    assert await ids(limit=2, after="msg_1") == (["msg_0"], False)
    assert await ids(order="asc", limit=2) == (["msg_0", "msg_1"], True)
    assert await ids(order="asc", limit=2, after="msg_1") == (["msg_2", "msg_3"], True)
    assert await ids(order="asc", limit=2, after="msg_3") == (["msg_4"], False)
    assert await ids(order="asc", after="msg_4") == ([], False)
    assert await ids(after="msg_unknown") == ([], False)
    empty = await store.input_items(OWNER, "resp_1", after="msg_0")
    assert (empty["first_id"], empty["last_id"]) == (None, None)
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "up"}):
        with pytest.raises(ValueError):
            await store.input_items(OWNER, "resp_1", **bad)


async def test_the_conversation_continues_from_history_input_and_output(
    store: ResponseStore,
) -> None:
    history = [
        {"type": "message", "role": "user", "content": "First"},
        {"type": "message", "id": "msg_a", "role": "assistant", "content": "One"},
    ]
    turn = [{"type": "message", "role": "user", "content": "Second"}]
    made = answer(instructions="Never carried over.")
    await store.keep(OWNER, made, turn, history)
    conversation = await store.conversation(OWNER, "resp_1")
    assert conversation == [*history, *turn, *made["output"]]
    assert "Never carried over." not in str(conversation)
    # A next turn kept from it: the conversation grows.
    turn2 = [{"type": "message", "role": "user", "content": "Third"}]
    await store.keep(OWNER, answer("resp_2"), turn2, conversation)
    assert await store.conversation(OWNER, "resp_2") == [
        *conversation,
        *turn2,
        *made["output"],
    ]
    page = await store.input_items(OWNER, "resp_2")
    assert [i["content"][0]["text"] for i in page["data"]] == ["Third"]  # this turn's only


async def test_delete(store: ResponseStore, tmp_path: Path) -> None:
    await store.keep(OWNER, answer(), [], [])
    assert await store.delete(OWNER, "resp_1") == {
        "id": "resp_1",
        "object": "response",
        "deleted": True,
    }
    assert not [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    for call in (store.get, store.delete, store.input_items):
        with pytest.raises(NotFound) as gone:
            await call(OWNER, "resp_1")
        assert gone.value.message == "Response with id 'resp_1' not found."
    with pytest.raises(NotFound) as previous:
        await store.conversation(OWNER, "resp_1")
    assert previous.value.param == "previous_response_id"
    assert previous.value.message == "Previous response with id 'resp_1' not found."
    assert previous.value.code == "previous_response_not_found"


async def test_expiry(store: ResponseStore, clock: Clock, tmp_path: Path) -> None:
    await store.keep(OWNER, answer(created_at=NOW), [], [])
    await store.keep(OWNER, answer("resp_2", created_at=NOW + 10), [], [])
    clock.now = NOW + 30 * DAY_S - 1
    assert (await store.get(OWNER, "resp_1"))["id"] == "resp_1"
    clock.now = NOW + 30 * DAY_S
    with pytest.raises(NotFound):
        await store.get(OWNER, "resp_1")
    stored = [p.name for p in (tmp_path / "store").rglob("*.json")]
    assert stored == ["resp_2.json"]  # the expired one was deleted as it was read
    with pytest.raises(NotFound) as previous:
        await store.conversation(OWNER, "resp_1")
    assert previous.value.param == "previous_response_id"
    assert await store.conversation(OWNER, "resp_2") == answer()["output"]
    clock.now = NOW + 10 + 30 * DAY_S
    with pytest.raises(NotFound) as expired:
        await store.conversation(OWNER, "resp_2")
    assert expired.value.param == "previous_response_id"


async def test_a_response_without_created_at_lives_from_when_it_was_kept(
    store: ResponseStore, clock: Clock
) -> None:
    made = answer()
    del made["created_at"]
    await store.keep(OWNER, made, [], [])
    clock.now = NOW + 30 * DAY_S - 1
    assert await store.get(OWNER, "resp_1") == made
    clock.now = NOW + 30 * DAY_S
    with pytest.raises(NotFound):
        await store.get(OWNER, "resp_1")


def test_owners() -> None:
    alone, other_alone = principal("k1"), principal("k2")
    team_a, team_a_too, team_b = principal("k3", "a"), principal("k4", "a"), principal("k5", "b")
    assert owner(team_a) == owner(team_a_too)  # a team's keys share its responses
    names = {owner(p) for p in (alone, other_alone, team_a, team_b)}
    assert len(names) == 4
    # A team named like a key's id is not that key.
    assert owner(principal("k9", team="k1")) != owner(alone)
    assert owner(alone).startswith("key/") and owner(team_a).startswith("team/")
    assert all(re.fullmatch(r"(key|team)/[0-9a-f]{32}", name) for name in names)


async def test_another_owner_has_no_such_response(store: ResponseStore) -> None:
    mine, theirs = owner(principal("k1", "a")), owner(principal("k2", "b"))
    keyed = owner(principal("a"))  # a key whose id is the team's name, without a team
    await store.keep(mine, answer(), [{"type": "message", "role": "user", "content": "x"}], [])
    for other in (theirs, keyed):
        for call in (store.get, store.delete, store.input_items, store.conversation):
            with pytest.raises(NotFound):
                await call(other, "resp_1")
    assert (await store.get(owner(principal("k3", "a")), "resp_1"))["id"] == "resp_1"


async def test_keep_refuses_an_id_that_is_not_the_gateways(store: ResponseStore) -> None:
    for bad in ("resp_../x", "file-1", "resp_", "resp_" + "a" * 101, "resp_a.json"):
        with pytest.raises(ValueError):
            await store.keep(OWNER, answer(bad), [], [])


async def test_reading_makes_no_store(tmp_path: Path) -> None:
    store = ResponseStore(FileStore(str(tmp_path / "never"), max_bytes=10), 30)
    with pytest.raises(NotFound):
        await store.get(OWNER, "resp_1")
    assert not (tmp_path / "never").exists()


async def test_the_memory_store() -> None:
    store = ResponseStore(FileStore("memory:///", max_bytes=10), 30)
    await store.keep(OWNER, answer(), [], [])
    assert (await store.get(OWNER, "resp_1"))["id"] == "resp_1"
    await store.delete(OWNER, "resp_1")
    with pytest.raises(NotFound):
        await store.get(OWNER, "resp_1")


class Untouchable(FileStore):
    """A store that fails the test if it is asked anything."""

    def present(self) -> bool:
        return True

    @property
    def store(self) -> ObjectStore:
        raise AssertionError("the store was asked")


def test_ids_of_the_gateways_shape() -> None:
    assert is_response_id("resp_0123abcdef") and is_response_id("resp_a-b_C")
    for odd in ("resp_", "resp_a/b", "resp_a\n", "resp_ä", "Resp_a", "resp_" + "a" * 101):
        assert not is_response_id(odd), odd


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd=odd_ids(10_000))
async def test_an_odd_id_is_a_404_without_asking_the_store(odd: str) -> None:
    assume(not is_response_id(odd))
    store = ResponseStore(Untouchable("memory:///", max_bytes=10), 30)
    for call in (store.get, store.delete, store.input_items):
        with pytest.raises(NotFound) as exc:
            await call(OWNER, odd)
        assert len(exc.value.message) < 150
    with pytest.raises(NotFound) as previous:
        await store.conversation(OWNER, odd)
    assert previous.value.param == "previous_response_id"


@pytest.mark.parametrize("odd", ["resp_../../x", "resp_a/b", "resp_%2e%2e", "resp_a.json"])
async def test_path_characters_are_a_404(odd: str) -> None:
    store = ResponseStore(Untouchable("memory:///", max_bytes=10), 30)
    with pytest.raises(NotFound):
        await store.get(OWNER, odd)
