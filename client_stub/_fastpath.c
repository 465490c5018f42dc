/*
 * client_stub._fastpath: the per-record work of the client in C.
 *
 * What runs once per record decides how fast an application can produce, and
 * in Python it costs several microseconds. This module holds that work:
 *
 *   - Kafka's v2 record encoding (KIP-98), written straight into a batch's
 *     shared-memory block: the one encoder of the project (client_stub.contract.records
 *     and the daemon use it too);
 *   - murmur2, the Java producer's hash of keys;
 *   - OpenBatch, a batch being written by this process, which publishes what it wrote in its slot of the
 *     segment's control area for the daemon to claim (client_stub/contract/batch_slots.py: the protocol);
 *   - Appender.send(), which is Producer.send(): it appends the record itself in
 *     the common case (a known topic, bytes or None for key and value, no
 *     headers, a batch with room or a spare block to open one on), and hands
 *     anything else to Producer's Python path;
 *   - Completer.complete(), the delivery reports: each record's RecordMetadata
 *     or error, its future and its on_delivery callback.
 *
 * Its pure-Python twin, client_stub/_fastpath_py.py, does the same with the same names and errors;
 * client_stub.fastpath chooses between the two at import. The Python side (client_stub.producer and the
 * modules it is made of) keeps the logic: sessions, blocks, sealing, waiting, errors. Every function here holds the GIL
 * throughout.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stdint.h>
#include <sched.h>
#include <string.h>
#include <time.h>

/* -- varints (zig-zag, as protobuf's sint32/sint64) ---------------------------------------------- */

static inline uint64_t zigzag(int64_t value) {
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
}

static inline Py_ssize_t uvarint_size(uint64_t value) {
    Py_ssize_t size = 1;
    while (value > 0x7F) {
        value >>= 7;
        size++;
    }
    return size;
}

static inline Py_ssize_t varint_size(int64_t value) {
    return uvarint_size(zigzag(value));
}

static inline char *put_varint(char *out, int64_t value) {
    uint64_t v = zigzag(value);
    while (v > 0x7F) {
        *out++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *out++ = (char)v;
    return out;
}

/* -- one record ----------------------------------------------------------------------------------- */

/* A record's fields as byte ranges: data NULL with length -1 is null. */
typedef struct {
    const char *data;
    Py_ssize_t length;
} Field;

typedef struct {
    int64_t offset_delta;
    int64_t timestamp_delta;
    Field key;
    Field value;
    Py_ssize_t header_count;
    Field *header_keys;
    Field *header_values;
} Record;

static inline Py_ssize_t field_size(const Field *field) {
    return field->length < 0 ? 1 : varint_size(field->length) + field->length;
}

/* The bytes after the length prefix. */
static Py_ssize_t body_size(const Record *record) {
    Py_ssize_t size = 1 + varint_size(record->timestamp_delta) + varint_size(record->offset_delta);
    size += field_size(&record->key) + field_size(&record->value);
    size += varint_size(record->header_count);
    for (Py_ssize_t i = 0; i < record->header_count; i++) {
        size += field_size(&record->header_keys[i]) + field_size(&record->header_values[i]);
    }
    return size;
}

static inline char *put_field(char *out, const Field *field) {
    if (field->length < 0) {
        return put_varint(out, -1);
    }
    out = put_varint(out, field->length);
    memcpy(out, field->data, (size_t)field->length);
    return out + field->length;
}

/* The record's size with its length prefix; *body receives the body size. */
static inline Py_ssize_t record_size_of(const Record *record, Py_ssize_t *body) {
    *body = body_size(record);
    return varint_size(*body) + *body;
}

static void write_record(char *out, const Record *record, Py_ssize_t body) {
    out = put_varint(out, body);
    *out++ = 0; /* attributes */
    out = put_varint(out, record->timestamp_delta);
    out = put_varint(out, record->offset_delta);
    out = put_field(out, &record->key);
    out = put_field(out, &record->value);
    out = put_varint(out, record->header_count);
    for (Py_ssize_t i = 0; i < record->header_count; i++) {
        out = put_field(out, &record->header_keys[i]);
        out = put_field(out, &record->header_values[i]);
    }
}

/* A type's tp_new that runs its initialisation: an instance never exists without it (__new__ alone would
   leave the NULL fields that every method relies on), and __init__ is object's, which does nothing. */
#define DEFINE_NEW_INITIALISED(Type)                                                                    \
    static PyObject *Type##_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {                 \
        PyObject *self = PyType_GenericNew(type, NULL, NULL);                                            \
        if (self != NULL && Type##_init((Type *)self, args, kwargs) < 0) {                               \
            Py_CLEAR(self);                                                                              \
        }                                                                                                \
        return self;                                                                                     \
    }

/* -- reading Python arguments into a Record --------------------------------------------------------- */

/* Buffers held while a record is encoded from arbitrary buffer objects. */
#define MAX_HELD 64

typedef struct {
    Py_buffer views[MAX_HELD];
    int count;
    PyObject *headers_fast;
    Field *header_fields;
} Held;

static void held_release(Held *held) {
    for (int i = 0; i < held->count; i++) {
        PyBuffer_Release(&held->views[i]);
    }
    held->count = 0;
    Py_CLEAR(held->headers_fast);
    PyMem_Free(held->header_fields);
    held->header_fields = NULL;
}

/* bytes, or any object with the buffer protocol, or None (null). */
static int field_from(PyObject *obj, Field *field, Held *held, const char *what) {
    if (obj == Py_None) {
        field->data = NULL;
        field->length = -1;
        return 0;
    }
    if (PyBytes_Check(obj)) { /* a subclass's bytes too: immutable, and held by the record's arguments */
        field->data = PyBytes_AS_STRING(obj);
        field->length = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (held->count == MAX_HELD) {
        PyErr_Format(PyExc_ValueError, "too many non-bytes buffers in one record (%d at most)", MAX_HELD);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &held->views[held->count], PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be bytes-like or None, got %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    field->data = held->views[held->count].buf;
    field->length = held->views[held->count].len;
    held->count++;
    return 0;
}

/* headers: a sequence of (key bytes, value bytes | None) pairs. */
static int headers_from(PyObject *headers, Record *record, Held *held) {
    record->header_count = 0;
    record->header_keys = record->header_values = NULL;
    if (headers == NULL || headers == Py_None) {
        return 0;
    }
    /* A tuple of its own, not the caller's list: taking a buffer may run Python code (a __buffer__,
       PEP 688) that empties that list while the fields below point into its pairs. */
    held->headers_fast = PySequence_Tuple(headers);
    if (held->headers_fast == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_SetString(PyExc_TypeError, "headers must be a sequence of (key, value) pairs");
        }
        return -1;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(held->headers_fast);
    if (count == 0) {
        return 0;
    }
    held->header_fields = PyMem_Calloc((size_t)count * 2, sizeof(Field));
    if (held->header_fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    record->header_keys = held->header_fields;
    record->header_values = held->header_fields + count;
    PyObject **items = PySequence_Fast_ITEMS(held->headers_fast);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = items[i];
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "a header is a (key, value) tuple");
            return -1;
        }
        PyObject *key = PyTuple_GET_ITEM(pair, 0);
        if (key == Py_None) {
            PyErr_SetString(PyExc_TypeError, "a header key cannot be None");
            return -1;
        }
        if (field_from(key, &record->header_keys[i], held, "a header key") < 0 ||
            field_from(PyTuple_GET_ITEM(pair, 1), &record->header_values[i], held, "a header value") < 0) {
            return -1;
        }
    }
    record->header_count = count;
    return 0;
}

static int record_from(Record *record, Held *held, long long offset_delta, long long timestamp_delta,
                       PyObject *key, PyObject *value, PyObject *headers) {
    record->offset_delta = offset_delta;
    record->timestamp_delta = timestamp_delta;
    if (field_from(key, &record->key, held, "key") < 0 || field_from(value, &record->value, held, "value") < 0) {
        return -1;
    }
    return headers_from(headers, record, held);
}

/* -- module functions: encoding and murmur2 -------------------------------------------------------- */

PyDoc_STRVAR(encode_record_doc,
"encode_record($module, offset_delta, timestamp_delta, key, value, headers=())\n--\n\n"
"One record in Kafka's v2 format, its length prefix included.");

static PyObject *encode_record(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"offset_delta", "timestamp_delta", "key", "value", "headers", NULL};
    long long offset_delta, timestamp_delta;
    PyObject *key, *value, *headers = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLOO|O:encode_record", keywords, &offset_delta,
                                     &timestamp_delta, &key, &value, &headers)) {
        return NULL;
    }
    Record record;
    Held held = {.count = 0};
    PyObject *result = NULL;
    if (record_from(&record, &held, offset_delta, timestamp_delta, key, value, headers) == 0) {
        Py_ssize_t body;
        Py_ssize_t size = record_size_of(&record, &body);
        result = PyBytes_FromStringAndSize(NULL, size);
        if (result != NULL) {
            write_record(PyBytes_AS_STRING(result), &record, body);
        }
    }
    held_release(&held);
    return result;
}

PyDoc_STRVAR(encode_record_into_doc,
"encode_record_into($module, buf, pos, offset_delta, timestamp_delta, key, value, headers=())\n--\n\n"
"Write one record into the writable buffer ``buf`` at ``pos``; returns the position after it.\n"
"ValueError if it does not fit.");

static PyObject *encode_record_into(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"buf", "pos", "offset_delta", "timestamp_delta", "key", "value", "headers", NULL};
    Py_buffer buf;
    Py_ssize_t pos;
    long long offset_delta, timestamp_delta;
    PyObject *key, *value, *headers = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "w*nLLOO|O:encode_record_into", keywords, &buf, &pos,
                                     &offset_delta, &timestamp_delta, &key, &value, &headers)) {
        return NULL;
    }
    Record record;
    Held held = {.count = 0};
    PyObject *result = NULL;
    if (record_from(&record, &held, offset_delta, timestamp_delta, key, value, headers) == 0) {
        Py_ssize_t body;
        Py_ssize_t size = record_size_of(&record, &body);
        if (pos < 0 || pos > buf.len || size > buf.len - pos) {
            PyErr_Format(PyExc_ValueError, "a record of %zd bytes does not fit at %zd in a buffer of %zd",
                         size, pos, buf.len);
        } else {
            write_record((char *)buf.buf + pos, &record, body);
            result = PyLong_FromSsize_t(pos + size);
        }
    }
    held_release(&held);
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(record_size_doc,
"record_size($module, offset_delta, timestamp_delta, key, value, headers=())\n--\n\n"
"Bytes the encoded record takes, its length prefix included.");

