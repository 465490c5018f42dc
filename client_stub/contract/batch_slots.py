"""The control area of a client's segment: what a client publishes of its open batches, and the daemon's claims.

The daemon lingers and seals: a client appends records to the open batch of a partition in its own blocks and
publishes what it wrote; the daemon claims a batch when it is due (linger.ms after its first record, full,
flush, pool pressure, the client's end) and sends it. No message per record or per batch: the two sides meet
in the control area, after the blocks of the segment: a header, then a slot of :data:`SLOT_SIZE` bytes per
block. The slot of a batch's first block describes the batch; all of it is 8-byte words, each written by one
side only:

====  ==================  ======  =====================================================================
word  name                writer  what
====  ==================  ======  =====================================================================
0     published           client  records (bits 32-62), :data:`FULL` (bit 63), length in bytes (bits 0-31)
1     claim               daemon  0 while open to the client; :data:`CLAIMING`; :data:`CLAIMED` | records
2     base_timestamp      client  the first record's timestamp (ms), before the first publish
3     max_timestamp       client  the largest timestamp so far, before each publish
4     batch_id            client  the client's number for the batch (its reports name it)
5     topic, partition    client  the session's index of the topic (low 32 bits), the partition (high 32)
6     block_count         client  blocks of the batch, from this one
7     opened_ns           client  ``time.monotonic_ns()`` when the batch opened (a clock of the host)
====  ==================  ======  =====================================================================

The header's words: 0 ``watched_until_ns`` and 1 ``scan_interval_ns`` (the daemon's: it looks at this
segment's open batches at least every ``scan_interval_ns`` until ``watched_until_ns``, so that a client
opening a batch then needs to tell it nothing), 2 ``linger_ns`` (the client's linger.ms), 3
``reports_wanted`` (the client's: not 0 while its process waits on a report, a callback to run, a future
waited on or watched, a flush; at 0, the daemon holds the process's reports back longer, and wakes it less
often), 4 ``spare_wanted`` (the client's: how many more spare blocks it would take now; the daemon hands it up
to that many with its delivery reports, at most one a batch reported, unless the pool is short).

A client opening a batch on a block sets its ``published``, then its ``claim``, to 0 (a block granted again
keeps its last claim until then: an open batch of this process that has not seen the claim yet finds it
there, not a slot that looks open). Appending is Dekker's protocol between the two writers:

- the client, to append: loads ``claim`` (not 0: the batch is closed to it); writes the record past the
  published length, then ``max_timestamp``, then ``published`` with one more record; then a full fence; then
  loads ``claim`` again. 0: the record is in the batch (the daemon has not read ``published`` yet, and will
  see it). ``CLAIMED | n``: in it if its index is below n. ``CLAIMING``: the daemon is between its fence and
  its answer, which decides.
- the daemon, to claim: stores ``CLAIMING``; a full fence; loads ``published``; stores ``CLAIMED | records``.
  The batch is what it loaded: its records and length (the daemon copies and checks them once, later).

A record a client wrote that the claim does not hold is not in the batch: the client writes it again in a new
one. A client that will write no more into a batch (full, or the session ends) publishes it with :data:`FULL`;
the daemon claims a full batch without waiting for its linger. Whatever a client writes in its slots concerns
its own records only: the daemon reads a slot once, checks it as it checks every client's word, and never
reads ``published`` after its claim.

The C fast path does the same with C11 atomics. This pure-Python twin relies on CPython writing an aligned
8-byte word with one store (a memoryview of format ``Q``), and takes its full fence from a lock's atomic
instruction (CPython has no fence of its own): a ``lock cmpxchg``, a full barrier on x86-64, to which it is
limited (see :func:`check_pure_python_ordering`).
"""

from __future__ import annotations

import platform
import threading
from typing import NamedTuple

SLOT_SIZE = 64
HEADER_SIZE = 64
_WORDS_PER_SLOT = SLOT_SIZE // 8
_HEADER_WORDS = HEADER_SIZE // 8

