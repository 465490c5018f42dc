"""The checks of what clients send: each refusal a ClientError, with the code the client is answered with."""

from __future__ import annotations

from typing import Any

import pytest

from client_stub.contract import PROTOCOL_VERSION, ipc
from service.client_error import ClientError
from service.front.checks import check_int, check_notice, check_topic, clip, read_message

NOTICE = [7, 0, 2, "t", 3, 5, 1000, 1, 2, 0]


def test_a_known_clients_message_is_read() -> None:
    assert read_message(ipc.encode(ipc.Heartbeat()), known_client=True) == ipc.Heartbeat()


@pytest.mark.parametrize(("payload", "code", "text"), [
    (b"\xc1", ipc.ERROR_REFUSED, "not a msgpack message"),
    (ipc.pack("x"), ipc.ERROR_REFUSED, "a message is an array that starts with its type"),
    (ipc.pack(ipc.Heartbeat.TYPE, 1), ipc.ERROR_REFUSED, "HEARTBEAT has 0 fields, got 1"),
    (ipc.pack(ipc.Hello.TYPE, PROTOCOL_VERSION + 1, 1, "x", {}), ipc.ERROR_VERSION, "protocol version mismatch"),
])
def test_a_message_that_breaks_the_contract_is_a_client_error(payload: bytes, code: str, text: str) -> None:
    with pytest.raises(ClientError, match=text) as refused:
        read_message(payload, known_client=True)
    assert refused.value.code == code and refused.value.answer is None


def test_an_unknown_client_may_say_hello_or_ask_for_stats_only() -> None:
    with pytest.raises(ClientError, match="unknown client: send HELLO first") as refused:
        read_message(ipc.encode(ipc.Heartbeat()), known_client=False)
    assert refused.value.code == ipc.ERROR_UNKNOWN_CLIENT
    assert read_message(ipc.encode(ipc.Stats()), known_client=False) == ipc.Stats()


@pytest.mark.parametrize("value", [True, -1, 11, 1.0, "1", None])
def test_an_integer_out_of_range_or_of_another_type_is_refused(value: Any) -> None:
    with pytest.raises(ClientError, match="count must be an integer in \\[0, 10\\]"):
        check_int(value, "count", 0, 10)


def test_a_topic_kafka_would_refuse_is_refused() -> None:
    assert check_topic("orders.v1") == "orders.v1"
    with pytest.raises(ClientError, match="invalid topic name"):
        check_topic("a/b")


def test_a_notice_is_checked_against_the_pool() -> None:
    assert check_notice(NOTICE, block_count=4, block_size=1000) == ipc.SealNotice(*NOTICE)
    with pytest.raises(ClientError, match="first_block must be an integer in \\[0, 3\\]"):
        check_notice([7, 4, *NOTICE[2:]], block_count=4, block_size=1000)
    with pytest.raises(ClientError, match="length must be an integer in \\[1, 2000\\]"):
        check_notice([*NOTICE[:6], 2001, *NOTICE[7:]], block_count=4, block_size=1000)
    with pytest.raises(ClientError, match="a seal notice has the fields batch_id, "):
        check_notice(NOTICE[:-1], block_count=4, block_size=1000)


def test_an_error_text_a_client_gets_is_clipped() -> None:
    assert clip("short") == "short"
    assert len(clip("x" * 10_000)) == 400 and clip("x" * 10_000).endswith("...")
