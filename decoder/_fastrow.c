/*
 * decoder._fastrow: the per-column loop of pgoutput tuple data, compiled.
 *
 * The profile of the decoder (docs/benchmarks.md) shows no single hot spot: the
 * time is the Python interpreter walking every column of every row twice, once
 * to cut the TupleData out of the message and once to turn each text value into
 * a typed value.  These two functions do both walks in one C loop and call the
 * column's Python decoder (int, Decimal, ...) only for the value itself.
 *
 * They are exact equivalents of decoder/tuples.py (the reference, used when
 * this module is not built): same values, same errors, same offsets;
 * tests/unit/test_fastrow.py checks that with hypothesis.
 *
 * TupleData: Int16 column count, then per column a kind byte:
 *   'n' NULL, 'u' unchanged TOASTed value, 't' text or 'b' binary followed by
 *   Int32 length and that many bytes.
 *
 * Errors raise TupleError(reason, offset): the caller turns it into the
 * decoder's DecodeError with the message tag.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static PyObject *TupleError;

static PyObject *
fail(Py_ssize_t offset, const char *format, ...)
{
    va_list vargs;
    va_start(vargs, format);
    PyObject *reason = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (reason == NULL)
        return NULL;
    PyObject *args = Py_BuildValue("(Nn)", reason, offset);
    if (args != NULL) {
        PyErr_SetObject(TupleError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* Reads the column count at *pos; -1 with an exception set on error. */
static int
column_count(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end)
{
    if (*pos + 2 > end) {
        fail(*pos, "needs 2 more bytes, %zd left", end - *pos);
        return -1;
    }
    int ncols = (int16_t)((buf[*pos] << 8) | buf[*pos + 1]);
    *pos += 2;
    if (ncols < 0) {
        fail(*pos, "negative column count %d", ncols);
        return -1;
    }
    return ncols;
}

enum { KIND_NULL, KIND_UNCHANGED, KIND_TEXT, KIND_BINARY, KIND_ERROR };

/*
 * Reads one column at *pos: its kind and, for text and binary, where its bytes start and
 * how many there are.  Returns the kind, or KIND_ERROR with an exception set.
 */
static int
next_span(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *start,
          Py_ssize_t *size)
{
    Py_ssize_t p = *pos;
    if (p >= end) {
        fail(p, "tuple data ends before its last column");
        return KIND_ERROR;
    }
    unsigned char kind = buf[p++];
    if (kind == 't' || kind == 'b') {
        if (p + 4 > end) {
            fail(p, "column length cut short");
            return KIND_ERROR;
        }
        int32_t length = (int32_t)(((uint32_t)buf[p] << 24) | ((uint32_t)buf[p + 1] << 16)
                                   | ((uint32_t)buf[p + 2] << 8) | (uint32_t)buf[p + 3]);
        p += 4;
        if (length < 0 || p + length > end) {
            fail(p, "column length %d exceeds the message", (int)length);
            return KIND_ERROR;
        }
        *start = p;
        *size = length;
        *pos = p + length;
        return kind == 't' ? KIND_TEXT : KIND_BINARY;
    }
    if (kind == 'n') {
        *pos = p;
        return KIND_NULL;
    }
    if (kind == 'u') {
        *pos = p;
        return KIND_UNCHANGED;
    }
    fail(p - 1, "unknown tuple column kind 0x%x", (unsigned int)kind);
    return KIND_ERROR;
}

/* The str of a text column, the bytes of a binary one; NULL with an exception set. */
static PyObject *
span_value(int kind, const unsigned char *buf, Py_ssize_t start, Py_ssize_t size)
{
    if (kind == KIND_BINARY)
        return PyBytes_FromStringAndSize((const char *)buf + start, size);
    PyObject *value = PyUnicode_DecodeUTF8((const char *)buf + start, size, NULL);
    if (value != NULL)
        return value;
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    PyObject *text = exc != NULL ? PyObject_Str(exc) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    if (text == NULL)
        return NULL;
    fail(start + size, "text column is not valid UTF-8: %U", text);
    Py_DECREF(text);
    return NULL;
}

/*
 * Reads one column at *pos.  For text and binary, *value is a new reference
 * (str or bytes).  Returns the kind, or KIND_ERROR with an exception set.
 */
static int
next_column(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, PyObject **value)
{
    Py_ssize_t start = 0, size = 0;
    int kind = next_span(buf, pos, end, &start, &size);
    if (kind == KIND_TEXT || kind == KIND_BINARY) {
        *value = span_value(kind, buf, start, size);
        if (*value == NULL)
            return KIND_ERROR;
    }
    return kind;
}

