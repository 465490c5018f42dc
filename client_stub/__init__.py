"""kafka-sidecar's client: produce to Kafka through the node's sender daemon.

    from client_stub import Producer
    with Producer() as producer:
        producer.send("events", b"value", key=b"key").result()
"""

from .producer import Producer, RecordMetadata

__all__ = ["Producer", "RecordMetadata"]