static PyObject *record_size(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"offset_delta", "timestamp_delta", "key", "value", "headers", NULL};
    long long offset_delta, timestamp_delta;
    PyObject *key, *value, *headers = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLOO|O:record_size", keywords, &offset_delta,
                                     &timestamp_delta, &key, &value, &headers)) {
        return NULL;
    }
    Record record;
    Held held = {.count = 0};
    PyObject *result = NULL;
    if (record_from(&record, &held, offset_delta, timestamp_delta, key, value, headers) == 0) {
        Py_ssize_t body;
        result = PyLong_FromSsize_t(record_size_of(&record, &body));
    }
    held_release(&held);
    return result;
}

/* Kafka's Utils.murmur2: seed 0x9747b28c, little-endian 4-byte words. */
static uint32_t murmur2_of(const unsigned char *data, Py_ssize_t length) {
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t words = length / 4;
    for (Py_ssize_t i = 0; i < words; i++) {
        const unsigned char *p = data + i * 4;
        uint32_t k = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const unsigned char *tail = data + words * 4;
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)tail[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

PyDoc_STRVAR(murmur2_doc,
"murmur2($module, data, /)\n--\n\n"
"Kafka's murmur2 (Utils.murmur2) of ``data`` as an unsigned 32-bit value.");

static PyObject *murmur2(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t h = murmur2_of(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(h);
}

/* -- RecordFuture's slots ---------------------------------------------------------------------------- */

/* A RecordFuture (client_stub.futures) keeps everything in __slots__; this module reads and writes
   them where the interpreter would, at the offsets its member descriptors give, with no attribute
   lookup per record. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t on_delivery, timestamp_ms, key_size, value_size, state, result, exception, cond;
} FutureSlots;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset) {
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%.100s must declare %s in __slots__", type->tp_name, name);
        return -1;
    }
    *offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    return 0;
}

static int future_slots_init(FutureSlots *slots, PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "future_type must be a type");
        return -1;
    }
    PyTypeObject *t = (PyTypeObject *)type;
    if (slot_offset(t, "on_delivery", &slots->on_delivery) < 0 ||
        slot_offset(t, "timestamp_ms", &slots->timestamp_ms) < 0 ||
        slot_offset(t, "key_size", &slots->key_size) < 0 || slot_offset(t, "value_size", &slots->value_size) < 0 ||
        slot_offset(t, "_state", &slots->state) < 0 || slot_offset(t, "_result", &slots->result) < 0 ||
        slot_offset(t, "_exception", &slots->exception) < 0 || slot_offset(t, "_cond", &slots->cond) < 0) {
        return -1;
    }
    Py_INCREF(type);
    Py_XSETREF(slots->type, t);
    return 0;
}

static inline void slot_set(PyObject *obj, Py_ssize_t offset, PyObject *value) {
    Py_XSETREF(SLOT(obj, offset), Py_NewRef(value));
}

/* Steals a reference to value (which may be NULL after a failed allocation: then -1). */
static inline int slot_set_new(PyObject *obj, Py_ssize_t offset, PyObject *value) {
    if (value == NULL) {
        return -1;
    }
    Py_XSETREF(SLOT(obj, offset), value);
    return 0;
}

/* -- module state: interned names ------------------------------------------------------------------ */

/* send()'s parameters, in order; the first three may be positional. */
enum { ARG_TOPIC, ARG_VALUE, ARG_KEY, ARG_PARTITION, ARG_TIMESTAMP, ARG_HEADERS, ARG_ON_DELIVERY, ARG_COUNT };
#define POSITIONAL_ARGS 3
static const char *send_parameters[ARG_COUNT] = {"topic", "value", "key", "partition", "timestamp_ms", "headers",
                                                 "on_delivery"};
static PyObject *send_parameter_names[ARG_COUNT];

static PyObject *str_notify, *str_finished, *str_running, *empty_tuple;
/* functools.partial: the one kind of on_delivery callback kept out of the collector's sight in flight. */
static PyTypeObject *partial_type;

static int module_state_init(void) {
    str_notify = PyUnicode_InternFromString("_notify");
    /* concurrent.futures' state names; Future compares them with ==. */
    str_finished = PyUnicode_InternFromString("FINISHED");
    str_running = PyUnicode_InternFromString("RUNNING");
    empty_tuple = PyTuple_New(0);
    for (int i = 0; i < ARG_COUNT; i++) {
        if ((send_parameter_names[i] = PyUnicode_InternFromString(send_parameters[i])) == NULL) {
            return -1;
        }
    }
    if (!(str_notify && str_finished && str_running && empty_tuple)) {
        return -1;
    }
    /* The C type itself, not whatever functools.partial names now; without it nothing is hidden. */
    PyObject *functools = PyImport_ImportModule("_functools");
    PyObject *partial = functools == NULL ? NULL : PyObject_GetAttrString(functools, "partial");
    Py_XDECREF(functools);
    if (partial != NULL && PyType_Check(partial)) {
        partial_type = (PyTypeObject *)partial;
    } else {
        Py_XDECREF(partial);
        PyErr_Clear();
    }
    return 0;
}

/* A record's on_delivery callback, once the record is in a batch: out of the garbage collector's sight
   while in flight, as its future is. Applications make one per record to carry the record's context
   (perf_test does); it lives as long as the record is in flight, long enough to be promoted to the
   oldest generation, whose full collections scan the whole heap; it cannot be garbage while the future
   holds it. Only an exact functools.partial: its deallocator untracks it only if it is tracked, so one
   dropped untracked (a future never completed) is freed safely. Functions, lambdas and bound methods
   must be tracked when they are freed (their deallocators assume it), and other types are unknown. A
   partial in a reference cycle whose record never completes (a forked child's copy of the parent's
   batches) is not collected; one gc.freeze() froze goes back to the youngest generation once shown. */
static void hide_callback(PyObject *callback) {
    if (partial_type != NULL && Py_IS_TYPE(callback, partial_type) && PyObject_GC_IsTracked(callback)) {
        PyObject_GC_UnTrack(callback);
    }
}

/* Hand a callback hide_callback() may have hidden back to the collector, before it runs (it may make a
   cycle of itself) and before the future lets go of it. One partial may be many records': the first
   report tracks it again, the others find it tracked. */
static void show_callback(PyObject *callback) {
    if (callback != NULL && partial_type != NULL && Py_IS_TYPE(callback, partial_type) &&
        !PyObject_GC_IsTracked(callback)) {
        PyObject_GC_Track(callback);
    }
}

/* Call a bound method with no arguments (a lock's acquire, release, locked); -1 on error, else its
   truth. */
static int call_truth(PyObject *method) {
    PyObject *result = PyObject_CallNoArgs(method);
    if (result == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
}

static inline long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -- OpenBatch -------------------------------------------------------------------------------------- */

/* The control area's layout: client_stub/contract/batch_slots.py, which says what each word is and who writes it. */
#define SLOT_HEADER_BYTES 64
#define SLOT_BYTES 64
enum { PUBLISHED, CLAIM, BASE_TIMESTAMP, MAX_TIMESTAMP, BATCH_ID, TOPIC_PARTITION, BLOCK_COUNT, OPENED_NS };
enum { HEADER_WATCHED_UNTIL_NS, HEADER_SCAN_INTERVAL_NS, HEADER_LINGER_NS, HEADER_REPORTS_WANTED, HEADER_SPARE_WANTED };
#define PUBLISHED_FULL (1ULL << 63)
#define CLAIM_CLAIMING (1ULL << 63)
#define CLAIM_COUNT_MASK ((1ULL << 31) - 1)
/* How long an append waits for a claim the daemon is in the middle of (two of its instructions apart) before it
   takes its record as held: only a daemon stopped there for that long, or killed there (its successor then takes
   the batch as this process counts it), makes it wait at all. */
#define CLAIMING_WAIT_NS 1000000000LL

typedef struct {
    PyObject_HEAD
    Py_buffer buffer;      /* the batch's blocks of shared memory; buffer.obj NULL once released */
    Py_buffer control;     /* the segment's control area; control.obj NULL once released */
    uint64_t *slot;        /* the batch's slot in it: its first block's */
    Py_ssize_t pos;        /* bytes written */
    long long base_timestamp;
    long long max_timestamp;
    PyObject *futures;     /* list: a RecordFuture per record, in offset order */
    PyObject *topic;
    long long batch_id;
    int partition;
    long long first_block;
    long long block_count;
    double created;        /* time.monotonic() when opened */
    Py_ssize_t reported;   /* records whose delivery report arrived */
} OpenBatch;

static PyTypeObject OpenBatchType;

/* A record with a callback is in flight: the segment's header says this process waits on its report (the
   daemon then reports to it at once, not after a while; the I/O thread says when nothing is in flight). */
static inline void want_reports(OpenBatch *batch) {
    uint64_t *header = (uint64_t *)batch->control.buf;
    if (__atomic_load_n(&header[HEADER_REPORTS_WANTED], __ATOMIC_RELAXED) == 0) {
        __atomic_store_n(&header[HEADER_REPORTS_WANTED], 1, __ATOMIC_RELAXED);
    }
}

static int OpenBatch_init(OpenBatch *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"batch_id", "topic", "partition", "first_block", "block_count", "view",
                               "timestamp_ms", "created", "control", "topic_index", NULL};
    PyObject *topic, *view, *control;
    unsigned int topic_index;
    if (self->buffer.obj != NULL || self->futures != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "an OpenBatch is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LUiLLOLdOI:OpenBatch", keywords, &self->batch_id, &topic,
                                     &self->partition, &self->first_block, &self->block_count, &view,
                                     &self->base_timestamp, &self->created, &control, &topic_index)) {
        return -1;
    }
    /* Timestamps are never negative (send() refuses them): a record's delta from the base cannot overflow. */
    if (self->base_timestamp < 0) {
        PyErr_SetString(PyExc_ValueError, "timestamp_ms must not be negative");
        return -1;
    }
    if (self->first_block < 0) {
        PyErr_SetString(PyExc_ValueError, "first_block must not be negative");
        return -1;
    }
    if (PyObject_GetBuffer(control, &self->control, PyBUF_WRITABLE) < 0) {
        return -1;
    }
    if (self->control.len < SLOT_HEADER_BYTES + (self->first_block + 1) * SLOT_BYTES ||
        ((uintptr_t)self->control.buf & 7) != 0) {
        PyBuffer_Release(&self->control);
        PyErr_SetString(PyExc_ValueError, "the control area has no slot for first_block (or is not 8-byte aligned)");
        return -1;
    }
    if (PyObject_GetBuffer(view, &self->buffer, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&self->control);
        return -1;
    }
    self->futures = PyList_New(0);
    if (self->futures == NULL) {
        return -1;
    }
    Py_INCREF(topic);
    self->topic = topic;
    self->max_timestamp = self->base_timestamp;
    uint64_t *slot = self->slot =
        (uint64_t *)((char *)self->control.buf + SLOT_HEADER_BYTES + self->first_block * SLOT_BYTES);
    /* A block granted again keeps its last claim until now: nothing published, then nothing claimed. The
       other words the daemon reads only after a publish. */
    __atomic_store_n(&slot[PUBLISHED], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[CLAIM], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&slot[BASE_TIMESTAMP], (uint64_t)self->base_timestamp, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[MAX_TIMESTAMP], (uint64_t)self->base_timestamp, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[BATCH_ID], (uint64_t)self->batch_id, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[TOPIC_PARTITION], (uint64_t)topic_index | ((uint64_t)(uint32_t)self->partition << 32),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&slot[BLOCK_COUNT], (uint64_t)self->block_count, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[OPENED_NS], (uint64_t)(long long)(self->created * 1e9), __ATOMIC_RELAXED);
    return 0;
}

DEFINE_NEW_INITIALISED(OpenBatch)

static int OpenBatch_traverse(OpenBatch *self, visitproc visit, void *arg) {
    Py_VISIT(self->futures);
    Py_VISIT(self->buffer.obj);
    Py_VISIT(self->control.obj);
    return 0;
}

static int OpenBatch_clear(OpenBatch *self) {
    Py_CLEAR(self->futures);
    Py_CLEAR(self->topic);
    if (self->buffer.obj != NULL) {
        PyBuffer_Release(&self->buffer);
    }
    if (self->control.obj != NULL) {
        PyBuffer_Release(&self->control);
    }
    return 0;
}

static void OpenBatch_dealloc(OpenBatch *self) {
    PyObject_GC_UnTrack(self);
    OpenBatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline long long monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Publish what the batch holds (FULL: nothing more will be written) and return the claim as loaded after a full
   fence: the client's half of the protocol. */
static uint64_t publish(OpenBatch *batch, Py_ssize_t record_count, int full) {
    uint64_t *slot = batch->slot;
    __atomic_store_n(&slot[MAX_TIMESTAMP], (uint64_t)batch->max_timestamp, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[PUBLISHED], (full ? PUBLISHED_FULL : 0) | ((uint64_t)record_count << 32) |
                                       (uint64_t)batch->pos, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(&slot[CLAIM], __ATOMIC_ACQUIRE);
}

/* Whether the batch holds its record ``index``, from the claim loaded after publishing it. */
static int holds(OpenBatch *batch, uint64_t claim, Py_ssize_t index) {
    if (claim == CLAIM_CLAIMING) {
        long long deadline = monotonic_ns() + CLAIMING_WAIT_NS;
        do {
            sched_yield();
            claim = __atomic_load_n(&batch->slot[CLAIM], __ATOMIC_ACQUIRE);
        } while (claim == CLAIM_CLAIMING && monotonic_ns() < deadline);
        if (claim == CLAIM_CLAIMING) {
            return 1;
        }
    }
    return claim == 0 || (uint64_t)index < (claim & CLAIM_COUNT_MASK);
}

/* Append an encoded record: 1 if written, 0 if it does not fit or the daemon has claimed the batch (the caller
   writes it in another), -1 on error. */
static int batch_append(OpenBatch *batch, const Record *record, long long timestamp, PyObject *future) {
    if (batch->buffer.obj == NULL) {
        PyErr_SetString(PyExc_ValueError, "the batch is sealed");
        return -1;
    }
    if (__atomic_load_n(&batch->slot[CLAIM], __ATOMIC_ACQUIRE) != 0) {
        return 0;
    }
    Py_ssize_t body;
    Py_ssize_t size = record_size_of(record, &body);
    if (size > batch->buffer.len - batch->pos) {
        return 0;
    }
    Py_ssize_t index = PyList_GET_SIZE(batch->futures);
    if (PyList_Append(batch->futures, future) < 0) {
        return -1;
    }
    write_record((char *)batch->buffer.buf + batch->pos, record, body);
    Py_ssize_t pos = batch->pos;
    long long max_timestamp = batch->max_timestamp;
    batch->pos += size;
    if (timestamp > batch->max_timestamp) {
        batch->max_timestamp = timestamp;
    }
    if (!holds(batch, publish(batch, index + 1, 0), index)) {
        /* Claimed without it: the daemon reads nothing of this batch again, so only this side forgets it. */
        batch->pos = pos;
        batch->max_timestamp = max_timestamp;
        return PyList_SetSlice(batch->futures, index, index + 1, NULL) < 0 ? -1 : 0;
    }
    return 1;
}

PyDoc_STRVAR(OpenBatch_append_doc,
"append($self, key, value, headers, timestamp_ms, future, /)\n--\n\n"
"Write a record after the others (offset and timestamp deltas from this batch), publish it and keep its\n"
"future; False if it does not fit, or the daemon has claimed the batch without it.");

static PyObject *OpenBatch_append(OpenBatch *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "append() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    long long timestamp = PyLong_AsLongLong(args[3]);
    if (timestamp == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (timestamp < 0) {
        PyErr_SetString(PyExc_ValueError, "timestamp_ms must not be negative");
        return NULL;
    }
    Record record;
    Held held = {.count = 0};
    int appended = -1;
    if (record_from(&record, &held, PyList_GET_SIZE(self->futures), timestamp - self->base_timestamp, args[0],
                    args[1], args[2]) == 0) {
        appended = batch_append(self, &record, timestamp, args[4]);
    }
    held_release(&held);
    if (appended < 0) {
        return NULL;
    }
    return PyBool_FromLong(appended);
}

PyDoc_STRVAR(OpenBatch_release_doc,
"release($self, /)\n--\n\nPublish the batch as full and let go of the shared memory: nothing more can be written.");

static PyObject *OpenBatch_release(OpenBatch *self, PyObject *unused) {
    if (self->buffer.obj != NULL) {
        publish(self, PyList_GET_SIZE(self->futures), 1);
        PyBuffer_Release(&self->buffer);
    }
    if (self->control.obj != NULL) {
        PyBuffer_Release(&self->control);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(OpenBatch_claimed_doc,
"claimed($self, /)\n--\n\nWhether the daemon has claimed the batch (or is claiming it): it takes no more records.");

static PyObject *OpenBatch_claimed(OpenBatch *self, PyObject *unused) {
    return PyBool_FromLong(self->control.obj == NULL || __atomic_load_n(&self->slot[CLAIM], __ATOMIC_ACQUIRE) != 0);
}

static PyObject *OpenBatch_get_record_count(OpenBatch *self, void *closure) {
    return PyLong_FromSsize_t(self->futures == NULL ? 0 : PyList_GET_SIZE(self->futures));
}

static PyObject *OpenBatch_get_capacity(OpenBatch *self, void *closure) {
    return PyLong_FromSsize_t(self->buffer.obj == NULL ? 0 : self->buffer.len);
}

static PyMethodDef OpenBatch_methods[] = {
    {"append", (PyCFunction)(void (*)(void))OpenBatch_append, METH_FASTCALL, OpenBatch_append_doc},
    {"release", (PyCFunction)OpenBatch_release, METH_NOARGS, OpenBatch_release_doc},
    {"claimed", (PyCFunction)OpenBatch_claimed, METH_NOARGS, OpenBatch_claimed_doc},
    {NULL},
};

static PyMemberDef OpenBatch_members[] = {
    {"batch_id", T_LONGLONG, offsetof(OpenBatch, batch_id), READONLY, "this client's number for the batch"},
    {"topic", T_OBJECT, offsetof(OpenBatch, topic), READONLY, NULL},
    {"partition", T_INT, offsetof(OpenBatch, partition), READONLY, NULL},
    {"first_block", T_LONGLONG, offsetof(OpenBatch, first_block), READONLY, NULL},
    {"block_count", T_LONGLONG, offsetof(OpenBatch, block_count), READONLY, NULL},
    {"pos", T_PYSSIZET, offsetof(OpenBatch, pos), READONLY, "bytes written"},
    {"base_timestamp", T_LONGLONG, offsetof(OpenBatch, base_timestamp), READONLY, NULL},
    {"max_timestamp", T_LONGLONG, offsetof(OpenBatch, max_timestamp), READONLY, NULL},
    {"futures", T_OBJECT, offsetof(OpenBatch, futures), READONLY, "a future per record, in offset order"},
    {"created", T_DOUBLE, offsetof(OpenBatch, created), READONLY, "time.monotonic() when opened"},
    {"reported", T_PYSSIZET, offsetof(OpenBatch, reported), 0, "records whose delivery report arrived"},
    {NULL},
};

static PyGetSetDef OpenBatch_getset[] = {
    {"record_count", (getter)OpenBatch_get_record_count, NULL, "records written", NULL},
    {"capacity", (getter)OpenBatch_get_capacity, NULL, "bytes of shared memory (0 once released)", NULL},
    {NULL},
};

static PyTypeObject OpenBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "client_stub._fastpath.OpenBatch",
    .tp_doc = PyDoc_STR("OpenBatch(batch_id, topic, partition, first_block, block_count, view, timestamp_ms, "
                        "created, control, topic_index)\n--\n\nA batch this process writes records into, in its "
                        "blocks of shared memory, publishing them in its slot of ``control``, the segment's control "
                        "area (``topic_index``: the session's number for the topic)."),
    .tp_basicsize = sizeof(OpenBatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = OpenBatch_new,
    .tp_dealloc = (destructor)OpenBatch_dealloc,
    .tp_traverse = (traverseproc)OpenBatch_traverse,
    .tp_clear = (inquiry)OpenBatch_clear,
    .tp_methods = OpenBatch_methods,
    .tp_members = OpenBatch_members,
    .tp_getset = OpenBatch_getset,
};

/* -- Appender: the common case of Producer.send() ---------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *lock_locked;      /* the producer's lock (guards open batches and the counts): its locked, */
    PyObject *lock_acquire;     /* acquire */
    PyObject *lock_release;     /* and release */
    PyObject *open;             /* the accumulator's dict (topic, partition) -> OpenBatch, read here */
    PyObject *partition_counts; /* the producer metadata's dict topic -> partition count, for the topics
                                   known without error, read here */
    PyObject *sticky;           /* dict: topic -> partition for records without a key, or None */
    PyObject *seal;             /* seal(batch), called with the lock held for a batch to seal that took no record
                                   (its blocks go back), sealing it unless another thread has meanwhile; this
                                   fast path seals the others itself (seal_open()) */
    PyObject *slow_send;        /* the producer's Python path, for what the fast path does not take */
    PyObject *topic_indexes;    /* the producer metadata's dict topic -> the session's number for it, read here */
    PyObject *unreported;       /* the accumulator's dict batch id -> batch, where a batch opened here goes */
    PyObject *batch_ids;        /* the accumulator's iterator of batch ids */
    PyObject *wakeup;           /* wakeup(): say WAKEUP (a batch opened here, and the daemon would not look in time) */
    /* The session's segment, while attached: where batches are opened on spare blocks. */
    PyObject *blocks;           /* its blocks (a memoryview), or NULL */
    PyObject *control;          /* its control area */
    PyObject *take_spare;       /* take_spare(): a spare block's number, or None; called with the lock held */
    /* The spare blocks at hand (the producer's list, or NULL), which a batch opened here takes the last of itself
       while it leaves at least ``spare_floor - 1`` and the clock is before ``spare_until_ns``: the cases where
       take_spare() would ask for nothing and measure nothing (see spare_policy()). */
    PyObject *spare;
    Py_ssize_t spare_floor;
    long long spare_until_ns;
    Py_ssize_t spare_wanted_base; /* the header's spare_wanted is this less the blocks at hand, at least 0 */
    Py_ssize_t spare_taken;     /* blocks taken here since spare_policy() last said */
    Py_ssize_t block_size;
    Py_ssize_t max_record_size; /* the largest record a batch of one block takes (max.request.size included) */
    long long linger_ns;        /* the producer's linger.ms */
    FutureSlots slots;          /* of RecordFuture */
    int enabled;                /* off until the session is up, and when the producer cannot take this path */
    int murmur2_keys;           /* keyed records go by murmur2 (murmur2_random) */
    Py_ssize_t outstanding;     /* records handed off and not yet reported: counted here alone, by the
                                   methods below and by this fast path */
} Appender;

static int Appender_init(Appender *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"lock", "open", "partition_counts", "future_type", "seal", "slow_send", "sticky",
                               "murmur2_keys", "topic_indexes", "unreported", "batch_ids", "wakeup", NULL};
    PyObject *lock, *open, *partition_counts, *future_type, *seal, *slow_send, *sticky, *topic_indexes, *unreported,
        *batch_ids, *wakeup;
    int murmur2_keys;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!OOOOpO!O!OO:Appender", keywords, &lock, &PyDict_Type, &open,
                                     &PyDict_Type, &partition_counts, &future_type, &seal, &slow_send, &sticky,
                                     &murmur2_keys, &PyDict_Type, &topic_indexes, &PyDict_Type, &unreported,
                                     &batch_ids, &wakeup)) {
        return -1;
    }
    if (!PyIter_Check(batch_ids)) {
        PyErr_SetString(PyExc_TypeError, "batch_ids must be an iterator");
        return -1;
    }
    if (sticky != Py_None && !PyDict_CheckExact(sticky)) {
        PyErr_SetString(PyExc_TypeError, "sticky must be a dict or None");
        return -1;
    }
    if (future_slots_init(&self->slots, future_type) < 0) {
        return -1;
    }
    Py_XSETREF(self->lock_locked, PyObject_GetAttrString(lock, "locked"));
    Py_XSETREF(self->lock_acquire, PyObject_GetAttrString(lock, "acquire"));
    Py_XSETREF(self->lock_release, PyObject_GetAttrString(lock, "release"));
    if (!self->lock_locked || !self->lock_acquire || !self->lock_release) {
        return -1;
    }
    Py_INCREF(open);
    Py_XSETREF(self->open, open);
    Py_INCREF(partition_counts);
    Py_XSETREF(self->partition_counts, partition_counts);
    Py_INCREF(seal);
    Py_XSETREF(self->seal, seal);
    Py_INCREF(slow_send);
    Py_XSETREF(self->slow_send, slow_send);
    Py_XSETREF(self->topic_indexes, Py_NewRef(topic_indexes));
    Py_XSETREF(self->unreported, Py_NewRef(unreported));
    Py_XSETREF(self->batch_ids, Py_NewRef(batch_ids));
    Py_XSETREF(self->wakeup, Py_NewRef(wakeup));
    Py_INCREF(sticky);
    Py_XSETREF(self->sticky, sticky);
    self->murmur2_keys = murmur2_keys;
    self->enabled = 0;
    self->outstanding = 0;
    return 0;
}

DEFINE_NEW_INITIALISED(Appender)

static int Appender_traverse(Appender *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock_locked);
    Py_VISIT(self->lock_acquire);
    Py_VISIT(self->lock_release);
    Py_VISIT(self->open);
    Py_VISIT(self->partition_counts);
    Py_VISIT(self->sticky);
    Py_VISIT(self->seal);
    Py_VISIT(self->slow_send);
    Py_VISIT(self->topic_indexes);
    Py_VISIT(self->unreported);
    Py_VISIT(self->batch_ids);
    Py_VISIT(self->wakeup);
    Py_VISIT(self->blocks);
    Py_VISIT(self->control);
    Py_VISIT(self->take_spare);
    Py_VISIT(self->spare);
    Py_VISIT(self->slots.type);
    return 0;
}

static int Appender_clear(Appender *self) {
    Py_CLEAR(self->lock_locked);
    Py_CLEAR(self->lock_acquire);
    Py_CLEAR(self->lock_release);
    Py_CLEAR(self->open);
    Py_CLEAR(self->partition_counts);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->seal);
    Py_CLEAR(self->slow_send);
    Py_CLEAR(self->topic_indexes);
    Py_CLEAR(self->unreported);
    Py_CLEAR(self->batch_ids);
    Py_CLEAR(self->wakeup);
    Py_CLEAR(self->blocks);
    Py_CLEAR(self->control);
    Py_CLEAR(self->take_spare);
    Py_CLEAR(self->spare);
    Py_CLEAR(self->slots.type);
    return 0;
}

static void Appender_dealloc(Appender *self) {
    PyObject_GC_UnTrack(self);
    Appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A pending RecordFuture, made as object.__new__ would, its slots filled without running Python. */
static PyObject *new_future(const FutureSlots *slots, PyObject *on_delivery, long long timestamp,
                            Py_ssize_t key_size, Py_ssize_t value_size) {
    PyObject *future = slots->type->tp_new(slots->type, empty_tuple, NULL);
    if (future == NULL) {
        return NULL;
    }
    slot_set(future, slots->on_delivery, on_delivery);
    slot_set(future, slots->state, str_running);
    slot_set(future, slots->result, Py_None);
    slot_set(future, slots->exception, Py_None);
    slot_set(future, slots->cond, Py_None);
    if (slot_set_new(future, slots->timestamp_ms, PyLong_FromLongLong(timestamp)) < 0 ||
        slot_set_new(future, slots->key_size, PyLong_FromSsize_t(key_size)) < 0 ||
        slot_set_new(future, slots->value_size, PyLong_FromSsize_t(value_size)) < 0) {
        Py_DECREF(future);
        return NULL;
    }
    /* Out of the garbage collector's sight while in flight: thousands of futures live for a few
       milliseconds each, long enough to be promoted and scanned again and again, and none can be
       garbage while its batch holds it. Completer.complete() hands it back to the collector before
       anything can make it part of a garbage cycle (an exception with a traceback, say). */
    PyObject_GC_UnTrack(future);
    return future;
}

/* The partition for the record, or -1 if the Python path must decide (or complain). */
static long choose_partition(Appender *self, PyObject *topic, PyObject *key, PyObject *partition, long count) {
    if (partition != Py_None) {
        if (!PyLong_CheckExact(partition)) {
            return -1;
        }
        long explicit = PyLong_AsLong(partition);
        if (explicit == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        return explicit >= 0 && explicit < count ? explicit : -1;
    }
    if (key != Py_None) {
        if (!self->murmur2_keys) {
            return -1;
        }
        uint32_t h = murmur2_of((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        return (long)((h & 0x7FFFFFFFu) % (uint32_t)count);
    }
    if (self->sticky == Py_None) {
        return -1;
    }
    PyObject *sticky = PyDict_GetItemWithError(self->sticky, topic);
    if (sticky == NULL) {
        PyErr_Clear();
        return -1;
    }
    long chosen = PyLong_AsLong(sticky);
    if (chosen == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return chosen >= 0 && chosen < count ? chosen : -1;
}

/* The key of (topic, partition) in the open batches. */
static PyObject *open_key(PyObject *topic, long partition) {
    PyObject *key = PyTuple_New(2);
    PyObject *index = PyLong_FromLong(partition);
    if (key == NULL || index == NULL) {
        Py_XDECREF(key);
        Py_XDECREF(index);
        return NULL;
    }
    PyTuple_SET_ITEM(key, 0, Py_NewRef(topic));
    PyTuple_SET_ITEM(key, 1, index);
    return key;
}

/* Release the producer's lock, keeping the error being raised (``failed``) if any; -1 if either failed. */
static int release_lock(Appender *self, int failed) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    int released = call_truth(self->lock_release);
    if (type != NULL) {
        PyErr_Restore(type, value, traceback);
    }
    return failed || released < 0 ? -1 : 0;
}

/* Records without a key of the batch's topic stick to another partition once its batch is sealed, as the
   Partitioner's batch_sealed() has them. */
static int unstick(Appender *self, OpenBatch *batch) {
    if (self->sticky == Py_None) {
        return 0;
    }
    PyObject *sticky = PyDict_GetItemWithError(self->sticky, batch->topic);
    if (sticky == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!PyLong_CheckExact(sticky)) {
        return 0;
    }
    int overflow;
    long partition = PyLong_AsLongAndOverflow(sticky, &overflow);
    if (overflow || partition != batch->partition) {
        return 0;
    }
    return PyDict_DelItem(self->sticky, batch->topic);
}

/* seal(batch) with the producer's lock held, as the accumulator seals a batch (its seal_if_open()): nothing if it
   is not the open batch of its partition any more. A batch that took records, the common case, is sealed here
   without a Python frame (out of the open batches, its partition no longer sticky, published full and let go);
   one that took none is seal()'s, which gives its blocks back. 0, or -1 on error. */
static int seal_open(Appender *self, OpenBatch *batch) {
    if (batch->futures == NULL || PyList_GET_SIZE(batch->futures) == 0) {
        PyObject *sealed = PyObject_CallOneArg(self->seal, (PyObject *)batch);
        Py_XDECREF(sealed);
        return sealed == NULL ? -1 : 0;
    }
    PyObject *key = open_key(batch->topic, batch->partition);
    if (key == NULL) {
        return -1;
    }
    PyObject *current = PyDict_GetItemWithError(self->open, key);
    int result = 0;
    if (current == NULL) {
        result = PyErr_Occurred() ? -1 : 0;
    } else if (current == (PyObject *)batch) {
        if (PyDict_DelItem(self->open, key) < 0 || unstick(self, batch) < 0) {
            result = -1;
        } else {
            Py_DECREF(OpenBatch_release(batch, NULL));
        }
    }
    Py_DECREF(key);
    return result;
}

/* seal_open() with the producer's lock held, as Python code that changes batches must be. Taking the lock may
   wait, and let other threads run: seal_open() finds out whether the batch is still open. */
static int seal_full(Appender *self, OpenBatch *batch) {
    if (call_truth(self->lock_acquire) < 0) {
        return -1;
    }
    return release_lock(self, seal_open(self, batch) < 0);
}

/* The last spare block at hand, taken without take_spare()'s Python frame where the policy allows it (see
   spare_policy()): a new reference, or NULL (take_spare() decides; or an error). ``wanted``: what the header is to
   say of the spare blocks this client would take then, as take_spare() would have said. */
static PyObject *take_quick(Appender *self, uint64_t *wanted) {
    if (self->spare == NULL) {
        return NULL;
    }
    Py_ssize_t held = PyList_GET_SIZE(self->spare);
    if (held == 0 || held < self->spare_floor || monotonic_ns() >= self->spare_until_ns) {
        return NULL;
    }
    PyObject *block = Py_NewRef(PyList_GET_ITEM(self->spare, held - 1));
    if (PyList_SetSlice(self->spare, held - 1, held, NULL) < 0) {
        Py_DECREF(block);
        return NULL;
    }
    self->spare_taken++;
    /* Both are at least 0 (spare_policy() says so). */
    *wanted = self->spare_wanted_base > held - 1 ? (uint64_t)(self->spare_wanted_base - (held - 1)) : 0;
    return block;
}

/* The header's spare_wanted, after a block taken here. */
static void say_spare_wanted(OpenBatch *batch, uint64_t wanted) {
    uint64_t *header = (uint64_t *)batch->control.buf;
    if (__atomic_load_n(&header[HEADER_SPARE_WANTED], __ATOMIC_RELAXED) != wanted) {
        __atomic_store_n(&header[HEADER_SPARE_WANTED], wanted, __ATOMIC_RELAXED);
    }
}

/* A batch for a record of ``size`` bytes on a spare block of the attached segment, opened as the accumulator opens
   one (in the open batches under ``key_of_batch``, and in the unreported), with the producer's lock taken without
   waiting: everything read here before is as it was when the lock was seen free (with the GIL held throughout,
   nothing could change it), and nothing changes it while the lock is held (take_spare() may let other threads
   run). Returns it with the lock still held, or NULL with the lock released (or never taken): no segment, the topic
   not numbered in this session yet, a record larger than a block, the lock taken (by a thread that waited for it,
   and has it before it has the GIL) or no spare block at hand (the Python path takes the record, and waits if it
   must), or an error. A block taken and then failed with is not given back: such an error is a bug. */
static OpenBatch *open_on_spare(Appender *self, PyObject *topic, PyObject *key_of_batch, long partition,
                                long long timestamp, Py_ssize_t size) {
    if (self->blocks == NULL || size > self->max_record_size) {
        return NULL;
    }
    PyObject *index_obj = PyDict_GetItemWithError(self->topic_indexes, topic);
    if (index_obj == NULL || !PyLong_CheckExact(index_obj)) {
        return NULL;
    }
    long topic_index = PyLong_AsLong(index_obj);
    if (topic_index < 0 || topic_index > UINT32_MAX) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *acquired = PyObject_CallOneArg(self->lock_acquire, Py_False);
    if (acquired != Py_True) {
        Py_XDECREF(acquired);
        return NULL; /* or an error */
    }
    Py_DECREF(acquired);
    uint64_t wanted = 0;
    PyObject *block_obj = take_quick(self, &wanted);
    int quick = block_obj != NULL;
    if (!quick && !PyErr_Occurred()) {
        block_obj = PyObject_CallNoArgs(self->take_spare);
    }
    if (block_obj == NULL || block_obj == Py_None) {
        Py_XDECREF(block_obj);
        release_lock(self, 0);
        return NULL;
    }
    long long block = PyLong_AsLongLong(block_obj);
    if (block == -1 && PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        block = LLONG_MAX;
    }
    Py_DECREF(block_obj);
    PyObject *batch = NULL, *batch_id = NULL, *view = NULL;
    Py_ssize_t length = PyErr_Occurred() ? -1 : PyObject_Length(self->blocks);
    if (length < 0) {
        /* an error: take_spare() gave no int, or the blocks are released */
    } else if (block < 0 || block >= length / self->block_size) {
        PyErr_SetString(PyExc_ValueError, "take_spare() gave a block that is not one of the segment's");
    } else if ((batch_id = PyIter_Next(self->batch_ids)) == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "batch_ids ran out");
        }
    } else if ((view = PySequence_GetSlice(self->blocks, block * self->block_size,
                                           (block + 1) * self->block_size)) != NULL) {
        batch = PyObject_CallFunction((PyObject *)&OpenBatchType, "OOlLiOLdOl", batch_id, topic, partition, block, 1,
                                      view, timestamp, (double)monotonic_ns() / 1e9, self->control, topic_index);
        if (batch != NULL && (PyDict_SetItem(self->open, key_of_batch, batch) < 0 ||
                              PyDict_SetItem(self->unreported, batch_id, batch) < 0)) {
            Py_CLEAR(batch);
        }
        if (batch != NULL && quick) {
            say_spare_wanted((OpenBatch *)batch, wanted);
        }
    }
    Py_XDECREF(view);
    Py_XDECREF(batch_id);
    if (batch == NULL) {
        release_lock(self, 1);
    }
    return (OpenBatch *)batch;
}

/* A batch's first record is published: if the daemon's watch ends before the producer's linger.ms is up (or it
   looks less often than that), say WAKEUP. Checked after the publish, not at the open: a daemon that looks in
   between finds the record, one that looks no more is told. */
static int first_published(Appender *self, OpenBatch *batch) {
    uint64_t *header = (uint64_t *)batch->control.buf;
    uint64_t scan_interval = __atomic_load_n(&header[HEADER_SCAN_INTERVAL_NS], __ATOMIC_RELAXED);
    uint64_t watched_until = __atomic_load_n(&header[HEADER_WATCHED_UNTIL_NS], __ATOMIC_ACQUIRE);
    uint64_t deadline = (uint64_t)(monotonic_ns() + self->linger_ns);
    if (scan_interval > 0 && scan_interval <= (uint64_t)self->linger_ns && watched_until >= deadline) {
        return 0;
    }
    PyObject *result = PyObject_CallNoArgs(self->wakeup);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

/* After the first record is in a batch open_on_spare() opened (the lock held): first_published(), and seal(batch)
   if it is full (or if the record is not in it: the daemon claimed it first, and the Python path opens another);
   then the lock is released. -1 on error. */
static int finish_opened(Appender *self, OpenBatch *batch, int appended, int full) {
    int failed = appended > 0 && first_published(self, batch) < 0;
    if (!failed && (full || appended == 0)) {
        failed = seal_open(self, batch) < 0;
    }
    return release_lock(self, failed);
}

/* Append the record to the open batch of (topic, partition), or to one open_on_spare() opens: 1 if appended, 0 if
   the Python path must take it, -1 on error. ``refused``: the open batch did not take it (full, or claimed by the
   daemon) and was sealed. */
static int append_to_partition(Appender *self, PyObject *topic, long partition, Record *record, long long timestamp,
                               PyObject *future, PyObject *on_delivery, int *refused) {
    PyObject *key_of_batch = open_key(topic, partition);
    if (key_of_batch == NULL) {
        return -1;
    }
    /* Everything is allocated: allocating can collect garbage, which can run Python code and let other
       threads run. From here until the batch is full, nothing can: no other thread runs Python code
       while this one holds the GIL. So the producer's lock is not taken per record; it is enough that
       no thread holds it now, in the middle of a change to the batches (a thread blocked on the lock
       may take it meanwhile, but cannot act on it before the GIL is released). If one holds it, the
       Python path waits for it. A batch to open is the exception: taking a spare block may run Python code
       (take_spare()), and the lock is held from it until the record is in. */
    int locked = call_truth(self->lock_locked);
    OpenBatch *batch = NULL; /* a new reference */
    int opened = 0;
    if (locked == 0) {
        batch = (OpenBatch *)PyDict_GetItemWithError(self->open, key_of_batch);
        Py_XINCREF(batch);
        if (batch == NULL && !PyErr_Occurred()) {
            Py_ssize_t body;
            record->offset_delta = record->timestamp_delta = 0;
            batch = open_on_spare(self, topic, key_of_batch, partition, timestamp, record_size_of(record, &body));
            opened = batch != NULL;
        }
    }
    Py_DECREF(key_of_batch);
    if (batch == NULL) {
        return locked < 0 || PyErr_Occurred() ? -1 : 0; /* locked, or no batch at hand: the Python path */
    }
    /* The dict is the producer's: anything else in it (the Python twin's OpenBatch, say) is not written here. */
    if (!PyObject_TypeCheck(batch, &OpenBatchType)) {
        PyErr_Format(PyExc_TypeError, "open batches must be %s, got %.100s", OpenBatchType.tp_name,
                     Py_TYPE(batch)->tp_name);
        Py_DECREF(batch);
        return -1;
    }
    int appended = 0;
    Py_ssize_t before = batch->pos;
    if (batch->buffer.obj != NULL) {
        record->offset_delta = PyList_GET_SIZE(batch->futures);
        record->timestamp_delta = timestamp - batch->base_timestamp;
        appended = batch_append(batch, record, timestamp, future);
    }
    /* Full, or nearly: the next record like this one would not fit. */
    int full = appended > 0 && batch->buffer.len - batch->pos < batch->pos - before;
    if (appended > 0) {
        self->outstanding++;
        if (on_delivery != Py_None) {
            want_reports(batch);
        }
        hide_callback(on_delivery);
    }
    int failed = 0;
    if (opened) {
        failed = finish_opened(self, batch, appended, full) < 0;
    } else if (appended >= 0 && (full || appended == 0)) {
        *refused = appended == 0;
        failed = seal_full(self, batch) < 0;
    }
    Py_DECREF(batch);
    return failed ? -1 : appended;
}

/* Append the record to its partition's open batch, or to a new one on a spare block, if that is the whole job: a
   topic with known partitions, bytes or None for key and value, a batch with room, the producer's lock free.
   Returns its future, or None (the Python path must take it), or NULL on error. */
static PyObject *try_append(Appender *self, PyObject *topic, PyObject *value, PyObject *key, PyObject *partition,
                            PyObject *timestamp_arg, PyObject *on_delivery) {
    if (!self->enabled || (key != Py_None && !PyBytes_CheckExact(key)) ||
        (value != Py_None && !PyBytes_CheckExact(value)) || !PyUnicode_CheckExact(topic)) {
        Py_RETURN_NONE;
    }
    long long timestamp;
    if (timestamp_arg == Py_None) {
        timestamp = now_ms();
    } else {
        if (!PyLong_CheckExact(timestamp_arg)) {
            Py_RETURN_NONE;
        }
        timestamp = PyLong_AsLongLong(timestamp_arg);
        if ((timestamp == -1 && PyErr_Occurred()) || timestamp < 0) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    PyObject *count_obj = PyDict_GetItemWithError(self->partition_counts, topic);
    if (count_obj == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    long count = PyLong_AsLong(count_obj);
    if (count <= 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t key_size = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
    Py_ssize_t value_size = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
    PyObject *future = new_future(&self->slots, on_delivery, timestamp, key_size, value_size);
    if (future == NULL) {
        return NULL;
    }
    Record record = {
        .key = {key == Py_None ? NULL : PyBytes_AS_STRING(key), key_size},
        .value = {value == Py_None ? NULL : PyBytes_AS_STRING(value), value_size},
        .header_count = 0,
    };
    /* A batch that refuses the record (full, or claimed by the daemon) is sealed, and the partition chosen again
       (for a record without a key, the Python path then chooses the next sticky one); a second refusal leaves the
       record to the Python path. Sealing may let other threads run: the Appender may be disabled meanwhile. */
    for (int attempt = 0; attempt < 2 && self->enabled; attempt++) {
        long chosen = choose_partition(self, topic, key, partition, count);
        if (chosen < 0) {
            break;
        }
        int refused = 0;
        int appended = append_to_partition(self, topic, chosen, &record, timestamp, future, on_delivery, &refused);
        if (appended != 0) {
            if (appended < 0) {
                Py_CLEAR(future);
            }
            return future;
        }
        if (!refused) {
            break;
        }
    }
    Py_DECREF(future);
    Py_RETURN_NONE;
}

/* Python's argument rules for send(topic, value=None, key=None, *, partition=None, ...). */
static int send_arguments(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *out[ARG_COUNT]) {
    for (int i = 0; i < ARG_COUNT; i++) {
        out[i] = NULL;
    }
    if (nargs > POSITIONAL_ARGS) {
        PyErr_Format(PyExc_TypeError, "send() takes at most %d positional arguments (topic, value, key), %zd given",
                     POSITIONAL_ARGS, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        out[i] = args[i];
    }
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < keywords; j++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, j);
        int found = -1;
        for (int i = 0; i < ARG_COUNT && found < 0; i++) {
            if (name == send_parameter_names[i] || PyUnicode_Compare(name, send_parameter_names[i]) == 0) {
                found = i;
            }
        }
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "send() got an unexpected keyword argument '%U'", name);
            return -1;
        }
        if (out[found] != NULL) {
            PyErr_Format(PyExc_TypeError, "send() got multiple values for argument '%s'", send_parameters[found]);
            return -1;
        }
        out[found] = args[nargs + j];
    }
    if (out[ARG_TOPIC] == NULL) {
        PyErr_SetString(PyExc_TypeError, "send() missing required argument 'topic'");
        return -1;
    }
    for (int i = 0; i < ARG_COUNT; i++) {
        if (out[i] == NULL) {
            out[i] = Py_None;
        }
    }
    return 0;
}

PyDoc_STRVAR(Appender_send_doc,
"send($self, /, topic, value=None, key=None, *, partition=None, timestamp_ms=None, headers=None,\n"
"     on_delivery=None)\n--\n\n"
"Producer.send(): the record is appended here when that is the whole job; else slow_send(topic, value,\n"
"key, partition, timestamp_ms, headers, on_delivery) takes it.");

static PyObject *Appender_send(Appender *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *arg[ARG_COUNT];
    if (send_arguments(args, nargs, kwnames, arg) < 0) {
        return NULL;
    }
    int no_headers = arg[ARG_HEADERS] == Py_None ? 1 : PyObject_Not(arg[ARG_HEADERS]);
    if (no_headers < 0) {
        return NULL;
    }
    if (no_headers) {
        PyObject *future = try_append(self, arg[ARG_TOPIC], arg[ARG_VALUE], arg[ARG_KEY], arg[ARG_PARTITION],
                                      arg[ARG_TIMESTAMP], arg[ARG_ON_DELIVERY]);
        if (future != Py_None) {
            return future; /* or NULL: an error */
        }
        Py_DECREF(future);
    }
    return PyObject_Vectorcall(self->slow_send, arg, ARG_COUNT, NULL);
}

PyDoc_STRVAR(Appender_attach_doc,
"attach($self, blocks, control, block_size, max_record_size, linger_ns, take_spare, /)\n--\n\n"
"A session's segment (its blocks and control area, memoryviews): send() opens batches on its spare blocks,\n"
"taken by take_spare() with the lock held, for records of at most max_record_size bytes; linger_ns is\n"
"the producer's linger.ms.");

static PyObject *Appender_attach(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "attach() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t block_size = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (block_size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t max_record_size = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if (max_record_size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *linger = PyNumber_Index(args[4]);
    long long linger_ns = linger == NULL ? -1 : PyLong_AsLongLong(linger);
    Py_XDECREF(linger);
    if (linger_ns == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (block_size <= 0 || max_record_size < 0 || linger_ns < 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive, max_record_size and linger_ns not negative");
        return NULL;
    }
    if (!PyMemoryView_Check(args[0]) || !PyMemoryView_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "blocks and control must be memoryviews");
        return NULL;
    }
    Py_XSETREF(self->blocks, Py_NewRef(args[0]));
    Py_XSETREF(self->control, Py_NewRef(args[1]));
    Py_XSETREF(self->take_spare, Py_NewRef(args[5]));
    self->block_size = block_size;
    self->max_record_size = max_record_size;
    self->linger_ns = linger_ns;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Appender_first_published_doc,
"first_published($self, batch, /)\n--\n\n"
"The first record of a batch the Python path opened is published: wakeup() if the daemon would not look at\n"
"it within the producer's linger.ms (as send() does for the batches it opens).");

static PyObject *Appender_first_published(Appender *self, PyObject *batch) {
    if (!PyObject_TypeCheck(batch, &OpenBatchType)) {
        PyErr_Format(PyExc_TypeError, "first_published() takes a %s, not %.100s", OpenBatchType.tp_name,
                     Py_TYPE(batch)->tp_name);
        return NULL;
    }
    if (((OpenBatch *)batch)->control.obj == NULL) {
        PyErr_SetString(PyExc_ValueError, "the batch is sealed");
        return NULL;
    }
    if (first_published(self, (OpenBatch *)batch) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Appender_detach(Appender *self, PyObject *unused) {
    Py_CLEAR(self->blocks);
    Py_CLEAR(self->control);
    Py_CLEAR(self->take_spare);
    Py_CLEAR(self->spare);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Appender_spare_policy_doc,
"spare_policy($self, spare, floor, until_ns, wanted_base, /)\n--\n\n"
"When send() may open a batch on a spare block without take_spare(): it takes the last of the list ``spare``\n"
"(None: never) while that holds at least ``floor`` blocks and time.monotonic_ns() is before ``until_ns``, and\n"
"then says in the segment's header that it would take max(wanted_base - len(spare), 0) more. Called with the\n"
"producer's lock held; returns the blocks it took so since the last call.");

static PyObject *Appender_spare_policy(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "spare_policy() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (args[0] != Py_None && !PyList_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "spare must be a list or None, not %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    Py_ssize_t floor = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (floor == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *until = PyNumber_Index(args[2]);
    long long until_ns = until == NULL ? -1 : PyLong_AsLongLong(until);
    Py_XDECREF(until);
    if (until_ns == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t wanted_base = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if (wanted_base == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (floor < 0 || wanted_base < 0) {
        PyErr_SetString(PyExc_ValueError, "floor and wanted_base must not be negative");
        return NULL;
    }
    Py_XSETREF(self->spare, args[0] == Py_None ? NULL : Py_NewRef(args[0]));
    self->spare_floor = floor;
    self->spare_until_ns = until_ns;
    self->spare_wanted_base = wanted_base;
    Py_ssize_t taken = self->spare_taken;
    self->spare_taken = 0;
    return PyLong_FromSsize_t(taken);
}

static PyObject *Appender_enable(Appender *self, PyObject *unused) {
    self->enabled = 1;
    Py_RETURN_NONE;
}

static PyObject *Appender_disable(Appender *self, PyObject *unused) {
    self->enabled = 0;
    Py_RETURN_NONE;
}

static PyObject *Appender_count_appended(Appender *self, PyObject *unused) {
    self->outstanding++;
    Py_RETURN_NONE;
}

static PyObject *Appender_count_done(Appender *self, PyObject *arg) {
    Py_ssize_t count = PyLong_AsSsize_t(arg);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count < 0 || count > self->outstanding) {
        PyErr_Format(PyExc_ValueError, "count_done(%zd) with %zd record(s) outstanding", count, self->outstanding);
        return NULL;
    }
    self->outstanding -= count;
    Py_RETURN_NONE;
}

/* A report row's (a tuple's) field ``index`` as a Py_ssize_t (ints beyond it saturate: a count past the batch's end counts up
   to its end), or -1 with TypeError if it is not an int. */
static int row_field(PyObject *row, Py_ssize_t index, Py_ssize_t *out) {
    PyObject *field = PyTuple_GET_ITEM(row, index);
    if (!PyLong_Check(field)) {
        PyErr_Format(PyExc_TypeError, "a delivery report's field %zd must be an int, not %.100s", index,
                     Py_TYPE(field)->tp_name);
        return -1;
    }
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(field, &overflow);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = overflow > 0 || value > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX
           : overflow < 0 || value < PY_SSIZE_T_MIN ? PY_SSIZE_T_MIN : (Py_ssize_t)value;
    return 0;
}

/* Of the futures[first:first + count] of a batch reported in part before, those not completed yet. */
static Py_ssize_t pending_futures(Appender *self, OpenBatch *batch, Py_ssize_t first, Py_ssize_t count) {
    Py_ssize_t pending = 0;
    for (Py_ssize_t i = first; i < first + count && i < PyList_GET_SIZE(batch->futures); i++) {
        PyObject *future = PyList_GET_ITEM(batch->futures, i);
        if (!PyObject_TypeCheck(future, self->slots.type)) {
            PyErr_Format(PyExc_TypeError, "futures must be %.100s, got %.100s", self->slots.type->tp_name,
                         Py_TYPE(future)->tp_name);
            return -1;
        }
        PyObject *state = SLOT(future, self->slots.state);
        int finished = state == NULL ? 0 : PyObject_RichCompareBool(state, str_finished, Py_EQ);
        if (finished < 0) {
            return -1;
        }
        pending += !finished;
    }
    return pending;
}

/* A batch wholly reported leaves the unreported (one that took no record may have left them as it was sealed). */
static int forget_reported(Appender *self, PyObject *batch_id) {
    if (PyDict_DelItem(self->unreported, batch_id) == 0) {
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
        return -1;
    }
    PyErr_Clear();
    return 0;
}

/* One report row counted against its batch (see Appender_reported): appended to ``out`` as (batch, first, count,
   base_offset, log_append_time_ms, error), and its records reported for the first time added to ``counts``
   (delivered, failed). */
static int count_report(Appender *self, PyObject *row, PyObject *out, Py_ssize_t counts[2]) {
    /* A copy: sealing may run Python code, which may change the row. */
    PyObject *fields = PySequence_Tuple(row);
    if (fields == NULL) {
        return -1;
    }
    int result = -1;
    Py_ssize_t first, count;
    OpenBatch *batch = NULL;
    if (PyTuple_GET_SIZE(fields) != 6) {
        PyErr_Format(PyExc_ValueError, "a delivery report has 6 fields, not %zd", PyTuple_GET_SIZE(fields));
    } else if (row_field(fields, 1, &first) == 0 && row_field(fields, 2, &count) == 0) {
        PyObject *found = PyDict_GetItemWithError(self->unreported, PyTuple_GET_ITEM(fields, 0));
        if (found == NULL) {
            result = PyErr_Occurred() ? -1 : 0; /* of a batch given up on, or of another session */
        } else if (!PyObject_TypeCheck(found, &OpenBatchType)) {
            PyErr_Format(PyExc_TypeError, "unreported batches must be %s, got %.100s", OpenBatchType.tp_name,
                         Py_TYPE(found)->tp_name);
        } else if (first < 0) {
            PyErr_SetString(PyExc_ValueError, "a delivery report's first record must not be negative");
        } else {
            batch = (OpenBatch *)Py_NewRef(found);
        }
    }
    if (batch != NULL && seal_open(self, batch) == 0) { /* the daemon claimed it: it takes no more records */
        PyObject *error = PyTuple_GET_ITEM(fields, 5);
        Py_ssize_t record_count = PyList_GET_SIZE(batch->futures);
        Py_ssize_t left = record_count > first ? record_count - first : 0;
        Py_ssize_t span = count < left ? (count > 0 ? count : 0) : left;
        /* Part of it reported before (split by the daemon, or sent again whole by the daemon that took the
           session back): only the records whose futures are not done count now. */
        Py_ssize_t fresh = batch->reported ? pending_futures(self, batch, first, span) : span;
        if (fresh >= 0) {
            if (fresh > record_count - batch->reported) {
                fresh = record_count - batch->reported;
            }
            batch->reported += fresh;
            counts[error != Py_None] += fresh;
            PyObject *entry = Py_BuildValue("(OnnOOO)", batch, first, span, PyTuple_GET_ITEM(fields, 3),
                                            PyTuple_GET_ITEM(fields, 4), error);
            if (entry != NULL && PyList_Append(out, entry) == 0) {
                result = batch->reported < record_count ? 0 : forget_reported(self, PyTuple_GET_ITEM(fields, 0));
            }
            Py_XDECREF(entry);
        }
    }
    Py_XDECREF(batch);
    Py_DECREF(fields);
    return result;
}

PyDoc_STRVAR(Appender_reported_doc,
"reported($self, rows, /)\n--\n\n"
"Count delivery reports (DeliveryReport rows) against the unreported batches they report on, with the\n"
"producer's lock held: each batch is sealed if it is still open (the daemon claimed it), and forgotten once\n"
"all its records are reported. Returns ([(batch, first, count, base_offset, log_append_time_ms, error), ...],\n"
"delivered, failed): a row for each batch still known, its count within the batch, and the records reported\n"
"delivered and failed for the first time.");

static PyObject *Appender_reported(Appender *self, PyObject *rows) {
    if (!PyList_Check(rows)) {
        PyErr_Format(PyExc_TypeError, "rows must be a list, not %.100s", Py_TYPE(rows)->tp_name);
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t counts[2] = {0, 0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = Py_NewRef(PyList_GET_ITEM(rows, i)); /* the list may change as a seal runs Python code */
        int failed = count_report(self, row, out, counts) < 0;
        Py_DECREF(row);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return Py_BuildValue("(Nnn)", out, counts[0], counts[1]);
}

static PyMethodDef Appender_methods[] = {
    {"reported", (PyCFunction)Appender_reported, METH_O, Appender_reported_doc},
    {"send", (PyCFunction)(void (*)(void))Appender_send, METH_FASTCALL | METH_KEYWORDS, Appender_send_doc},
    {"attach", (PyCFunction)(void (*)(void))Appender_attach, METH_FASTCALL, Appender_attach_doc},
    {"first_published", (PyCFunction)Appender_first_published, METH_O, Appender_first_published_doc},
    {"spare_policy", (PyCFunction)(void (*)(void))Appender_spare_policy, METH_FASTCALL, Appender_spare_policy_doc},
    {"detach", (PyCFunction)Appender_detach, METH_NOARGS,
     PyDoc_STR("detach($self, /)\n--\n\nLet go of the segment (before it is unmapped): no batch is opened here.")},
    {"enable", (PyCFunction)Appender_enable, METH_NOARGS,
     "enable($self, /)\n--\n\nLet send() take records (the session is up)."},
    {"disable", (PyCFunction)Appender_disable, METH_NOARGS,
     "disable($self, /)\n--\n\nsend() takes no record here: the Python path does."},
    {"count_appended", (PyCFunction)Appender_count_appended, METH_NOARGS,
     "count_appended($self, /)\n--\n\nCount a record the Python path appended as outstanding."},
    {"count_done", (PyCFunction)Appender_count_done, METH_O,
     "count_done($self, count, /)\n--\n\nCount outstanding records that are reported, failed or given up on."},
    {NULL},
};

static PyMemberDef Appender_members[] = {
    {"enabled", T_BOOL, offsetof(Appender, enabled), READONLY, "whether send() may take records"},
    {"outstanding", T_PYSSIZET, offsetof(Appender, outstanding), READONLY, "records handed off and not yet reported"},
    {NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "client_stub._fastpath.Appender",
    .tp_doc = PyDoc_STR("Appender(lock, open, partition_counts, future_type, seal, slow_send, sticky, murmur2_keys,\n"
                        "         topic_indexes, unreported, batch_ids, wakeup)\n"
                        "--\n\n"
                        "The open batches of a producer, and its send()."),
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Appender_new,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_traverse = (traverseproc)Appender_traverse,
    .tp_clear = (inquiry)Appender_clear,
    .tp_methods = Appender_methods,
    .tp_members = Appender_members,
};

/* -- Completer: delivery reports to futures and callbacks --------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *metadata_type;   /* RecordMetadata (a NamedTuple) */
    PyObject *lock_acquire;    /* the lock that guards a RecordFuture's lazily made Condition against */
    PyObject *lock_release;    /* its completion: its acquire and release */
    PyObject *callback_failed; /* callback_failed(exception): an on_delivery callback raised */
    FutureSlots slots;         /* of RecordFuture */
} Completer;

static int Completer_init(Completer *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"future_type", "metadata_type", "condition_lock", "callback_failed", NULL};
    PyObject *future_type, *metadata_type, *condition_lock, *callback_failed;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO:Completer", keywords, &future_type, &PyType_Type,
                                     &metadata_type, &condition_lock, &callback_failed)) {
        return -1;
    }
    if (!PyType_IsSubtype((PyTypeObject *)metadata_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "metadata_type must be a tuple type");
        return -1;
    }
    if (future_slots_init(&self->slots, future_type) < 0) {
        return -1;
    }
    Py_XSETREF(self->lock_acquire, PyObject_GetAttrString(condition_lock, "acquire"));
    Py_XSETREF(self->lock_release, PyObject_GetAttrString(condition_lock, "release"));
    if (self->lock_acquire == NULL || self->lock_release == NULL) {
        return -1;
    }
    Py_INCREF(metadata_type);
    Py_XSETREF(self->metadata_type, metadata_type);
    Py_INCREF(callback_failed);
    Py_XSETREF(self->callback_failed, callback_failed);
    return 0;
}

DEFINE_NEW_INITIALISED(Completer)

static int Completer_traverse(Completer *self, visitproc visit, void *arg) {
    Py_VISIT(self->metadata_type);
    Py_VISIT(self->lock_acquire);
    Py_VISIT(self->lock_release);
    Py_VISIT(self->callback_failed);
    Py_VISIT(self->slots.type);
    return 0;
}

static int Completer_clear(Completer *self) {
    Py_CLEAR(self->metadata_type);
    Py_CLEAR(self->lock_acquire);
    Py_CLEAR(self->lock_release);
    Py_CLEAR(self->callback_failed);
    Py_CLEAR(self->slots.type);
    return 0;
}

static void Completer_dealloc(Completer *self) {
    PyObject_GC_UnTrack(self);
    Completer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A slot of a future that must be set (a RecordFuture made by this module or its __init__). */
static inline PyObject *required_slot(PyObject *future, Py_ssize_t offset) {
    PyObject *value = SLOT(future, offset);
    if (value == NULL) {
        PyErr_SetString(PyExc_ValueError, "a RecordFuture without its record's sizes and timestamp");
    }
    return value;
}

/* RecordMetadata(topic, partition, offset, timestamp_ms, serialized_key_size, serialized_value_size). */
static PyObject *new_metadata(Completer *self, PyObject *future, PyObject *topic, PyObject *partition,
                              long long offset, long long log_append_time) {
    PyObject *timestamp = required_slot(future, self->slots.timestamp_ms);
    PyObject *key_size = required_slot(future, self->slots.key_size);
    PyObject *value_size = required_slot(future, self->slots.value_size);
    if (timestamp == NULL || key_size == NULL || value_size == NULL) {
        return NULL;
    }
    PyObject *offset_obj = PyLong_FromLongLong(offset);
    PyObject *time_obj = log_append_time >= 0 ? PyLong_FromLongLong(log_append_time) : Py_NewRef(timestamp);
    PyTypeObject *type = (PyTypeObject *)self->metadata_type;
    PyObject *metadata = offset_obj && time_obj ? type->tp_alloc(type, 6) : NULL;
    if (metadata == NULL) {
        Py_XDECREF(offset_obj);
        Py_XDECREF(time_obj);
        return NULL;
    }
    PyTuple_SET_ITEM(metadata, 0, Py_NewRef(topic));
    PyTuple_SET_ITEM(metadata, 1, Py_NewRef(partition));
    PyTuple_SET_ITEM(metadata, 2, offset_obj);
    PyTuple_SET_ITEM(metadata, 3, time_obj);
    PyTuple_SET_ITEM(metadata, 4, Py_NewRef(key_size));
    PyTuple_SET_ITEM(metadata, 5, Py_NewRef(value_size));
    /* A str and ints: it can be in no cycle. The collector would find that out itself, later. */
    PyObject_GC_UnTrack(metadata);
    return metadata;
}

/* What becomes of each future of a report. */
enum { SETTLED = 0, WATCHED = 1, DONE_ALREADY = 2 };

/* Settle the futures nobody watches, in place; mark the others: WATCHED (their Condition exists:
   someone waits on them, or added a done-callback; they complete through _notify) or DONE_ALREADY
   (a record completes once: one failed as lost stays failed if its report comes after all). */
static int settle_quiet(Completer *self, PyObject **futures, PyObject **results, char *fate, Py_ssize_t count,
                        PyObject *error) {
    PyObject *taken = PyObject_CallOneArg(self->lock_acquire, Py_True);
    if (taken == NULL) {
        return -1;
    }
    Py_DECREF(taken);
    const FutureSlots *slots = &self->slots;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *future = futures[i];
        PyObject *state = SLOT(future, slots->state);
        if (state == NULL || (state != str_running && PyUnicode_Compare(state, str_running) != 0)) {
            fate[i] = DONE_ALREADY;
        } else if (SLOT(future, slots->cond) != Py_None) {
            fate[i] = WATCHED;
        } else {
            slot_set(future, slots->result, error == Py_None ? results[i] : Py_None);
            slot_set(future, slots->exception, error);
            slot_set(future, slots->state, str_finished);
            fate[i] = SETTLED;
        }
    }
    return call_truth(self->lock_release) < 0 ? -1 : 0;
}

/* Run the record's on_delivery(error, metadata); an Exception it raises goes to callback_failed, a
   BaseException that is not one (SystemExit, KeyboardInterrupt) is left set and -1 returned. */
static int run_callback(Completer *self, PyObject *future, PyObject *result, PyObject *error) {
    PyObject *callback = SLOT(future, self->slots.on_delivery);
    if (callback == NULL || callback == Py_None) {
        return 0;
    }
    Py_INCREF(callback);
    PyObject *call[] = {error, result};
    PyObject *r = PyObject_Vectorcall(callback, call, 2, NULL);
    Py_DECREF(callback);
    if (r == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    if (r == NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL && value != NULL) {
            PyException_SetTraceback(value, traceback);
        }
        r = PyObject_CallOneArg(self->callback_failed, value != NULL ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    }
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

PyDoc_STRVAR(Completer_complete_doc,
"complete($self, futures, first, count, topic, partition, base_offset, log_append_time, error, /)\n--\n\n"
"Complete futures[first:first + count], the records of one delivery report: with their\n"
"RecordMetadata (offsets from base_offset on; -1 for all if it is -1), or with ``error``; then run\n"
"their on_delivery callbacks. A callback that raises is handed to callback_failed.");

static PyObject *Completer_complete(Completer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "complete() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *futures = args[0], *topic = args[3], *partition = args[4], *error = args[7];
    if (!PyList_CheckExact(futures)) {
        PyErr_SetString(PyExc_TypeError, "futures must be a list");
        return NULL;
    }
    /* One at a time: PyLong_AsLongLong may call __index__, which must not run with an error already set. */
    Py_ssize_t first, count;
    long long base_offset, log_append_time;
    if (((first = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) ||
        ((count = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) ||
        ((base_offset = PyLong_AsLongLong(args[5])) == -1 && PyErr_Occurred()) ||
        ((log_append_time = PyLong_AsLongLong(args[6])) == -1 && PyErr_Occurred())) {
        return NULL;
    }
    Py_ssize_t size = PyList_GET_SIZE(futures);
    if (first < 0 || count < 0 || first > size) {
        PyErr_SetString(PyExc_ValueError, "first and count must select records of futures");
        return NULL;
    }
    if (count > size - first) {
        count = size - first;
    }
    if (count == 0) {
        Py_RETURN_NONE;
    }
    /* The futures and their results are taken from the list first: a callback may change the list. */
    PyObject **done = PyMem_Calloc((size_t)count * 2, sizeof(PyObject *));
    char *fate = PyMem_Calloc((size_t)count, 1);
    if (done == NULL || fate == NULL) {
        PyMem_Free(done);
        PyMem_Free(fate);
        return PyErr_NoMemory();
    }
    PyObject **results = done + count;
    /* All held before anything is allocated: an allocation may collect garbage, and a finalizer may change
       the list (or let another thread do so). */
    for (Py_ssize_t i = 0; i < count; i++) {
        done[i] = Py_NewRef(PyList_GET_ITEM(futures, first + i));
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        PyObject *future = done[i];
        if (!PyObject_TypeCheck(future, self->slots.type)) {
            PyErr_Format(PyExc_TypeError, "futures must be %.100s, got %.100s", self->slots.type->tp_name,
                         Py_TYPE(future)->tp_name);
            failed = 1;
            break;
        }
        if (!PyObject_GC_IsTracked(future)) {
            PyObject_GC_Track(future); /* see new_future() */
        }
        show_callback(SLOT(future, self->slots.on_delivery));
        if (error == Py_None) {
            /* base_offset is that of futures[first]: each part of a batch the daemon split has its own. */
            long long offset = base_offset >= 0 ? base_offset + i : -1;
            results[i] = new_metadata(self, future, topic, partition, offset, log_append_time);
            failed = results[i] == NULL;
        } else {
            results[i] = Py_NewRef(Py_None);
        }
    }
    if (!failed) {
        failed = settle_quiet(self, done, results, fate, count, error) < 0;
    }
    /* Every future completes and every callback runs, whatever one of them raises: the first exception
       that escapes (a BaseException from a callback) is raised once all are done. */
    PyObject *raised_type = NULL, *raised_value = NULL, *raised_traceback = NULL;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        int escaped = 0;
        if (fate[i] == WATCHED) {
            PyObject *call[] = {done[i], results[i], error};
            PyObject *r = PyObject_VectorcallMethod(str_notify, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            escaped = r == NULL;
            Py_XDECREF(r);
        } else if (fate[i] == SETTLED) {
            escaped = run_callback(self, done[i], results[i], error) < 0;
        }
        if (escaped && raised_type == NULL) {
            PyErr_Fetch(&raised_type, &raised_value, &raised_traceback);
        } else if (escaped) {
            PyErr_Clear();
        }
    }
    if (raised_type != NULL) {
        PyErr_Restore(raised_type, raised_value, raised_traceback);
        failed = 1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_XDECREF(done[i]);
        Py_XDECREF(results[i]);
    }
    PyMem_Free(done);
    PyMem_Free(fate);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Completer_methods[] = {
    {"complete", (PyCFunction)(void (*)(void))Completer_complete, METH_FASTCALL, Completer_complete_doc},
    {NULL},
};

static PyTypeObject CompleterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "client_stub._fastpath.Completer",
    .tp_doc = PyDoc_STR("Completer(future_type, metadata_type, condition_lock, callback_failed)\n--\n\n"
                        "Turns delivery reports into completed record futures and on_delivery calls."),
    .tp_basicsize = sizeof(Completer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Completer_new,
    .tp_dealloc = (destructor)Completer_dealloc,
    .tp_traverse = (traverseproc)Completer_traverse,
    .tp_clear = (inquiry)Completer_clear,
    .tp_methods = Completer_methods,
};

/* -- the module ------------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"encode_record", (PyCFunction)(void (*)(void))encode_record, METH_VARARGS | METH_KEYWORDS,
     encode_record_doc},
    {"encode_record_into", (PyCFunction)(void (*)(void))encode_record_into, METH_VARARGS | METH_KEYWORDS,
     encode_record_into_doc},
    {"record_size", (PyCFunction)(void (*)(void))record_size, METH_VARARGS | METH_KEYWORDS, record_size_doc},
    {"murmur2", (PyCFunction)murmur2, METH_O, murmur2_doc},
    {NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "client_stub._fastpath",
    .m_doc = "The client's per-record work in C: record encoding, murmur2, the send() fast path, deliveries\n"
             "(its pure-Python twin: client_stub._fastpath_py; client_stub.fastpath chooses).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (module_state_init() < 0 || PyType_Ready(&OpenBatchType) < 0 || PyType_Ready(&AppenderType) < 0 ||
        PyType_Ready(&CompleterType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&fastpath_module);
    if (module == NULL) {
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    /* The append path is lock-free under the GIL (the Appender's open batches, a future's slots): on a
       free-threaded CPython, importing this module turns the GIL back on. */
    if (PyUnstable_Module_SetGIL(module, Py_MOD_GIL_USED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
#endif
    if (PyModule_AddObjectRef(module, "OpenBatch", (PyObject *)&OpenBatchType) < 0 ||
        PyModule_AddObjectRef(module, "Appender", (PyObject *)&AppenderType) < 0 ||
        PyModule_AddObjectRef(module, "Completer", (PyObject *)&CompleterType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
