/*
 * sinks._loadfast: the initial load's rows, from COPY's text straight to Kafka, compiled.
 *
 * The load's profile (docs/initial-load.md) puts most of a worker's time per row in
 * Python: building the row's dict of typed values and its ChangeEvent, turning the typed
 * values back into the Avro schema's text, and confluent_kafka's produce() (its argument
 * parsing, a header list converted per message, a per-message delivery callback).  For a
 * read event nearly all of that is constant: this module transcodes one COPY text row into
 * the event's Avro key and value and hands them to librdkafka itself.
 *
 * Producer: an idempotent librdkafka producer of its own, configured with the Kafka sink's
 * properties (sinks/kafka.py), so the partitioner and the guarantees are the sink's.  The
 * library is the one confluent_kafka loaded (dlopen of its path: sinks/loadfast.py), so no
 * build-time dependency; only its stable public C API is used (declared below).  Delivery
 * reports are counted in C; the first failure is kept and raised by flush().
 *
 * Table: one table version's plan.  Per column a kind: a text the Python path would pass
 * through unchanged, an int, a long, a boolean, a float or double, a numeric whose
 * Decimal text is COPY's, a date, a timestamp (rewritten to datetime.isoformat()), a
 * one-dimensional int array (rewritten to JSON); any other column, and any value outside
 * the exact cases (an infinite timestamp, a numeric Python prints in scientific notation,
 * ...), goes to the column's Python fallback (sinks/loadfast.py: the stream's decoder and
 * Avro writer).  tests/unit/test_loadfast.py checks the bytes against sinks/avro.py's.
 *
 * JsonTable: the same for JSON (Debezium's encoding or pgcdc's): the read
 * event's key and value as sinks/envelope.py's JsonEncoder writes them, the envelope's
 * constant texts cut from that encoder's own output (sinks/loadfast.py), the common values
 * of the common types written here (_loadfast_json.h), every other value through the
 * column's Python fallback (its text in the encoder's output).
 * tests/unit/test_loadfast_json.py checks the bytes against the encoder's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ctype.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_avrobuf.h"
#include "_loadfast_rdkafka.h"
#include "_loadfast_text.h"
#include "_loadfast_libpq.h"
#include "_loadfast_json.h"

/* --- Table ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Producer *producer;
    rk_topic_t *topic;
    rk_headers_t *headers;
    int columns;
    unsigned char *kinds;
    PyObject *fallbacks;  /* tuple: per column, fallback(text) -> the field's Avro bytes */
    Py_ssize_t *key_columns;  /* positions, in key order */
    int keys;
    PyObject *middle;  /* bytes between the Row record and the ordinal */
    PyObject *tail;    /* bytes after the ordinal, up to ts_ms */
    PyObject *key_head, *value_head;  /* bytes before each key, each value (wire format) */
    Buf value, key, scratch, bytes;
    Py_ssize_t *starts, *ends;  /* each field's span in value, per row */
    /* JsonTable: JSON; head is the value's text before the after image, middle
     * the text after it up to the ordinal, pieces the texts after the ordinal, between which
     * ts_ms's number goes */
    int json;
    int *args;  /* per column, its kind's argument (a scale, a precision) */
    PyObject *prefixes, *key_prefixes;  /* tuples of bytes: ,"name": (or {"name": first) */
    PyObject *pieces;
    PyObject *dump;  /* value -> its JSON text, for the values put_native leaves */
} Table;

