/*
 * sinks._fastjson: a change event's JSON key and value in Debezium's encoding, compiled.
 *
 * encode_pgcdc does the same for pgcdc's own JSON (--json-mode pgcdc, _Shape).
 *
 * sinks/envelope.py's _DebeziumShape builds the same text in Python: the envelope's
 * constant parts (made once per table version and server name, handed in as `spec`),
 * the event's numbers, and each image's columns converted as sinks/debezium_json.py
 * says.  encode() writes the whole key and value here; the common values are written
 * in C (None, bool, int, float, str, lists of those; and by the column's kind a
 * numeric(p,s) Decimal in precise mode, a date as days, a time or timestamp as milli- or
 * microseconds, a timestamptz in UTC as ISO 8601, bytea as base64).  Anything else goes
 * through the column's Python converter and, for what C does not write, the Python
 * encoder's own _dumps, so bytes and errors are those of the Python path.
 * tests/unit/test_fastjson.py compares both paths.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

static PyObject *DecimalType;
static PyObject *dumps;  /* sinks.envelope._dumps, set by init() */

enum {
    K_PLAIN, K_NUMERIC, K_DATE_DAYS, K_TIME_MICROS, K_TIME_MILLIS, K_TS_MICROS, K_TS_MILLIS,
    K_TSTZ, K_FLOAT, K_BASE64
};

/* --- a growable buffer ----------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
    int heap;  /* data was allocated here (else it is the caller's stack array) */
} Buf;