/* --- Binary values: the send formats of the hot types, compiled -----------------------------
 *
 * binary_decoder(kind, fallback, element=None, element_oid=0) makes a BinaryDecoder: a
 * callable that turns the bytes of one binary column value (pgoutput's binary option: the
 * type's send function output) into the Python value decoder/binary.py returns for them.
 * decode_row calls it on the tuple's bytes in place, without a bytes object or a Python
 * frame.
 *
 * The C code reads only the common case of each format.  Whatever it cannot turn into
 * exactly the reference's value (infinity, BC and years past 9999, NaN and infinite
 * numerics, a length that is not the type's, invalid UTF-8, an array with an element of
 * that kind, any malformed byte) goes, value by value, to `fallback`: the column's Python
 * decoder (decoder/binary.py), which returns the value or raises the error naming the
 * type.  tests/unit/test_fastrow_binary.py checks both against each other.
 *
 * Formats (PostgreSQL's src/backend/utils/adt/\*.c, *_send): integers and floats big-endian;
 * numeric is ndigits, weight, sign, dscale (Int16 each), then ndigits base-10000 digits;
 * dates are Int32 days and timestamps Int64 microseconds since 2000-01-01; jsonb a version
 * byte (1) and its text; arrays ndim, flags, element OID, (size, lower bound) per dimension,
 * then each element as Int32 length (-1: NULL) and its bytes.
 */

enum {
    BIN_BOOL, BIN_INT2, BIN_INT4, BIN_INT8, BIN_UINT4, BIN_UINT8, BIN_FLOAT4, BIN_FLOAT8,
    BIN_TEXT, BIN_JSONB, BIN_BYTEA, BIN_UUID, BIN_NUMERIC, BIN_DATE, BIN_TIMESTAMP,
    BIN_TIMESTAMPTZ, BIN_ARRAY, BIN_KINDS
};

static const char *const binary_kinds[BIN_KINDS] = {
    "bool", "int2", "int4", "int8", "uint4", "uint8", "float4", "float8", "text", "jsonb",
    "bytea", "uuid", "numeric", "date", "timestamp", "timestamptz", "array",
};

/* Set at module initialisation. */
static PyObject *Decimal, *Uuid, *uuid_unknown, *str_int, *str_is_safe;

#define POSTGRES_EPOCH_JDATE 2451545   /* 2000-01-01 as a Julian day */
#define EPOCH_ORDINAL 730120           /* 2000-01-01 as a proleptic Gregorian ordinal */
#define MAX_ORDINAL 3652059            /* 9999-12-31 */
#define DAY_US INT64_C(86400000000)