static void
Table_dealloc(Table *self)
{
    if (self->headers)
        rk.headers_destroy(self->headers);
    if (self->topic)
        rk.topic_destroy(self->topic);
    Py_XDECREF(self->producer);
    Py_XDECREF(self->fallbacks);
    Py_XDECREF(self->middle);
    Py_XDECREF(self->tail);
    Py_XDECREF(self->key_head);
    Py_XDECREF(self->value_head);
    PyMem_Free(self->kinds);
    PyMem_Free(self->key_columns);
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    PyMem_Free(self->args);
    Py_XDECREF(self->prefixes);
    Py_XDECREF(self->key_prefixes);
    Py_XDECREF(self->pieces);
    Py_XDECREF(self->dump);
    buf_free(&self->bytes);
    buf_free(&self->value);
    buf_free(&self->key);
    buf_free(&self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int table_setup(Table *self, Producer *producer, const char *topic, PyObject *headers,
                       PyObject *kinds, PyObject *fallbacks, PyObject *keys, int count);

/* Table(producer, topic, headers, kinds, fallbacks, key_columns, middle, tail[, key_head,
 * value_head]) */
static int
Table_init(Table *self, PyObject *args, PyObject *kwargs)
{
    Producer *producer;
    const char *topic;
    PyObject *headers, *kinds, *fallbacks, *keys, *middle, *tail, *key_head = NULL,
        *value_head = NULL;
    if (!PyArg_ParseTuple(args, "O!sO!O!O!O!SS|SS", &ProducerType, &producer, &topic,
                          &PyList_Type, &headers, &PyTuple_Type, &kinds, &PyTuple_Type,
                          &fallbacks, &PyTuple_Type, &keys, &middle, &tail, &key_head,
                          &value_head))
        return -1;
    if (self->producer != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Table is initialized once");
        return -1;
    }
    if (table_setup(self, producer, topic, headers, kinds, fallbacks, keys, K_COUNT) < 0)
        return -1;
    Py_INCREF(middle);
    self->middle = middle;
    Py_INCREF(tail);
    self->tail = tail;
    Py_XINCREF(key_head);
    self->key_head = key_head;
    Py_XINCREF(value_head);
    self->value_head = value_head;
    return 0;
}

/* the parts of Table and JsonTable alike (not initialized yet); kinds below `count` */
static int
table_setup(Table *self, Producer *producer, const char *topic, PyObject *headers,
            PyObject *kinds, PyObject *fallbacks, PyObject *keys, int count)
{
    if (!producer_ready(producer))
        return -1;
    Py_ssize_t columns = PyTuple_GET_SIZE(kinds);
    if (PyTuple_GET_SIZE(fallbacks) != columns) {
        PyErr_SetString(PyExc_ValueError, "one fallback per column");
        return -1;
    }
    buf_init(&self->value);
    buf_init(&self->key);
    buf_init(&self->scratch);
    buf_init(&self->bytes);
    self->columns = (int)columns;
    self->keys = (int)PyTuple_GET_SIZE(keys);
    self->kinds = PyMem_Malloc(columns + 1);
    self->starts = PyMem_Malloc(sizeof(Py_ssize_t) * (columns + 1));
    self->ends = PyMem_Malloc(sizeof(Py_ssize_t) * (columns + 1));
    self->key_columns = PyMem_Malloc(sizeof(Py_ssize_t) * (self->keys + 1));
    if (!self->kinds || !self->starts || !self->ends || !self->key_columns) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < columns; i++) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, i));
        if (kind == -1 && PyErr_Occurred())
            return -1;
        PyObject *fallback = PyTuple_GET_ITEM(fallbacks, i);
        if (kind < 0 || kind >= count || !PyCallable_Check(fallback)) {
            PyErr_Format(PyExc_ValueError, "column %zd: kind %ld, fallback %R", i, kind,
                         fallback);
            return -1;
        }
        self->kinds[i] = (unsigned char)kind;
    }
    for (int i = 0; i < self->keys; i++) {
        Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, i));
        if (position < 0 || position >= columns) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "key column %zd out of range", position);
            return -1;
        }
        self->key_columns[i] = position;
    }
    self->headers = rk.headers_new(PyList_GET_SIZE(headers));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        const char *name, *value;
        Py_ssize_t size;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(headers, i), "sy#", &name, &value, &size))
            return -1;
        rk.header_add(self->headers, name, -1, value, size);
    }
    self->topic = rk.topic_new(producer->rk, topic, NULL);
    if (self->topic == NULL) {
        PyErr_Format(PyExc_RuntimeError, "librdkafka refused the topic %s", topic);
        return -1;
    }
    Py_INCREF(producer);
    self->producer = producer;
    Py_INCREF(fallbacks);
    self->fallbacks = fallbacks;
    return 0;
}

