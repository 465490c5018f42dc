"""What the client and the daemon agree on, and all of it.

- :mod:`.ipc`: the messages over ZeroMQ, each a typed record, with encode and decode,
  the handshake's hello options and welcome settings by name;
- :mod:`.shared_memory`: a client's segment of shared memory, its layout, and the memory
  socket that hands it over;
- :mod:`.batch_slots`: the segment's control area, where a client publishes its open batches and the
  daemon claims them;
- :mod:`.records`: Kafka's v2 record format, which clients write into their blocks and
  the daemon wraps in a batch header.

:data:`PROTOCOL_VERSION` versions the whole contract: a client and a daemon of different
versions refuse each other at the handshake.
"""

PROTOCOL_VERSION = 4