static uint16_t
be16(const unsigned char *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* PostgreSQL's j2date (datetime.c) for a Julian day of years 1 to 9999. */
static void
j2date(int64_t julian_day, int *year, int *month, int *day)
{
    int64_t julian = julian_day + 32044;
    int64_t quad = julian / 146097;
    int64_t extra = (julian - quad * 146097) * 4 + 3;
    julian += 60 + quad * 3 + extra / 146097;
    quad = julian / 1461;
    julian -= quad * 1461;
    int64_t y = julian * 4 / 1461;
    julian = (y != 0 ? (julian + 305) % 365 : (julian + 306) % 366) + 123;
    y += quad * 4;
    *year = (int)(y - 4800);
    quad = julian * 2141 / 65536;
    *day = (int)(julian - 7834 * quad / 256);
    *month = (int)((quad + 10) % 12 + 1);
}

/* The UTF-8 text at p; 0 (fall back) when it is not valid UTF-8. */
static int
binary_text(const unsigned char *p, Py_ssize_t n, PyObject **out)
{
    *out = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (*out != NULL)
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* float4out's shortest decimal, read back as a double (binary.py's _float4). */
static int
binary_float4(const unsigned char *p, PyObject **out)
{
    double exact = PyFloat_Unpack4((const char *)p, 0);
    if (exact == -1.0 && PyErr_Occurred())
        return -1;
    if (isnan(exact) || isinf(exact) || exact == 0.0) {
        *out = PyFloat_FromDouble(exact);
        return *out == NULL ? -1 : 1;
    }
    for (int digits = 1; digits < 10; digits++) {
        char *text = PyOS_double_to_string(exact, 'g', digits, 0, NULL);
        if (text == NULL)
            return -1;
        double shortest = PyOS_string_to_double(text, NULL, NULL);
        PyMem_Free(text);
        if (shortest == -1.0 && PyErr_Occurred())
            return -1;
        float narrowed = (float)shortest;
        if (isinf(narrowed))  /* rounded past the largest float4: struct.pack refuses it */
            continue;
        if ((double)narrowed == exact) {
            *out = PyFloat_FromDouble(shortest);
            return *out == NULL ? -1 : 1;
        }
    }
    *out = PyFloat_FromDouble(exact);
    return *out == NULL ? -1 : 1;
}

/* Decimal of the same digits string binary.py's _numeric builds; 0 for NaN, infinities
 * and anything malformed. */
static int
binary_numeric(const unsigned char *p, Py_ssize_t n, PyObject **out)
{
    if (n < 8)
        return 0;
    int ndigits = (int16_t)be16(p);
    int weight = (int16_t)be16(p + 2);
    unsigned int sign = be16(p + 4), dscale = be16(p + 6);
    if ((sign != 0 && sign != 0x4000) || ndigits < 0 || n != 8 + 2 * (Py_ssize_t)ndigits)
        return 0;
    Py_ssize_t length = ndigits ? 4 * (Py_ssize_t)ndigits : 1;
    Py_ssize_t exponent = ndigits ? 4 * ((Py_ssize_t)weight - ndigits + 1) : 0;
    Py_ssize_t zeros = exponent > -(Py_ssize_t)dscale ? exponent + dscale : 0;
    char small[256];
    Py_ssize_t size = 1 + length + zeros + 8;
    char *text = size <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc(size);
    if (text == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    char *digits = text + 1, *at = digits;
    for (int i = 0; i < ndigits; i++) {
        unsigned int group = be16(p + 8 + 2 * i);
        if (group > 9999) {
            if (text != small)
                PyMem_Free(text);
            return 0;
        }
        at[0] = (char)('0' + group / 1000);
        at[1] = (char)('0' + group / 100 % 10);
        at[2] = (char)('0' + group / 10 % 10);
        at[3] = (char)('0' + group % 10);
        at += 4;
    }
    if (ndigits == 0)
        *at++ = '0';
    if (zeros > 0) {
        memset(at, '0', zeros);
        at += zeros;
    }
    else if (exponent < -(Py_ssize_t)dscale) {  /* the last group's zeros beyond dscale */
        Py_ssize_t cut = -(Py_ssize_t)dscale - exponent, kept = at - digits;
        Py_ssize_t from = cut < kept ? kept - cut : 0;
        for (char *c = digits + from; c < at; c++) {
            if (*c != '0') {
                if (text != small)
                    PyMem_Free(text);
                return 0;
            }
        }
        at = digits + from;
        if (at == digits)
            *at++ = '0';
    }
    at += sprintf(at, "E-%u", dscale);
    char *begin = digits;
    if (sign == 0x4000)
        *--begin = '-';
    PyObject *string = PyUnicode_FromStringAndSize(begin, at - begin);
    if (text != small)
        PyMem_Free(text);
    if (string == NULL)
        return -1;
    *out = PyObject_CallOneArg(Decimal, string);
    Py_DECREF(string);
    return *out == NULL ? -1 : 1;
}

/* UUID(bytes=...): the same object state (int, is_safe) without UUID.__init__. */
static int
binary_uuid(const unsigned char *p, PyObject **out)
{
    PyObject *number = _PyLong_FromByteArray(p, 16, 0, 0);
    if (number == NULL)
        return -1;
    PyObject *args = PyTuple_New(0);
    PyObject *uuid = args == NULL ? NULL : PyBaseObject_Type.tp_new((PyTypeObject *)Uuid, args,
                                                                     NULL);
    Py_XDECREF(args);
    if (uuid == NULL || PyObject_GenericSetAttr(uuid, str_int, number) < 0
        || PyObject_GenericSetAttr(uuid, str_is_safe, uuid_unknown) < 0) {
        Py_DECREF(number);
        Py_XDECREF(uuid);
        return -1;
    }
    Py_DECREF(number);
    *out = uuid;
    return 1;
}

static int
binary_timestamp(const unsigned char *p, PyObject *zone, PyObject **out)
{
    int64_t micros = (int64_t)be64(p);
    int64_t days = micros / DAY_US, rest = micros % DAY_US;
    if (rest < 0) {
        rest += DAY_US;
        days -= 1;
    }
    if (days + EPOCH_ORDINAL < 1 || days + EPOCH_ORDINAL > MAX_ORDINAL)
        return 0;  /* infinity, BC or past 9999: the reference's text */
    int year, month, day;
    j2date(days + POSTGRES_EPOCH_JDATE, &year, &month, &day);
    int64_t seconds = rest / 1000000;
    *out = PyDateTimeAPI->DateTime_FromDateAndTime(
        year, month, day, (int)(seconds / 3600), (int)(seconds / 60 % 60), (int)(seconds % 60),
        (int)(rest % 1000000), zone, PyDateTimeAPI->DateTimeType);
    return *out == NULL ? -1 : 1;
}

/*
 * One scalar value of the given kind from the n bytes at p: 1 with *out a new reference;
 * 0 when only the Python decoder gives the exact value or error (fall back); -1 with an
 * exception set.
 */
static int
binary_scalar(int kind, const unsigned char *p, Py_ssize_t n, PyObject **out)
{
    switch (kind) {
    case BIN_BOOL:
        if (n != 1 || p[0] > 1)
            return 0;
        *out = Py_NewRef(p[0] ? Py_True : Py_False);
        return 1;
    case BIN_INT2:
        if (n != 2)
            return 0;
        *out = PyLong_FromLong((int16_t)be16(p));
        break;
    case BIN_INT4:
        if (n != 4)
            return 0;
        *out = PyLong_FromLong((int32_t)be32(p));
        break;
    case BIN_INT8:
        if (n != 8)
            return 0;
        *out = PyLong_FromLongLong((int64_t)be64(p));
        break;
    case BIN_UINT4:
        if (n != 4)
            return 0;
        *out = PyLong_FromUnsignedLong(be32(p));
        break;
    case BIN_UINT8:
        if (n != 8)
            return 0;
        *out = PyLong_FromUnsignedLongLong(be64(p));
        break;
    case BIN_FLOAT4:
        return n == 4 ? binary_float4(p, out) : 0;
    case BIN_FLOAT8: {
        if (n != 8)
            return 0;
        double value = PyFloat_Unpack8((const char *)p, 0);
        if (value == -1.0 && PyErr_Occurred())
            return -1;
        *out = PyFloat_FromDouble(value);
        break;
    }
    case BIN_TEXT:
        return binary_text(p, n, out);
    case BIN_JSONB:
        return n >= 1 && p[0] == 1 ? binary_text(p + 1, n - 1, out) : 0;
    case BIN_BYTEA:
        *out = PyBytes_FromStringAndSize((const char *)p, n);
        break;
    case BIN_UUID:
        return n == 16 ? binary_uuid(p, out) : 0;
    case BIN_NUMERIC:
        return binary_numeric(p, n, out);
    case BIN_DATE: {
        if (n != 4)
            return 0;
        int64_t days = (int32_t)be32(p);
        if (days + EPOCH_ORDINAL < 1 || days + EPOCH_ORDINAL > MAX_ORDINAL)
            return 0;
        int year, month, day;
        j2date(days + POSTGRES_EPOCH_JDATE, &year, &month, &day);
        *out = PyDateTimeAPI->Date_FromDate(year, month, day, PyDateTimeAPI->DateType);
        break;
    }
    case BIN_TIMESTAMP:
        return n == 8 ? binary_timestamp(p, Py_None, out) : 0;
    case BIN_TIMESTAMPTZ:
        return n == 8 ? binary_timestamp(p, PyDateTime_TimeZone_UTC, out) : 0;
    default:
        return 0;
    }
    return *out == NULL ? -1 : 1;
}

#define MAX_DIMS 6

/* The elements of dimension dim onward as nested lists (lower bounds dropped); 0 when an
 * element falls back, which makes the whole array fall back. */
static int
array_level(int element, const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos,
            const int32_t *sizes, int dim, int ndim, PyObject **out)
{
    PyObject *list = PyList_New(sizes[dim]);
    if (list == NULL)
        return -1;
    for (int32_t i = 0; i < sizes[dim]; i++) {
        PyObject *item = NULL;
        int rc;
        if (dim + 1 < ndim) {
            rc = array_level(element, p, n, pos, sizes, dim + 1, ndim, &item);
        }
        else if (*pos + 4 > n) {
            rc = 0;
        }
        else {
            int32_t length = (int32_t)be32(p + *pos);
            *pos += 4;
            if (length == -1) {
                item = Py_NewRef(Py_None);
                rc = 1;
            }
            else if (length < 0 || length > n - *pos) {
                rc = 0;
            }
            else {
                rc = binary_scalar(element, p + *pos, length, &item);
                *pos += length;
            }
        }
        if (rc <= 0) {
            Py_DECREF(list);
            return rc;
        }
        PyList_SET_ITEM(list, i, item);
    }
    *out = list;
    return 1;
}

static int
binary_array(int element, uint32_t element_oid, const unsigned char *p, Py_ssize_t n,
             PyObject **out)
{
    if (n < 12)
        return 0;
    int32_t ndim = (int32_t)be32(p);
    uint32_t oid = be32(p + 8);
    if (element_oid != 0 && oid != element_oid)
        return 0;
    if (ndim == 0) {
        if (n != 12)
            return 0;
        *out = PyList_New(0);
        return *out == NULL ? -1 : 1;
    }
    if (ndim < 1 || ndim > MAX_DIMS || n < 12 + 8 * (Py_ssize_t)ndim)
        return 0;
    int32_t sizes[MAX_DIMS];
    Py_ssize_t total = 1;
    for (int i = 0; i < ndim; i++) {
        sizes[i] = (int32_t)be32(p + 12 + 8 * i);
        if (sizes[i] <= 0)  /* PostgreSQL sends none; the reference's own outcome */
            return 0;
        total *= sizes[i];
        if (total > n / 4)  /* more elements than lengths fit in the value: malformed */
            return 0;
    }
    Py_ssize_t pos = 12 + 8 * (Py_ssize_t)ndim;
    int rc = array_level(element, p, n, &pos, sizes, 0, ndim, out);
    if (rc == 1 && pos != n) {
        Py_CLEAR(*out);
        return 0;
    }
    return rc;
}

typedef struct {
    PyObject_HEAD
    int kind;
    int element;
    uint32_t element_oid;
    PyObject *fallback;
    vectorcallfunc vectorcall;
} BinaryDecoderObject;

static PyTypeObject BinaryDecoderType;

/*
 * The value of the n bytes at p for a BinaryDecoder; `raw` is the bytes object of the
 * value when the caller has one (NULL: made here if the value falls back).
 */
static PyObject *
binary_decode(BinaryDecoderObject *self, const unsigned char *p, Py_ssize_t n, PyObject *raw)
{
    PyObject *value = NULL;
    int rc = self->kind == BIN_ARRAY ? binary_array(self->element, self->element_oid, p, n, &value)
                                     : binary_scalar(self->kind, p, n, &value);
    if (rc > 0)
        return value;
    if (rc < 0)
        return NULL;
    if (raw != NULL)
        return PyObject_CallOneArg(self->fallback, raw);
    raw = PyBytes_FromStringAndSize((const char *)p, n);
    if (raw == NULL)
        return NULL;
    value = PyObject_CallOneArg(self->fallback, raw);
    Py_DECREF(raw);
    return value;
}

static PyObject *
binary_decoder_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, "a binary decoder takes one argument, the bytes");
        return NULL;
    }
    BinaryDecoderObject *self = (BinaryDecoderObject *)callable;
    if (PyBytes_CheckExact(args[0]))
        return binary_decode(self, (const unsigned char *)PyBytes_AS_STRING(args[0]),
                             PyBytes_GET_SIZE(args[0]), args[0]);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *value = binary_decode(self, view.buf, view.len, args[0]);
    PyBuffer_Release(&view);
    return value;
}

