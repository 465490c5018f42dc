/*
 * service._fastpath: the daemon's per-record work in C.
 *
 * rebase_records(), with which the daemon coalesces small batches of one partition into one
 * (ProducerBatch.coalesce in service/producer/batch.py): the records a client wrote, re-encoded with
 * the offset and timestamp deltas of the batch that holds them all. copy_records(), with which it
 * reads every other batch before its first send (ProducerBatch.read_records): one private copy,
 * checked as rebase_records checks, so that no malformed batch reaches a broker. claim_ready(), with
 * which it claims the batches of a client's segment that are due (OpenBatches in
 * service/front/open_batches.py): one pass over the client's slots, every few milliseconds per client.
 * seal_claimed(), with which it seals each batch claimed as it hands it over (Seals.claim in
 * service/front/seals.py): the checks of its fields and blocks in one call, not a Python check a field.
 * Its pure-Python twin is service/_fastpath_py.py; service.fastpath chooses between the two at import,
 * as client_stub.fastpath chooses the client's.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- varints (zig-zag, as protobuf's sint32/sint64) ---------------------------------------------- */

static inline uint64_t zigzag(int64_t value) {
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
}

static inline Py_ssize_t varint_size(int64_t value) {
    uint64_t v = zigzag(value);
    Py_ssize_t size = 1;
    while (v > 0x7F) {
        v >>= 7;
        size++;
    }
    return size;
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

/* -- reading records back: rebasing them into another batch --------------------------------------- */

/* Read a zig-zag varint at *pos (below end); 0 unless a whole one of 10 bytes at most is there (the bits
   of a tenth byte past the 64th are dropped, as Java's ByteUtils drops them). */
static int get_varint(const unsigned char *data, Py_ssize_t end, Py_ssize_t *pos, int64_t *value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64 && *pos < end; shift += 7) {
        unsigned char byte = data[(*pos)++];
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return 1;
        }
    }
    return 0;
}

/* A length-prefixed field at *pos: 0 if its length is below ``min`` or it runs past end. */
static int skip_field(const unsigned char *data, Py_ssize_t end, Py_ssize_t *pos, int64_t min) {
    int64_t length;
    if (!get_varint(data, end, pos, &length) || length < min || length > end - *pos) {
        return 0;
    }
    if (length > 0) {
        *pos += length;
    }
    return 1;
}

/* One record's layout, as found at its start. */
typedef struct {
    Py_ssize_t body_end;   /* where the record ends */
    Py_ssize_t rest;       /* where its key length starts: everything from there is kept as it is */
    unsigned char attributes;
    int64_t timestamp_delta;
} ParsedRecord;

/* Parse the whole record at *pos, checking every length in it as a broker would; 0 if malformed, *pos
   then left at the record's start (where the error message says the malformed record is). */
static int parse_record(const unsigned char *data, Py_ssize_t end, Py_ssize_t *pos, ParsedRecord *record) {
    int64_t length, offset_delta, headers;
    Py_ssize_t p = *pos;
    if (!get_varint(data, end, &p, &length) || length < 1 || length > end - p) {
        return 0;
    }
    Py_ssize_t body_end = p + length;
    record->attributes = data[p++];
    if (!get_varint(data, body_end, &p, &record->timestamp_delta) ||
        !get_varint(data, body_end, &p, &offset_delta)) {
        return 0;
    }
    record->rest = p;
    if (!skip_field(data, body_end, &p, -1) || !skip_field(data, body_end, &p, -1) ||
        !get_varint(data, body_end, &p, &headers) || headers < 0) {
        return 0;
    }
    for (int64_t i = 0; i < headers; i++) {
        if (!skip_field(data, body_end, &p, 0) || !skip_field(data, body_end, &p, -1)) {
            return 0;
        }
    }
    if (p != body_end) {
        return 0;
    }
    record->body_end = body_end;
    *pos = body_end;
    return 1;
}

/* The next of ``count`` records at *pos (record ``n``), into *record: 1 if there is one; 0 after the last,
   if the records were exactly ``count`` and end at ``len``; else -1, with a ValueError naming the record
   and the byte where they stop. */
