/*
 * sinks._fastavro: a change event's Avro key and value in one call, compiled.
 *
 * The profile of the Kafka path (docs/benchmarks.md, "decoder into Kafka") shows the
 * Avro encoding as the largest single cost of the sink after librdkafka's produce():
 * a dozen Python-level calls per event for the envelope's longs, and for every column
 * typed as string in the schema (numeric, timestamptz, arrays, ...) a Python call chain
 * that turns the typed value back into its text.  encode() does the whole event in C:
 * the key record, the Row records, the envelope, and the text of the common typed
 * values (Decimal, a datetime in UTC or without zone, a date, a list of ints); anything
 * else goes to the same Python function sinks/avro.py uses (text_of, or the column's
 * writer), so the bytes and the errors are those of the Python encoder.
 * tests/unit/test_avro.py checks both encoders against fastavro with hypothesis.
 *
 * Avro binary: a long or int is a zigzag varint, a double little-endian IEEE, bytes
 * and strings their length (a long) then the data; a union is its branch index (a
 * long) then the value; a record its fields in order; an array a block count, the
 * items, then 0.  Every column is a union of null (branch 0) and its type (branch 1).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

static PyObject *DecimalType;

enum { AVRO_BOOLEAN, AVRO_INT, AVRO_LONG, AVRO_FLOAT, AVRO_DOUBLE, AVRO_BYTES, AVRO_STRING };
/* typed Avro's columns (--avro-types logical, sinks/avro_logical.py KINDS): a date, a
 * timestamp without and with zone (UTC), a time, in microseconds; an array of ints or
 * longs; a decimal(p,s) as AVRO_DECIMAL + p * 64 + s.  What these cases do not take (text
 * the decoder kept, a NaN, a nested array, ...) goes to the column's Python writer. */
enum { AVRO_DATE = 7, AVRO_TIMESTAMP_LOCAL, AVRO_TIMESTAMP_UTC, AVRO_TIME, AVRO_INT_ARRAY,
       AVRO_LONG_ARRAY, AVRO_DECIMAL = 1000 };

#include "_avrobuf.h"

static int
put_str(Buf *b, PyObject *text)
{
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(text, &size);
    if (data == NULL)
        return -1;
    return put_text(b, data, size);
}

/* --- the text of common typed values, as sinks/envelope.py's text_of gives it ---------- */

