"""Drop-in producers for code written against other Kafka clients: one import changes, nothing else.

- :mod:`client_stub.compat.confluent`: confluent-kafka's ``Producer`` (``produce``, ``poll``, ``flush``,
  delivery callbacks served from ``poll()`` and ``flush()`` on the calling thread, ``KafkaError``,
  ``KafkaException``, ``Message``).
- :mod:`client_stub.compat.kafka_python`: kafka-python's ``KafkaProducer`` (``send`` returning a
  ``FutureRecordMetadata``, ``flush``, ``close``, serializers, ``kafka.errors``' classes).

Settings the daemon owns (acks, compression, retries, idempotence...) are accepted and checked against the
daemon's: a difference is one :class:`DaemonSettingWarning`, since the daemon's value is what applies.
"""

from ._settings import DaemonSettingWarning

__all__ = ["DaemonSettingWarning"]
