/*
 * The JSON of one COPY text value, in Debezium's encoding (--format json's default,
 * sinks/debezium_json.py) or pgcdc's (--json-mode pgcdc): the text sinks/envelope.py's
 * encoder writes for the value the stream's decoder makes of it, for the common values of
 * the common types; 0 for any other text (the column's Python fallback then writes it:
 * sinks/loadfast.py).
 * Part of sinks/_loadfast.c (included there once; static functions).
 */
#ifndef PGCDC_LOADFAST_JSON_H
#define PGCDC_LOADFAST_JSON_H

/* a column's JSON writer (0, FALLBACK: its Python fallback), with an argument for some */
enum { J_FALLBACK, J_STRING, J_INTEGER, J_BOOLEAN, J_FLOAT, J_NUMERIC, J_NUMERIC_VARIABLE,
       J_DATE_DAYS, J_TIME_MICROS, J_TIME_MILLIS, J_TS_MICROS, J_TS_MILLIS, J_TSTZ, J_BASE64,
       J_UUID, J_INT_ARRAY,
       /* pgcdc's own JSON: a float's NaN and infinities bare (as Python's json writes
        * them), numeric, date and timestamps as strings of their Python text */
       J_FLOAT_BARE, J_TEXT_NUMERIC, J_ISO_DATE, J_ISO_TIMESTAMP, J_COUNT };

#define PUTS(b, text) put((b), (text), (Py_ssize_t)(sizeof(text) - 1))

static const char PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* n's decimal text (Python's str(int)) */
static int
put_ll(Buf *b, long long n)
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
    }
    else
        digits[--at] = (char)('0' + u);
    if (n < 0)
        digits[--at] = '-';
    return put(b, digits + at, 24 - at);
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

static int
hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* bytea's "\x0a1b" (escapes undone) as its bytes' base64 (bytes.fromhex, then b2a_base64) */
static int
put_bytea(Buf *b, Buf *scratch, const char *s, Py_ssize_t n)
{
    if (n < 2 || s[0] != '\\' || s[1] != 'x' || n % 2)
        return 0;
    scratch->size = 0;
    if (buf_reserve(scratch, n / 2) < 0)
        return -1;
    unsigned char *to = (unsigned char *)scratch->data;
    for (Py_ssize_t i = 2; i < n; i += 2) {
        int high = hex_digit(s[i]), low = hex_digit(s[i + 1]);
        if (high < 0 || low < 0)
            return 0;
        *to++ = (unsigned char)(high << 4 | low);
    }
    return put_base64(b, (unsigned char *)scratch->data, n / 2 - 1) < 0 ? -1 : 1;
}

/* COPY's numeric "[-]digits[.digits]": its digits as one number, the fraction's length;
 * 0 for anything else (NaN, infinities) or more than 38 significant digits */
static int
parse_numeric(const char *s, Py_ssize_t n, unsigned __int128 *number, int *negative,
              int *fraction)
{
    Py_ssize_t i = 0;
    *negative = n > 0 && s[0] == '-';
    i = *negative;
    unsigned __int128 u = 0;
    int digits = 0, point = 0, integer_digits = 0;
    *fraction = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') {
            if (u || c != '0') {
                if (++digits > 38)
                    return 0;
            }
            u = u * 10 + (unsigned)(c - '0');
            if (point)
                (*fraction)++;
            else
                integer_digits++;
        }
        else if (c == '.' && !point)
            point = 1;
        else
            return 0;
    }
    if (integer_digits == 0 || (point && *fraction == 0))
        return 0;
    *number = u;
    return 1;
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

/* numeric(p,s) in precise mode: the unscaled value at scale s (debezium_json._unscaled) */
static int
put_numeric_fixed(Buf *b, const char *s, Py_ssize_t n, int scale)
{
    unsigned __int128 u;
    int negative, fraction;
    if (!parse_numeric(s, n, &u, &negative, &fraction))
        return 0;
    int shift = scale - fraction;
    for (; shift > 0; shift--) {
        if (u > (((unsigned __int128)1) << 126) / 10)
            return 0;
        u *= 10;
    }
    for (; shift < 0; shift++) {
        if (u % 10)
            return 0;  /* more decimal places than the scale: Python's error */
        u /= 10;
    }
    if (u >> 126)
        return 0;
    return put_twos_complement(b, u, negative) < 0 ? -1 : 1;
}

/* an unconstrained numeric in precise mode: {"scale":s,"value":...}, trailing zeros
 * stripped (debezium_json.variable_scale) */
static int
put_numeric_variable(Buf *b, const char *s, Py_ssize_t n)
{
    unsigned __int128 u;
    int negative, scale;
    if (!parse_numeric(s, n, &u, &negative, &scale))
        return 0;
    if (u == 0)
        scale = 0;
    while (scale > 0 && u % 10 == 0) {
        u /= 10;
        scale--;
    }
    if (PUTS(b, "{\"scale\":") < 0 || put_ll(b, scale) < 0 || PUTS(b, ",\"value\":") < 0
        || put_twos_complement(b, u, negative) < 0 || put_byte(b, '}') < 0)
        return -1;
    return 1;
}