/* the decimal digits of n (as str(n)); returns their count, at most 20 */
static int
format_int(char *out, long long n)
{
    char digits[20];
    int size = 0, at = 0;
    unsigned long long u = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
    do {
        digits[size++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (n < 0)
        out[at++] = '-';
    while (size)
        out[at++] = digits[--size];
    return at;
}

/* n as exactly width digits (0 <= n < 10**width) */
static char *
format_fixed(char *out, int n, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        out[i] = (char)('0' + n % 10);
        n /= 10;
    }
    return out + width;
}

/* 1: written to b; 0: not an int list this code writes (b unchanged); -1: error */
static int
json_int_list(Buf *b, PyObject *list, int depth)
{
    if (depth > 16)
        return 0;
    Py_ssize_t start = b->size, n = PyList_GET_SIZE(list);
    if (put_byte(b, '[') < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (i > 0 && put_byte(b, ',') < 0)
            return -1;
        if (item == Py_None) {
            if (put(b, "null", 4) < 0)
                return -1;
        }
        else if (PyLong_CheckExact(item)) {
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (v == -1 && PyErr_Occurred())
                return -1;
            if (overflow) {
                b->size = start;
                return 0;
            }
            char digits[24];
            int size = format_int(digits, v);
            if (put(b, digits, size) < 0)
                return -1;
        }
        else if (PyList_CheckExact(item)) {
            int done = json_int_list(b, item, depth + 1);
            if (done <= 0) {
                if (done == 0)
                    b->size = start;
                return done;
            }
        }
        else {
            b->size = start;
            return 0;
        }
    }
    if (put_byte(b, ']') < 0)
        return -1;
    return 1;
}

/* datetime.isoformat() / date.isoformat() of an exact datetime or date, years 1-9999; 0
 * when the value has a time zone other than UTC (its offset needs the tzinfo's own code) */
static int
iso_text(PyObject *value, char *out, int *size)
{
    char *at = out;
    at = format_fixed(at, PyDateTime_GET_YEAR(value), 4);
    *at++ = '-';
    at = format_fixed(at, PyDateTime_GET_MONTH(value), 2);
    *at++ = '-';
    at = format_fixed(at, PyDateTime_GET_DAY(value), 2);
    if (!PyDate_CheckExact(value)) {
        PyObject *tz = PyDateTime_DATE_GET_TZINFO(value);
        if (tz != Py_None && tz != PyDateTime_TimeZone_UTC)
            return 0;
        *at++ = 'T';
        at = format_fixed(at, PyDateTime_DATE_GET_HOUR(value), 2);
        *at++ = ':';
        at = format_fixed(at, PyDateTime_DATE_GET_MINUTE(value), 2);
        *at++ = ':';
        at = format_fixed(at, PyDateTime_DATE_GET_SECOND(value), 2);
        int us = PyDateTime_DATE_GET_MICROSECOND(value);
        if (us) {
            *at++ = '.';
            at = format_fixed(at, us, 6);
        }
        if (tz == PyDateTime_TimeZone_UTC) {
            memcpy(at, "+00:00", 6);
            at += 6;
        }
    }
    *size = (int)(at - out);
    return 1;
}

/* a column typed as string: the union branch, then the value's text */
static int
put_string_column(Buf *b, Buf *scratch, PyObject *value, PyObject *text_of)
{
    if (put_byte(b, 2) < 0)
        return -1;
    if (PyUnicode_CheckExact(value))
        return put_str(b, value);
    if (Py_TYPE(value) == (PyTypeObject *)DecimalType) {
        PyObject *text = PyObject_Str(value);
        if (text == NULL)
            return -1;
        int rc = put_str(b, text);
        Py_DECREF(text);
        return rc;
    }
    if (PyDateTime_CheckExact(value) || PyDate_CheckExact(value)) {
        char text[64];
        int size;
        if (iso_text(value, text, &size))
            return put_text(b, text, size);
    }
    else if (PyList_CheckExact(value)) {
        scratch->size = 0;
        int done = json_int_list(scratch, value, 0);
        if (done < 0)
            return -1;
        if (done)
            return put_text(b, scratch->data, scratch->size);
    }
    PyObject *text = PyObject_CallOneArg(text_of, value);
    if (text == NULL)
        return -1;
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "text_of returned %R, not a str", (PyObject *)Py_TYPE(text));
        Py_DECREF(text);
        return -1;
    }
    int rc = put_str(b, text);
    Py_DECREF(text);
    return rc;
}


/* --- typed Avro's values ------------------------------------------------------------- */

