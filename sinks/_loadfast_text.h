/*
 * COPY's text format: escapes undone, and the exact checks and rewrites that turn a
 * column's COPY text into the text or number sinks/avro.py would write for it.
 * Part of sinks/_loadfast.c (included there once; static functions).
 */
#ifndef PGCDC_LOADFAST_TEXT_H
#define PGCDC_LOADFAST_TEXT_H

/* --- transcoding one COPY text value --------------------------------------------------- */

enum { K_FALLBACK, K_TEXT, K_INT, K_LONG, K_BOOLEAN, K_FLOAT, K_DOUBLE, K_NUMERIC, K_DATE,
       K_TIMESTAMP, K_INT_ARRAY, K_COUNT };

/* COPY text's escapes undone into out (\b \f \n \r \t \v \\, octal, \xhh, \c -> c) */
static int
unescape(Buf *out, const char *s, Py_ssize_t n)
{
    out->size = 0;
    if (buf_reserve(out, n) < 0)
        return -1;
    char *to = out->data;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 == n) {
            *to++ = c;
            continue;
        }
        c = s[++i];
        switch (c) {
        case 'b': *to++ = '\b'; break;
        case 'f': *to++ = '\f'; break;
        case 'n': *to++ = '\n'; break;
        case 'r': *to++ = '\r'; break;
        case 't': *to++ = '\t'; break;
        case 'v': *to++ = '\v'; break;
        case 'x':
            if (i + 1 < n && isxdigit((unsigned char)s[i + 1])) {
                int v = 0;
                for (int k = 0; k < 2 && i + 1 < n && isxdigit((unsigned char)s[i + 1]); k++) {
                    char h = s[++i];
                    v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                *to++ = (char)v;
            }
            else
                *to++ = 'x';
            break;
        default:
            if (c >= '0' && c <= '7') {
                int v = c - '0';
                for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++)
                    v = v * 8 + (s[++i] - '0');
                *to++ = (char)v;
            }
            else
                *to++ = c;
        }
    }
    out->size = to - out->data;
    return 0;
}

/* a decimal integer, optional sign: 1 and *value, or 0 when not one in int64 range */
static int
parse_integer(const char *s, Py_ssize_t n, int64_t *value)
{
    Py_ssize_t i = 0;
    int negative = 0;
    if (n > 0 && (s[0] == '-' || s[0] == '+')) {
        negative = s[0] == '-';
        i = 1;
    }
    if (i == n || n - i > 19)
        return 0;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX + (uint64_t)negative)
        return 0;
    *value = negative ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static int
all_digits(const char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return n > 0;
}

/* COPY's text of a numeric is str(Decimal(text)) unless Python would print it in
 * scientific notation: a magnitude below 1e-6 (adjusted exponent < -6) */
static int
numeric_as_is(const char *s, Py_ssize_t n)
{
    if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0)
        || (n == 9 && memcmp(s, "-Infinity", 9) == 0))
        return 1;
    Py_ssize_t i = (n > 0 && s[0] == '-') ? 1 : 0;
    Py_ssize_t dot = i;
    while (dot < n && s[dot] != '.')
        dot++;
    if (!all_digits(s + i, dot - i) || (dot < n && !all_digits(s + dot + 1, n - dot - 1)))
        return 0;
    if (dot - i > 1 && s[i] == '0')
        return 0;  /* not COPY's form */
    if (dot == n || s[i] != '0')
        return 1;  /* an integer part other than 0 */
    Py_ssize_t zeros = 0, fraction = n - dot - 1;
    while (zeros < fraction && s[dot + 1 + zeros] == '0')
        zeros++;
    Py_ssize_t adjusted = zeros == fraction ? -fraction : -(zeros + 1);
    return adjusted >= -6;
}

