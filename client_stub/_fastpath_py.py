"""The client's per-record work in pure Python: the twin of the C extension ``client_stub._fastpath``.

Name for name, behaviour for behaviour and error for error what ``client_stub/_fastpath.c`` does
(its docstrings and comments are the specification; these follow them): Kafka's v2 record encoding,
murmur2, OpenBatch, Appender.send() and Completer.complete(). It is the reference for the C code,
the client of machines where the extension could not be built, and the path to a free-threaded
CPython. ``client_stub.fastpath`` chooses between the two when first imported.

One difference is on purpose: this code does not rely on the GIL. The C fast path of send() appends
without taking the producer's lock, only checking that nobody holds it (nothing else runs while it
holds the GIL); Appender.send() here takes the lock, without waiting, around the append and the
count of outstanding records, and hands the record to the Python path when another thread holds it,
as the C code does.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures._base import FINISHED, RUNNING
from types import MemberDescriptorType
from typing import TYPE_CHECKING, Any, Self, SupportsFloat, SupportsIndex, cast, final

from .contract import batch_slots
from .contract.batch_slots import ControlArea
from .contract.records import encode_uvarint

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

    from ._fastpath import _Field, _Headers

__all__ = ["Appender", "Completer", "OpenBatch", "encode_record", "encode_record_into", "murmur2", "record_size"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1  # a signed value stored in a word of shared memory, as C casts it to uint64_t

# How long an append waits for a claim the daemon is in the middle of (see the C twin's CLAIMING_WAIT_NS).
_CLAIMING_WAIT_S = 1.0

# The C encoder holds at most this many buffers (fields that are not bytes) while it writes one record,
# and refuses a record with more: so does this one, so that both take the same records.
_MAX_HELD = 64

# -- arguments, converted as the C argument parser converts them ------------------------------------------


def _int64(value: SupportsIndex) -> int:
    """``value`` as a C long long: TypeError unless it is an integer, OverflowError outside int64."""
    value = operator.index(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise OverflowError("int too big to convert")
    return value


def _int32(value: SupportsIndex) -> int:
    """``value`` as a C int."""
    value = operator.index(value)
    if value > _INT32_MAX:
        raise OverflowError("signed integer is greater than maximum")
    if value < _INT32_MIN:
        raise OverflowError("signed integer is less than minimum")
    return value


def _uint32(value: SupportsIndex) -> int:
    """``value`` as a C unsigned int (the argument parser's "I" format takes any int modulo 2**32)."""
    return operator.index(value) & _MASK32


def _ssize(value: object) -> int:
    """``value`` as a Py_ssize_t taken by PyLong_AsSsize_t: an int, not anything with __index__."""
    if not isinstance(value, int):
        raise TypeError("an integer is required")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return value


def _double(value: object) -> float:
    """``value`` as a C double: a real number (or an integer), not a string."""
    if hasattr(type(value), "__float__"):
        return float(cast(SupportsFloat, value))
    return float(operator.index(cast(SupportsIndex, value)))


def _writable_bytes(obj: WriteableBuffer) -> memoryview:
    """A writable view of ``obj``'s bytes in one run (PyBUF_WRITABLE), to write at byte positions."""
    view = memoryview(obj)
    with view:
        if view.readonly:
            raise BufferError("Object is not writable.")
        if not view.c_contiguous:
            raise BufferError("memoryview: underlying buffer is not C-contiguous")
        return view.cast("B")


# Varints as the record format defines them (client_stub.contract.records), unchecked: every caller here
# passes what fits.
_uvarint = encode_uvarint


def _varint(value: int) -> bytes:
    """The zig-zag varint of a signed 64-bit ``value``."""
    return encode_uvarint((value << 1) ^ (value >> 63))


_NULL = _varint(-1)  # the length of a null field
_ATTRIBUTES = b"\x00"
_NO_HEADERS = _varint(0)


def _buffer_bytes(obj: ReadableBuffer, what: str) -> bytes:
    """The bytes of a field given as a buffer (PyBUF_SIMPLE: one contiguous run), else TypeError."""
    try:
        view = memoryview(obj)
    except Exception:
        pass  # C clears whatever taking the buffer raised, and says what the field must be
    else:
        with view:
            if view.c_contiguous:
                return view.tobytes()
    raise TypeError(f"{what} must be bytes-like or None, got {type(obj).__name__}")


def _fields(key: _Field, value: _Field, headers: _Headers) -> bytes:
    """A record's bytes after its offset delta: key, value and headers (a sequence of (key, value) pairs)."""
    parts: list[bytes] = []
    buffers = 0

    def field(obj: _Field, what: str) -> None:
        nonlocal buffers
        if obj is None:
            parts.append(_NULL)
            return
        if type(obj) is bytes:
            data = obj
        elif isinstance(obj, bytes):
            data = bytes.__bytes__(obj)  # a subclass's own bytes, as C reads them: not its __bytes__()
        else:
            if buffers == _MAX_HELD:
                raise ValueError(f"too many non-bytes buffers in one record ({_MAX_HELD} at most)")
            data = _buffer_bytes(obj, what)
            buffers += 1
        parts.append(_uvarint(len(data) << 1))
        parts.append(data)

    field(key, "key")
    field(value, "value")
    pairs: tuple[tuple[ReadableBuffer, _Field], ...] = ()
    if headers is not None:
        # A tuple of its own, not the caller's list: reading a buffer may run Python code (a __buffer__,
        # PEP 688) that changes that list.
        try:
            pairs = tuple(headers)
        except TypeError:
            raise TypeError("headers must be a sequence of (key, value) pairs") from None
    parts.append(_uvarint(len(pairs) << 1))
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError("a header is a (key, value) tuple")
        header_key, header_value = pair
        if header_key is None:
            raise TypeError("a header key cannot be None")
        field(header_key, "a header key")
        field(header_value, "a header value")
    return b"".join(parts)


def _plain_fields(key: bytes | None, value: bytes | None) -> bytes:
    """_fields() of a bytes (or null) key and value and no headers: the common case of send()."""
    return b"".join((
        _NULL if key is None else _uvarint(len(key) << 1), key or b"",
        _NULL if value is None else _uvarint(len(value) << 1), value or b"",
        _NO_HEADERS,
    ))


def _record(offset_delta: int, timestamp_delta: int, fields: bytes) -> bytes:
    """The whole record, its length prefix first: attributes, the two deltas, then ``fields``."""
    timestamp = _varint(timestamp_delta)
    offset = _varint(offset_delta)
    body = 1 + len(timestamp) + len(offset) + len(fields)
    return b"".join((_uvarint(body << 1), _ATTRIBUTES, timestamp, offset, fields))


# -- module functions: encoding and murmur2 ------------------------------------------------------------------


def encode_record(offset_delta: int, timestamp_delta: int, key: _Field, value: _Field, headers: _Headers = ()) -> bytes:
    """One record in Kafka's v2 format, its length prefix included."""
    return _record(_int64(offset_delta), _int64(timestamp_delta), _fields(key, value, headers))


def encode_record_into(buf: WriteableBuffer, pos: int, offset_delta: int, timestamp_delta: int, key: _Field,
                       value: _Field, headers: _Headers = ()) -> int:
    """Write one record into the writable buffer ``buf`` at ``pos``; returns the position after it.

    ValueError if it does not fit.
    """
    try:
        view = _writable_bytes(buf)
    except (TypeError, BufferError):
        raise TypeError("encode_record_into() argument 1 must be read-write bytes-like object, "
                        f"not {type(buf).__name__}") from None
    with view:
        pos = _ssize(operator.index(pos))
        record = _record(_int64(offset_delta), _int64(timestamp_delta), _fields(key, value, headers))
        size = len(record)
        if pos < 0 or pos > view.nbytes or size > view.nbytes - pos:
            raise ValueError(f"a record of {size} bytes does not fit at {pos} in a buffer of {view.nbytes}")
        view[pos:pos + size] = record
    return pos + size


def record_size(offset_delta: int, timestamp_delta: int, key: _Field, value: _Field, headers: _Headers = ()) -> int:
    """Bytes the encoded record takes, its length prefix included."""
    return len(encode_record(offset_delta, timestamp_delta, key, value, headers))


_MURMUR2_SEED = 0x9747B28C
_MURMUR2_M = 0x5BD1E995
_WORDS = struct.Struct("<I")


def murmur2(data: ReadableBuffer, /) -> int:
    """Kafka's murmur2 (Utils.murmur2) of ``data`` as an unsigned 32-bit value."""
    if type(data) is not bytes:
        with memoryview(data) as view:
            if not view.c_contiguous:
                raise BufferError("memoryview: underlying buffer is not C-contiguous")
            data = view.tobytes()
    m = _MURMUR2_M
    length = len(data)
    h = (_MURMUR2_SEED ^ length) & _MASK32
    whole = length & ~3
    for (k,) in _WORDS.iter_unpack(memoryview(data)[:whole]):
        k = (k * m) & _MASK32
        k ^= k >> 24
        k = (k * m) & _MASK32
        h = ((h * m) & _MASK32) ^ k
    tail = length & 3
    # Java's switch falls through from case 3 to case 1.
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h


# -- RecordFuture's slots -------------------------------------------------------------------------------------

_FUTURE_SLOTS = ("on_delivery", "timestamp_ms", "key_size", "value_size", "_state", "_result", "_exception", "_cond")
_ABSENT = object()


class _FutureSlots:
    """The slots of a RecordFuture type (client_stub.futures), read and written through their member
    descriptors: where the C code reads and writes them at their offsets, past any property or
    __getattr__ of the instance's class."""

    __slots__ = ("type", "on_delivery", "timestamp_ms", "key_size", "value_size", "state", "result", "exception",
                 "cond")
    # Each set by its name in _FUTURE_SLOTS.
    on_delivery: MemberDescriptorType
    timestamp_ms: MemberDescriptorType
    key_size: MemberDescriptorType
    value_size: MemberDescriptorType
    state: MemberDescriptorType
    result: MemberDescriptorType
    exception: MemberDescriptorType
    cond: MemberDescriptorType
    type: type[object]

    def __init__(self, future_type: object) -> None:
        if not isinstance(future_type, type):
            raise TypeError("future_type must be a type")
        for name in _FUTURE_SLOTS:
            descriptor = vars(future_type).get(name)
            if type(descriptor) is not MemberDescriptorType:
                raise TypeError(f"{future_type.__name__} must declare {name} in __slots__")
            setattr(self, name.lstrip("_"), descriptor)
        self.type = future_type

    def new(self, on_delivery: object, timestamp_ms: int, key_size: int, value_size: int) -> Any:
        """A pending future, made as object.__new__ would, its slots filled without running __init__."""
        future = self.type.__new__(self.type)
        for descriptor, value in ((self.on_delivery, on_delivery), (self.state, RUNNING), (self.result, None),
                                  (self.exception, None), (self.cond, None), (self.timestamp_ms, timestamp_ms),
                                  (self.key_size, key_size), (self.value_size, value_size)):
            descriptor.__set__(future, value)
        return future


def _slot(descriptor: MemberDescriptorType, future: object, default: object = None) -> Any:
    """The slot's value, or ``default`` where it was never set (NULL in C)."""
    try:
        return descriptor.__get__(future)
    except AttributeError:
        return default


# -- OpenBatch -------------------------------------------------------------------------------------------------


def _read_only(name: str, doc: str | None = None) -> property:
    return property(operator.attrgetter(name), doc=doc)


@final
class OpenBatch:
    """OpenBatch(batch_id, topic, partition, first_block, block_count, view, timestamp_ms, created, control,
    topic_index)

    A batch this process writes records into, in its blocks of shared memory, publishing them in its slot of
    ``control``, the segment's control area (``topic_index``: the session's number for the topic).
    """

    __slots__ = ("_batch_id", "_topic", "_partition", "_first_block", "_block_count", "_view", "_pos",
                 "_base_timestamp", "_max_timestamp", "_futures", "_created", "_control", "reported")
    _batch_id: int
    _topic: str
    _partition: int
    _first_block: int
    _block_count: int
    _view: memoryview | None
    _pos: int
    _base_timestamp: int
    _max_timestamp: int
    _futures: list[Any]
    _created: float
    _control: ControlArea | None
    reported: int  # records whose delivery report arrived

    # Made and initialised in one, as the C type is: no instance exists without its fields.
    def __new__(cls, batch_id: int, topic: str, partition: int, first_block: int, block_count: int,
                view: WriteableBuffer, timestamp_ms: int, created: float, control: WriteableBuffer,
                topic_index: int) -> Self:
        self = super().__new__(cls)
        self._batch_id = _int64(batch_id)
        if not isinstance(topic, str):
            raise TypeError(f"OpenBatch() argument 2 must be str, not {type(topic).__name__}")
        self._topic = topic
        self._partition = _int32(partition)
        self._first_block = _int64(first_block)
        self._block_count = _int64(block_count)
        self._base_timestamp = _int64(timestamp_ms)
        self._created = _double(created)
        # Timestamps are never negative (send() refuses them): a record's delta from the base cannot overflow.
        if self._base_timestamp < 0:
            raise ValueError("timestamp_ms must not be negative")
        topic_index = _uint32(topic_index)
        if self._first_block < 0:
            raise ValueError("first_block must not be negative")
        area = _writable_bytes(control)
        # Aligned, as the C twin checks: an 8-byte word is written with one store only if it is.
        if (area.nbytes < batch_slots.control_size(self._first_block + 1)
                or ctypes.addressof(ctypes.c_char.from_buffer(area)) % 8):
            raise ValueError("the control area has no slot for first_block (or is not 8-byte aligned)")
        self._control = ControlArea(area, self._first_block + 1)
        self._view = _writable_bytes(view)
        self._pos = 0
        self._max_timestamp = self._base_timestamp
        self._futures = []
        self.reported = 0
        # Nothing published, then nothing claimed; the daemon reads the rest only after a publish.
        self._control.open(self._first_block, batch_id=self._batch_id & _MASK64, topic_index=topic_index,
                           partition=self._partition & _MASK32, block_count=self._block_count & _MASK64,
                           base_timestamp=self._base_timestamp, opened_ns=int(self._created * 1e9) & _MASK64)
        return self

    batch_id = _read_only("_batch_id", "this client's number for the batch")
    topic = _read_only("_topic")
    partition = _read_only("_partition")
    first_block = _read_only("_first_block")
    block_count = _read_only("_block_count")
    pos = _read_only("_pos", "bytes written")
    base_timestamp = _read_only("_base_timestamp")
    max_timestamp = _read_only("_max_timestamp")
    futures = _read_only("_futures", "a future per record, in offset order")
    created = _read_only("_created", "time.monotonic() when opened")

    @property
    def record_count(self) -> int:
        """Records written."""
        return len(self._futures)

    @property
    def capacity(self) -> int:
        """Bytes of shared memory (0 once released)."""
        view = self._view
        return 0 if view is None else view.nbytes

    def append(self, key: _Field, value: _Field, headers: _Headers, timestamp_ms: int, future: object, /) -> bool:
        """Write a record after the others (offset and timestamp deltas from this batch) and keep its future;
        False if it does not fit."""
        timestamp = _int64(timestamp_ms)
        if timestamp < 0:
            raise ValueError("timestamp_ms must not be negative")
        return self._write(_fields(key, value, headers), timestamp, future)

    def _write(self, fields: bytes, timestamp: int, future: object) -> bool:
        """Append a record of ``fields`` (see _fields) and publish it; False if it does not fit, or the daemon
        has claimed the batch without it."""
        view, control = self._view, self._control
        if view is None or control is None:
            raise ValueError("the batch is sealed")
        block = self._first_block
        if control.claim_word(block):
            return False
        index = len(self._futures)
        # The deltas are taken here, after whatever reading the fields ran: the record's offset is its place.
        record = _record(index, timestamp - self._base_timestamp, fields)
        end = self._pos + len(record)
        if end > view.nbytes:
            return False
        view[self._pos:end] = record
        pos, max_timestamp = self._pos, self._max_timestamp
        self._futures.append(future)
        self._pos = end
        if timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        if not self._holds(control.publish(block, index + 1, end, self._max_timestamp), index):
            # Claimed without it: the daemon reads nothing of this batch again, so only this side forgets it.
            self._pos, self._max_timestamp = pos, max_timestamp
            del self._futures[index]
            return False
        return True

    def _want_reports(self) -> None:
        """A record with a callback is in flight: the segment's header says this process waits on its report (as
        the C twin's want_reports())."""
        control = self._control
        if control is not None and not control.header(batch_slots.REPORTS_WANTED):
            control.set_header(batch_slots.REPORTS_WANTED, 1)

    def _holds(self, claim: int, index: int) -> bool:
        """Whether the batch holds its record ``index`` (as the C twin's holds())."""
        held = batch_slots.holds(claim, index)
        deadline = time.monotonic() + _CLAIMING_WAIT_S
        while held is None and time.monotonic() < deadline:
            time.sleep(0)
            assert self._control is not None
            held = batch_slots.holds(self._control.claim_word(self._first_block), index)
        return True if held is None else held

    def release(self) -> None:
        """Publish the batch as full and let go of the shared memory: nothing more can be written."""
        view, self._view = self._view, None
        control, self._control = self._control, None
        if view is not None and control is not None:
            control.publish(self._first_block, len(self._futures), self._pos, self._max_timestamp, full=True)
        if view is not None:
            view.release()
        if control is not None:
            control.release()

    def claimed(self) -> bool:
        """Whether the daemon has claimed the batch (or is claiming it): it takes no more records."""
        control = self._control
        return control is None or control.claim_word(self._first_block) != 0


# -- Appender: the common case of Producer.send() --------------------------------------------------------------

def _report_field(fields: tuple[Any, ...], index: int) -> int:
    """A report row's field ``index``, saturated to a Py_ssize_t as C has it (a count past the batch's end counts up
    to its end); TypeError if it is not an int."""
    field = fields[index]
    if not isinstance(field, int):
        raise TypeError(f"a delivery report's field {index} must be an int, not {type(field).__name__}")
    return min(max(field, _INT64_MIN), _INT64_MAX)


_MISSING: Any = object()


@final
class Appender:
    """Appender(lock, open, partition_counts, future_type, seal, slow_send, sticky, murmur2_keys,
             topic_indexes, unreported, batch_ids, wakeup)

    The open batches of a producer, and its send().
    """

    __slots__ = ("_acquire", "_release", "_open", "_partition_counts", "_sticky", "_seal", "_slow_send", "_slots",
                 "_enabled", "_murmur2_keys", "_outstanding", "_topic_indexes", "_unreported", "_batch_ids", "_wakeup",
                 "_blocks", "_control", "_take_spare", "_block_size", "_max_record_size", "_linger_ns", "_spare",
                 "_spare_floor", "_spare_until_ns", "_spare_wanted_base", "_spare_taken")
    # The producer's lock, which guards its open batches and the counts: its acquire and release.
    _acquire: Callable[[bool], bool]
    _release: Callable[[], None]
    # The producer's dicts, read here: the accumulator's (topic, partition) -> OpenBatch, and the producer
    # metadata's topic -> partition count for the topics known without error.
    _open: dict[tuple[str, int], OpenBatch]
    _partition_counts: dict[str, int]
    _sticky: dict[str, int] | None  # topic -> partition for records without a key, or None
    # seal(batch), called with the lock held for a batch to seal that took no record (its blocks go back); the others
    # are sealed here (_seal_open()).
    _seal: Callable[[OpenBatch], object]
    _slow_send: Callable[..., Any]  # the producer's Python path, for what the fast path does not take
    _topic_indexes: dict[str, int]  # the producer metadata's topic -> the session's number for it, read here
    _unreported: dict[int, OpenBatch]  # the accumulator's batch id -> batch, where a batch opened here goes
    _batch_ids: Iterator[int]  # the accumulator's batch ids
    _wakeup: Callable[[], object]  # say WAKEUP (a batch opened here, and the daemon would not look in time)
    # The session's segment, while attached: where batches are opened on spare blocks (see attach()).
    _blocks: memoryview | None
    _control: memoryview | None
    _take_spare: Callable[[], int | None] | None
    # The spare blocks at hand (the producer's list, or None), which a batch opened here takes the last of itself
    # while it leaves at least _spare_floor - 1 and the clock is before _spare_until_ns: the cases where take_spare()
    # would ask for nothing and measure nothing (see spare_policy()).
    _spare: list[int] | None
    _spare_floor: int
    _spare_until_ns: int
    _spare_wanted_base: int  # the header's spare_wanted is this less the blocks at hand, at least 0
    _spare_taken: int  # blocks taken here since spare_policy() last said
    _block_size: int
    _max_record_size: int
    _linger_ns: int
    _slots: _FutureSlots
    _murmur2_keys: bool  # keyed records go by murmur2 (murmur2_random)
    _enabled: bool  # off until the session is up, and when the producer cannot take this path
    _outstanding: int  # records handed off and not yet reported: counted here alone

    # Made and initialised in one, as the C type is: no instance exists without its fields.
    def __new__(cls, lock: threading.Lock, open: dict[tuple[str, int], OpenBatch], partition_counts: dict[str, int],
                future_type: type[Any], seal: Callable[[OpenBatch], object], slow_send: Callable[..., Any],
                sticky: dict[str, int] | None, murmur2_keys: bool, topic_indexes: dict[str, int],
                unreported: dict[int, OpenBatch], batch_ids: Iterator[int], wakeup: Callable[[], object]) -> Self:
        for position, given in ((2, open), (3, partition_counts), (9, topic_indexes), (10, unreported)):
            if not isinstance(given, dict):
                raise TypeError(f"Appender() argument {position} must be dict, not {type(given).__name__}")
        if sticky is not None and type(sticky) is not dict:
            raise TypeError("sticky must be a dict or None")
        if not isinstance(batch_ids, Iterator):
            raise TypeError("batch_ids must be an iterator")
        self = super().__new__(cls)
        self._slots = _FutureSlots(future_type)
        self._acquire = lock.acquire
        self._release = lock.release
        self._open = open
        self._partition_counts = partition_counts
        self._sticky = sticky
        self._seal = seal
        self._slow_send = slow_send
        self._topic_indexes = topic_indexes
        self._unreported = unreported
        self._batch_ids = batch_ids
        self._wakeup = wakeup
        self._blocks = self._control = self._take_spare = self._spare = None
        self._block_size = self._max_record_size = self._linger_ns = 0
        self._spare_floor = self._spare_until_ns = self._spare_wanted_base = self._spare_taken = 0
        self._murmur2_keys = bool(murmur2_keys)
        self._enabled = False
        self._outstanding = 0
        return self

    @property
    def enabled(self) -> bool:
        """Whether send() may take records."""
        return self._enabled

    @property
    def outstanding(self) -> int:
        """Records handed off and not yet reported."""
        return self._outstanding

    def send(self, topic: str = _MISSING, value: Any = None, key: Any = None, *more: Any, partition: Any = None,
             timestamp_ms: Any = None, headers: Any = None, on_delivery: Any = None) -> Any:
        """send(topic, value=None, key=None, *, partition=None, timestamp_ms=None, headers=None, on_delivery=None)

        Producer.send(): the record is appended here when that is the whole job; else slow_send(topic, value,
        key, partition, timestamp_ms, headers, on_delivery) takes it.
        """
        if more:
            raise TypeError(f"send() takes at most 3 positional arguments (topic, value, key), {3 + len(more)} given")
        if topic is _MISSING:
            raise TypeError("send() missing required argument 'topic'")
        if not headers:
            future = self._try_append(topic, value, key, partition, timestamp_ms, on_delivery)
            if future is not None:
                return future
        return self._slow_send(topic, value, key, partition, timestamp_ms, headers, on_delivery)

    def attach(self, blocks: memoryview, control: memoryview, block_size: int, max_record_size: int,
               linger_ns: int, take_spare: Callable[[], int | None], /) -> None:
        """attach(blocks, control, block_size, max_record_size, linger_ns, take_spare)

        A session's segment (its blocks and control area, memoryviews): send() opens batches on its spare blocks,
        taken by take_spare() with the lock held, for records of at most max_record_size bytes; linger_ns is
        the producer's linger.ms.
        """
        block_size, max_record_size, linger_ns = (operator.index(block_size), operator.index(max_record_size),
                                                  operator.index(linger_ns))
        if block_size <= 0 or max_record_size < 0 or linger_ns < 0:
            raise ValueError("block_size must be positive, max_record_size and linger_ns not negative")
        if type(blocks) is not memoryview or type(control) is not memoryview:
            raise TypeError("blocks and control must be memoryviews")
        self._blocks, self._control, self._take_spare = blocks, control, take_spare
        self._block_size, self._max_record_size, self._linger_ns = block_size, max_record_size, linger_ns

    def detach(self) -> None:
        """Let go of the segment (before it is unmapped): no batch is opened here."""
        self._blocks = self._control = self._take_spare = self._spare = None

    def spare_policy(self, spare: list[int] | None, floor: int, until_ns: int, wanted_base: int, /) -> int:
        """spare_policy(spare, floor, until_ns, wanted_base)

        When send() may open a batch on a spare block without take_spare(): it takes the last of the list ``spare``
        (None: never) while that holds at least ``floor`` blocks and time.monotonic_ns() is before ``until_ns``, and
        then says in the segment's header that it would take max(wanted_base - len(spare), 0) more. Called with the
        producer's lock held; returns the blocks it took so since the last call.
        """
        if spare is not None and not isinstance(spare, list):
            raise TypeError(f"spare must be a list or None, not {type(spare).__name__}")
        floor, until_ns = _ssize(operator.index(floor)), _int64(until_ns)
        wanted_base = _ssize(operator.index(wanted_base))
        if floor < 0 or wanted_base < 0:
            raise ValueError("floor and wanted_base must not be negative")
        self._spare, self._spare_floor, self._spare_until_ns, self._spare_wanted_base = (spare, floor, until_ns,
                                                                                          wanted_base)
        taken, self._spare_taken = self._spare_taken, 0
        return taken

    def _take_quick(self) -> tuple[Any, int] | None:
        """The last spare block at hand, taken without take_spare() where the policy allows it (see
        spare_policy()), and what the header is to say of the spare blocks this client would take then, as
        take_spare() would have said; None: take_spare() decides."""
        spare = self._spare
        if (spare is None or not spare or len(spare) < self._spare_floor
                or time.monotonic_ns() >= self._spare_until_ns):
            return None
        self._spare_taken += 1
        block = spare.pop()
        return block, max(self._spare_wanted_base - len(spare), 0)

    def enable(self) -> None:
        """Let send() take records (the session is up)."""
        self._enabled = True

    def disable(self) -> None:
        """send() takes no record here: the Python path does."""
        self._enabled = False

    def count_appended(self) -> None:
        """Count a record the Python path appended as outstanding (the producer's lock held)."""
        self._outstanding += 1

    def count_done(self, count: int, /) -> None:
        """count_done(n): n outstanding records are reported, failed or given up on (the producer's lock held)."""
        count = _ssize(count)
        if count < 0 or count > self._outstanding:
            raise ValueError(f"count_done({count}) with {self._outstanding} record(s) outstanding")
        self._outstanding -= count

    def _try_append(self, topic: Any, value: Any, key: Any, partition: Any, timestamp_ms: Any,
                    on_delivery: Any) -> Any:
        """Append the record to its partition's open batch, or to one it opens on a spare block, if that
        is the whole job: a topic with known partitions, bytes or None for key and value, a batch with room, the
        producer's lock free. Returns its future, or None (the Python path must take it)."""
        if (type(topic) is not str or (key is not None and type(key) is not bytes)
                or (value is not None and type(value) is not bytes)):
            return None
        if timestamp_ms is None:
            timestamp = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is int and 0 <= timestamp_ms <= _INT64_MAX:
            timestamp = timestamp_ms
        else:
            return None
        count = self._partition_counts.get(topic)
        if type(count) is not int or count <= 0:
            return None
        fields = _plain_fields(key, value)
        future = self._slots.new(on_delivery, timestamp, -1 if key is None else len(key),
                                 -1 if value is None else len(value))
        # A batch that refuses the record (full, or claimed by the daemon) is sealed, and the partition chosen
        # again (for a record without a key, the Python path then chooses the next sticky one); a second refusal
        # leaves the record to the Python path.
        for _ in range(2):
            chosen = self._choose_partition(topic, key, partition, count)
            if chosen < 0:
                return None
            appended = self._append_to_partition(topic, chosen, key, value, fields, timestamp, future, on_delivery)
            if appended is not False:
                return future if appended else None
        return None

    def _append_to_partition(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                             fields: bytes, timestamp: int, future: Any,
                             on_delivery: Any) -> bool | None:
        """Append the record to the open batch of (topic, partition), or to one opened on a spare block: True if
        appended, None if the Python path must take it, False if the open batch did not take it (full, or claimed
        by the daemon) and was sealed."""
        # The lock, not the GIL, keeps other threads out of the batches. If one holds it, in the middle of a
        # change to them, the Python path waits for it.
        if not self._acquire(False):
            return None
        try:
            if not self._enabled:
                return None
            batch = self._open.get((topic, partition))
            opened = batch is None
            if opened:
                batch = self._open_on_spare(topic, partition, timestamp, record_size(0, 0, key, value))
                if batch is None:
                    return None
            if not isinstance(batch, OpenBatch):
                raise TypeError(f"open batches must be {OpenBatch.__module__}.OpenBatch, got {type(batch).__name__}")
            before = batch._pos
            if batch._view is None or not batch._write(fields, timestamp, future):
                self._seal_open(batch)
                # One it opened was claimed before its first record: the Python path opens another.
                return None if opened else False
            self._outstanding += 1
            if on_delivery is not None:
                batch._want_reports()
            if opened:
                self.first_published(batch)
            # Full, or nearly: the next record like this one would not fit.
            if batch.capacity - batch._pos < batch._pos - before:
                self._seal_open(batch)
        finally:
            self._release()
        return True

    def _seal_open(self, batch: OpenBatch) -> None:
        """seal(batch), as the accumulator seals a batch (its seal_if_open()): nothing if it is not the open batch of
        its partition any more. A batch that took records is sealed here (out of the open batches, its partition no
        longer sticky, published full and let go); one that took none is seal()'s, which gives its blocks back."""
        if not batch._futures:
            self._seal(batch)
            return
        key = (batch._topic, batch._partition)
        if self._open.get(key) is not batch:
            return
        del self._open[key]
        # Records without a key of the topic stick to another partition once its batch is sealed, as the
        # Partitioner's batch_sealed() has them.
        sticky = self._sticky
        if sticky is not None:
            chosen = sticky.get(batch._topic)
            if type(chosen) is int and chosen == batch._partition:
                del sticky[batch._topic]
        batch.release()

    def reported(self, rows: list[Any], /) -> tuple[list[tuple[OpenBatch, int, int, Any, Any, Any]], int, int]:
        """reported(rows)

        Count delivery reports (DeliveryReport rows) against the unreported batches they report on, with the
        producer's lock held: each batch is sealed if it is still open (the daemon claimed it), and forgotten once
        all its records are reported. Returns ([(batch, first, count, base_offset, log_append_time_ms, error), ...],
        delivered, failed): a row for each batch still known, its count within the batch, and the records reported
        delivered and failed for the first time.
        """
        if not isinstance(rows, list):
            raise TypeError(f"rows must be a list, not {type(rows).__name__}")
        out: list[tuple[OpenBatch, int, int, Any, Any, Any]] = []
        counts = [0, 0]
        i = 0
        while i < len(rows):  # the list may change as a seal runs Python code
            self._count_report(rows[i], out, counts)
            i += 1
        return out, counts[0], counts[1]

    def _count_report(self, row: Any, out: list[tuple[OpenBatch, int, int, Any, Any, Any]], counts: list[int]) -> None:
        """One report row counted against its batch (see reported())."""
        fields = tuple(row)  # a copy: sealing may run Python code, which may change the row
        if len(fields) != 6:
            raise ValueError(f"a delivery report has 6 fields, not {len(fields)}")
        first, count = (_report_field(fields, index) for index in (1, 2))
        batch = self._unreported.get(fields[0])
        if batch is None:
            return  # of a batch given up on, or of another session
        if not isinstance(batch, OpenBatch):
            raise TypeError(f"unreported batches must be {OpenBatch.__module__}.OpenBatch, got {type(batch).__name__}")
        if first < 0:
            raise ValueError("a delivery report's first record must not be negative")
        self._seal_open(batch)  # the daemon claimed it: it takes no more records
        record_count = len(batch._futures)
        span = min(max(count, 0), max(record_count - first, 0))
        # Part of it reported before (split by the daemon, or sent again whole by the daemon that took the session
        # back): only the records whose futures are not done count now.
        fresh = self._pending_futures(batch, first, span) if batch.reported else span
        fresh = min(fresh, record_count - batch.reported)
        batch.reported += fresh
        error = fields[5]
        counts[error is not None] += fresh
        out.append((batch, first, span, fields[3], fields[4], error))
        if batch.reported >= record_count:
            # A batch that took no record may have left the unreported as it was sealed.
            self._unreported.pop(fields[0], None)

    def _pending_futures(self, batch: OpenBatch, first: int, count: int) -> int:
        """Of the futures[first:first + count] of a batch reported in part before, those not completed yet."""
        slots = self._slots
        pending = 0
        for future in batch._futures[first:first + count]:
            if not issubclass(type(future), slots.type):
                raise TypeError(f"futures must be {slots.type.__name__}, got {type(future).__name__}")
            pending += _slot(slots.state, future) != FINISHED
        return pending

    def _open_on_spare(self, topic: str, partition: int, timestamp: int, size: int) -> OpenBatch | None:
        """A batch for a record of ``size`` bytes on a spare block of the attached segment, opened as the accumulator
        opens one (the lock held); None if there is no segment, the topic is not numbered in this session yet, the
        record is larger than a block or no spare block is at hand: the Python path takes the record."""
        blocks, control, take_spare = self._blocks, self._control, self._take_spare
        if blocks is None or control is None or take_spare is None or size > self._max_record_size:
            return None
        topic_index = self._topic_indexes.get(topic)
        if type(topic_index) is not int or not 0 <= topic_index <= 0xFFFFFFFF:
            return None
        quick = self._take_quick()
        block = take_spare() if quick is None else quick[0]
        if block is None:
            return None
        block = operator.index(block)
        block_size = self._block_size
        if not 0 <= block < len(blocks) // block_size:
            raise ValueError("take_spare() gave a block that is not one of the segment's")
        batch_id = next(self._batch_ids, None)
        if batch_id is None:
            raise RuntimeError("batch_ids ran out")
        batch = OpenBatch(batch_id, topic, partition, block, 1, blocks[block * block_size:(block + 1) * block_size],
                          timestamp, time.monotonic(), control, topic_index)
        self._open[(topic, partition)] = batch
        self._unreported[batch_id] = batch
        if quick is not None:
            assert batch._control is not None
            if batch._control.header(batch_slots.SPARE_WANTED) != quick[1]:
                batch._control.set_header(batch_slots.SPARE_WANTED, quick[1])
        return batch

    def first_published(self, batch: OpenBatch, /) -> None:
        """first_published(batch)

        The first record of a batch the Python path opened is published: wakeup() if the daemon would not look at
        it within the producer's linger.ms (as send() does for the batches it opens).
        """
        # Checked after the publish, not at the open: a daemon that looks in between finds the record, one that
        # looks no more is told.
        if not isinstance(batch, OpenBatch):
            raise TypeError(f"first_published() takes a {OpenBatch.__module__}.OpenBatch, not {type(batch).__name__}")
        control = batch._control
        if control is None:
            raise ValueError("the batch is sealed")
        scan_interval = control.header(batch_slots.SCAN_INTERVAL_NS)
        watched_until = control.header(batch_slots.WATCHED_UNTIL_NS)
        if not (0 < scan_interval <= self._linger_ns and watched_until >= time.monotonic_ns() + self._linger_ns):
            self._wakeup()

    def _choose_partition(self, topic: str, key: bytes | None, partition: Any, count: int) -> int:
        """The partition for the record, or -1 if the Python path must decide (or complain)."""
        if partition is not None:
            return partition if type(partition) is int and 0 <= partition < count else -1
        if key is not None:
            return (murmur2(key) & 0x7FFFFFFF) % count if self._murmur2_keys else -1
        if self._sticky is None:
            return -1
        chosen = self._sticky.get(topic)
        return chosen if type(chosen) is int and 0 <= chosen < count else -1


# -- Completer: delivery reports to futures and callbacks -----------------------------------------------------

# What becomes of each future of a report: settled in place here; WATCHED, its Condition exists (someone
# waits on it, or added a done-callback), completed through its _notify(); or DONE_ALREADY (a record
# completes once: one failed as lost stays failed if its report comes after all).
_SETTLED, _WATCHED, _DONE_ALREADY = range(3)


@final
class Completer:
    """Completer(future_type, metadata_type, condition_lock, callback_failed)

    Turns delivery reports into completed record futures and on_delivery calls.
    """

    __slots__ = ("_slots", "_metadata_type", "_acquire", "_release", "_callback_failed")
    _slots: _FutureSlots
    _metadata_type: type[tuple[Any, ...]]  # RecordMetadata (a NamedTuple)
    # The lock that guards a RecordFuture's lazily made Condition against its completion: its acquire and release.
    _acquire: Callable[[bool], bool]
    _release: Callable[[], None]
    _callback_failed: Callable[[Exception], object]  # an on_delivery callback raised

    # Made and initialised in one, as the C type is: no instance exists without its fields.
    def __new__(cls, future_type: type[Any], metadata_type: type[tuple[Any, ...]], condition_lock: threading.Lock,
                callback_failed: Callable[[Exception], object]) -> Self:
        if not isinstance(metadata_type, type):
            raise TypeError(f"Completer() argument 2 must be type, not {type(metadata_type).__name__}")
        if not issubclass(metadata_type, tuple):
            raise TypeError("metadata_type must be a tuple type")
        self = super().__new__(cls)
        self._slots = _FutureSlots(future_type)
        self._acquire = condition_lock.acquire
        self._release = condition_lock.release
        self._metadata_type = metadata_type
        self._callback_failed = callback_failed
        return self

    def complete(self, futures: list[Any], first: int, count: int, topic: str, partition: int, base_offset: int,
                 log_append_time: int, error: BaseException | None, /) -> None:
        """complete(futures, first, count, topic, partition, base_offset, log_append_time, error)

        Complete futures[first:first + count], the records of one delivery report: with their
        RecordMetadata (offsets from base_offset on; -1 for all if it is -1), or with ``error``; then run
        their on_delivery callbacks. A callback that raises is handed to callback_failed.
        """
        if type(futures) is not list:
            raise TypeError("futures must be a list")
        first = _ssize(first)
        count = _ssize(count)
        base_offset = _int64(base_offset)
        log_append_time = _int64(log_append_time)
        if first < 0 or count < 0 or first > len(futures):
            raise ValueError("first and count must select records of futures")
        # Taken from the list first: a callback may change the list.
        done = futures[first:first + count]
        if not done:
            return
        future_type = self._slots.type
        results: list[tuple[Any, ...] | None] = []
        for i, future in enumerate(done):
            if not issubclass(type(future), future_type):
                raise TypeError(f"futures must be {future_type.__name__}, got {type(future).__name__}")
            if error is None:
                # base_offset is that of futures[first]: each part of a batch the daemon split has its own.
                offset = base_offset + i if base_offset >= 0 else -1
                results.append(self._metadata(future, topic, partition, offset, log_append_time))
            else:
                results.append(None)
        fates = self._settle_quiet(done, results, error)
        # Every future completes and every callback runs, whatever one of them raises: the first exception
        # that escapes (a BaseException from a callback) is raised once all are done.
        raised: BaseException | None = None
        for future, result, fate in zip(done, results, fates, strict=True):
            try:
                if fate == _WATCHED:
                    future._notify(result, error)
                elif fate == _SETTLED:
                    self._run_callback(future, result, error)
            except BaseException as exc:
                if raised is None:
                    raised = exc
        if raised is not None:
            raise raised

    def _metadata(self, future: object, topic: str, partition: int, offset: int,
                  log_append_time: int) -> tuple[Any, ...]:
        """RecordMetadata(topic, partition, offset, timestamp_ms, serialized_key_size, serialized_value_size)."""
        slots = self._slots
        timestamp = _slot(slots.timestamp_ms, future, _ABSENT)
        key_size = _slot(slots.key_size, future, _ABSENT)
        value_size = _slot(slots.value_size, future, _ABSENT)
        if timestamp is _ABSENT or key_size is _ABSENT or value_size is _ABSENT:
            raise ValueError("a RecordFuture without its record's sizes and timestamp")
        if log_append_time >= 0:
            timestamp = log_append_time
        # As the C code makes it: no __new__ of the NamedTuple runs.
        return tuple.__new__(self._metadata_type, (topic, partition, offset, timestamp, key_size, value_size))

    def _settle_quiet(self, futures: list[Any], results: list[tuple[Any, ...] | None],
                      error: BaseException | None) -> list[int]:
        """Settle the futures nobody watches, in place; the fate of each."""
        slots = self._slots
        fates = []
        self._acquire(True)
        try:
            for future, result in zip(futures, results, strict=True):
                state = _slot(slots.state, future)
                if state is not RUNNING and state != RUNNING:
                    fates.append(_DONE_ALREADY)
                elif _slot(slots.cond, future, _ABSENT) is not None:
                    fates.append(_WATCHED)
                else:
                    slots.result.__set__(future, result)
                    slots.exception.__set__(future, error)
                    slots.state.__set__(future, FINISHED)
                    fates.append(_SETTLED)
        finally:
            self._release()
        return fates

    def _run_callback(self, future: object, result: object, error: BaseException | None) -> None:
        """Run the record's on_delivery(error, metadata); an Exception it raises goes to callback_failed, a
        BaseException that is not one (SystemExit, KeyboardInterrupt) propagates."""
        callback = _slot(self._slots.on_delivery, future)
        if callback is None:
            return
        try:
            callback(error, result)
        except Exception as exc:
            self._callback_failed(exc)