static int
bytes_tuple(PyObject *tuple, Py_ssize_t size, const char *what)
{
    if (PyTuple_GET_SIZE(tuple) != size) {
        PyErr_Format(PyExc_ValueError, "%zd %s, not %zd", PyTuple_GET_SIZE(tuple), what, size);
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(tuple, i))) {
            PyErr_Format(PyExc_TypeError, "%s are bytes", what);
            return -1;
        }
    return 0;
}

/* JsonTable(producer, topic, headers, kinds, args, fallbacks, key_columns, prefixes,
 * key_prefixes, head, middle, pieces, dump); a fallback gives the value to write (None,
 * bool, int, float, str, list, dict: written here; anything else through dump) */
static int
JsonTable_init(Table *self, PyObject *args, PyObject *kwargs)
{
    Producer *producer;
    const char *topic;
    PyObject *headers, *kinds, *arguments, *fallbacks, *keys, *prefixes, *key_prefixes, *head,
        *middle, *pieces, *dump;
    if (!PyArg_ParseTuple(args, "O!sO!O!O!O!O!O!O!SSO!O", &ProducerType, &producer, &topic,
                          &PyList_Type, &headers, &PyTuple_Type, &kinds, &PyTuple_Type,
                          &arguments, &PyTuple_Type, &fallbacks, &PyTuple_Type, &keys,
                          &PyTuple_Type, &prefixes, &PyTuple_Type, &key_prefixes, &head,
                          &middle, &PyTuple_Type, &pieces, &dump))
        return -1;
    if (!PyCallable_Check(dump)) {
        PyErr_SetString(PyExc_TypeError, "JsonTable: dump is called");
        return -1;
    }
    if (self->producer != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Table is initialized once");
        return -1;
    }
    Py_ssize_t columns = PyTuple_GET_SIZE(kinds);
    if (bytes_tuple(prefixes, columns, "prefixes") < 0
        || bytes_tuple(key_prefixes, PyTuple_GET_SIZE(keys), "key prefixes") < 0
        || bytes_tuple(pieces, PyTuple_GET_SIZE(pieces), "pieces") < 0)
        return -1;
    if (PyTuple_GET_SIZE(arguments) != columns || PyTuple_GET_SIZE(pieces) == 0) {
        PyErr_SetString(PyExc_ValueError, "JsonTable: one argument per column, and pieces");
        return -1;
    }
    PyMem_Free(self->args);
    self->args = PyMem_Malloc(sizeof(int) * (columns + 1));
    if (self->args == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < columns; i++) {
        self->args[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(arguments, i));
        if (self->args[i] == -1 && PyErr_Occurred())
            return -1;
    }
    self->json = 1;
    if (table_setup(self, producer, topic, headers, kinds, fallbacks, keys, J_COUNT) < 0)
        return -1;
    self->prefixes = Py_NewRef(prefixes);
    self->key_prefixes = Py_NewRef(key_prefixes);
    self->value_head = Py_NewRef(head);  /* before the after image */
    self->middle = Py_NewRef(middle);
    self->pieces = Py_NewRef(pieces);
    self->dump = Py_NewRef(dump);
    return 0;
}

/* the field of column i through its Python fallback (the text of a non-null value) */
static int
put_fallback(Table *self, int i, const char *text, Py_ssize_t size)
{
    PyObject *value = PyUnicode_DecodeUTF8(text, size, "strict");
    if (value == NULL)
        return -1;
    PyObject *field = PyObject_CallOneArg(PyTuple_GET_ITEM(self->fallbacks, i), value);
    Py_DECREF(value);
    if (field == NULL)
        return -1;
    if (!PyBytes_Check(field)) {
        PyErr_Format(PyExc_TypeError, "a load fallback returned %R, not bytes",
                     (PyObject *)Py_TYPE(field));
        Py_DECREF(field);
        return -1;
    }
    int rc = put_bytes_object(&self->value, field);
    Py_DECREF(field);
    return rc;
}

/* one non-null column value (COPY's escaped text s[0:n]) as its field: union branch 1
 * (byte 2), then the value */