static inline int
buf_reserve(Buf *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 256;
    while (capacity < b->size + more)
        capacity *= 2;
    char *data = b->heap ? PyMem_Realloc(b->data, (size_t)capacity)
                         : PyMem_Malloc((size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (!b->heap && b->size)
        memcpy(data, b->data, (size_t)b->size);
    b->data = data;
    b->capacity = capacity;
    b->heap = 1;
    return 0;
}

static inline int
put(Buf *b, const char *text, Py_ssize_t size)
{
    if (buf_reserve(b, size) < 0)
        return -1;
    memcpy(b->data + b->size, text, (size_t)size);
    b->size += size;
    return 0;
}

static int
put_byte(Buf *b, char c)
{
    if (buf_reserve(b, 1) < 0)
        return -1;
    b->data[b->size++] = c;
    return 0;
}

static int
put_utf8(Buf *b, PyObject *text)
{
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(text, &size);
    if (data == NULL)
        return -1;
    return put(b, data, size);
}

#include "_jsonbuf.h"

static int
put_fixed(Buf *b, long n, int width)
{
    if (buf_reserve(b, width) < 0)
        return -1;
    for (int i = width - 1; i >= 0; i--) {
        b->data[b->size + i] = (char)('0' + n % 10);
        n /= 10;
    }
    b->size += width;
    return 0;
}

/* a date's (or datetime's) 2024-02-29 */
static int
put_date(Buf *b, PyObject *v)
{
    return put_fixed(b, PyDateTime_GET_YEAR(v), 4) < 0 || put_byte(b, '-') < 0
        || put_fixed(b, PyDateTime_GET_MONTH(v), 2) < 0 || put_byte(b, '-') < 0
        || put_fixed(b, PyDateTime_GET_DAY(v), 2) < 0 ? -1 : 0;
}

/* a datetime's 2024-02-29T13:14:15, to the second */
static int
put_date_time(Buf *b, PyObject *v)
{
    return put_date(b, v) < 0 || put_byte(b, 'T') < 0
        || put_fixed(b, PyDateTime_DATE_GET_HOUR(v), 2) < 0 || put_byte(b, ':') < 0
        || put_fixed(b, PyDateTime_DATE_GET_MINUTE(v), 2) < 0 || put_byte(b, ':') < 0
        || put_fixed(b, PyDateTime_DATE_GET_SECOND(v), 2) < 0 ? -1 : 0;
}

/* --- values by column kind -------------------------------------------------------------- */

/* 1: a numeric(p,s) Decimal written as its unscaled value's two's complement in base64;
 * 0: not one C writes (special, too many digits, more decimal places than the scale) */
static int
put_numeric(Buf *b, PyObject *value, int scale)
{
    PyObject *text = PyObject_Str(value);
    if (text == NULL)
        return -1;
    Py_ssize_t size;
    const char *s = PyUnicode_AsUTF8AndSize(text, &size);
    if (s == NULL) {
        Py_DECREF(text);
        return -1;
    }
    unsigned __int128 u = 0;
    int negative = 0, digits = 0, fraction = 0, seen_point = 0, exponent = 0, ok = 1;
    Py_ssize_t i = 0;
    if (i < size && (s[i] == '-' || s[i] == '+'))
        negative = s[i++] == '-';
    if (i >= size)
        ok = 0;
    for (; ok && i < size; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') {
            if (digits >= 38) {
                ok = 0;
                break;
            }
            u = u * 10 + (unsigned)(c - '0');
            if (u)
                digits++;
            if (seen_point)
                fraction++;
        } else if (c == '.' && !seen_point) {
            seen_point = 1;
        } else if (c == 'E' || c == 'e') {
            char *end;
            long e = strtol(s + i + 1, &end, 10);
            if (end != s + size || e > 1000 || e < -1000)
                ok = 0;
            exponent = (int)e;
            break;
        } else {
            ok = 0;  /* NaN, Infinity */
        }
    }
    Py_DECREF(text);
    if (!ok)
        return 0;
    if (!rescale(&u, scale - fraction + exponent))
        return 0;
    return put_twos_complement(b, u, negative) < 0 ? -1 : 1;
}

static long long
time_micros(int h, int m, int s, int us)
{
    return ((long long)(h * 60 + m) * 60 + s) * 1000000LL + us;
}

static int
put_fraction(Buf *b, int us, int width)
{
    if (width == 0) {  /* without trailing zeros, none for 0 */
        if (us == 0)
            return 0;
        int n = 6;
        while (us % 10 == 0) {
            us /= 10;
            n--;
        }
        return put_byte(b, '.') < 0 ? -1 : put_fixed(b, us, n);
    }
    if (put_byte(b, '.') < 0)
        return -1;
    char digits[6];
    for (int i = 5; i >= 0; i--) {
        digits[i] = (char)('0' + us % 10);
        us /= 10;
    }
    return put(b, digits, width > 6 ? 6 : width);
}

/* 1 written, 0 not a value this kind writes in C, -1 error */
static int
put_kind(Buf *b, int kind, int arg, PyObject *v)
{
    switch (kind) {
    case K_NUMERIC:
        if (Py_TYPE(v) == (PyTypeObject *)DecimalType)
            return put_numeric(b, v, arg);
        return 0;
    case K_DATE_DAYS:
        if (PyDate_CheckExact(v))
            return put_ll(b, days_from_civil(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v),
                                             PyDateTime_GET_DAY(v))) < 0 ? -1 : 1;
        return 0;
    case K_TIME_MICROS:
    case K_TIME_MILLIS:
        if (PyTime_CheckExact(v)) {
            long long us = time_micros(PyDateTime_TIME_GET_HOUR(v), PyDateTime_TIME_GET_MINUTE(v),
                                       PyDateTime_TIME_GET_SECOND(v),
                                       PyDateTime_TIME_GET_MICROSECOND(v));
            return put_ll(b, kind == K_TIME_MILLIS ? us / 1000 : us) < 0 ? -1 : 1;
        }
        return 0;
    case K_TS_MICROS:
    case K_TS_MILLIS:
        if (PyDateTime_CheckExact(v) && PyDateTime_DATE_GET_TZINFO(v) == Py_None) {
            long long us = days_from_civil(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v),
                                           PyDateTime_GET_DAY(v)) * 86400000000LL
                + time_micros(PyDateTime_DATE_GET_HOUR(v), PyDateTime_DATE_GET_MINUTE(v),
                              PyDateTime_DATE_GET_SECOND(v),
                              PyDateTime_DATE_GET_MICROSECOND(v));
            return put_ll(b, kind == K_TS_MILLIS ? floor_div(us, 1000) : us) < 0 ? -1 : 1;
        }
        return 0;
    case K_TSTZ:
        if (PyDateTime_CheckExact(v) && PyDateTime_DATE_GET_TZINFO(v) == PyDateTime_TimeZone_UTC) {
            if (put_byte(b, '"') < 0 || put_date_time(b, v) < 0
                    || put_fraction(b, PyDateTime_DATE_GET_MICROSECOND(v), arg) < 0
                    || PUTS(b, "Z\"") < 0)
                return -1;
            return 1;
        }
        return 0;
    case K_FLOAT:
        if (PyFloat_CheckExact(v))
            return put_float(b, PyFloat_AS_DOUBLE(v), 1) < 0 ? -1 : 1;
        return 0;
    case K_BASE64:
        if (PyBytes_CheckExact(v))
            return put_base64(b, (const unsigned char *)PyBytes_AS_STRING(v),
                              PyBytes_GET_SIZE(v)) < 0 ? -1 : 1;
        return 0;
    }
    return 0;
}

