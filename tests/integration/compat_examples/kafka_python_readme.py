# kafka-python's README producer examples: the code blocks of the "KafkaProducer" section of dpkp/kafka-python's
# README.rst at commit a3b3836ff3a4b34ebaa42fd93500bfcb16c1e9b7, in order, with only their imports changed (from
# kafka to kafka-sidecar's drop-in), but the transactions block: kafka-sidecar has no transactions (a
# KafkaProducer with a transactional_id raises KafkaConfigurationError; tests/integration/test_compat_kafka_python.py
# shows it). That test runs this file against a broker through the daemon ($KAFKA_SIDECAR_ENDPOINT).
# ruff: noqa  (kept as upstream wrote it)

# -- README block 1
from client_stub.compat.kafka_python import KafkaProducer
producer = KafkaProducer(bootstrap_servers='localhost:1234')
for _ in range(100):
    # Fire-and-forget: send() is async and returns before delivery
    producer.send('foobar', b'some_message_bytes')

# -- README block 2
# To check the status of an async message delivery, use .get()
future = producer.send('foobar', b'another_message')
# future.get() will block until it can return the result or raise on error
result = future.get(timeout=60)

# -- README block 3
# Block until all pending messages are at least put on the network
# NOTE: This does not guarantee delivery or success! It is really
# only useful if you configure internal batching using linger_ms
producer.flush()

# -- README block 4
# Use a key for hashed-partitioning
producer.send('foobar', key=b'foo', value=b'bar')

# -- README block 5
# Serialize json messages
from client_stub.compat.kafka_python import KafkaProducer, JsonSerializer
producer = KafkaProducer(value_serializer=JsonSerializer())
producer.send('fizzbuzz', {'foo': 'bar'})

# -- README block 6
# Serialize string keys
from client_stub.compat.kafka_python import KafkaProducer, DefaultSerializer
producer = KafkaProducer(key_serializer=DefaultSerializer())
producer.send('flipflap', key='ping', value=b'1234')

# -- README block 7
# Compress messages
producer = KafkaProducer(compression_type='gzip')
for i in range(1000):
    producer.send('foobar', b'msg %d' % i)

# -- README block 8: transactions, not run (see above)

# -- README block 9
# Include record headers. The format is list of tuples with string key
# and bytes value.
producer.send('foobar', value=b'c29tZSB2YWx1ZQ==', headers=[('content-encoding', b'base64')])

# -- README block 10
# Get producer performance metrics
metrics = producer.metrics()