static int
digits_at(const char *s, int count)
{
    int v = 0;
    for (int i = 0; i < count; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* "YYYY-MM-DD" of a date datetime.date can hold (years 1-9999), as date.isoformat() */
static int
is_iso_date(const char *s, Py_ssize_t n)
{
    if (n != 10 || s[4] != '-' || s[7] != '-')
        return 0;
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int year = digits_at(s, 4), month = digits_at(s + 5, 2), day = digits_at(s + 8, 2);
    if (year < 1 || month < 1 || month > 12 || day < 1)
        return 0;
    int leap = month == 2 && year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    return day <= days[month - 1] + leap;
}

/* COPY's "YYYY-MM-DD HH:MM:SS[.f][+HH[:MM[:SS]]]" as datetime.fromisoformat(text).isoformat()
 * into out (at most 40 bytes); 0 for any other text (the Python fallback decides) */
static int
iso_timestamp(const char *s, Py_ssize_t n, char *out, Py_ssize_t *size)
{
    if (n < 19 || !is_iso_date(s, 10) || s[10] != ' ' || s[13] != ':' || s[16] != ':')
        return 0;
    int hour = digits_at(s + 11, 2), minute = digits_at(s + 14, 2), second = digits_at(s + 17, 2);
    if (hour < 0 || hour > 23 || minute < 0 || minute > 59 || second < 0 || second > 59)
        return 0;
    memcpy(out, s, 19);
    out[10] = 'T';
    Py_ssize_t at = 19, i = 19;
    if (i < n && s[i] == '.') {
        int micros = 0, count = 0;
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            if (++count > 6)
                return 0;
            micros = micros * 10 + (s[i] - '0');
        }
        if (count == 0)
            return 0;
        for (; count < 6; count++)
            micros *= 10;
        if (micros) {
            out[at++] = '.';
            for (int k = 5; k >= 0; k--, micros /= 10)
                out[at + k] = (char)('0' + micros % 10);
            at += 6;
        }
    }
    if (i < n) {
        if (s[i] != '+' && s[i] != '-')
            return 0;
        int parts[3] = {0, 0, 0}, count = 0;
        char sign = s[i++];
        while (count < 3) {
            if (i + 2 > n || (parts[count] = digits_at(s + i, 2)) < 0)
                return 0;
            i += 2;
            count++;
            if (i == n)
                break;
            if (s[i++] != ':')
                return 0;
        }
        if (i != n || parts[0] > 23 || parts[1] > 59 || parts[2] > 59)
            return 0;
        if (sign == '-' && parts[0] == 0 && parts[1] == 0 && parts[2] == 0)
            sign = '+';
        out[at++] = sign;
        for (int k = 0; k < (parts[2] ? 3 : 2); k++) {
            if (k)
                out[at++] = ':';
            out[at++] = (char)('0' + parts[k] / 10);
            out[at++] = (char)('0' + parts[k] % 10);
        }
    }
    *size = at;
    return 1;
}

/* COPY's "{1,2,NULL}" of a one-dimensional integer array as JSON "[1,2,null]" into out;
 * 0 for anything else */
static int
json_int_array(const char *s, Py_ssize_t n, Buf *out)
{
    out->size = 0;
    if (n < 2 || s[0] != '{' || s[n - 1] != '}' || buf_reserve(out, n + 4 * (n / 2 + 1)) < 0)
        return 0;
    char *to = out->data;
    *to++ = '[';
    Py_ssize_t i = 1, end = n - 1;
    if (i == end) {
        *to++ = ']';
        out->size = to - out->data;
        return 1;
    }
    for (;;) {
        Py_ssize_t start = i;
        while (i < end && s[i] != ',')
            i++;
        int64_t ignored;
        if (i - start == 4 && memcmp(s + start, "NULL", 4) == 0) {
            memcpy(to, "null", 4);
            to += 4;
        }
        else if (parse_integer(s + start, i - start, &ignored) && s[start] != '+'
                 && !(i - start > 1 && s[start] == '0')
                 && !(i - start >= 2 && s[start] == '-' && s[start + 1] == '0')) {
            memcpy(to, s + start, i - start);
            to += i - start;
        }
        else
            return 0;
        if (i == end)
            break;
        *to++ = ',';
        i++;
    }
    *to++ = ']';
    out->size = to - out->data;
    return 1;
}

#endif
