"""``kafka-sidecar produce``: records from standard input or files to one topic, through the daemon, as ``kcat -P``.

The input rules are kcat's producer mode (kcat.c: ``producer_run``, ``produce_file``, ``add_header``,
``parse_delim``):

- without FILE arguments, one record a line of standard input. The line's ``\\n`` is left out (a ``\\r``
  before it stays in the value, as with kcat's default ``-D \\n``), an empty line is skipped, and a last
  line without ``\\n`` is a record too;
- ``-K SEP``: the key is what comes before the first SEP, the value what comes after it (either may be
  empty); a line without SEP is the value, with a null key. SEP may be written with kcat's escapes
  ``\\t``, ``\\r``, ``\\n`` and ``\\xNN``;
- ``-H NAME=VALUE`` (repeatable): a header on every record, split at the first ``=``; ``-H NAME``, a
  header with a null value;
- ``-p PARTITION``: every record to that partition (``-1``, as kcat, the producer's partitioner);
- FILE arguments: each file is one record, with a null key (an empty file is skipped); with ``-l``, one
  record a line of each file, as standard input's. kcat takes one file with ``-l``; this takes several.

Records are handed to the daemon as they are read (each one's delivery report counts it), and the
command ends when every record has its report. Exit codes: 0 when every record was delivered; 1 when
any was not (each named on standard error, as ``<stdin>:LINE``, ``FILE:LINE`` or ``FILE``, with the
Kafka error) or no daemon answered within max.block.ms; 2 for a usage error (service/cli.py's), which
includes ``-p`` beyond the topic's partitions.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from functools import partial
from typing import BinaryIO, TextIO

from client_stub import Producer
from client_stub.contract import ipc
from client_stub.errors import (
    BufferExhaustedError,
    ConfigError,
    KafkaError,
    KafkaTimeoutError,
    SidecarUnavailableError,
)
from client_stub.futures import RecordMetadata

STDIN = "<stdin>"

# A record as read: where it came from (a file name or STDIN), its line number (None: a whole file), key, value.
Record = tuple[str, int | None, bytes | None, bytes]

# kcat's parse_delim escapes (its usage also names \r).
_ESCAPE = re.compile(rb"\\(?:([ntr])|x([0-9a-fA-F]{1,2}))")
_ESCAPED = {b"n": b"\n", b"t": b"\t", b"r": b"\r"}


def parse_separator(text: str) -> bytes:
    """``-K``'s separator as bytes, kcat's escapes replaced."""
    raw = os.fsencode(text)  # the argument's own bytes, even when they are not UTF-8
    separator = _ESCAPE.sub(lambda m: _ESCAPED[m[1]] if m[1] else bytes([int(m[2], 16)]), raw)
    if not separator:
        raise ConfigError("-K takes a separator of at least one byte")
    return separator


def parse_header(text: str) -> tuple[str, bytes | None]:
    """``-H NAME=VALUE`` as (name, value), split at the first ``=``; ``-H NAME``: a null value, as kcat."""
    name, equals, value = text.partition("=")
    if not name:
        raise ConfigError(f'-H takes NAME=VALUE or NAME, got "{text}"')
    return name, os.fsencode(value) if equals else None


def lines(stream: BinaryIO, source: str, separator: bytes | None) -> Iterator[Record]:
    """One record a line of ``stream``, as kcat -P reads them (see the module's docstring)."""
    for number, line in enumerate(stream, 1):
        if line[-1:] == b"\n":
            line = line[:-1]
        if not line:
            continue
        if separator is not None:
            key, found, value = line.partition(separator)
            if found:
                yield source, number, key, value
                continue
        yield source, number, None, line


class Outcomes:
    """The records that were not delivered: counted, and each named on ``stream``.

    Called from the main thread (send() refused a record) and from the producer's I/O thread (delivery
    reports), hence the lock.
    """

    def __init__(self, stream: TextIO) -> None:
        self.failed = 0
        self.stopped = False  # no daemon answered: the records from there on were not sent
        self._stream = stream
        self._lock = threading.Lock()

    def delivered(self, source: str, number: int | None, error: KafkaError | None,
                  metadata: RecordMetadata | None) -> None:
        """An on_delivery callback, with the record's place bound first."""
        if error is not None:
            self.record_failed(source, number, describe(error))

    def record_failed(self, source: str, number: int | None, why: str) -> None:
        where = source if number is None else f"{source}:{number}"
        self.say(f"{where}: {why}", failed=1)

    def say(self, line: str, failed: int = 0) -> None:
        with self._lock:
            self.failed += failed
            self._stream.write(f"kafka-sidecar produce: {line}\n")


def describe(error: KafkaError) -> str:
    """The Kafka error's name and message: ``NAME (code): message`` for a broker's, ``Class: message`` else."""
    return str(error) if error.code is not None else f"{error.name}: {error}"


def records(files: list[str], line_mode: bool, separator: bytes | None, stdin: BinaryIO,
            outcomes: Outcomes) -> Iterator[Record]:
    """The records of ``files`` (whole, or a line each with ``line_mode``), else of ``stdin``, in order.

    A file that cannot be read counts as a failed record, and the next file is read.
    """
    if not files:
        yield from lines(stdin, STDIN, separator)
        return
    for path in files:
        try:
            with open(path, "rb") as file:
                if line_mode:
                    yield from lines(file, path, separator)
                    continue
                value = file.read()
        except OSError as exc:
            outcomes.record_failed(path, None, f"cannot read it: {exc.strerror or exc}")
            continue
        if value:  # kcat skips an empty file
            yield path, None, None, value


def send_all(producer: Producer, topic: str, partition: int | None, headers: list[tuple[str, bytes | None]],
             source: Iterable[Record], outcomes: Outcomes) -> int:
    """Hand every record over (their delivery reports go to ``outcomes``); returns how many were read.

    Stops at the first record when no daemon answers (SidecarUnavailableError): nothing more could be
    sent, and that is said once. ValueError (``-p`` beyond the topic's partitions, the same for every
    record) is a usage error, raised as ConfigError.
    """
    count = 0
    missing: KafkaTimeoutError | None = None
    for name, number, key, value in source:
        count += 1
        if missing is not None:
            # The topic did not appear within max.block.ms for an earlier record: waiting as long again
            # for each of the others would make a long input take hours to fail.
            outcomes.record_failed(name, number, describe(missing))
            continue
        try:
            producer.send(topic, value, key, partition=partition, headers=headers,
                          on_delivery=partial(outcomes.delivered, name, number))
        except SidecarUnavailableError as exc:
            where = name if number is None else f"{name}:{number}"
            outcomes.stopped = True
            outcomes.say(f"{describe(exc)} (nothing sent from {where} on)")
            return count
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except KafkaError as exc:
            # send() raises KafkaTimeoutError itself for a topic not in metadata within max.block.ms, and
            # its BufferExhaustedError when no memory came: that one may pass, so later records try again.
            if isinstance(exc, KafkaTimeoutError) and not isinstance(exc, BufferExhaustedError):
                missing = exc
            outcomes.record_failed(name, number, describe(exc))
    return count


def main(args: argparse.Namespace) -> int:
    """``kafka-sidecar produce``: see the module's docstring; returns the exit code."""
    try:
        topic = ipc.check_topic(args.topic)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.partition is not None and args.partition < -1:
        raise ConfigError(f"-p takes a partition number, or -1 for the partitioner; got {args.partition}")
    if args.max_block_ms is not None and args.max_block_ms < 0:
        raise ConfigError(f"--max-block-ms takes a number of milliseconds from 0, got {args.max_block_ms}")
    separator = None if args.key_separator is None else parse_separator(args.key_separator)
    headers = [parse_header(header) for header in args.headers]
    partition = None if args.partition in (None, -1) else args.partition
    outcomes = Outcomes(sys.stderr)
    with Producer(args.endpoint, max_block_ms=args.max_block_ms,
                  client_name=f"kafka-sidecar-produce-{os.getpid()}") as producer:
        source = records(args.files, args.line_mode, separator, sys.stdin.buffer, outcomes)
        count = send_all(producer, topic, partition, headers, source, outcomes)
        # Leaving the block closes the producer, which waits for every record's report first.
    if outcomes.failed:
        outcomes.say(f"{outcomes.failed} of {count} records not delivered")
    return 1 if outcomes.failed or outcomes.stopped else 0