static int
put_field(Table *self, int i, const char *s, Py_ssize_t n)
{
    Buf *v = &self->value, *text = &self->scratch;
    int kind = self->kinds[i];
    int escaped = memchr(s, '\\', n) != NULL;
    if (escaped && kind != K_INT && kind != K_LONG && kind != K_BOOLEAN) {
        if (unescape(text, s, n) < 0)
            return -1;
        s = text->data;
        n = text->size;
        escaped = 0;
    }
    int64_t number;
    switch (kind) {
    case K_TEXT:
        if (put_byte(v, 2) < 0)
            return -1;
        return put_text(v, s, n);
    case K_INT:
        if (parse_integer(s, n, &number) && number >= INT32_MIN && number <= INT32_MAX) {
            if (put_byte(v, 2) < 0)
                return -1;
            return put_varint(v, zigzag(number));
        }
        break;
    case K_LONG:
        if (parse_integer(s, n, &number)) {
            if (put_byte(v, 2) < 0)
                return -1;
            return put_varint(v, zigzag(number));
        }
        break;
    case K_BOOLEAN:
        if (n == 1 && (s[0] == 't' || s[0] == 'f')) {
            if (put_byte(v, 2) < 0)
                return -1;
            return put_byte(v, s[0] == 't');
        }
        break;
    case K_FLOAT:
    case K_DOUBLE: {
        if (n == 0 || n > 64 || memchr(s, '\0', n) != NULL)
            break;
        char number_text[65], *end;
        memcpy(number_text, s, n);
        number_text[n] = '\0';
        double d = strtod(number_text, &end);
        if (end != number_text + n || isspace((unsigned char)number_text[0]))
            break;
        if (put_byte(v, 2) < 0)
            return -1;
        if (kind == K_DOUBLE)
            return put(v, &d, 8);  /* little-endian: x86-64 and aarch64 */
        float f = (float)d;  /* as struct.pack('<f'), an overflow an infinity (sinks/avro.py) */
        return put(v, &f, 4);
    }
    case K_NUMERIC:
        if (numeric_as_is(s, n)) {
            if (put_byte(v, 2) < 0)
                return -1;
            return put_text(v, s, n);
        }
        break;
    case K_DATE:
        if (is_iso_date(s, n)) {
            if (put_byte(v, 2) < 0)
                return -1;
            return put_text(v, s, n);
        }
        break;
    case K_TIMESTAMP: {
        char iso[48];
        Py_ssize_t size;
        if (n <= 40 && iso_timestamp(s, n, iso, &size)) {
            if (put_byte(v, 2) < 0)
                return -1;
            return put_text(v, iso, size);
        }
        break;
    }
    case K_INT_ARRAY: {
        Buf json;
        buf_init(&json);
        int rc = 0;
        if (json_int_array(s, n, &json)) {
            rc = put_byte(v, 2) < 0 ? -1 : put_text(v, json.data, json.size);
            buf_free(&json);
            return rc;
        }
        buf_free(&json);
        if (PyErr_Occurred())
            return -1;
        break;
    }
    default:
        break;
    }
    if (escaped) {
        if (unescape(text, s, n) < 0)
            return -1;
        s = text->data;
        n = text->size;
    }
    return put_fallback(self, i, s, n);
}

/* one non-null column value (COPY's escaped text s[0:n]) in JSON */
static int
put_json_field(Table *self, int i, const char *s, Py_ssize_t n)
{
    Buf *text = &self->scratch;
    if (memchr(s, '\\', n) != NULL) {
        if (unescape(text, s, n) < 0)
            return -1;
        s = text->data;
        n = text->size;
    }
    Py_ssize_t start = self->value.size;
    int done = put_json_value(&self->value, &self->bytes, self->kinds[i], self->args[i], s, n);
    if (done != 0)
        return done < 0 ? -1 : 0;
    self->value.size = start;
    PyObject *string = PyUnicode_DecodeUTF8(s, n, "strict");
    if (string == NULL)
        return -1;
    PyObject *value = PyObject_CallOneArg(PyTuple_GET_ITEM(self->fallbacks, i), string);
    Py_DECREF(string);
    if (value == NULL)
        return -1;
    int rc = put_native(&self->value, value, self->dump, 0);
    Py_DECREF(value);
    return rc;
}