/* NaN, Infinity or -Infinity, as a string (Debezium's) or bare (Python's json) */
static int
put_special(Buf *b, const char *name, int quoted)
{
    if (quoted && put_byte(b, '"') < 0)
        return -1;
    if (put(b, name, (Py_ssize_t)strlen(name)) < 0 || (quoted && put_byte(b, '"') < 0))
        return -1;
    return 1;
}

/* a float's text as float() reads it, written as json writes the float: repr, or NaN,
 * Infinity, -Infinity, as strings when quoted (debezium_json.float_value) */
static int
put_json_float(Buf *b, const char *s, Py_ssize_t n, int quoted)
{
    double d;
    if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0)
        || (n == 9 && memcmp(s, "-Infinity", 9) == 0)) {
        char name[10];
        memcpy(name, s, n);
        name[n] = '\0';
        return put_special(b, name, quoted);
    }
    if (n == 0 || n > 64)
        return 0;
    char number[65], *end;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e'
              || c == 'E'))
            return 0;
        number[i] = c;
    }
    number[n] = '\0';
    d = strtod(number, &end);
    if (end != number + n)
        return 0;
    if (!isfinite(d))
        return put_special(b, d > 0 ? "Infinity" : "-Infinity", quoted);
    char *text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return -1;
    int rc = put(b, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return rc < 0 ? -1 : 1;
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

/* "HH:MM:SS[.f{1,6}]" at s, hours 0-23: its microseconds past midnight and length, or 0 */
static Py_ssize_t
parse_time(const char *s, Py_ssize_t n, long long *micros)
{
    if (n < 8 || s[2] != ':' || s[5] != ':')
        return 0;
    int hour = digits_at(s, 2), minute = digits_at(s + 3, 2), second = digits_at(s + 6, 2);
    if (hour < 0 || hour > 23 || minute < 0 || minute > 59 || second < 0 || second > 59)
        return 0;
    Py_ssize_t i = 8;
    int fraction = 0;
    if (i < n && s[i] == '.') {
        int count = 0;
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            if (++count > 6)
                return 0;
            fraction = fraction * 10 + (s[i] - '0');
        }
        if (count == 0)
            return 0;
        for (; count < 6; count++)
            fraction *= 10;
    }
    *micros = ((long long)(hour * 60 + minute) * 60 + second) * 1000000LL + fraction;
    return i;
}

/* a time's COPY text as microseconds (or milliseconds) past midnight */
static int
put_time(Buf *b, const char *s, Py_ssize_t n, int millis)
{
    long long micros;
    if (parse_time(s, n, &micros) != n)
        return 0;
    return put_ll(b, millis ? micros / 1000 : micros) < 0 ? -1 : 1;
}

/* COPY's "YYYY-MM-DD HH:MM:SS[.f]" of a timestamp (years 1-9999): microseconds since
 * 1970-01-01 00:00, or 0 */
static int
parse_timestamp(const char *s, Py_ssize_t n, long long *epoch_micros)
{
    long long micros;
    if (n < 19 || !is_iso_date(s, 10) || s[10] != ' '
        || parse_time(s + 11, n - 11, &micros) != n - 11)
        return 0;
    *epoch_micros = days_from_civil(digits_at(s, 4), digits_at(s + 5, 2), digits_at(s + 8, 2))
                    * 86400000000LL + micros;
    return 1;
}

/* a timestamptz's offset (what follows its time) is zero or absent: "+00", "+00:00",
 * "+00:00:00" (or -), "" */
static int
zero_offset(const char *s, Py_ssize_t n)
{
    return n == 0 || ((n == 3 || n == 6 || n == 9) && (s[0] == '+' || s[0] == '-')
                      && memcmp(s + 1, "00:00:00", n - 1) == 0);
}

static int
put_timestamp(Buf *b, const char *s, Py_ssize_t n, int millis)
{
    long long epoch_micros;
    if (!parse_timestamp(s, n, &epoch_micros))
        return 0;
    return put_ll(b, millis ? floor_div(epoch_micros, 1000) : epoch_micros) < 0 ? -1 : 1;
}

/* timestamptz in UTC, ISO 8601 with width fraction digits (none for 0 unless there is a
 * fraction, then without trailing zeros): debezium_json.zoned_timestamp_converter */
