/*
 * The JSON primitives shared by the compiled JSON encoders (sinks/_fastjson.c: change
 * events; sinks/_loadfast_json.h: the initial load's COPY rows), written as Python's json
 * writes them (allow_nan, no spaces, ensure_ascii off) or as sinks/debezium_json.py
 * converts the values.  Static functions: each module gets its own copy.
 *
 * Include after <Python.h> and after the module's byte buffer: a type Buf with members
 * data and size, and buf_reserve(Buf *, Py_ssize_t more), put(Buf *, data, size) and
 * put_byte(Buf *, c), each 0 or -1 with an exception set.
 */
#ifndef PGCDC_JSONBUF_H
#define PGCDC_JSONBUF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define PUTS(b, text) put((b), (text), (Py_ssize_t)(sizeof(text) - 1))

static const char PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* the decimal text of n (Python's str(int)) into out (at least 21 bytes); its length */
static int
format_ll(char *out, long long n)
{
    char digits[24];
    int at = 24;
    unsigned long long u = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
    while (u >= 100) {
        unsigned pair = (unsigned)(u % 100) * 2;
        u /= 100;
        digits[--at] = PAIRS[pair + 1];
        digits[--at] = PAIRS[pair];
    }
    if (u >= 10) {
        digits[--at] = PAIRS[u * 2 + 1];
        digits[--at] = PAIRS[u * 2];
    } else {
        digits[--at] = (char)('0' + u);
    }
    if (n < 0)
        digits[--at] = '-';
    memcpy(out, digits + at, (size_t)(24 - at));
    return 24 - at;
}

static int
put_ll(Buf *b, long long n)
{
    if (buf_reserve(b, 21) < 0)
        return -1;
    b->size += format_ll(b->data + b->size, n);
    return 0;
}

/* a JSON string as Python's json writes it with ensure_ascii=False: the quote, the
 * backslash and control characters escaped, every other byte as it is (UTF-8) */
static int
put_json_string(Buf *b, const char *s, Py_ssize_t n)
{
    if (buf_reserve(b, n * 6 + 2) < 0)
        return -1;
    char *out = b->data + b->size;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = "0123456789abcdef"[c >> 4];
            *out++ = "0123456789abcdef"[c & 15];
        }
    }
    *out++ = '"';
    b->size = out - b->data;
    return 0;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* base64 with padding (binascii.b2a_base64), quoted */
static int
put_base64(Buf *b, const unsigned char *data, Py_ssize_t size)
{
    if (buf_reserve(b, (size + 2) / 3 * 4 + 2) < 0)
        return -1;
    char *out = b->data + b->size;
    *out++ = '"';
    Py_ssize_t i = 0;
    for (; i + 2 < size; i += 3) {
        unsigned v = (unsigned)data[i] << 16 | (unsigned)data[i + 1] << 8 | data[i + 2];
        *out++ = B64[v >> 18];
        *out++ = B64[(v >> 12) & 63];
        *out++ = B64[(v >> 6) & 63];
        *out++ = B64[v & 63];
    }
    if (i < size) {
        unsigned v = (unsigned)data[i] << 16 | (i + 1 < size ? (unsigned)data[i + 1] << 8 : 0);
        *out++ = B64[v >> 18];
        *out++ = B64[(v >> 12) & 63];
        *out++ = i + 1 < size ? B64[(v >> 6) & 63] : '=';
        *out++ = '=';
    }
    *out++ = '"';
    b->size = out - b->data;
    return 0;
}

/* *u scaled by 10**shift: 1, or 0 when that drops a nonzero digit or reaches 2**126 */
static int
rescale(unsigned __int128 *u, int shift)
{
    for (; shift > 0; shift--) {
        if (*u > (((unsigned __int128)1) << 126) / 10)
            return 0;
        *u *= 10;
    }
    for (; shift < 0; shift++) {
        if (*u % 10)
            return 0;
        *u /= 10;
    }
    return !(*u >> 126);
}