/* the Row record (Avro) or the after image's members (JSON) of one COPY line (its fields
 * separated by tabs, \N for null) */
static int
put_row(Table *self, const char *line, Py_ssize_t size)
{
    if (size > 0 && line[size - 1] == '\n')
        size--;
    Py_ssize_t at = 0;
    for (int i = 0; i < self->columns; i++) {
        if (at > size) {
            PyErr_Format(PyExc_ValueError, "a COPY row has %d columns, the table version %d", i,
                         self->columns);
            return -1;
        }
        const char *field = line + at;
        const char *tab = memchr(field, '\t', size - at);
        Py_ssize_t n = tab ? tab - field : size - at;
        int null = n == 2 && field[0] == '\\' && field[1] == 'N';
        if (self->json) {
            if (put_bytes_object(&self->value, PyTuple_GET_ITEM(self->prefixes, i)) < 0)
                return -1;
            self->starts[i] = self->value.size;
            if (null ? PUTS(&self->value, "null") < 0 : put_json_field(self, i, field, n) < 0)
                return -1;
        }
        else {
            self->starts[i] = self->value.size;
            if (null ? put_byte(&self->value, 0) < 0 : put_field(self, i, field, n) < 0)
                return -1;
        }
        self->ends[i] = self->value.size;
        at += n + 1;
    }
    if (self->columns ? at <= size : size > 0) {  /* a table without columns: empty lines */
        PyErr_Format(PyExc_ValueError, "a COPY row has more columns than the table version's %d",
                     self->columns);
        return -1;
    }
    return 0;
}