/* days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil) */
static int64_t
days_from_civil(int64_t y, int64_t m, int64_t d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int
put_long_branch(Buf *b, int64_t n)
{
    if (put_byte(b, 2) < 0 || put_varint(b, zigzag(n)) < 0)
        return -1;
    return 1;
}

/* a decimal(p,s) from str(Decimal): digits with exactly s after the point, at most 18
 * and at most p significant ones; 0 for anything else (NaN, an exponent, more digits) */
static int
put_decimal(Buf *b, PyObject *value, int precision, int scale)
{
    if (Py_TYPE(value) != (PyTypeObject *)DecimalType)
        return 0;
    PyObject *text = PyObject_Str(value);
    if (text == NULL)
        return -1;
    Py_ssize_t size;
    const char *s = PyUnicode_AsUTF8AndSize(text, &size);
    if (s == NULL) {
        Py_DECREF(text);
        return -1;
    }
    Py_ssize_t i = 0;
    int negative = 0, fraction = -1, digits = 0, ok = 1;
    int64_t n = 0;
    if (i < size && s[i] == '-') {
        negative = 1;
        i++;
    }
    if (i == size)
        ok = 0;
    for (; i < size && ok; i++) {
        char c = s[i];
        if (c == '.' && fraction < 0) {
            fraction = 0;
            continue;
        }
        if (c < '0' || c > '9') {
            ok = 0;
            break;
        }
        if (fraction >= 0)
            fraction++;
        if (n != 0 || c != '0')
            digits++;
        if (digits > 18 || digits > precision) {
            ok = 0;
            break;
        }
        n = n * 10 + (c - '0');
    }
    Py_DECREF(text);
    if (!ok || (fraction < 0 ? 0 : fraction) != scale)
        return 0;
    if (negative)
        n = -n;
    int k = 1;
    while (k < 8 && !(n >= -((int64_t)1 << (8 * k - 1)) && n < ((int64_t)1 << (8 * k - 1))))
        k++;
    unsigned char raw[10];
    raw[0] = 2;
    raw[1] = (unsigned char)(k << 1);
    for (int j = 0; j < k; j++)
        raw[2 + j] = (unsigned char)((uint64_t)n >> (8 * (k - 1 - j)));
    return put(b, raw, 2 + k) < 0 ? -1 : 1;
}

/* an array of ints or longs, each item null or a number; 0 (nothing written) when an
 * item is anything else (a nested array: the Python writer) */
static int
put_int_array(Buf *b, PyObject *value, int longs)
{
    if (!PyList_CheckExact(value))
        return 0;
    Py_ssize_t start = b->size, n = PyList_GET_SIZE(value);
    if (put_byte(b, 2) < 0)
        return -1;
    if (n > 0 && put_varint(b, zigzag(n)) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(value, i);
        if (item == Py_None) {
            if (put_byte(b, 0) < 0)
                return -1;
            continue;
        }
        int overflow = 0;
        long long x = PyLong_CheckExact(item) ? PyLong_AsLongLongAndOverflow(item, &overflow)
                                             : 0;
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (!PyLong_CheckExact(item) || overflow
                || (!longs && (x < INT32_MIN || x > INT32_MAX))) {
            b->size = start;
            return 0;
        }
        if (put_byte(b, 2) < 0 || put_varint(b, zigzag(x)) < 0)
            return -1;
    }
    return put_byte(b, 0) < 0 ? -1 : 1;
}

static int
put_typed(Buf *b, int kind, PyObject *value)
{
    if (kind >= AVRO_DECIMAL)
        return put_decimal(b, value, (kind - AVRO_DECIMAL) / 64, (kind - AVRO_DECIMAL) % 64);
    switch (kind) {
    case AVRO_DATE:
        if (PyDate_CheckExact(value))
            return put_long_branch(b, days_from_civil(PyDateTime_GET_YEAR(value),
                                                      PyDateTime_GET_MONTH(value),
                                                      PyDateTime_GET_DAY(value)));
        return 0;
    case AVRO_TIMESTAMP_LOCAL:
    case AVRO_TIMESTAMP_UTC:
        if (PyDateTime_CheckExact(value)) {
            PyObject *tz = PyDateTime_DATE_GET_TZINFO(value);
            if (tz != (kind == AVRO_TIMESTAMP_LOCAL ? Py_None : PyDateTime_TimeZone_UTC))
                return 0;
            int64_t days = days_from_civil(PyDateTime_GET_YEAR(value),
                                           PyDateTime_GET_MONTH(value),
                                           PyDateTime_GET_DAY(value));
            int64_t seconds = days * 86400 + PyDateTime_DATE_GET_HOUR(value) * 3600
                + PyDateTime_DATE_GET_MINUTE(value) * 60 + PyDateTime_DATE_GET_SECOND(value);
            return put_long_branch(b, seconds * 1000000
                                   + PyDateTime_DATE_GET_MICROSECOND(value));
        }
        return 0;
    case AVRO_TIME:
        if (PyTime_CheckExact(value) && PyDateTime_TIME_GET_TZINFO(value) == Py_None)
            return put_long_branch(b, ((int64_t)PyDateTime_TIME_GET_HOUR(value) * 3600
                                       + PyDateTime_TIME_GET_MINUTE(value) * 60
                                       + PyDateTime_TIME_GET_SECOND(value)) * 1000000
                                   + PyDateTime_TIME_GET_MICROSECOND(value));
        return 0;
    case AVRO_INT_ARRAY:
    case AVRO_LONG_ARRAY:
        return put_int_array(b, value, kind == AVRO_LONG_ARRAY);
    default:
        return 0;
    }
}

/* 1: written; 0: not the fast case (the Python writer decides); -1: error */
static int
put_fast(Buf *b, int kind, PyObject *value)
{
    switch (kind) {
    case AVRO_LONG:
    case AVRO_INT:
        if (PyLong_CheckExact(value)) {
            int overflow;
            long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (n == -1 && PyErr_Occurred())
                return -1;
            if (overflow || (kind == AVRO_INT && (n < INT32_MIN || n > INT32_MAX)))
                return 0;
            if (put_byte(b, 2) < 0 || put_varint(b, zigzag(n)) < 0)
                return -1;
            return 1;
        }
        return 0;
    case AVRO_BOOLEAN:
        if (value == Py_True || value == Py_False)
            return put(b, value == Py_True ? "\x02\x01" : "\x02\x00", 2) < 0 ? -1 : 1;
        return 0;
    case AVRO_DOUBLE:
        if (PyFloat_CheckExact(value)) {
            unsigned char raw[9];
            raw[0] = 2;
            if (PyFloat_Pack8(PyFloat_AS_DOUBLE(value), (char *)raw + 1, 1) < 0)
                return -1;
            return put(b, raw, 9) < 0 ? -1 : 1;
        }
        return 0;
    case AVRO_BYTES:
        if (PyBytes_CheckExact(value)) {
            if (put_byte(b, 2) < 0 || put_text(b, PyBytes_AS_STRING(value),
                                               PyBytes_GET_SIZE(value)) < 0)
                return -1;
            return 1;
        }
        return 0;
    default:
        return kind >= AVRO_DATE ? put_typed(b, kind, value) : 0;
    }
}

/* the Python writer of a column (sinks/avro.py): writer(bytearray, value) */
static int
put_by_writer(Buf *b, PyObject *writer, PyObject *value)
{
    PyObject *out = PyByteArray_FromStringAndSize(NULL, 0);
    if (out == NULL)
        return -1;
    PyObject *result = PyObject_CallFunctionObjArgs(writer, out, value, NULL);
    int rc = -1;
    if (result != NULL) {
        Py_DECREF(result);
        rc = put(b, PyByteArray_AS_STRING(out), PyByteArray_GET_SIZE(out));
    }
    Py_DECREF(out);
    return rc;
}

/* the fields of a Row or Key record: fields is a tuple of (name, kind, writer) */
static int
put_row(Buf *b, Buf *scratch, PyObject *row, PyObject *fields, PyObject *text_of)
{
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 3) {
            PyErr_SetString(PyExc_TypeError, "each field is a (name, kind, writer) triple");
            return -1;
        }
        PyObject *value = PyDict_GetItemWithError(row, PyTuple_GET_ITEM(field, 0));
        if (value == NULL && PyErr_Occurred())
            return -1;
        if (value == NULL || value == Py_None) {
            if (put_byte(b, 0) < 0)
                return -1;
            continue;
        }
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(field, 1));
        if (kind == -1 && PyErr_Occurred())
            return -1;
        if (kind == AVRO_STRING) {
            if (put_string_column(b, scratch, value, text_of) < 0)
                return -1;
            continue;
        }
        int written = put_fast(b, (int)kind, value);
        if (written < 0)
            return -1;
        if (written == 0 && put_by_writer(b, PyTuple_GET_ITEM(field, 2), value) < 0)
            return -1;
    }
    return 0;
}