/* Java's BigInteger.toByteArray of (negative ? -u : u), base64, quoted; u < 2**126 */
static int
put_twos_complement(Buf *b, unsigned __int128 u, int negative)
{
    __int128 v = negative ? -(__int128)u : (__int128)u;
    unsigned __int128 magnitude = v < 0 ? ~(unsigned __int128)v : (unsigned __int128)v;
    int bits = 0;
    while (magnitude) {
        bits++;
        magnitude >>= 1;
    }
    int size = bits / 8 + 1;
    unsigned char bytes[17];
    unsigned __int128 w = (unsigned __int128)v;
    for (int k = size - 1; k >= 0; k--) {
        bytes[k] = (unsigned char)(w & 0xFF);
        w >>= 8;
    }
    return put_base64(b, bytes, size);
}

/* NaN, Infinity or -Infinity, as a string (Debezium's) or bare (Python's json): 1 or -1 */
static int
put_special(Buf *b, const char *name, int quoted)
{
    if (quoted && put_byte(b, '"') < 0)
        return -1;
    if (put(b, name, (Py_ssize_t)strlen(name)) < 0 || (quoted && put_byte(b, '"') < 0))
        return -1;
    return 1;
}

/* a float as json writes it (repr), NaN and the infinities as strings when quoted
 * (debezium_json.float_value) or bare */
static int
put_float(Buf *b, double x, int quoted)
{
    if (!isfinite(x))
        return put_special(b, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity", quoted) < 0
            ? -1 : 0;
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return -1;
    int rc = put(b, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return rc;
}

static long long
days_from_civil(int y, int m, int d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static long long
floor_div(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* a Python value as json writes it (the envelope's JSON: allow_nan, no spaces,
 * ensure_ascii off): None, bools, ints of 64 bits, floats, exact str, lists and dicts of
 * those here, anything else as dump(value) gives it (a str) */
static int
put_native(Buf *b, PyObject *v, PyObject *dump, int depth)
{
    if (v == Py_None)
        return PUTS(b, "null");
    if (v == Py_True)
        return PUTS(b, "true");
    if (v == Py_False)
        return PUTS(b, "false");
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t size;
        const char *text = PyUnicode_AsUTF8AndSize(v, &size);
        return text == NULL ? -1 : put_json_string(b, text, size);
    }
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (n == -1 && PyErr_Occurred())
            return -1;
        if (!overflow)
            return put_ll(b, n);
    }
    else if (PyFloat_CheckExact(v)) {
        return put_float(b, PyFloat_AS_DOUBLE(v), 0);
    }
    else if (PyList_CheckExact(v) && depth < 32) {
        if (put_byte(b, '[') < 0)
            return -1;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++)
            if ((i && put_byte(b, ',') < 0)
                || put_native(b, PyList_GET_ITEM(v, i), dump, depth + 1) < 0)
                return -1;
        return put_byte(b, ']');
    }
    else if (PyDict_CheckExact(v) && depth < 32) {
        PyObject *key, *item;
        Py_ssize_t pos = 0, start = b->size;
        int first = 1, plain = 1;
        if (put_byte(b, '{') < 0)
            return -1;
        while (PyDict_Next(v, &pos, &key, &item)) {
            if (!PyUnicode_CheckExact(key)) {  /* keys of other types: as json writes them */
                plain = 0;
                break;
            }
            if ((!first && put_byte(b, ',') < 0) || put_native(b, key, dump, depth + 1) < 0
                || put_byte(b, ':') < 0 || put_native(b, item, dump, depth + 1) < 0)
                return -1;
            first = 0;
        }
        if (plain)
            return put_byte(b, '}');
        b->size = start;
    }
    PyObject *text = PyObject_CallOneArg(dump, v);
    if (text == NULL)
        return -1;
    Py_ssize_t size;
    const char *data = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &size) : NULL;
    if (data == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "a JSON dump returned %R, not str", Py_TYPE(text));
    int rc = data == NULL ? -1 : put(b, data, size);
    Py_DECREF(text);
    return rc;
}

#endif