static int
kind_of(PyObject *name)
{
    for (int kind = 0; kind < BIN_KINDS; kind++) {
        if (PyUnicode_CompareWithASCIIString(name, binary_kinds[kind]) == 0)
            return kind;
    }
    return -1;
}

/* binary_decoder(kind, fallback, element=None, element_oid=0) -> BinaryDecoder */
static PyObject *
binary_decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"kind", "fallback", "element", "element_oid", NULL};
    PyObject *kind_name, *fallback, *element_name = Py_None;
    unsigned int element_oid = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO|OI:BinaryDecoder", keywords, &kind_name,
                                     &fallback, &element_name, &element_oid))
        return NULL;
    int kind = kind_of(kind_name), element = -1;
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "no compiled binary decoder of kind %R", kind_name);
        return NULL;
    }
    if (kind == BIN_ARRAY) {
        element = PyUnicode_Check(element_name) ? kind_of(element_name) : -1;
        if (element < 0 || element == BIN_ARRAY) {
            PyErr_Format(PyExc_ValueError, "an array's element kind is a scalar kind, not %R",
                         element_name);
            return NULL;
        }
    }
    else if (element_name != Py_None) {
        PyErr_SetString(PyExc_ValueError, "only an array has an element kind");
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    BinaryDecoderObject *self = (BinaryDecoderObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->kind = kind;
    self->element = element;
    self->element_oid = element_oid;
    self->fallback = Py_NewRef(fallback);
    self->vectorcall = binary_decoder_call;
    return (PyObject *)self;
}

static void
binary_decoder_dealloc(BinaryDecoderObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->fallback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
binary_decoder_traverse(BinaryDecoderObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback);
    return 0;
}

static int
binary_decoder_clear(BinaryDecoderObject *self)
{
    Py_CLEAR(self->fallback);
    return 0;
}

static PyObject *
binary_decoder_repr(BinaryDecoderObject *self)
{
    if (self->kind == BIN_ARRAY)
        return PyUnicode_FromFormat("<BinaryDecoder array of %s (element OID %u)>",
                                    binary_kinds[self->element], (unsigned int)self->element_oid);
    return PyUnicode_FromFormat("<BinaryDecoder %s>", binary_kinds[self->kind]);
}

static PyObject *
binary_decoder_kind(BinaryDecoderObject *self, void *closure)
{
    return PyUnicode_FromString(binary_kinds[self->kind]);
}

static PyObject *
binary_decoder_element(BinaryDecoderObject *self, void *closure)
{
    if (self->element < 0)
        Py_RETURN_NONE;
    return PyUnicode_FromString(binary_kinds[self->element]);
}

static PyGetSetDef binary_decoder_getset[] = {
    {"kind", (getter)binary_decoder_kind, NULL, "the format read in C", NULL},
    {"element", (getter)binary_decoder_element, NULL, "an array's element kind, else None",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef binary_decoder_members[] = {
    {"fallback", T_OBJECT_EX, offsetof(BinaryDecoderObject, fallback), READONLY,
     "the Python decoder of the values C does not read"},
    {"element_oid", T_UINT, offsetof(BinaryDecoderObject, element_oid), READONLY,
     "an array's element type OID (0: any)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BinaryDecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "decoder._fastrow.BinaryDecoder",
    .tp_doc = "BinaryDecoder(kind, fallback, element=None, element_oid=0): a binary column "
              "value in C, or through fallback where C cannot give the exact value.",
    .tp_basicsize = sizeof(BinaryDecoderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = binary_decoder_new,
    .tp_dealloc = (destructor)binary_decoder_dealloc,
    .tp_traverse = (traverseproc)binary_decoder_traverse,
    .tp_clear = (inquiry)binary_decoder_clear,
    .tp_repr = (reprfunc)binary_decoder_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(BinaryDecoderObject, vectorcall),
    .tp_getset = binary_decoder_getset,
    .tp_members = binary_decoder_members,
};

/* The position argument checked against the buffer, then the column count read there
 * (decoder/tuples.py's _start); -1 with an exception set on error. */
static int
start_tuple(PyObject *position, const Py_buffer *view, Py_ssize_t *pos)
{
    *pos = PyLong_AsSsize_t(position);
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    if (*pos < 0 || *pos > view->len) {
        PyErr_Format(PyExc_IndexError, "position %zd outside a buffer of %zd bytes", *pos,
                     view->len);
        return -1;
    }
    return column_count(view->buf, pos, view->len);
}

/* tuple_data(buf, pos, unchanged) -> (values, end) */
static PyObject *
tuple_data(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tuple_data(buf, pos, unchanged)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *unchanged = args[2];
    PyObject *values = NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t end = view.len, pos;
    int ncols = start_tuple(args[1], &view, &pos);
    if (ncols < 0)
        goto error;
    values = PyTuple_New(ncols);
    if (values == NULL)
        goto error;
    for (int i = 0; i < ncols; i++) {
        PyObject *value = NULL;
        switch (next_column(buf, &pos, end, &value)) {
        case KIND_NULL:
            value = Py_NewRef(Py_None);
            break;
        case KIND_UNCHANGED:
            value = Py_NewRef(unchanged);
            break;
        case KIND_ERROR:
            goto error;
        default:
            break;
        }
        PyTuple_SET_ITEM(values, i, value);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", values, pos);

error:
    Py_XDECREF(values);
    PyBuffer_Release(&view);
    return NULL;
}

/*
 * decode_row(buf, pos, columns) -> (row, unchanged_names, end)
 *
 * columns: a tuple of (name, decode) pairs or (name, decode, decode_binary)
 * triples, one per column of the table version; decode is a callable taking the
 * text, or None to keep the text; decode_binary one taking the bytes of a binary
 * value, or None (or absent) to keep the bytes.
 * NULL -> row[name] = None; unchanged TOAST -> name listed, not in row;
 * text -> decode(text); binary -> decode_binary(bytes), or the bytes; a BinaryDecoder
 * reads the value where it is in buf.
 */
static PyObject *
decode_row(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "decode_row(buf, pos, columns: tuple)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *columns = args[2];
    PyObject *row = NULL, *unchanged = NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t end = view.len, pos;
    int ncols = start_tuple(args[1], &view, &pos);
    if (ncols < 0)
        goto error;
    Py_ssize_t expected = PyTuple_GET_SIZE(columns);
    if (ncols != expected) {
        fail(pos, "tuple has %d columns, its table version has %zd", ncols, expected);
        goto error;
    }
    row = _PyDict_NewPresized(ncols);
    if (row == NULL)
        goto error;
    for (int i = 0; i < ncols; i++) {
        PyObject *column = PyTuple_GET_ITEM(columns, i);
        Py_ssize_t width = PyTuple_Check(column) ? PyTuple_GET_SIZE(column) : 0;
        if (width != 2 && width != 3) {
            PyErr_SetString(PyExc_TypeError,
                            "each column is a (name, decode) pair or a "
                            "(name, decode, decode_binary) triple");
            goto error;
        }
        PyObject *name = PyTuple_GET_ITEM(column, 0);
        PyObject *decode = PyTuple_GET_ITEM(column, 1);
        PyObject *decode_binary = width == 3 ? PyTuple_GET_ITEM(column, 2) : Py_None;
        PyObject *value = NULL;
        Py_ssize_t start = 0, size = 0;
        int kind = next_span(buf, &pos, end, &start, &size);
        if (kind == KIND_ERROR)
            goto error;
        if (kind == KIND_BINARY && Py_IS_TYPE(decode_binary, &BinaryDecoderType)) {
            /* compiled: straight from the message, no bytes object, no Python frame */
            value = binary_decode((BinaryDecoderObject *)decode_binary, buf + start, size, NULL);
            if (value == NULL)
                goto error;
            int rc = PyDict_SetItem(row, name, value);
            Py_DECREF(value);
            if (rc < 0)
                goto error;
            continue;
        }
        if ((kind == KIND_TEXT || kind == KIND_BINARY)
            && (value = span_value(kind, buf, start, size)) == NULL)
            goto error;
        if (kind == KIND_UNCHANGED) {
            if (unchanged == NULL && (unchanged = PyList_New(0)) == NULL)
                goto error;
            if (PyList_Append(unchanged, name) < 0)
                goto error;
            continue;
        }
        if (kind == KIND_NULL) {
            value = Py_NewRef(Py_None);
        }
        else if ((kind == KIND_TEXT && decode != Py_None)
                 || (kind == KIND_BINARY && decode_binary != Py_None)) {
            PyObject *typed =
                PyObject_CallOneArg(kind == KIND_TEXT ? decode : decode_binary, value);
            Py_DECREF(value);
            if (typed == NULL)
                goto error;
            value = typed;
        }
        int rc = PyDict_SetItem(row, name, value);
        Py_DECREF(value);
        if (rc < 0)
            goto error;
    }
    PyBuffer_Release(&view);
    PyObject *names = unchanged == NULL ? PyTuple_New(0) : PyList_AsTuple(unchanged);
    Py_XDECREF(unchanged);
    if (names == NULL) {
        Py_DECREF(row);
        return NULL;
    }
    return Py_BuildValue("(NNn)", row, names, pos);

error:
    Py_XDECREF(row);
    Py_XDECREF(unchanged);
    PyBuffer_Release(&view);
    return NULL;
}

/* --- Avro binary: the column loop of sinks/avro.py ---------------------------------------
 *
 * avro_row(out, row, fields) appends the fields of a Row or Key record, each a union of
 * null and its type, exactly as sinks/avro.py's writers do (and fastavro's
 * schemaless_writer): fields is a tuple of (name, kind, writer); the common value types
 * are written here, anything else goes to the Python writer, which converts it or raises.
 */

enum { AVRO_BOOLEAN, AVRO_INT, AVRO_LONG, AVRO_FLOAT, AVRO_DOUBLE, AVRO_BYTES, AVRO_STRING };

static int
append(PyObject *out, const void *data, Py_ssize_t size)
{
    Py_ssize_t at = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, at + size) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(out) + at, data, size);
    return 0;
}

/* a union branch byte (when not negative), then a zigzagged varint */
static int
append_varint(PyObject *out, int branch, uint64_t n)
{
    unsigned char buf[11];
    int size = 0;
    if (branch >= 0)
        buf[size++] = (unsigned char)branch;
    while (n > 0x7F) {
        buf[size++] = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    buf[size++] = (unsigned char)n;
    return append(out, buf, size);
}

static uint64_t
zigzag(int64_t value)
{
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
}

/* 1: written; 0: not the fast case (call the Python writer); -1: error */
static int
write_fast(PyObject *out, int kind, PyObject *value)
{
    switch (kind) {
    case AVRO_STRING:
        if (PyUnicode_CheckExact(value)) {
            Py_ssize_t size;
            const char *data = PyUnicode_AsUTF8AndSize(value, &size);
            if (data == NULL)
                return -1;
            if (append_varint(out, 2, (uint64_t)size << 1) < 0 || append(out, data, size) < 0)
                return -1;
            return 1;
        }
        return 0;
    case AVRO_LONG:
    case AVRO_INT:
        if (PyLong_CheckExact(value)) {
            int overflow;
            long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (n == -1 && PyErr_Occurred())
                return -1;
            if (overflow || (kind == AVRO_INT && (n < INT32_MIN || n > INT32_MAX)))
                return 0;
            return append_varint(out, 2, zigzag(n)) < 0 ? -1 : 1;
        }
        return 0;
    case AVRO_BOOLEAN:
        if (value == Py_True || value == Py_False)
            return append(out, value == Py_True ? "\x02\x01" : "\x02\x00", 2) < 0 ? -1 : 1;
        return 0;
    case AVRO_DOUBLE:
        if (PyFloat_CheckExact(value)) {
            unsigned char buf[9];
            buf[0] = 2;
            if (PyFloat_Pack8(PyFloat_AS_DOUBLE(value), (char *)buf + 1, 1) < 0)
                return -1;
            return append(out, buf, 9) < 0 ? -1 : 1;
        }
        return 0;
    case AVRO_BYTES:
        if (PyBytes_CheckExact(value)) {
            Py_ssize_t size = PyBytes_GET_SIZE(value);
            if (append_varint(out, 2, (uint64_t)size << 1) < 0
                || append(out, PyBytes_AS_STRING(value), size) < 0)
                return -1;
            return 1;
        }
        return 0;
    default:
        return 0;
    }
}

/* avro_row(out: bytearray, row: dict, fields: tuple[(name, kind, writer), ...]) -> None */
static PyObject *
avro_row(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyByteArray_CheckExact(args[0]) || !PyDict_Check(args[1])
        || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "avro_row(out: bytearray, row: dict, fields: tuple)");
        return NULL;
    }
    PyObject *out = args[0], *row = args[1], *fields = args[2];
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 3) {
            PyErr_SetString(PyExc_TypeError, "each field is a (name, kind, writer) triple");
            return NULL;
        }
        PyObject *value = PyDict_GetItemWithError(row, PyTuple_GET_ITEM(field, 0));
        if (value == NULL && PyErr_Occurred())
            return NULL;
        if (value == NULL || value == Py_None) {
            if (append(out, "\x00", 1) < 0)
                return NULL;
            continue;
        }
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(field, 1));
        if (kind == -1 && PyErr_Occurred())
            return NULL;
        int written = write_fast(out, (int)kind, value);
        if (written < 0)
            return NULL;
        if (written == 0) {
            PyObject *result = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(field, 2), out,
                                                            value, NULL);
            if (result == NULL)
                return NULL;
            Py_DECREF(result);
        }
    }
    Py_RETURN_NONE;
}