/* one column: kind and arg (ints), the Python converter (or None), the placeholder's JSON */
static int
put_column(Buf *b, PyObject *column, PyObject *v)
{
    int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(column, 2));
    int arg = (int)PyLong_AsLong(PyTuple_GET_ITEM(column, 3));
    PyObject *convert = PyTuple_GET_ITEM(column, 4);
    if (kind != K_PLAIN) {
        Py_ssize_t start = b->size;
        int done = put_kind(b, kind, arg, v);
        if (done != 0)
            return done < 0 ? -1 : 0;
        b->size = start;
    }
    if (convert == Py_None)
        return put_native(b, v, dumps, 0);
    PyObject *converted = PyObject_CallOneArg(convert, v);
    if (converted == NULL)
        return -1;
    int rc = put_native(b, converted, dumps, 0);
    Py_DECREF(converted);
    return rc < 0 ? -1 : 0;
}

/* an image: every column in order, null when absent, the placeholder when unchanged */
static int
put_row(Buf *b, PyObject *columns, PyObject *row, PyObject *unchanged)
{
    if (row == Py_None)
        return PUTS(b, "null");
    if (!PyDict_Check(row)) {
        PyErr_SetString(PyExc_TypeError, "an image is a dict");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(columns);
    if (n == 0)
        return PUTS(b, "{}");
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *column = PyTuple_GET_ITEM(columns, i);
        if (put_utf8(b, PyTuple_GET_ITEM(column, 0)) < 0)
            return -1;
        PyObject *name = PyTuple_GET_ITEM(column, 1);
        PyObject *v = PyDict_GetItemWithError(row, name);
        if (v == NULL) {
            if (PyErr_Occurred())
                return -1;
            int is_unchanged = unchanged == NULL ? 0 : PySequence_Contains(unchanged, name);
            if (is_unchanged < 0)
                return -1;
            if (is_unchanged ? put_utf8(b, PyTuple_GET_ITEM(column, 5)) < 0
                             : PUTS(b, "null") < 0)
                return -1;
            continue;
        }
        if (v == Py_None) {
            if (PUTS(b, "null") < 0)
                return -1;
            continue;
        }
        if (put_column(b, column, v) < 0)
            return -1;
    }
    return put_byte(b, '}');
}

static int
get_ll(PyObject *event, Py_ssize_t index, long long *out)
{
    PyObject *v = PyTuple_GET_ITEM(event, index);
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return overflow ? 0 : 1;
}

/* the event's commit_lsn, lsn, ordinal, xid and commit_time: 1, or 0 when one is not a
 * plain int of 64 bits (the Python path writes those), -1 on error */
static int
event_numbers(PyObject *event, long long *commit_lsn, long long *lsn, long long *ordinal,
              long long *xid, long long *commit_time)
{
    int got;
    if ((got = get_ll(event, 5, commit_lsn)) <= 0 || (got = get_ll(event, 6, lsn)) <= 0
            || (got = get_ll(event, 7, ordinal)) <= 0 || (got = get_ll(event, 8, xid)) <= 0
            || (got = get_ll(event, 9, commit_time)) <= 0)
        return got;
    return 1;
}

/* the key: the key columns of ``image`` (a dict, or None: {}), each value by its column's
 * kind (Debezium's) or as decoded (pgcdc's own JSON) */
static int put_decoded(Buf *b, PyObject *v);