/* produce the current key and value; waits (polling) while librdkafka's queue is full */
static int
produce(Table *self)
{
    Producer *producer = self->producer;
    if (!producer_ready(producer))
        return -1;
    for (;;) {
        rk_headers_t *headers = rk.headers_copy(self->headers);
        int err = rk.producev(producer->rk, VTYPE_RKT, self->topic, VTYPE_PARTITION,
                              (int32_t)PARTITION_UA, VTYPE_MSGFLAGS, (int)MSG_F_COPY,
                              VTYPE_VALUE, (void *)self->value.data, (size_t)self->value.size,
                              VTYPE_KEY, (void *)self->key.data, (size_t)self->key.size,
                              VTYPE_HEADERS, headers, VTYPE_END);
        if (err == 0) {
            if ((++producer->produced & 1023) == 0)
                rk.poll(producer->rk, 0);
            return 0;
        }
        rk.headers_destroy(headers);
        if (err != ERR_QUEUE_FULL) {
            PyErr_Format(ProduceError, "the load's Kafka producer refused a message: %s",
                         rk.err2str(err));
            return -1;
        }
        Py_BEGIN_ALLOW_THREADS
        rk.poll(producer->rk, 50);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

/* encode_line in JSON: the value is head, the after image, middle, the ordinal,
 * then pieces with ts_ms's number between them; the key the key columns' members */
static int
encode_json_line(Table *self, const char *line, Py_ssize_t size, long long ordinal,
                 long long now_ms)
{
    Buf *value = &self->value, *key = &self->key;
    value->size = 0;
    key->size = 0;
    if (put_bytes_object(value, self->value_head) < 0 || put_row(self, line, size) < 0
        || (self->columns ? put_byte(value, '}') : PUTS(value, "{}")) < 0)
        return -1;
    for (int k = 0; k < self->keys; k++) {
        Py_ssize_t c = self->key_columns[k];
        if (put_bytes_object(key, PyTuple_GET_ITEM(self->key_prefixes, k)) < 0
            || put(key, value->data + self->starts[c], self->ends[c] - self->starts[c]) < 0)
            return -1;
    }
    if ((self->keys ? put_byte(key, '}') : PUTS(key, "{}")) < 0
        || put_bytes_object(value, self->middle) < 0 || put_ll(value, ordinal) < 0
        || put_bytes_object(value, PyTuple_GET_ITEM(self->pieces, 0)) < 0)
        return -1;
    for (Py_ssize_t k = 1; k < PyTuple_GET_SIZE(self->pieces); k++)
        if (put_ll(value, now_ms) < 0
            || put_bytes_object(value, PyTuple_GET_ITEM(self->pieces, k)) < 0)
            return -1;
    return 0;
}

/* the key and the value of the read event of one COPY line, into self->key, self->value */
static int
encode_line(Table *self, const char *line, Py_ssize_t size, long long ordinal, long long now_ms)
{
    if (self->json)
        return encode_json_line(self, line, size, ordinal, now_ms);
    self->value.size = 0;
    self->key.size = 0;
    if ((self->key_head && put_bytes_object(&self->key, self->key_head) < 0)
        || (self->value_head && put_bytes_object(&self->value, self->value_head) < 0))
        return -1;
    /* "before": null (union branch 0), "after": a Row (branch 1) */
    if (put_byte(&self->value, 0) < 0 || put_byte(&self->value, 2) < 0
        || put_row(self, line, size) < 0)
        return -1;
    for (int k = 0; k < self->keys; k++) {
        Py_ssize_t c = self->key_columns[k];
        if (put(&self->key, self->value.data + self->starts[c],
                self->ends[c] - self->starts[c]) < 0)
            return -1;
    }
    if (put_bytes_object(&self->value, self->middle) < 0
        || put_varint(&self->value, zigzag(ordinal)) < 0
        || put_bytes_object(&self->value, self->tail) < 0
        || put_varint(&self->value, zigzag(now_ms)) < 0
        || put_byte(&self->value, 0) < 0)  /* "unchanged": an empty array */
        return -1;
    return 0;
}

static int
encode_object(Table *self, PyObject *item, long long ordinal, long long now_ms)
{
    Py_buffer line;
    if (PyObject_GetBuffer(item, &line, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = encode_line(self, line.buf, line.len, ordinal, now_ms);
    PyBuffer_Release(&line);
    return rc;
}

static int
table_ready(Table *self)
{
    if (self->producer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Table not initialized");
        return 0;
    }
    return 1;
}

/* rows(iterator, limit, ordinal, now_ms) -> rows taken: up to limit COPY lines (bytes-like
 * objects) from iterator, each produced as a read event whose ordinal is ordinal,
 * ordinal + 1, ... and whose ts_ms is now_ms */
static PyObject *
Table_rows(Table *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "rows(iterator, limit, ordinal, now_ms)");
        return NULL;
    }
    PyObject *iterator = args[0];
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    long long ordinal = PyLong_AsLongLong(args[2]), now_ms = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred() || !table_ready(self))
        return NULL;
    Py_ssize_t taken = 0;
    if (Py_TYPE(iterator) == &CopyOutType) {  /* libpq's rows, without an object per row */
        CopyOut *copy = (CopyOut *)iterator;
        while (taken < limit) {
            char *line;
            int size = copyout_next(copy, &line);
            if (size < 0)
                return NULL;
            if (size == 0)
                break;
            int rc = encode_line(self, line, size, ordinal + taken, now_ms);
            lp.freemem(line);
            if (rc < 0 || produce(self) < 0)
                return NULL;
            taken++;
        }
        return PyLong_FromSsize_t(taken);
    }
    while (taken < limit) {
        PyObject *item = PyIter_Next(iterator);
        if (item == NULL) {
            if (PyErr_Occurred())
                return NULL;
            break;
        }
        int rc = encode_object(self, item, ordinal + taken, now_ms);
        Py_DECREF(item);
        if (rc < 0 || produce(self) < 0)
            return NULL;
        taken++;
    }
    return PyLong_FromSsize_t(taken);
}

/* encode(line, ordinal, now_ms) -> (key, value): what rows() produces for one line (for the
 * tests) */
static PyObject *
Table_encode(Table *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode(line, ordinal, now_ms)");
        return NULL;
    }
    long long ordinal = PyLong_AsLongLong(args[1]), now_ms = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred() || !table_ready(self)
        || encode_object(self, args[0], ordinal, now_ms) < 0)
        return NULL;
    return Py_BuildValue("(y#y#)", self->key.data, self->key.size, self->value.data,
                         self->value.size);
}

