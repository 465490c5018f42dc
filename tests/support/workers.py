"""What the client processes of the integration tests run (importable, for spawned processes).

Every record carries an ``id`` header naming its client and number, so that the
verifier can match what it reads to what was sent even when key and value are
null; results (RecordMetadata per record) go to a JSON-lines file.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

from client_stub import Producer
from tests.support.waiting import HANG_S

BIG_VALUE_SIZE = 900 * 1024
BASE_TIMESTAMP = 1_700_000_000_000


def record(client: int, n: int, big_at: int | None = None) -> dict:
    """The n-th record of a client: a mix of keys, null keys, null and empty values, headers, timestamps."""
    key = None if n % 7 == 0 else f"c{client}-k{n % 500}".encode()
    if n == big_at:
        value: bytes | None = bytes([n % 251]) * BIG_VALUE_SIZE
    elif n % 11 == 0:
        value = None
    elif n % 13 == 0:
        value = b""
    else:
        value = f"c{client}-v{n}".encode().ljust(40, b".")
    headers: list[tuple[str, bytes | None]] = [("id", f"{client}:{n}".encode())]
    if n % 5 == 0:
        headers += [("idx", str(n).encode()), ("nil", None)]
    timestamp = BASE_TIMESTAMP + n if n % 3 == 0 else None
    return {"key": key, "value": value, "headers": headers, "timestamp_ms": timestamp}


def produce_numbered(endpoint: str, topic: str, client: int, count: int, results: str,
                     big_at: int | None = None) -> None:
    """Send ``count`` records and write each one's RecordMetadata (or error) to ``results``."""
    with Producer(endpoint, max_block_ms=60_000) as producer:
        futures = [producer.send(topic, **record(client, n, big_at)) for n in range(count)]
        assert producer.flush(120) == 0
        write_results(results, futures)


def produce_paced(endpoint: str, topic: str, client: int, count: int, results: str, seconds: float,
                  log_path: str) -> None:
    """Send ``count`` records evenly over about ``seconds`` (whatever happens to the daemon meanwhile), then
    write each one's outcome to ``results``; the producer's warnings go to ``log_path``."""
    logging.basicConfig(filename=log_path, level=logging.WARNING, format="%(message)s")
    started = time.monotonic()
    with Producer(endpoint, max_block_ms=120_000) as producer:
        futures = []
        for n in range(count):
            futures.append(producer.send(topic, **record(client, n)))
            if n % 200 == 199:
                time.sleep(max(0.0, started + seconds * (n + 1) / count - time.monotonic()))
        assert producer.flush(180) == 0
        write_results(results, futures)


def write_results(path: str, futures: list) -> None:
    with open(path, "w") as out:
        for n, future in enumerate(futures):
            error = future.exception()
            if error is not None:
                out.write(json.dumps({"n": n, "error": str(error)}) + "\n")
                continue
            md = future.result()
            out.write(json.dumps({"n": n, "partition": md.partition, "offset": md.offset,
                                  "timestamp_ms": md.timestamp_ms, "key_size": md.serialized_key_size,
                                  "value_size": md.serialized_value_size}) + "\n")


def read_results(path: str | Path) -> list[dict]:
    with open(path) as lines:
        return [json.loads(line) for line in lines]


def run_children(children: list[multiprocessing.Process], queue: Queue, timeout: float = HANG_S) -> list[Any]:
    """Start the child processes, collect one result from each on ``queue``, check that each exited 0,
    and make sure none is left running."""
    try:
        for child in children:
            child.start()
        results = [queue.get(timeout=timeout) for _ in children]
        for child in children:
            child.join(timeout)
            assert child.exitcode == 0
        return results
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()


def flush_then_keep_writing(endpoint: str, topic: str, client: int, flushed: int) -> None:
    """Send ``flushed`` records and have the daemon claim them (flush), say so on stdout, then write records forever
    (published in open batches, which linger an hour).

    The test kills this process with SIGKILL once the daemon has claimed the flushed ones (its records-sealed-total).
    """
    producer = Producer(endpoint, linger_ms=3_600_000)
    for n in range(flushed):
        producer.send(topic, **record(client, n))
    producer.flush(timeout=0)  # closes every open batch and says WAKEUP, without waiting for the outcomes
    print(f"FLUSHED {flushed}", flush=True)
    n = flushed
    while True:
        producer.send(topic, **record(client, n))
        n += 1
        if n % 1000 == 0:
            time.sleep(0.001)


# A hostile client's values: a run of bytes that no record's framing can hold (0xAA continues a varint,
# and a varint has at most 10 bytes), so that it finds its values in its own blocks by their bytes alone.
HOSTILE_VALUE = b"\xaa" * 64


def rewrite_claimed_values(endpoint: str, topic: str, partitions: int, rewriting: Any) -> None:
    """Send records to every partition and, from a second thread, keep rewriting the values of those the daemon
    claimed and did not report yet with other bytes, in a tight loop, until killed (SIGKILL). Every record stays
    well-formed at every instant (no length changes), but no two reads of a claimed batch need agree.

    Sets ``rewriting`` (a multiprocessing Event) once the first claimed batch has been rewritten.
    """
    producer = Producer(endpoint, linger_ms=1)
    noise = [os.urandom(len(HOSTILE_VALUE)) for _ in range(64)]

    def rewrite() -> None:
        values: dict[int, list[int]] = {}  # batch id -> where its values start in its blocks
        turn = 0
        while True:
            try:
                # The producer's own state, read without its lock: what changes meanwhile is read next turn. A
                # batch takes no record once claimed (or closed: the daemon claims it at its next look).
                segment, batches = producer._io.segment, list(producer._accumulator.unreported.values())
                for batch in batches:
                    if not batch.claimed():
                        continue
                    blocks = segment.blocks(batch.first_block, batch.block_count)
                    if batch.batch_id not in values:
                        written = bytes(blocks[:batch.pos])
                        values[batch.batch_id] = [m.start() for m in re.finditer(HOSTILE_VALUE, written)]
                    for start in values[batch.batch_id]:
                        blocks[start:start + len(HOSTILE_VALUE)] = noise[turn % len(noise)]
                        turn += 1
                if turn and not rewriting.is_set():
                    rewriting.set()
            except (AttributeError, RuntimeError, ValueError):
                pass  # no segment yet or any more, the batches changed as they were listed

    threading.Thread(target=rewrite, daemon=True).start()
    n = 0
    while True:
        futures = [producer.send(topic, HOSTILE_VALUE, partition=(n + i) % partitions) for i in range(200)]
        n += len(futures)
        for future in futures:
            future.exception(60)  # its records carry whatever it wrote last: their outcomes are its business


def default_sigint() -> None:
    """A subprocess's preexec_fn: SIGINT's default disposition in the child, which a Python program then takes as
    KeyboardInterrupt, as from a terminal, however this run was started (a shell's background job starts with
    SIGINT ignored, and a child inherits that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def send_then_wait_to_be_killed(endpoint: str, topic: str, client: int, count: int, sent: Any) -> None:
    """Send ``count`` records with a linger of an hour (nothing is claimed for lingering), say so on the ``sent``
    connection once the last send() has returned, and wait (the test kills this process)."""
    producer = Producer(endpoint, linger_ms=3_600_000)
    for n in range(count):
        producer.send(topic, **record(client, n))
    sent.send(count)
    time.sleep(HANG_S)


if __name__ == "__main__":
    endpoint, topic, client, flushed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.stdout.write(f"PID {os.getpid()}\n")
    flush_then_keep_writing(endpoint, topic, client, flushed)