static int
put_key(Buf *key, PyObject *keys, PyObject *image, int decoded)
{
    if (image == Py_None || PyTuple_GET_SIZE(keys) == 0)
        return PUTS(key, "{}");
    if (!PyDict_Check(image)) {
        PyErr_SetString(PyExc_TypeError, "an image is a dict");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++) {
        PyObject *column = PyTuple_GET_ITEM(keys, i);
        if (put_utf8(key, PyTuple_GET_ITEM(column, 0)) < 0)
            return -1;
        PyObject *v = PyDict_GetItemWithError(image, PyTuple_GET_ITEM(column, 1));
        if (v == NULL && PyErr_Occurred())
            return -1;
        if (decoded ? put_decoded(key, v == NULL ? Py_None : v) < 0
                    : (v == NULL || v == Py_None) ? PUTS(key, "null") < 0
                    : put_column(key, column, v) < 0)
            return -1;
    }
    return put_byte(key, '}');
}

/* (key, value) as bytes */
static PyObject *
pack(Buf *key, Buf *value)
{
    PyObject *key_bytes = PyBytes_FromStringAndSize(key->data, key->size);
    PyObject *value_bytes = key_bytes == NULL ? NULL
        : PyBytes_FromStringAndSize(value->data, value->size);
    PyObject *result = value_bytes == NULL ? NULL : PyTuple_Pack(2, key_bytes, value_bytes);
    Py_XDECREF(key_bytes);
    Py_XDECREF(value_bytes);
    return result;
}

/* frees what the buffers allocated; returns result */
static PyObject *
release(Buf *key, Buf *value, PyObject *result)
{
    if (key->heap)
        PyMem_Free(key->data);
    if (value->heap)
        PyMem_Free(value->data);
    return result;
}

#define PG_EPOCH_OFFSET_US 946684800000000LL
#define PART(i) PyTuple_GET_ITEM(parts, i)

/*
 * encode(spec, event, now_ms) -> (key, value); fallback(event, now_ms) gives them when the
 * event's numbers are not plain ints of 64 bits (the Python path writes those).
 * spec: (columns, key_columns, parts, fallback); a column is (prefix, name, kind, arg, convert,
 * placeholder); parts the envelope's constant texts (see sinks/envelope.py).
 */