# Words of a slot.
PUBLISHED = 0
CLAIM = 1
BASE_TIMESTAMP = 2
MAX_TIMESTAMP = 3
BATCH_ID = 4
TOPIC_PARTITION = 5
BLOCK_COUNT = 6
OPENED_NS = 7
# Words of the header.
WATCHED_UNTIL_NS = 0
SCAN_INTERVAL_NS = 1
LINGER_NS = 2
REPORTS_WANTED = 3
SPARE_WANTED = 4

FULL = 1 << 63
CLAIMING = 1 << 63
CLAIMED = 1 << 62
_COUNT_MASK = (1 << 31) - 1
_LENGTH_MASK = (1 << 32) - 1
_INT64_LIMIT = 1 << 63
# Up to this many blocks, open_slots() reads each slot's two words; past it, the two columns they span.
_FEW_BLOCKS = 16

# The pure-Python twin's full fence: acquiring a lock is an atomic read-modify-write (lock cmpxchg on x86-64).
_fence_lock = threading.Lock()
_TSO_MACHINES = ("x86_64", "amd64", "i686", "i386")


def check_pure_python_ordering() -> None:
    """RuntimeError unless this machine orders memory as the pure-Python twin needs (x86's total store order,
    and a lock's atomic instruction as a full fence): elsewhere, use the C fast path."""
    machine = platform.machine().lower()
    if machine not in _TSO_MACHINES:
        raise RuntimeError(f"the pure-Python shared memory protocol needs x86-64's memory order; this machine is "
                           f"{machine}: build the C extensions (pip install without KAFKA_SIDECAR_PURE_PYTHON)")


def full_fence() -> None:
    """A full memory barrier, as the pure-Python twin can have one."""
    _fence_lock.acquire()
    _fence_lock.release()


def control_size(block_count: int) -> int:
    """Bytes of a segment's control area for ``block_count`` blocks."""
    return HEADER_SIZE + block_count * SLOT_SIZE


def pack_published(record_count: int, length: int, full: bool = False) -> int:
    return (FULL if full else 0) | (record_count << 32) | length


def unpack_published(word: int) -> tuple[int, int, bool]:
    """(record count, length, full) of a ``published`` word."""
    return (word >> 32) & _COUNT_MASK, word & _LENGTH_MASK, bool(word & FULL)


def _int64(word: int) -> int:
    return word - (1 << 64) if word >= _INT64_LIMIT else word


class SlotSnapshot(NamedTuple):
    """A slot as the daemon read it once (every field as the client wrote it, unchecked)."""

    record_count: int
    length: int
    full: bool
    base_timestamp: int
    max_timestamp: int
    batch_id: int
    topic_index: int
    partition: int
    block_count: int
    opened_ns: int


