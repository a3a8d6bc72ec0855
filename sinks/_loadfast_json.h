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

#include "_jsonbuf.h"

/* a column's JSON writer (0, FALLBACK: its Python fallback), with an argument for some */
enum { J_FALLBACK, J_STRING, J_INTEGER, J_BOOLEAN, J_FLOAT, J_NUMERIC, J_NUMERIC_VARIABLE,
       J_DATE_DAYS, J_TIME_MICROS, J_TIME_MILLIS, J_TS_MICROS, J_TS_MILLIS, J_TSTZ, J_BASE64,
       J_UUID, J_INT_ARRAY,
       /* pgcdc's own JSON: a float's NaN and infinities bare (as Python's json writes
        * them), numeric, date and timestamps as strings of their Python text */
       J_FLOAT_BARE, J_TEXT_NUMERIC, J_ISO_DATE, J_ISO_TIMESTAMP, J_COUNT };

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

/* numeric(p,s) in precise mode: the unscaled value at scale s (debezium_json._unscaled) */
static int
put_numeric_fixed(Buf *b, const char *s, Py_ssize_t n, int scale)
{
    unsigned __int128 u;
    int negative, fraction;
    if (!parse_numeric(s, n, &u, &negative, &fraction))
        return 0;
    if (!rescale(&u, scale - fraction))
        return 0;  /* e.g. more decimal places than the scale: Python's error */
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

/* a float's text as float() reads it, written as json writes the float: repr, or NaN,
 * Infinity, -Infinity, as strings when quoted (debezium_json.float_value) */
static int
put_json_float(Buf *b, const char *s, Py_ssize_t n, int quoted)
{
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
    double d = strtod(number, &end);
    if (end != number + n)
        return 0;
    return put_float(b, d, quoted) < 0 ? -1 : 1;
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