static PyObject *
encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_CheckExact(args[0]) || !PyTuple_Check(args[1])
            || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode(spec: tuple, event: tuple, now_ms: int)");
        return NULL;
    }
    PyObject *spec = args[0], *event = args[1];
    long long now_ms = PyLong_AsLongLong(args[2]);
    if (now_ms == -1 && PyErr_Occurred())
        return NULL;
    if (PyTuple_GET_SIZE(spec) != 4 || PyTuple_GET_SIZE(event) != 10) {
        PyErr_SetString(PyExc_ValueError, "encode(spec, event, now_ms): wrong shapes");
        return NULL;
    }
    PyObject *fallback = PyTuple_GET_ITEM(spec, 3);
    /* an event of a subclass of ChangeEvent (a marked read: sinks/snapshot_marks.py) */
    if (!PyTuple_CheckExact(event) && Py_TYPE(event)->tp_base != &PyTuple_Type)
        return PyObject_CallFunctionObjArgs(fallback, event, args[2], NULL);
    PyObject *columns = PyTuple_GET_ITEM(spec, 0), *keys = PyTuple_GET_ITEM(spec, 1);
    PyObject *parts = PyTuple_GET_ITEM(spec, 2);
    long long commit_lsn, lsn, ordinal, xid, commit_time;
    int got = event_numbers(event, &commit_lsn, &lsn, &ordinal, &xid, &commit_time);
    if (got <= 0) {
        if (got < 0)
            return NULL;
        goto python;
    }
    long long commit_us = commit_time + PG_EPOCH_OFFSET_US;
    if (commit_us <= 0 || commit_us > 9000000000000000LL || now_ms <= 0
            || now_ms > 9000000000000LL)
        goto python;
    PyObject *op = PyTuple_GET_ITEM(event, 0), *before = PyTuple_GET_ITEM(event, 2);
    PyObject *after = PyTuple_GET_ITEM(event, 3), *unchanged = PyTuple_GET_ITEM(event, 4);
    if (!PyUnicode_CheckExact(op) || !PyTuple_CheckExact(unchanged))
        goto python;
    /* on the stack while they fit: most events need no allocation */
    char key_space[256], value_space[4096];
    Buf key = {key_space, 0, sizeof key_space, 0};
    Buf value = {value_space, 0, sizeof value_space, 0};
    PyObject *result = NULL;

    if (put_key(&key, keys, after != Py_None ? after : before, 0) < 0)
        goto done;

    int read = PyUnicode_GET_LENGTH(op) == 1 && PyUnicode_READ_CHAR(op, 0) == 'r';
    /* each number's text once: ts_us and ts_ns are the microseconds and "000" */
    char us_text[32], now_text[32], commit_text[24], lsn_text[24];
    int us_size = format_ll(us_text, commit_us), now_size = format_ll(now_text, now_ms);
    int commit_size = format_ll(commit_text, commit_lsn), lsn_size = format_ll(lsn_text, lsn);
    if (PUTS(&value, "{\"before\":") < 0 || put_row(&value, columns, before, NULL) < 0
            || PUTS(&value, ",\"after\":") < 0
            || put_row(&value, columns, after, PyTuple_GET_SIZE(unchanged) ? unchanged : NULL) < 0
            || put_utf8(&value, PART(0)) < 0 || put_ll(&value, commit_us / 1000) < 0
            || (read ? PUTS(&value, ",\"snapshot\":\"true\"")
                     : PUTS(&value, ",\"snapshot\":\"false\"")) < 0
            || put_utf8(&value, PART(1)) < 0  /* ,"db":...,"sequence":"[\" */
            || put(&value, commit_text, commit_size) < 0 || PUTS(&value, "\\\",\\\"") < 0
            || put(&value, lsn_text, lsn_size) < 0 || PUTS(&value, "\\\"]\",\"ts_us\":") < 0
            || put(&value, us_text, us_size) < 0 || PUTS(&value, ",\"ts_ns\":") < 0
            || put(&value, us_text, us_size) < 0 || PUTS(&value, "000") < 0
            || put_utf8(&value, PART(2)) < 0)  /* ,"schema":...,"txId": */
        goto done;
    if ((xid ? put_ll(&value, xid) : PUTS(&value, "null")) < 0
            || PUTS(&value, ",\"lsn\":") < 0 || put(&value, lsn_text, lsn_size) < 0
            || put_utf8(&value, PART(3)) < 0 || put(&value, commit_text, commit_size) < 0
            || PUTS(&value, ",\"ordinal\":") < 0 || put_ll(&value, ordinal) < 0
            || put_utf8(&value, PART(4)) < 0 || put_native(&value, op, dumps, 0) < 0
            || PUTS(&value, ",\"ts_ms\":") < 0 || put(&value, now_text, now_size) < 0
            || PUTS(&value, ",\"ts_us\":") < 0 || put(&value, now_text, now_size) < 0
            || PUTS(&value, "000,\"ts_ns\":") < 0 || put(&value, now_text, now_size) < 0
            || PUTS(&value, "000000,\"unchanged\":[") < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(unchanged); i++) {
        PyObject *name = PyTuple_GET_ITEM(unchanged, i);
        if ((i && put_byte(&value, ',') < 0) || put_native(&value, name, dumps, 0) < 0)
            goto done;
    }
    if (PUTS(&value, "]}") < 0)
        goto done;
    result = pack(&key, &value);
done:
    return release(&key, &value, result);
python:  /* numbers this code does not write: the Python path, fallback(event, now_ms) */
    return PyObject_CallFunctionObjArgs(fallback, event, args[2], NULL);
}

/* a decoded value as _dumps writes it: a Decimal and a date, time or datetime as the JSON
 * string of str() and isoformat() (sinks/envelope.py _json_form), without _dumps' call (a
 * date, and a datetime naive or in UTC, written here) */