static int
put_timestamptz(Buf *b, const char *s, Py_ssize_t n, int width)
{
    long long micros_of_day;
    if (n < 19 || !is_iso_date(s, 10) || s[10] != ' ')
        return 0;
    Py_ssize_t end = 11 + parse_time(s + 11, n - 11, &micros_of_day);
    if (end == 11 || !zero_offset(s + end, n - end) || width > 9)
        return 0;
    int us = (int)(micros_of_day % 1000000);
    char out[48];
    Py_ssize_t at = 0;
    out[at++] = '"';
    memcpy(out + at, s, 10);
    at += 10;
    out[at++] = 'T';
    memcpy(out + at, s + 11, 8);
    at += 8;
    char digits[9];
    for (int k = 5; k >= 0; k--, us /= 10)
        digits[k] = (char)('0' + us % 10);
    memcpy(digits + 6, "000", 3);
    if (width == 0) {
        int count = 6;
        while (count > 0 && digits[count - 1] == '0')
            count--;
        if (count) {
            out[at++] = '.';
            memcpy(out + at, digits, count);
            at += count;
        }
    }
    else {
        out[at++] = '.';
        memcpy(out + at, digits, width);
        at += width;
    }
    out[at++] = 'Z';
    out[at++] = '"';
    return put(b, out, at) < 0 ? -1 : 1;
}

/* a uuid's canonical text (lowercase, as str(UUID(text)) gives it), quoted */
static int
put_uuid(Buf *b, const char *s, Py_ssize_t n)
{
    if (n != 36)
        return 0;
    for (int i = 0; i < 36; i++) {
        char c = s[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (c != '-')
                return 0;
        }
        else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
    }
    return put_json_string(b, s, n) < 0 ? -1 : 1;
}

/* a Python value as json writes it (the envelope's JSON: allow_nan, no spaces,
 * ensure_ascii off): None, bools, ints of 64 bits, floats, exact str, lists and dicts of
 * those here, anything else as dump(value) gives it */
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
        double x = PyFloat_AS_DOUBLE(v);
        if (!isfinite(x))
            return put_special(b, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity", 0) < 0
                ? -1 : 0;
        char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (text == NULL)
            return -1;
        int rc = put(b, text, (Py_ssize_t)strlen(text));
        PyMem_Free(text);
        return rc;
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

/* one non-null value (its text, escapes undone) of a column of kind `kind`: 1 written,
 * 0 not one this code writes (the fallback does), -1 an error */
static int
put_json_value(Buf *b, Buf *scratch, int kind, int arg, const char *s, Py_ssize_t n)
{
    int64_t number;
    switch (kind) {
    case J_STRING:
        return put_json_string(b, s, n) < 0 ? -1 : 1;
    case J_INTEGER:
        if (parse_integer(s, n, &number))
            return put_ll(b, number) < 0 ? -1 : 1;
        return 0;
    case J_BOOLEAN:
        if (n == 1 && (s[0] == 't' || s[0] == 'f'))
            return (s[0] == 't' ? PUTS(b, "true") : PUTS(b, "false")) < 0 ? -1 : 1;
        return 0;
    case J_FLOAT:
    case J_FLOAT_BARE:
        return put_json_float(b, s, n, kind == J_FLOAT);
    case J_NUMERIC:
        return put_numeric_fixed(b, s, n, arg);
    case J_NUMERIC_VARIABLE:
        return put_numeric_variable(b, s, n);
    case J_DATE_DAYS:
        if (is_iso_date(s, n))
            return put_ll(b, days_from_civil(digits_at(s, 4), digits_at(s + 5, 2),
                                             digits_at(s + 8, 2))) < 0 ? -1 : 1;
        return 0;
    case J_TIME_MICROS:
    case J_TIME_MILLIS:
        return put_time(b, s, n, kind == J_TIME_MILLIS);
    case J_TS_MICROS:
    case J_TS_MILLIS:
        return put_timestamp(b, s, n, kind == J_TS_MILLIS);
    case J_TSTZ:
        return put_timestamptz(b, s, n, arg);
    case J_BASE64:
        return put_bytea(b, scratch, s, n);
    case J_UUID:
        return put_uuid(b, s, n);
    case J_TEXT_NUMERIC:  /* str(Decimal(text)) */
        return numeric_as_is(s, n) ? (put_json_string(b, s, n) < 0 ? -1 : 1) : 0;
    case J_ISO_DATE:  /* date.isoformat() */
        return is_iso_date(s, n) ? (put_json_string(b, s, n) < 0 ? -1 : 1) : 0;
    case J_ISO_TIMESTAMP: {  /* datetime.isoformat() */
        char iso[48];
        Py_ssize_t size;
        if (n <= 40 && iso_timestamp(s, n, iso, &size))
            return put_json_string(b, iso, size) < 0 ? -1 : 1;
        return 0;
    }
    case J_INT_ARRAY: {
        Py_ssize_t start = b->size;
        Buf json;
        buf_init(&json);
        int done = json_int_array(s, n, &json);
        int rc = done ? put(b, json.data, json.size) : 0;
        buf_free(&json);
        if (rc < 0 || PyErr_Occurred()) {
            b->size = start;
            return -1;
        }
        return done;
    }
    default:
        return 0;
    }
}

#endif
