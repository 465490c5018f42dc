/*
 * service._fastpath: the daemon's per-record work in C.
 *
 * rebase_records(), with which the daemon coalesces small batches of one partition into one
 * (ProducerBatch.coalesce in service/producer/batch.py): the records a client wrote, re-encoded with
 * the offset and timestamp deltas of the batch that holds them all. copy_records(), with which it
 * reads every other batch before its first send (ProducerBatch.read_records): one private copy,
 * checked as rebase_records checks, so that no malformed batch reaches a broker. Its pure-Python twin is
 * service/_fastpath_py.py; service.fastpath chooses between the two at import, as
 * client_stub.fastpath chooses the client's.
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

static PyMethodDef module_methods[] = {
    {"rebase_records", (PyCFunction)rebase_records, METH_VARARGS, rebase_records_doc},
    {"copy_records", (PyCFunction)copy_records, METH_VARARGS, copy_records_doc},
    {NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "service._fastpath",
    .m_doc = "The daemon's per-record work in C: rebase_records(), for coalescing batches, and\n"
             "copy_records(), for reading the others (its pure-Python twin: service._fastpath_py;\n"
             "service.fastpath chooses).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    PyObject *module = PyModule_Create(&fastpath_module);
#ifdef Py_GIL_DISABLED
    /* rebase_records() and copy_records() keep no state, and read their argument once, into a copy of their own. */
    if (module != NULL && PyUnstable_Module_SetGIL(module, Py_MOD_GIL_NOT_USED) < 0) {
        Py_CLEAR(module);
    }
#endif
    return module;
}