class ControlArea:
    """The words of a segment's control area (``buf``: its bytes, writable), by block."""

    def __init__(self, buf: memoryview, block_count: int) -> None:
        self.block_count = block_count
        self.words = buf[:control_size(block_count)].cast("Q")

    def release(self) -> None:
        """Let go of the segment's memory (before it is unmapped)."""
        self.words.release()

    def _at(self, block: int, word: int) -> int:
        return _HEADER_WORDS + block * _WORDS_PER_SLOT + word

    # -- header ----------------------------------------------------------------------------------

    def header(self, word: int) -> int:
        return self.words[word]

    def set_header(self, word: int, value: int) -> None:
        self.words[word] = value

    # -- the client's side -----------------------------------------------------------------------

    def open(self, block: int, *, batch_id: int, topic_index: int, partition: int, block_count: int,
             base_timestamp: int, opened_ns: int) -> None:
        """Describe a new batch in its first block's slot (nothing is published until its first record)."""
        words = self.words
        at = self._at(block, 0)
        words[at + PUBLISHED] = 0
        words[at + CLAIM] = 0
        words[at + BASE_TIMESTAMP] = base_timestamp
        words[at + MAX_TIMESTAMP] = base_timestamp
        words[at + BATCH_ID] = batch_id
        words[at + TOPIC_PARTITION] = topic_index | (partition << 32)
        words[at + BLOCK_COUNT] = block_count
        words[at + OPENED_NS] = opened_ns

    def claim_word(self, block: int) -> int:
        return self.words[self._at(block, CLAIM)]

    def publish(self, block: int, record_count: int, length: int, max_timestamp: int, *, full: bool = False) -> int:
        """Publish the batch's records and length; returns ``claim`` as loaded after the fence (the caller
        decides from it whether its last record is in the batch: :func:`holds`)."""
        words = self.words
        at = self._at(block, 0)
        words[at + MAX_TIMESTAMP] = max_timestamp
        words[at + PUBLISHED] = pack_published(record_count, length, full)
        full_fence()
        return words[at + CLAIM]

    # -- the daemon's side -----------------------------------------------------------------------

    def published(self, block: int) -> int:
        return self.words[self._at(block, PUBLISHED)]

    def open_slots(self, blocks: list[int]) -> list[tuple[int, int]]:
        """Those of ``blocks`` (in increasing order) whose slot holds a batch open to the client with records, each
        with its ``published`` word. A slot's claim is read before its ``published`` (a client opening a batch
        clears its published before its claim); past a few blocks, the claims of the slots they span in one read,
        then their published words in another."""
        if not blocks:
            return []
        words = self.words
        if len(blocks) <= _FEW_BLOCKS:
            found = []
            for block in blocks:
                at = self._at(block, 0)
                if not words[at + CLAIM]:
                    published = words[at + PUBLISHED]
                    if (published >> 32) & _COUNT_MASK:
                        found.append((block, published))
            return found
        first, end = self._at(blocks[0], 0), self._at(blocks[-1] + 1, 0)
        claims = words[first + CLAIM:end:_WORDS_PER_SLOT].tolist()
        publishes = words[first + PUBLISHED:end:_WORDS_PER_SLOT].tolist()
        base = blocks[0]
        return [(block, publishes[block - base]) for block in blocks
                if not claims[block - base] and (publishes[block - base] >> 32) & _COUNT_MASK]

    def opened_ns(self, block: int) -> int:
        return _int64(self.words[self._at(block, OPENED_NS)])

    def claim(self, block: int) -> tuple[int, int]:
        """Claim the batch of ``block``: its records and length as the client last published them."""
        words = self.words
        at = self._at(block, 0)
        words[at + CLAIM] = CLAIMING
        full_fence()
        record_count, length, _ = unpack_published(words[at + PUBLISHED])
        words[at + CLAIM] = CLAIMED | record_count
        return record_count, length

    def mark_claimed(self, block: int) -> None:
        """Mark the batch of ``block`` claimed without reading it (one the client handed back, by notice)."""
        self.words[self._at(block, CLAIM)] = CLAIMED

    def snapshot(self, block: int) -> SlotSnapshot:
        """The slot's fields, read once."""
        at = self._at(block, 0)
        words = self.words[at:at + _WORDS_PER_SLOT].tolist()
        record_count, length, full = unpack_published(words[PUBLISHED])
        topic_partition = words[TOPIC_PARTITION]
        return SlotSnapshot(record_count, length, full, _int64(words[BASE_TIMESTAMP]), _int64(words[MAX_TIMESTAMP]),
                            _int64(words[BATCH_ID]), topic_partition & _LENGTH_MASK, _int64(topic_partition) >> 32,
                            _int64(words[BLOCK_COUNT]), _int64(words[OPENED_NS]))


def holds(claim: int, index: int) -> bool | None:
    """Whether a batch holds its record ``index``, from ``claim`` as loaded after publishing it: None while the
    daemon is between its fence and its answer (load ``claim`` again)."""
    if claim == 0:
        return True
    if claim == CLAIMING:
        return None
    return index < (claim & _COUNT_MASK)
