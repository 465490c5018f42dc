"""confluent-kafka's Producer on kafka-sidecar (client_stub.compat.confluent.producer) with no daemon to answer:
what it raises and what it takes. tests/integration/test_compat_confluent.py runs it against a daemon and a
broker."""

from __future__ import annotations

import pytest

from client_stub.compat import confluent


def test_list_topics_without_a_topic_raises_transport_when_no_daemon_answers(tmp_path) -> None:
    producer = confluent.Producer({"sidecar.endpoint": f"ipc://{tmp_path}/nobody.sock"})
    try:
        with pytest.raises(confluent.KafkaException) as refused:
            producer.list_topics(timeout=0.3)
        assert refused.value.args[0].code() == confluent.KafkaError._TRANSPORT
        assert "no kafka-sidecar daemon answered" in refused.value.args[0].str()
    finally:
        producer.close()


class _NumpyLikeInt:
    """An integer that is not an int (as numpy's int64): it has __index__."""

    def __index__(self) -> int:
        return -1


def test_produce_takes_any_integer_for_the_partition(tmp_path) -> None:
    # Taken for its value, not its type; the record waits here for a daemon, till its message.timeout.ms.
    producer = confluent.Producer({"sidecar.endpoint": f"ipc://{tmp_path}/nobody.sock", "message.timeout.ms": 300})
    try:
        producer.produce("t", b"v", partition=_NumpyLikeInt())  # type: ignore[arg-type]
        assert len(producer) == 1
        with pytest.raises(confluent.KafkaException) as refused:
            producer.produce("t", b"v", partition="0")  # type: ignore[arg-type]
        assert refused.value.args[0].code() == confluent.KafkaError._INVALID_ARG
    finally:
        assert producer.close()
    assert len(producer) == 0