static int
put_decoded(Buf *b, PyObject *v)
{
    PyObject *text = NULL;
    if (PyDateTime_CheckExact(v) && (PyDateTime_DATE_GET_TZINFO(v) == Py_None
                                     || PyDateTime_DATE_GET_TZINFO(v) == PyDateTime_TimeZone_UTC)) {
        /* isoformat(): 2024-02-29T13:14:15[.123456][+00:00] */
        int us = PyDateTime_DATE_GET_MICROSECOND(v);
        if (put_byte(b, '"') < 0 || put_date_time(b, v) < 0
                || (us && (put_byte(b, '.') < 0 || put_fixed(b, us, 6) < 0))
                || (PyDateTime_DATE_GET_TZINFO(v) != Py_None && PUTS(b, "+00:00") < 0))
            return -1;
        return put_byte(b, '"');
    }
    if (PyDate_CheckExact(v)) {  /* 2024-02-29 */
        if (put_byte(b, '"') < 0 || put_date(b, v) < 0)
            return -1;
        return put_byte(b, '"');
    }
    if (Py_TYPE(v) == (PyTypeObject *)DecimalType)
        text = PyObject_Str(v);
    else if (PyDateTime_CheckExact(v) || PyTime_CheckExact(v))  /* another zone; a time */
        text = PyObject_CallMethod(v, "isoformat", NULL);
    else
        return put_native(b, v, dumps, 0);
    if (text == NULL)
        return -1;
    Py_ssize_t size;
    const char *data = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &size) : NULL;
    int rc = data == NULL ? -1 : put_json_string(b, data, size);
    Py_DECREF(text);
    return rc;
}

/* an image (a dict of column name to decoded value) as _dumps writes it */
static int
put_image(Buf *b, PyObject *row)
{
    if (row == Py_None)
        return PUTS(b, "null");
    if (!PyDict_CheckExact(row))
        return put_native(b, row, dumps, 0);
    PyObject *name, *v;
    Py_ssize_t pos = 0, start = b->size;
    int first = 1;
    if (put_byte(b, '{') < 0)
        return -1;
    while (PyDict_Next(row, &pos, &name, &v)) {
        if (!PyUnicode_CheckExact(name)) {  /* a name of another type: as json writes it */
            b->size = start;
            return put_native(b, row, dumps, 0);
        }
        if ((!first && put_byte(b, ',') < 0) || put_native(b, name, dumps, 0) < 0
                || put_byte(b, ':') < 0 || put_decoded(b, v) < 0)
            return -1;
        first = 0;
    }
    return put_byte(b, '}');
}

/*
 * encode_pgcdc(spec, event, now_ms) -> (key, value) in pgcdc's own JSON (--json-mode pgcdc):
 * the text of sinks/envelope.py's _Shape.value and key, whose images are the decoded rows
 * as _dumps writes them (values C does not write go through _dumps one by one, which is
 * the same text).  spec: (key_columns, parts, fallback); a key column is (prefix, name);
 * parts the envelope's constant texts, in the order they are written (see _Shape.spec).
 */