/* an exact int in int64 range, else 0 (the caller falls back to the Python encoder) */
static int
as_int64(PyObject *value, int64_t *out)
{
    if (!PyLong_CheckExact(value))
        return 0;
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (n == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (overflow)
        return 0;
    *out = n;
    return 1;
}

/* floor division, as Python's // */
static int64_t
floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q -= 1;
    return q;
}

/* ChangeEvent's fields, by position (sinks/avro.py checks the order at import) */
enum { EV_OP, EV_TABLE, EV_BEFORE, EV_AFTER, EV_UNCHANGED, EV_COMMIT_LSN, EV_LSN, EV_ORDINAL,
       EV_XID, EV_COMMIT_TIME, EV_SIZE };

/* the plan of one table version for one server name (sinks/avro.py _Version.plan) */
enum { PLAN_FIELDS, PLAN_KEY_FIELDS, PLAN_NULL_KEY, PLAN_HEAD, PLAN_SNAPSHOT,
       PLAN_READ_SNAPSHOT, PLAN_TABLE, PLAN_NAMES, PLAN_OPS, PLAN_TEXT_OF, PLAN_EPOCH_MS,
       PLAN_FALLBACK, PLAN_KEY_HEAD, PLAN_VALUE_HEAD, PLAN_SIZE };

