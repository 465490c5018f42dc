"""kafka-sidecar's client: produce to Kafka through the node's sender daemon.

    from client_stub import Producer
    with Producer() as producer:
        producer.send("events", b"value", key=b"key").result()
"""

from .futures import RecordMetadata
from .producer import Producer

__all__ = ["Producer", "RecordMetadata"]