static PyObject *
encode_pgcdc(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_CheckExact(args[0]) || !PyTuple_Check(args[1])
            || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode_pgcdc(spec: tuple, event: tuple, now_ms: int)");
        return NULL;
    }
    PyObject *spec = args[0], *event = args[1];
    if (PyTuple_GET_SIZE(spec) != 3 || PyTuple_GET_SIZE(event) != 10
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(spec, 1))
            || PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 1)) != 12) {
        PyErr_SetString(PyExc_ValueError, "encode_pgcdc(spec, event, now_ms): wrong shapes");
        return NULL;
    }
    PyObject *keys = PyTuple_GET_ITEM(spec, 0), *parts = PyTuple_GET_ITEM(spec, 1);
    PyObject *fallback = PyTuple_GET_ITEM(spec, 2);
    /* an event of a subclass of ChangeEvent (a marked read: sinks/snapshot_marks.py) */
    if (!PyTuple_CheckExact(event) && Py_TYPE(event)->tp_base != &PyTuple_Type)
        return PyObject_CallFunctionObjArgs(fallback, event, args[2], NULL);
    long long now_ms, commit_lsn, lsn, ordinal, xid, commit_time;
    int got = event_numbers(event, &commit_lsn, &lsn, &ordinal, &xid, &commit_time);
    if (got <= 0) {
        if (got < 0)
            return NULL;
        goto python;
    }
    if (!PyLong_CheckExact(args[2]))
        goto python;
    int overflow;
    now_ms = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (now_ms == -1 && PyErr_Occurred())
        return NULL;
    /* commit_time + the epoch's offset must not overflow (then Python's ints write it) */
    if (overflow || commit_time > 9000000000000000000LL - PG_EPOCH_OFFSET_US
            || commit_time < -9000000000000000000LL)
        goto python;
    PyObject *op = PyTuple_GET_ITEM(event, 0), *before = PyTuple_GET_ITEM(event, 2);
    PyObject *after = PyTuple_GET_ITEM(event, 3), *unchanged = PyTuple_GET_ITEM(event, 4);
    if (!PyUnicode_CheckExact(op) || !PyTuple_CheckExact(unchanged))
        goto python;
    char key_space[256], value_space[4096];
    Buf key = {key_space, 0, sizeof key_space, 0};
    Buf value = {value_space, 0, sizeof value_space, 0};
    PyObject *result = NULL;

    if (put_key(&key, keys, after != Py_None ? after : before, 1) < 0)
        goto done;

    int read = PyUnicode_GET_LENGTH(op) == 1 && PyUnicode_READ_CHAR(op, 0) == 'r';
    if (put_utf8(&value, PART(0)) < 0  /* {"before": */
            || put_image(&value, before) < 0
            || put_utf8(&value, PART(1)) < 0  /* ,"after": */
            || put_image(&value, after) < 0
            || put_utf8(&value, PART(2)) < 0  /* the source's head, up to its ts_ms */
            || put_ll(&value, floor_div(commit_time + PG_EPOCH_OFFSET_US, 1000)) < 0
            || put_utf8(&value, PART(read ? 4 : 3)) < 0  /* snapshot ... txId: */
            || put_ll(&value, xid) < 0
            || put_utf8(&value, PART(5)) < 0 || put_ll(&value, lsn) < 0  /* ,"lsn": */
            || put_utf8(&value, PART(6)) < 0 || put_ll(&value, commit_lsn) < 0
            || put_utf8(&value, PART(7)) < 0 || put_ll(&value, ordinal) < 0  /* ,"ordinal": */
            || put_utf8(&value, PART(8)) < 0  /* table_oid ... ,"op": */
            || put_native(&value, op, dumps, 0) < 0
            || put_utf8(&value, PART(9)) < 0 || put_ll(&value, now_ms) < 0  /* ,"ts_ms": */
            || put_utf8(&value, PART(10)) < 0)  /* ,"unchanged": */
        goto done;
    if (PyTuple_GET_SIZE(unchanged) == 0) {
        if (PUTS(&value, "[]") < 0)
            goto done;
    } else {
        if (put_byte(&value, '[') < 0)
            goto done;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(unchanged); i++)
            if ((i && put_byte(&value, ',') < 0)
                    || put_native(&value, PyTuple_GET_ITEM(unchanged, i), dumps, 0) < 0)
                goto done;
        if (put_byte(&value, ']') < 0)
            goto done;
    }
    if (put_utf8(&value, PART(11)) < 0)  /* } */
        goto done;
    result = pack(&key, &value);
done:
    return release(&key, &value, result);
python:  /* numbers this code does not write: the Python path, fallback(event, now_ms) */
    return PyObject_CallFunctionObjArgs(fallback, event, args[2], NULL);
}

static PyObject *
init(PyObject *self, PyObject *args)
{
    PyObject *decimal, *function;
    if (!PyArg_ParseTuple(args, "OO", &decimal, &function))
        return NULL;
    Py_XSETREF(DecimalType, Py_NewRef(decimal));
    Py_XSETREF(dumps, Py_NewRef(function));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(spec, event, now_ms) -> (key, value) in Debezium's JSON, or None"},
    {"encode_pgcdc", (PyCFunction)(void (*)(void))encode_pgcdc, METH_FASTCALL,
     "encode_pgcdc(spec, event, now_ms) -> (key, value) in pgcdc's own JSON"},
    {"init", init, METH_VARARGS, "init(Decimal, dumps): the types and fallback encode needs"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastjson",
    "A change event's JSON key and value in Debezium's encoding (sinks/envelope.py).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__fastjson(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    return PyModule_Create(&module);
}