static int next_record(const unsigned char *data, Py_ssize_t len, Py_ssize_t count, Py_ssize_t n, Py_ssize_t *pos,
                       ParsedRecord *record) {
    if (*pos < len && n < count && parse_record(data, len, pos, record)) {
        return 1;
    }
    if (n != count || *pos != len) {
        PyErr_Format(PyExc_ValueError, "not %zd well-formed records (record %zd, byte %zd of %zd)", count, n, *pos,
                     len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(rebase_records_doc,
"rebase_records($module, records, record_count, first_offset_delta, timestamp_shift, /)\n--\n\n"
"The records of one batch, re-encoded for another that holds them from ``first_offset_delta`` on,\n"
"with a base timestamp ``timestamp_shift`` ms lower. ValueError unless ``records`` is exactly\n"
"``record_count`` well-formed records.");

static PyObject *rebase_records(PyObject *module, PyObject *args) {
    Py_buffer src;
    Py_ssize_t count;
    long long first_offset, shift;
    if (!PyArg_ParseTuple(args, "y*nLL:rebase_records", &src, &count, &first_offset, &shift)) {
        return NULL;
    }
    PyObject *result = NULL;
    /* The records lie in shared memory that their client can still write: both passes read one private
       copy, so that what the first pass checked and sized is what the second writes. */
    unsigned char *data = PyMem_Malloc(src.len > 0 ? (size_t)src.len : 1);
    if (data == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(data, src.buf, (size_t)src.len);
    /* First pass: check every record and size the result. */
    Py_ssize_t pos = 0, size = 0, n = 0;
    ParsedRecord record;
    int64_t shifted, offset;
    int found;
    while ((found = next_record(data, src.len, count, n, &pos, &record)) > 0) {
        if (__builtin_add_overflow(record.timestamp_delta, (int64_t)shift, &shifted) ||
            __builtin_add_overflow((int64_t)first_offset, (int64_t)n, &offset)) {
            PyErr_Format(PyExc_ValueError, "record %zd: its timestamp or offset delta is out of range", n);
            goto done;
        }
        Py_ssize_t body = 1 + varint_size(shifted) + varint_size(offset) + (record.body_end - record.rest);
        size += varint_size(body) + body;
        n++;
    }
    if (found < 0) {
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        goto done;
    }
    /* Second pass: write them with their new deltas. */
    char *out = PyBytes_AS_STRING(result);
    pos = 0;
    for (n = 0; n < count; n++) {
        parse_record(data, src.len, &pos, &record);
        Py_ssize_t rest = record.body_end - record.rest;
        int64_t timestamp_delta = record.timestamp_delta + shift;
        Py_ssize_t body = 1 + varint_size(timestamp_delta) + varint_size(first_offset + n) + rest;
        out = put_varint(out, body);
        *out++ = (char)record.attributes;
        out = put_varint(out, timestamp_delta);
        out = put_varint(out, first_offset + n);
        memcpy(out, data + record.rest, (size_t)rest);
        out += rest;
    }
done:
    PyMem_Free(data);
    PyBuffer_Release(&src);
    return result;
}

PyDoc_STRVAR(copy_records_doc,
"copy_records($module, records, record_count, /)\n--\n\n"
"A copy of the records of one batch, read once. ValueError unless the copy is exactly ``record_count``\n"
"well-formed records.");

static PyObject *copy_records(PyObject *module, PyObject *args) {
    Py_buffer src;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n:copy_records", &src, &count)) {
        return NULL;
    }
    /* The records lie in shared memory that their client can still write: what is checked is the copy
       returned, which is what the daemon sends. */
    PyObject *result = PyBytes_FromStringAndSize(NULL, src.len);
    if (result != NULL) {
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(result);
        memcpy(PyBytes_AS_STRING(result), src.buf, (size_t)src.len);
        Py_ssize_t pos = 0, n = 0;
        ParsedRecord record;
        int found;
        while ((found = next_record(data, src.len, count, n, &pos, &record)) > 0) {
            n++;
        }
        if (found < 0) {
            Py_CLEAR(result);
        }
    }
    PyBuffer_Release(&src);
    return result;
}

/* -- the daemon's claims of a client's open batches (client_stub/contract/batch_slots.py) ------------ */

/* The control area's layout and words, as client_stub/contract/batch_slots.py defines them (its docstring is
   the protocol; the client's side is client_stub/_fastpath.c). */
#define HEADER_WORDS 8
#define SLOT_WORDS 8
enum { PUBLISHED, CLAIM, BASE_TIMESTAMP, MAX_TIMESTAMP, BATCH_ID, TOPIC_PARTITION, BLOCK_COUNT, OPENED_NS };
enum { HEADER_LINGER_NS = 2 };
#define PUBLISHED_FULL (1ULL << 63)
#define CLAIM_CLAIMING (1ULL << 63)
#define CLAIM_CLAIMED (1ULL << 62)
#define COUNT_MASK ((1ULL << 31) - 1)
#define LENGTH_MASK ((1ULL << 32) - 1)
/* The longest linger.ms a client's header may ask for, and the longest early_ms: a day (a lingering batch still
   expires at delivery.timeout.ms from its claim). */
#define MAX_LINGER_MS 86400000LL
/* first_seen's word of a block where no open batch was seen since its last claim. */
#define UNSEEN INT64_MIN

/* A batch claimed: what its slot said, with the records and length of the claim. */
typedef struct {
    Py_ssize_t block;
    uint64_t record_count, length;
    int64_t base_timestamp, max_timestamp, batch_id, partition, block_count, opened_ns;
    uint64_t topic_index;
} ClaimedBatch;

static inline int64_t floor_div(int64_t value, int64_t divisor) {
    int64_t quotient = value / divisor;
    return (value % divisor != 0 && value < 0) ? quotient - 1 : quotient;
}

/* A partition's batches go in the order the client opened them (its batch ids), then by block, as the
   pure-Python twin's stable sort of the blocks in increasing order puts them. */
static int by_batch_id(const void *a, const void *b) {
    const ClaimedBatch *x = a, *y = b;
    if (x->batch_id != y->batch_id) {
        return x->batch_id < y->batch_id ? -1 : 1;
    }
    return x->block < y->block ? -1 : (x->block > y->block);
}

PyDoc_STRVAR(claim_ready_doc,
"claim_ready($module, control, state, owned, first_seen, now_ms, claim_all, early_ms, /)\n--\n\n"
"Claim the batches of a client's segment that are ready, as OpenBatches decides (see\n"
"client_stub/contract/batch_slots.py): of the blocks whose byte in ``state`` is ``owned``, those whose slot\n"
"holds a batch open with records, due linger.ms (the header's) after the earlier of its opened_ns and when\n"
"the daemon first saw it (``first_seen``: an int64 per block, in ``now_ms``'s clock; only the blocks it\n"
"covers are looked at, so it covers every block the client owns), due within ``early_ms`` of now (at most\n"
"a day), full, or any with ``claim_all``. Returns (claimed, next_due_ms, still_open, found_full, found_due):\n"
"each batch claimed with records as (block, record_count, length, base_timestamp, max_timestamp, batch_id,\n"
"topic_index, partition, block_count, opened_ns), in batch-id order; the earliest due of those left open\n"
"(None if none); whether some are left open; whether some were claimed full; whether some with records\n"
"were claimed because they were due now, not full.");

static PyObject *claim_ready(PyObject *module, PyObject *args) {
    PyObject *control;
    Py_buffer state, first_seen, words = {0};
    unsigned char owned;
    long long now_ms, early_ms;
    int claim_all;
    if (!PyArg_ParseTuple(args, "Oy*bw*LpL:claim_ready", &control, &state, &owned, &first_seen, &now_ms,
                          &claim_all, &early_ms)) {
        return NULL;
    }
    PyObject *result = NULL, *claimed_list = NULL, *words_object = NULL;
    ClaimedBatch *claimed = NULL;
    if (early_ms < 0) {
        PyErr_SetString(PyExc_ValueError, "early_ms must not be negative");
        goto done;
    }
    early_ms = early_ms < MAX_LINGER_MS ? early_ms : MAX_LINGER_MS;
    words_object = PyObject_GetAttrString(control, "words");
    if (words_object == NULL || PyObject_GetBuffer(words_object, &words, PyBUF_WRITABLE) < 0) {
        goto done;
    }
    /* The blocks that first_seen covers: the caller sizes it past the last block the client owns. */
    Py_ssize_t block_count = first_seen.len / (Py_ssize_t)sizeof(int64_t);
    if (first_seen.len % (Py_ssize_t)sizeof(int64_t) || block_count > state.len ||
        words.len < (HEADER_WORDS + block_count * SLOT_WORDS) * (Py_ssize_t)sizeof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "first_seen covers more blocks than state or the control area");
        goto done;
    }
    const unsigned char *states = state.buf;
    int64_t *seen = first_seen.buf;
    uint64_t *area = words.buf;
    uint64_t linger_ns = __atomic_load_n(&area[HEADER_LINGER_NS], __ATOMIC_RELAXED);
    int64_t linger_ms = (int64_t)(linger_ns / 1000000) < MAX_LINGER_MS ? (int64_t)(linger_ns / 1000000) : MAX_LINGER_MS;
    Py_ssize_t count = 0, capacity = 0;
    int64_t next_due = INT64_MAX;
    int still_open = 0, found_full = 0, found_due = 0;
    for (Py_ssize_t block = 0; block < block_count; block++) {
        if (states[block] != owned) {
            continue;
        }
        uint64_t *slot = area + HEADER_WORDS + block * SLOT_WORDS;
        /* The claim before published: a client opening a batch clears its published before its claim. */
        if (__atomic_load_n(&slot[CLAIM], __ATOMIC_ACQUIRE) != 0) {
            continue;
        }
        uint64_t published = __atomic_load_n(&slot[PUBLISHED], __ATOMIC_ACQUIRE);
        if (!((published >> 32) & COUNT_MASK)) {
            continue;
        }
        int full = (published & PUBLISHED_FULL) != 0;
        if (seen[block] == UNSEEN) {
            seen[block] = now_ms;
        }
        int64_t opened_ms = floor_div((int64_t)__atomic_load_n(&slot[OPENED_NS], __ATOMIC_RELAXED), 1000000);
        int64_t due = (opened_ms < seen[block] ? opened_ms : seen[block]) + linger_ms;
        /* due is a client's word in ms plus a day at most, and early_ms is a day at most (clamped above): far from
           INT64_MIN, due - early_ms cannot overflow. */
        if (!(claim_all || full || now_ms >= due - early_ms)) {
            still_open = 1;
            next_due = due < next_due ? due : next_due;
            continue;
        }
        /* Room for the batch before it is claimed: one claimed must be handed over. */
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            ClaimedBatch *grown = PyMem_Realloc(claimed, (size_t)capacity * sizeof(ClaimedBatch));
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            claimed = grown;
        }
        seen[block] = UNSEEN;
        found_full |= full;
        int due_now = !full && now_ms >= due;
        /* Dekker's protocol, the daemon's side: CLAIMING, a full fence, what is published is the batch. */
        __atomic_store_n(&slot[CLAIM], CLAIM_CLAIMING, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        published = __atomic_load_n(&slot[PUBLISHED], __ATOMIC_ACQUIRE);
        uint64_t record_count = (published >> 32) & COUNT_MASK;
        __atomic_store_n(&slot[CLAIM], CLAIM_CLAIMED | record_count, __ATOMIC_RELEASE);
        if (!record_count) {
            continue;  /* a client's own slot, rewritten: nothing of it is sent */
        }
        found_due |= due_now;
        uint64_t topic_partition = __atomic_load_n(&slot[TOPIC_PARTITION], __ATOMIC_RELAXED);
        claimed[count++] = (ClaimedBatch){
            .block = block,
            .record_count = record_count,
            .length = published & LENGTH_MASK,
            .base_timestamp = (int64_t)__atomic_load_n(&slot[BASE_TIMESTAMP], __ATOMIC_RELAXED),
            .max_timestamp = (int64_t)__atomic_load_n(&slot[MAX_TIMESTAMP], __ATOMIC_RELAXED),
            .batch_id = (int64_t)__atomic_load_n(&slot[BATCH_ID], __ATOMIC_RELAXED),
            .topic_index = topic_partition & LENGTH_MASK,
            .partition = (int64_t)topic_partition >> 32,
            .block_count = (int64_t)__atomic_load_n(&slot[BLOCK_COUNT], __ATOMIC_RELAXED),
            .opened_ns = (int64_t)__atomic_load_n(&slot[OPENED_NS], __ATOMIC_RELAXED),
        };
    }
    if (count > 1) {
        qsort(claimed, (size_t)count, sizeof(ClaimedBatch), by_batch_id);
    }
    claimed_list = PyList_New(count);
    if (claimed_list == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        ClaimedBatch *c = &claimed[i];
        PyObject *item = Py_BuildValue("(nKKLLLKLLL)", c->block, (unsigned long long)c->record_count,
                                       (unsigned long long)c->length, (long long)c->base_timestamp,
                                       (long long)c->max_timestamp, (long long)c->batch_id,
                                       (unsigned long long)c->topic_index, (long long)c->partition,
                                       (long long)c->block_count, (long long)c->opened_ns);
        if (item == NULL) {
            goto done;
        }
        PyList_SET_ITEM(claimed_list, i, item);
    }
    if (still_open) {
        result = Py_BuildValue("(OLOOO)", claimed_list, (long long)next_due, Py_True,
                               found_full ? Py_True : Py_False, found_due ? Py_True : Py_False);
    } else {
        result = Py_BuildValue("(OOOOO)", claimed_list, Py_None, Py_False, found_full ? Py_True : Py_False,
                               found_due ? Py_True : Py_False);
    }
done:
    Py_XDECREF(claimed_list);
    PyMem_Free(claimed);
    if (words.obj != NULL) {
        PyBuffer_Release(&words);
    }
    Py_XDECREF(words_object);
    PyBuffer_Release(&first_seen);
    PyBuffer_Release(&state);
    return result;
}

PyDoc_STRVAR(seal_claimed_doc,
"seal_claimed($module, state, owned, sealed, block_size, claimed, /)\n--\n\n"
"Seal a batch claim_ready() claimed (``claimed``, a tuple as it returns one, whose items it takes as\n"
"integers): make its blocks' bytes in ``state`` ``sealed`` and return True if its fields are in range for\n"
"blocks of ``block_size`` bytes, as service/front/checks.py's check_notice() checks a notice, and its blocks\n"
"are all ``owned``; else leave ``state`` as it is and return False.");

static PyObject *seal_claimed(PyObject *module, PyObject *args) {
    Py_buffer state;
    unsigned char owned, sealed;
    Py_ssize_t block_size;
    PyObject *claimed;
    if (!PyArg_ParseTuple(args, "w*bbnO!:seal_claimed", &state, &owned, &sealed, &block_size, &PyTuple_Type,
                          &claimed)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t block;
    long long record_count, length, base_timestamp, max_timestamp, batch_id, topic_index, partition, block_count,
        opened_ns;
    if (!PyArg_ParseTuple(claimed, "nLLLLLLLLL:seal_claimed", &block, &record_count, &length, &base_timestamp,
                          &max_timestamp, &batch_id, &topic_index, &partition, &block_count, &opened_ns)) {
        goto done;
    }
    if (block_size < 1) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        goto done;
    }
    /* The length of the records and their count are the claim's; the rest is the client's word. The length fits
       block_count blocks, length <= block_count * block_size, tested by a division: the product may overflow. */
    int in_range = block >= 0 && block < state.len && batch_id >= 0 && partition >= 0 && partition <= INT32_MAX &&
                   base_timestamp >= -1 && max_timestamp >= -1 && block_count >= 1 &&
                   block_count <= state.len - block && record_count >= 1 && record_count <= length &&
                   (length - 1) / block_size < block_count;
    unsigned char *states = state.buf;
    for (Py_ssize_t b = block; in_range && b < block + block_count; b++) {
        in_range = states[b] == owned;
    }
    if (in_range) {
        memset(states + block, sealed, (size_t)block_count);
    }
    result = PyBool_FromLong(in_range);
done:
    PyBuffer_Release(&state);
    return result;
}

static PyMethodDef module_methods[] = {
    {"rebase_records", (PyCFunction)rebase_records, METH_VARARGS, rebase_records_doc},
    {"copy_records", (PyCFunction)copy_records, METH_VARARGS, copy_records_doc},
    {"claim_ready", (PyCFunction)claim_ready, METH_VARARGS, claim_ready_doc},
    {"seal_claimed", (PyCFunction)seal_claimed, METH_VARARGS, seal_claimed_doc},
    {NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "service._fastpath",
    .m_doc = "The daemon's per-record work in C: rebase_records(), for coalescing batches,\n"
             "copy_records(), for reading the others, claim_ready(), for claiming the batches of a\n"
             "client's segment, and seal_claimed(), for sealing each batch claimed (its pure-Python twin:\n"
             "service._fastpath_py; service.fastpath chooses).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    PyObject *module = PyModule_Create(&fastpath_module);
#ifdef Py_GIL_DISABLED
    /* rebase_records() and copy_records() keep no state, and read their argument once, into a copy of their own;
       claim_ready() and seal_claimed() write only the buffers they are given, which the daemon's loop alone uses. */
    if (module != NULL && PyUnstable_Module_SetGIL(module, Py_MOD_GIL_NOT_USED) < 0) {
        Py_CLEAR(module);
    }
#endif
    return module;
}