static PyMethodDef Table_methods[] = {
    {"rows", (PyCFunction)(void (*)(void))Table_rows, METH_FASTCALL,
     "rows(iterator, limit, ordinal, now_ms) -> rows produced"},
    {"encode", (PyCFunction)(void (*)(void))Table_encode, METH_FASTCALL,
     "encode(line, ordinal, now_ms) -> (key, value)"},
    {NULL, NULL, 0, NULL},
};

/* Table (Avro) and JsonTable: one struct and methods, each its own constructor */
#define TABLE_TYPE(name, doc, init) {                                                    \
    PyVarObject_HEAD_INIT(NULL, 0)                                                        \
    .tp_name = "sinks._loadfast." name,                                                   \
    .tp_basicsize = sizeof(Table),                                                        \
    .tp_flags = Py_TPFLAGS_DEFAULT,                                                       \
    .tp_doc = doc,                                                                        \
    .tp_new = PyType_GenericNew,                                                          \
    .tp_init = (initproc)init,                                                            \
    .tp_dealloc = (destructor)Table_dealloc,                                              \
    .tp_methods = Table_methods,                                                          \
}

static PyTypeObject TableType = TABLE_TYPE(
    "Table", "Table(producer, topic, headers, kinds, fallbacks, key_columns, middle, tail"
             "[, key_head, value_head])", Table_init);

static PyTypeObject JsonTableType = TABLE_TYPE(
    "JsonTable", "JsonTable(producer, topic, headers, kinds, args, fallbacks, key_columns, "
                 "prefixes, key_prefixes, head, middle, pieces, dump): read events in JSON",
    JsonTable_init);

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sinks._loadfast",
    "The initial load's COPY rows straight to Kafka as read events (sinks/loadfast.py).",
    -1, NULL,
};

PyMODINIT_FUNC
PyInit__loadfast(void)
{
    if (PyType_Ready(&ProducerType) < 0 || PyType_Ready(&TableType) < 0
        || PyType_Ready(&JsonTableType) < 0 || PyType_Ready(&CopyOutType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    CopyError = PyErr_NewException("sinks._loadfast.CopyError", PyExc_ConnectionError, NULL);
    if (CopyError == NULL || PyModule_AddObjectRef(m, "CopyError", CopyError) < 0)
        goto error;
    ProduceError = PyErr_NewException("sinks._loadfast.ProduceError", PyExc_RuntimeError, NULL);
    if (ProduceError == NULL || PyModule_AddObjectRef(m, "ProduceError", ProduceError) < 0)
        goto error;
    const char *names[] = {"FALLBACK", "TEXT", "INT", "LONG", "BOOLEAN", "FLOAT", "DOUBLE",
                           "NUMERIC", "DATE", "TIMESTAMP", "INT_ARRAY"};
    for (int i = 0; i < K_COUNT; i++)
        if (PyModule_AddIntConstant(m, names[i], i) < 0)
            goto error;
    const char *json_names[] = {"JSON_FALLBACK", "JSON_STRING", "JSON_INTEGER", "JSON_BOOLEAN",
                                "JSON_FLOAT", "JSON_NUMERIC", "JSON_NUMERIC_VARIABLE",
                                "JSON_DATE_DAYS", "JSON_TIME_MICROS", "JSON_TIME_MILLIS",
                                "JSON_TS_MICROS", "JSON_TS_MILLIS", "JSON_TSTZ", "JSON_BASE64",
                                "JSON_UUID", "JSON_INT_ARRAY", "JSON_FLOAT_BARE",
                                "JSON_TEXT_NUMERIC", "JSON_ISO_DATE", "JSON_ISO_TIMESTAMP"};
    for (int i = 0; i < J_COUNT; i++)
        if (PyModule_AddIntConstant(m, json_names[i], i) < 0)
            goto error;
    Py_INCREF(&ProducerType);
    if (PyModule_AddObject(m, "Producer", (PyObject *)&ProducerType) < 0)
        goto error;
    Py_INCREF(&CopyOutType);
    if (PyModule_AddObject(m, "CopyOut", (PyObject *)&CopyOutType) < 0)
        goto error;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0)
        goto error;
    Py_INCREF(&JsonTableType);
    if (PyModule_AddObject(m, "JsonTable", (PyObject *)&JsonTableType) < 0)
        goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