/* avro_long(out: bytearray, value: int) -> None: a long outside a union */
static PyObject *
avro_long(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyByteArray_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "avro_long(out: bytearray, value: int)");
        return NULL;
    }
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%R (type %R) is not an Avro long", args[1],
                     (PyObject *)Py_TYPE(args[1]));
        return NULL;
    }
    if (append_varint(args[0], -1, zigzag(n)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"tuple_data", (PyCFunction)(void (*)(void))tuple_data, METH_FASTCALL,
     "tuple_data(buf, pos, unchanged) -> (values, end): the TupleData at pos."},
    {"decode_row", (PyCFunction)(void (*)(void))decode_row, METH_FASTCALL,
     "decode_row(buf, pos, columns) -> (row, unchanged_names, end): TupleData as a typed row."},
    {"avro_row", (PyCFunction)(void (*)(void))avro_row, METH_FASTCALL,
     "avro_row(out, row, fields): append a Row/Key record's fields in Avro binary."},
    {"avro_long", (PyCFunction)(void (*)(void))avro_long, METH_FASTCALL,
     "avro_long(out, value): append an Avro long (zigzag varint)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "decoder._fastrow",
    "The per-column loop of pgoutput tuple data, compiled (see decoder/_tuples.py).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__fastrow(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL || PyType_Ready(&BinaryDecoderType) < 0
        || PyModule_AddObjectRef(m, "BinaryDecoder", (PyObject *)&BinaryDecoderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (Decimal == NULL) {
        PyObject *decimal = PyImport_ImportModule("decimal");
        PyObject *uuid = PyImport_ImportModule("uuid");
        PyObject *safe = uuid == NULL ? NULL : PyObject_GetAttrString(uuid, "SafeUUID");
        Decimal = decimal == NULL ? NULL : PyObject_GetAttrString(decimal, "Decimal");
        Uuid = uuid == NULL ? NULL : PyObject_GetAttrString(uuid, "UUID");
        uuid_unknown = safe == NULL ? NULL : PyObject_GetAttrString(safe, "unknown");
        str_int = PyUnicode_InternFromString("int");
        str_is_safe = PyUnicode_InternFromString("is_safe");
        Py_XDECREF(decimal);
        Py_XDECREF(uuid);
        Py_XDECREF(safe);
        if (Decimal == NULL || Uuid == NULL || uuid_unknown == NULL || str_int == NULL
            || str_is_safe == NULL) {
            Py_CLEAR(Decimal);
            Py_DECREF(m);
            return NULL;
        }
    }
    TupleError = PyErr_NewExceptionWithDoc(
        "decoder._fastrow.TupleError",
        "Malformed tuple data: args are (reason, offset).", PyExc_ValueError, NULL);
    if (TupleError == NULL || PyModule_AddObjectRef(m, "TupleError", TupleError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
