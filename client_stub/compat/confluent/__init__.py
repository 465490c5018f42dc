"""confluent-kafka's ``Producer`` on kafka-sidecar: code written for confluent-kafka runs with one import changed.

    from client_stub.compat.confluent import Producer   # was: from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": "ignored", "linger.ms": 5})
    p.produce("events", b"value", key=b"key", on_delivery=lambda err, msg: print(err, msg.offset()))
    p.flush()

As confluent-kafka's, ``produce()`` does not wait: a record whose topic the producer does not know yet, or that
is produced while no daemon answers, waits in this process (librdkafka's unassigned queue) until it can be handed
off, and a full BufferPool (or ``queue.buffering.max.messages`` records waiting) raises BufferError at once.
Delivery callbacks run on the application's thread, inside ``poll()`` and ``flush()``. A topic the cluster does not
have fails its records with UNKNOWN_TOPIC_OR_PART after ``topic.metadata.propagation.max.ms``; records not
delivered within the daemon's delivery.timeout.ms fail with _MSG_TIMED_OUT.

Settings: docs/migration/confluent-kafka.md says which are honoured, which the daemon owns (checked against the
daemon's: a difference is a :class:`~client_stub.compat.DaemonSettingWarning`), and which mean nothing here. An
unknown one raises KafkaException(_INVALID_ARG), as confluent-kafka does. The daemon's endpoint is
``sidecar.endpoint``, else ``$KAFKA_SIDECAR_ENDPOINT``.
"""

from .errors import KafkaError, KafkaException
from .message import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message
from .metadata import ClusterMetadata, PartitionMetadata, TopicMetadata
from .producer import Producer

__all__ = ["TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE", "ClusterMetadata",
           "KafkaError", "KafkaException", "Message", "PartitionMetadata", "Producer", "TopicMetadata"]
