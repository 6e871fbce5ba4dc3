"""assert_enqueued: the step it finds, the message when none matches, bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

import cyclone
from cyclone.errors import ValidationError
from cyclone.testing import assert_enqueued, drain


@dataclass
class Mail:
    to: str
    subject: str


@cyclone.action("t_send_mail")
async def send_mail(ctx: cyclone.Context, inp: Mail) -> None:
    pass


@cyclone.step("t_resize", queue="images")
async def resize(ctx: cyclone.Context, inp: dict[str, int]) -> int:
    return inp["width"] // 2


@pytest.fixture
async def client(dsn: str) -> AsyncIterator[cyclone.Client]:
    made = cyclone.Client(dsn, handlers=[send_mail, resize])
    try:
        yield made
    finally:
        await made.stop()


async def test_a_matching_step_is_returned(client: cyclone.Client) -> None:
    job = await client.enqueue(resize, {"width": 640})
    step = await assert_enqueued(client, resize)
    assert (step.id, step.run_id) == (job.step_id, job.run_id)
    assert step.state is cyclone.StepState.AVAILABLE
    found = await assert_enqueued(client, "t_resize", input={"width": 640}, queue="images")
    assert found.id == job.step_id


async def test_an_input_is_compared_as_the_json_stored(client: cyclone.Client) -> None:
    await client.enqueue(send_mail, Mail("ann@example.com", "hi"), scheduled_at=3600)
    step = await assert_enqueued(client, send_mail, input=Mail("ann@example.com", "hi"))
    assert step.input == {"to": "ann@example.com", "subject": "hi"}
    await assert_enqueued(client, send_mail, input={"subject": "hi", "to": "ann@example.com"})


async def test_no_match_lists_the_steps_of_the_kind(client: cyclone.Client) -> None:
    job = await client.enqueue(resize, {"width": 640})
    with pytest.raises(AssertionError) as caught:
        await assert_enqueued(client, resize, input={"width": 800})
    message = str(caught.value)
    assert "no step of kind 't_resize' with input {\"width\": 800} is enqueued" in message
    assert "available steps of kind 't_resize'" in message
    assert f'input {{"width": 640}} (run {job.run_id}, step {job.step_id}, attempt 0' in message
    with pytest.raises(AssertionError, match="in queue 'default'"):
        await assert_enqueued(client, resize, queue="default")


async def test_no_step_of_the_kind_lists_the_others(client: cyclone.Client) -> None:
    await client.enqueue(resize, {"width": 640})
    with pytest.raises(AssertionError) as caught:
        await assert_enqueued(client, send_mail)
    message = str(caught.value)
    assert "no step of kind 't_send_mail' is enqueued" in message
    assert "(none of that kind)" in message
    assert "kind 't_resize' queue 'images'" in message


async def test_a_step_that_ran_is_no_longer_enqueued(client: cyclone.Client) -> None:
    await client.enqueue(resize, {"width": 640})
    assert await drain(client) == 1
    with pytest.raises(AssertionError, match="no step is available"):
        await assert_enqueued(client, resize)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"kind": ""}, "kind"),
        ({"kind": 3}, "kind"),
        ({"kind": "t_resize", "queue": ""}, "queue"),
        ({"kind": "t_resize", "queue": 7}, "queue"),
        ({"kind": "t_resize", "input": {1, 2}}, "input"),
    ],
)
async def test_bad_arguments_are_refused(
    client: cyclone.Client, options: dict[str, Any], named: str
) -> None:
    await client.enqueue(resize, {"width": 640})
    with pytest.raises(ValidationError, match=named):
        await assert_enqueued(client, **options)


async def test_what_is_not_an_async_client_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"cyclone\.Client"):
        await assert_enqueued("postgresql://", "t_resize")  # type: ignore[arg-type]