/* the plan's fallback, the Python encoder: fallback(event, now_ms) -> (key, value) */
static PyObject *
fall_back(PyObject *plan, PyObject *event, PyObject *now_ms)
{
    return PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(plan, PLAN_FALLBACK), event, now_ms,
                                        NULL);
}

/*
 * encode(plan, event, now_ms) -> (key, value).  An event holding something this code
 * leaves to the Python encoder (an envelope number that is not a plain int64, a row that
 * is not a dict, ...) goes to the plan's fallback, which gives the same bytes or the same
 * error.
 */
static PyObject *
encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != PLAN_SIZE
        || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode(plan: tuple, event: ChangeEvent, now_ms: int)");
        return NULL;
    }
    PyObject *plan = args[0], *event = args[1];
    if (PyTuple_GET_SIZE(event) != EV_SIZE) {
        PyErr_SetString(PyExc_TypeError, "encode: the event is not a ChangeEvent");
        return NULL;
    }
    /* an event of a subclass of ChangeEvent (a marked read: sinks/snapshot_marks.py) */
    if (!PyTuple_CheckExact(event) && Py_TYPE(event)->tp_base != &PyTuple_Type)
        return fall_back(plan, event, args[2]);
    PyObject *fields = PyTuple_GET_ITEM(plan, PLAN_FIELDS);
    PyObject *key_fields = PyTuple_GET_ITEM(plan, PLAN_KEY_FIELDS);
    PyObject *names = PyTuple_GET_ITEM(plan, PLAN_NAMES);
    PyObject *ops = PyTuple_GET_ITEM(plan, PLAN_OPS);
    PyObject *text_of = PyTuple_GET_ITEM(plan, PLAN_TEXT_OF);
    PyObject *constants[] = {PyTuple_GET_ITEM(plan, PLAN_NULL_KEY),
                             PyTuple_GET_ITEM(plan, PLAN_HEAD),
                             PyTuple_GET_ITEM(plan, PLAN_SNAPSHOT),
                             PyTuple_GET_ITEM(plan, PLAN_READ_SNAPSHOT),
                             PyTuple_GET_ITEM(plan, PLAN_TABLE),
                             /* before each key and each value: b"" or the Confluent wire
                              * format's magic byte and schema id (sinks/registry.py) */
                             PyTuple_GET_ITEM(plan, PLAN_KEY_HEAD),
                             PyTuple_GET_ITEM(plan, PLAN_VALUE_HEAD)};
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++) {
        if (!PyBytes_CheckExact(constants[i])) {
            PyErr_SetString(PyExc_TypeError, "encode: the plan's constant parts are bytes");
            return NULL;
        }
    }
    if (!PyTuple_Check(fields) || !PyTuple_Check(key_fields) || !PyDict_Check(names)
        || !PyDict_Check(ops)) {
        PyErr_SetString(PyExc_TypeError, "encode: malformed plan");
        return NULL;
    }
    PyObject *op = PyTuple_GET_ITEM(event, EV_OP);
    PyObject *before = PyTuple_GET_ITEM(event, EV_BEFORE);
    PyObject *after = PyTuple_GET_ITEM(event, EV_AFTER);
    PyObject *unchanged = PyTuple_GET_ITEM(event, EV_UNCHANGED);
    int64_t numbers[5], now_ms, epoch_ms;
    for (int i = 0; i < 5; i++) {
        if (!as_int64(PyTuple_GET_ITEM(event, EV_COMMIT_LSN + i), &numbers[i]))
            return fall_back(plan, event, args[2]);
    }
    if (!as_int64(args[2], &now_ms) || !as_int64(PyTuple_GET_ITEM(plan, PLAN_EPOCH_MS),
                                                 &epoch_ms)
        || (before != Py_None && !PyDict_Check(before))
        || (after != Py_None && !PyDict_Check(after)) || !PyTuple_Check(unchanged)
        || !PyUnicode_Check(op))
        return fall_back(plan, event, args[2]);
    int64_t commit_lsn = numbers[0], lsn = numbers[1], ordinal = numbers[2], xid = numbers[3],
            commit_time = numbers[4];

    Buf key, value, scratch;
    buf_init(&key);
    buf_init(&value);
    buf_init(&scratch);
    PyObject *result = NULL, *key_bytes = NULL;

    /* the key: the key columns of the new row, else of the old one */
    PyObject *row = after != Py_None ? after : before;
    if (row == Py_None && PyBytes_GET_SIZE(constants[5]) == 0) {
        key_bytes = Py_NewRef(constants[0]);
    }
    else {
        if (put_bytes_object(&key, constants[5]) < 0)
            goto done;
        if (row == Py_None ? put_bytes_object(&key, constants[0]) < 0
                           : put_row(&key, &scratch, row, key_fields, text_of) < 0)
            goto done;
        key_bytes = PyBytes_FromStringAndSize(key.data, key.size);
        if (key_bytes == NULL)
            goto done;
    }

    /* the value: before, after, source, op, ts_ms, unchanged */
    if (put_bytes_object(&value, constants[6]) < 0)
        goto done;
    PyObject *rows[2] = {before, after};
    for (int i = 0; i < 2; i++) {
        if (rows[i] == Py_None) {
            if (put_byte(&value, 0) < 0)
                goto done;
        }
        else if (put_byte(&value, 2) < 0
                 || put_row(&value, &scratch, rows[i], fields, text_of) < 0) {
            goto done;
        }
    }
    /* Source: version, connector, name | ts_ms | snapshot, db, schema, table | txId, lsn,
     * commit_lsn, ordinal | table_oid, table_version */
    Py_ssize_t op_size;
    const char *op_text = PyUnicode_AsUTF8AndSize(op, &op_size);
    if (op_text == NULL)
        goto done;
    int is_read = op_size == 1 && op_text[0] == 'r';
    if (put_bytes_object(&value, constants[1]) < 0
        || put_varint(&value, zigzag(floor_div(commit_time, 1000) + epoch_ms)) < 0
        || put_bytes_object(&value, constants[is_read ? 3 : 2]) < 0
        || put_varint(&value, zigzag(xid)) < 0 || put_varint(&value, zigzag(lsn)) < 0
        || put_varint(&value, zigzag(commit_lsn)) < 0
        || put_varint(&value, zigzag(ordinal)) < 0
        || put_bytes_object(&value, constants[4]) < 0)
        goto done;
    PyObject *op_bytes = PyDict_GetItemWithError(ops, op);
    if (op_bytes == NULL && PyErr_Occurred())
        goto done;
    if (op_bytes != NULL && PyBytes_CheckExact(op_bytes) ? put_bytes_object(&value, op_bytes) < 0
                                                         : put_text(&value, op_text, op_size) < 0)
        goto done;
    if (put_varint(&value, zigzag(now_ms)) < 0)
        goto done;
    Py_ssize_t count = PyTuple_GET_SIZE(unchanged);
    if (count > 0) {
        if (put_varint(&value, zigzag(count)) < 0)
            goto done;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *name = PyTuple_GET_ITEM(unchanged, i);
            PyObject *encoded = PyDict_GetItemWithError(names, name);
            if (encoded == NULL && PyErr_Occurred())
                goto done;
            if (encoded != NULL && PyBytes_CheckExact(encoded)) {
                if (put_bytes_object(&value, encoded) < 0)
                    goto done;
            }
            else if (PyUnicode_Check(name)) {
                if (put_str(&value, name) < 0)
                    goto done;
            }
            else {
                result = fall_back(plan, event, args[2]);
                goto done;
            }
        }
    }
    if (put_byte(&value, 0) < 0)
        goto done;
    PyObject *value_bytes = PyBytes_FromStringAndSize(value.data, value.size);
    if (value_bytes == NULL)
        goto done;
    result = PyTuple_Pack(2, key_bytes, value_bytes);
    Py_DECREF(value_bytes);

done:
    Py_XDECREF(key_bytes);
    buf_free(&key);
    buf_free(&value);
    buf_free(&scratch);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(plan, event, now_ms) -> (key, value) in Avro binary."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sinks._fastavro",
    "A change event's Avro key and value in one call (see sinks/avro.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__fastavro(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    PyObject *decimal = PyImport_ImportModule("decimal");
    if (decimal == NULL)
        return NULL;
    DecimalType = PyObject_GetAttrString(decimal, "Decimal");
    Py_DECREF(decimal);
    if (DecimalType == NULL)
        return NULL;
    return PyModule_Create(&module);
}
