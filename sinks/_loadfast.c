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

/* --- librdkafka's public API, the part used here (rdkafka.h, ABI-stable since 1.0) ----- */

typedef struct rk_s rk_t;
typedef struct rk_conf_s rk_conf_t;
typedef struct rk_topic_s rk_topic_t;
typedef struct rk_headers_s rk_headers_t;

typedef struct {
    int err;
    rk_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rk_message_t;

enum { VTYPE_END, VTYPE_TOPIC, VTYPE_RKT, VTYPE_PARTITION, VTYPE_VALUE, VTYPE_KEY,
       VTYPE_OPAQUE, VTYPE_MSGFLAGS, VTYPE_TIMESTAMP, VTYPE_HEADER, VTYPE_HEADERS };
#define MSG_F_COPY 0x2
#define PARTITION_UA (-1)
#define ERR_QUEUE_FULL (-184)

static struct {
    int (*version)(void);
    rk_conf_t *(*conf_new)(void);
    int (*conf_set)(rk_conf_t *, const char *, const char *, char *, size_t);
    void (*conf_set_dr_msg_cb)(rk_conf_t *, void (*)(rk_t *, const rk_message_t *, void *));
    void (*conf_set_opaque)(rk_conf_t *, void *);
    void (*conf_destroy)(rk_conf_t *);
    rk_t *(*new_)(int, rk_conf_t *, char *, size_t);
    void (*destroy)(rk_t *);
    rk_topic_t *(*topic_new)(rk_t *, const char *, void *);
    void (*topic_destroy)(rk_topic_t *);
    const char *(*topic_name)(const rk_topic_t *);
    int (*producev)(rk_t *, ...);
    int (*poll)(rk_t *, int);
    int (*flush)(rk_t *, int);
    int (*outq_len)(rk_t *);
    const char *(*err2str)(int);
    int (*fatal_error)(rk_t *, char *, size_t);
    rk_headers_t *(*headers_new)(size_t);
    void (*headers_destroy)(rk_headers_t *);
    rk_headers_t *(*headers_copy)(const rk_headers_t *);
    int (*header_add)(rk_headers_t *, const char *, Py_ssize_t, const void *, Py_ssize_t);
} rk;

static int rk_loaded = 0;

static int
load_library(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot load librdkafka from %s: %s", path, dlerror());
        return -1;
    }
    struct { void **slot; const char *name; } symbols[] = {
        {(void **)&rk.version, "rd_kafka_version"},
        {(void **)&rk.conf_new, "rd_kafka_conf_new"},
        {(void **)&rk.conf_set, "rd_kafka_conf_set"},
        {(void **)&rk.conf_set_dr_msg_cb, "rd_kafka_conf_set_dr_msg_cb"},
        {(void **)&rk.conf_set_opaque, "rd_kafka_conf_set_opaque"},
        {(void **)&rk.conf_destroy, "rd_kafka_conf_destroy"},
        {(void **)&rk.new_, "rd_kafka_new"},
        {(void **)&rk.destroy, "rd_kafka_destroy"},
        {(void **)&rk.topic_new, "rd_kafka_topic_new"},
        {(void **)&rk.topic_destroy, "rd_kafka_topic_destroy"},
        {(void **)&rk.topic_name, "rd_kafka_topic_name"},
        {(void **)&rk.producev, "rd_kafka_producev"},
        {(void **)&rk.poll, "rd_kafka_poll"},
        {(void **)&rk.flush, "rd_kafka_flush"},
        {(void **)&rk.outq_len, "rd_kafka_outq_len"},
        {(void **)&rk.err2str, "rd_kafka_err2str"},
        {(void **)&rk.fatal_error, "rd_kafka_fatal_error"},
        {(void **)&rk.headers_new, "rd_kafka_headers_new"},
        {(void **)&rk.headers_destroy, "rd_kafka_headers_destroy"},
        {(void **)&rk.headers_copy, "rd_kafka_headers_copy"},
        {(void **)&rk.header_add, "rd_kafka_header_add"},
    };
    for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
        *symbols[i].slot = dlsym(lib, symbols[i].name);
        if (*symbols[i].slot == NULL) {
            PyErr_Format(PyExc_ImportError, "librdkafka at %s lacks %s", path, symbols[i].name);
            return -1;
        }
    }
    if (rk.version() < 0x010600ff) {
        PyErr_Format(PyExc_ImportError, "librdkafka at %s is version 0x%x; 1.6 or later needed",
                     path, rk.version());
        return -1;
    }
    rk_loaded = 1;
    return 0;
}

/* --- Producer ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    rk_t *rk;
    long long delivered, failed, produced;
    char error[512];  /* the first failed delivery, or "" */
} Producer;

static void
delivery_report(rk_t *handle, const rk_message_t *message, void *opaque)
{
    Producer *self = (Producer *)opaque;
    if (message->err == 0) {
        self->delivered++;
        return;
    }
    if (self->failed++ == 0)
        snprintf(self->error, sizeof(self->error), "delivery to %s failed: %s",
                 message->rkt ? rk.topic_name(message->rkt) : "?", rk.err2str(message->err));
}

static int
Producer_init(Producer *self, PyObject *args, PyObject *kwargs)
{
    const char *library;
    PyObject *config;
    if (!PyArg_ParseTuple(args, "sO!", &library, &PyList_Type, &config))
        return -1;
    if (!rk_loaded && load_library(library) < 0)
        return -1;
    char errstr[512];
    rk_conf_t *conf = rk.conf_new();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(config); i++) {
        const char *name, *value;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(config, i), "ss", &name, &value)) {
            rk.conf_destroy(conf);
            return -1;
        }
        if (rk.conf_set(conf, name, value, errstr, sizeof(errstr)) != 0) {
            PyErr_Format(PyExc_ValueError, "producer property %s: %s", name, errstr);
            rk.conf_destroy(conf);
            return -1;
        }
    }
    rk.conf_set_dr_msg_cb(conf, delivery_report);
    rk.conf_set_opaque(conf, self);
    self->rk = rk.new_(0 /* RD_KAFKA_PRODUCER */, conf, errstr, sizeof(errstr));
    if (self->rk == NULL) {
        rk.conf_destroy(conf);
        PyErr_Format(PyExc_RuntimeError, "cannot create the load's Kafka producer: %s", errstr);
        return -1;
    }
    return 0;
}

static void
Producer_dealloc(Producer *self)
{
    if (self->rk != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rk.destroy(self->rk);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
producer_ready(Producer *self)
{
    if (self->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the load's Kafka producer is closed");
        return 0;
    }
    return 1;
}

static PyObject *
Producer_poll(Producer *self, PyObject *arg)
{
    int timeout_ms = (int)PyLong_AsLong(arg);
    if ((timeout_ms == -1 && PyErr_Occurred()) || !producer_ready(self))
        return NULL;
    int served;
    Py_BEGIN_ALLOW_THREADS
    served = rk.poll(self->rk, timeout_ms);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(served);
}

/* flush(timeout_ms) -> messages still queued; raises the first failure or a fatal error */
static PyObject *
Producer_flush(Producer *self, PyObject *arg)
{
    int timeout_ms = (int)PyLong_AsLong(arg);
    if ((timeout_ms == -1 && PyErr_Occurred()) || !producer_ready(self))
        return NULL;
    int left;
    Py_BEGIN_ALLOW_THREADS
    rk.flush(self->rk, timeout_ms);
    left = rk.outq_len(self->rk);
    Py_END_ALLOW_THREADS
    char fatal[512];
    if (rk.fatal_error(self->rk, fatal, sizeof(fatal)) != 0)
        return PyErr_Format(PyExc_RuntimeError, "the load's Kafka producer failed: %s", fatal);
    if (self->failed)
        return PyErr_Format(PyExc_RuntimeError, "%s (%lld messages failed)", self->error,
                            self->failed);
    return PyLong_FromLong(left);
}

static PyObject *
Producer_close(Producer *self, PyObject *unused)
{
    if (self->rk != NULL) {
        rk_t *handle = self->rk;
        self->rk = NULL;
        Py_BEGIN_ALLOW_THREADS
        rk.destroy(handle);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *
Producer_counts(Producer *self, PyObject *unused)
{
    return Py_BuildValue("(LLL)", self->produced, self->delivered, self->failed);
}

static PyMethodDef Producer_methods[] = {
    {"poll", (PyCFunction)Producer_poll, METH_O, "poll(timeout_ms) -> events served"},
    {"flush", (PyCFunction)Producer_flush, METH_O,
     "flush(timeout_ms) -> messages still queued; raises the first delivery failure"},
    {"close", (PyCFunction)Producer_close, METH_NOARGS, "destroy the producer (idempotent)"},
    {"counts", (PyCFunction)Producer_counts, METH_NOARGS, "(produced, delivered, failed)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sinks._loadfast.Producer",
    .tp_basicsize = sizeof(Producer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Producer(librdkafka_path, [(property, value), ...]): the load's producer.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Producer_init,
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_methods = Producer_methods,
};

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
                 && !(i - start > 2 && s[start] == '-' && s[start + 1] == '0')) {
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

/* --- COPY's rows from libpq itself ---------------------------------------------------------
 *
 * psycopg hands out a COPY's rows one Python call chain each (its generators and waits):
 * about 0.7 us per row, as much as encoding the event.  CopyOut runs the COPY on the
 * connection's own PGconn (psycopg's pgconn_ptr) with the libpq psycopg loaded (its path,
 * from sinks/loadfast.py), and Table.rows() reads it without an object per row.  The
 * connection is in blocking mode while the COPY runs and back in its own mode after it;
 * the COPY leaves it as psycopg left it (idle, in the same transaction).
 */

typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;
#define PGRES_COMMAND_OK 1
#define PGRES_COPY_OUT 3

static struct {
    int (*getCopyData)(PGconn *, char **, int);
    void (*freemem)(void *);
    int (*sendQuery)(PGconn *, const char *);
    PGresult *(*getResult)(PGconn *);
    int (*resultStatus)(const PGresult *);
    char *(*resultErrorMessage)(const PGresult *);
    void (*clear)(PGresult *);
    char *(*errorMessage)(const PGconn *);
    int (*setnonblocking)(PGconn *, int);
    int (*isnonblocking)(const PGconn *);
} lp;

static int lp_loaded = 0;

static int
load_libpq(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot load libpq from %s: %s", path, dlerror());
        return -1;
    }
    struct { void **slot; const char *name; } symbols[] = {
        {(void **)&lp.getCopyData, "PQgetCopyData"},
        {(void **)&lp.freemem, "PQfreemem"},
        {(void **)&lp.sendQuery, "PQsendQuery"},
        {(void **)&lp.getResult, "PQgetResult"},
        {(void **)&lp.resultStatus, "PQresultStatus"},
        {(void **)&lp.resultErrorMessage, "PQresultErrorMessage"},
        {(void **)&lp.clear, "PQclear"},
        {(void **)&lp.errorMessage, "PQerrorMessage"},
        {(void **)&lp.setnonblocking, "PQsetnonblocking"},
        {(void **)&lp.isnonblocking, "PQisnonblocking"},
    };
    for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
        *symbols[i].slot = dlsym(lib, symbols[i].name);
        if (*symbols[i].slot == NULL) {
            PyErr_Format(PyExc_ImportError, "libpq at %s lacks %s", path, symbols[i].name);
            return -1;
        }
    }
    lp_loaded = 1;
    return 0;
}

typedef struct {
    PyObject_HEAD
    PGconn *conn;
    int nonblocking;  /* the connection's mode before the COPY */
    int state;        /* 0: not started, 1: rows to read, 2: ended */
    long long rows;
} CopyOut;

static PyTypeObject CopyOutType;

static PyObject *
copy_error(CopyOut *self, const char *what, const char *message)
{
    return PyErr_Format(PyExc_ConnectionError, "COPY %s: %s", what,
                        message && *message ? message : "(no message from libpq)");
}

/* after the last row (or an error): every result, the connection back in its mode; 0 or -1 */
static int
copyout_end(CopyOut *self)
{
    PGresult *result;
    int failed = 0;
    char message[512] = "";
    Py_BEGIN_ALLOW_THREADS
    while ((result = lp.getResult(self->conn)) != NULL) {
        if (lp.resultStatus(result) != PGRES_COMMAND_OK && !failed) {
            failed = 1;
            snprintf(message, sizeof(message), "%s", lp.resultErrorMessage(result));
        }
        lp.clear(result);
    }
    Py_END_ALLOW_THREADS
    lp.setnonblocking(self->conn, self->nonblocking);
    self->state = 2;
    if (failed) {
        copy_error(self, "failed", message);
        return -1;
    }
    return 0;
}

/* the next row into *line (PQfreemem it): its size, 0 at the end, -1 on an error */
static int
copyout_next(CopyOut *self, char **line)
{
    if (self->state != 1) {
        if (self->state == 0)
            PyErr_SetString(PyExc_RuntimeError, "CopyOut not started");
        return self->state == 0 ? -1 : 0;
    }
    int size = lp.getCopyData(self->conn, line, 1);
    if (size == 0) {  /* no whole row buffered: wait for the server without the GIL */
        Py_BEGIN_ALLOW_THREADS
        size = lp.getCopyData(self->conn, line, 0);
        Py_END_ALLOW_THREADS
    }
    if (size > 0) {
        self->rows++;
        return size;
    }
    if (size == -1)
        return copyout_end(self) < 0 ? -1 : 0;
    copy_error(self, "lost its connection", lp.errorMessage(self->conn));
    self->state = 2;
    return -1;
}

/* CopyOut(libpq_path, pgconn_ptr, query): sends the COPY ... TO STDOUT query */
static int
CopyOut_init(CopyOut *self, PyObject *args, PyObject *kwargs)
{
    const char *library, *query;
    unsigned long long pointer;
    if (!PyArg_ParseTuple(args, "sKy", &library, &pointer, &query))
        return -1;
    if (self->state != 0) {
        PyErr_SetString(PyExc_RuntimeError, "CopyOut is started once");
        return -1;
    }
    if (!lp_loaded && load_libpq(library) < 0)
        return -1;
    self->conn = (PGconn *)(uintptr_t)pointer;
    self->nonblocking = lp.isnonblocking(self->conn);
    lp.setnonblocking(self->conn, 0);  /* PQsendQuery flushes the whole query */
    PGresult *result = NULL;
    int sent;
    Py_BEGIN_ALLOW_THREADS
    sent = lp.sendQuery(self->conn, query);
    if (sent)
        result = lp.getResult(self->conn);
    Py_END_ALLOW_THREADS
    if (!sent) {
        lp.setnonblocking(self->conn, self->nonblocking);
        self->state = 2;
        copy_error(self, "could not be sent", lp.errorMessage(self->conn));
        return -1;
    }
    if (result == NULL || lp.resultStatus(result) != PGRES_COPY_OUT) {
        char message[512];
        snprintf(message, sizeof(message), "%s",
                 result ? lp.resultErrorMessage(result) : lp.errorMessage(self->conn));
        if (result)
            lp.clear(result);
        self->state = 1;
        copyout_end(self);
        PyErr_Clear();
        copy_error(self, "was refused", message);
        return -1;
    }
    lp.clear(result);
    self->state = 1;
    return 0;
}

static PyObject *
CopyOut_iternext(CopyOut *self)
{
    char *line;
    int size = copyout_next(self, &line);
    if (size <= 0)
        return NULL;  /* the end (no error set) or an error */
    PyObject *row = PyBytes_FromStringAndSize(line, size);
    lp.freemem(line);
    return row;
}

/* close(): the rest of the rows read and dropped (a COPY cannot be left half read) */
static PyObject *
CopyOut_close(CopyOut *self, PyObject *unused)
{
    char *line;
    int size;
    while (self->state == 1 && (size = copyout_next(self, &line)) > 0)
        lp.freemem(line);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static void
CopyOut_dealloc(CopyOut *self)
{
    if (self->state == 1) {  /* not closed: the connection must not stay in COPY */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *done = CopyOut_close(self, NULL);
        Py_XDECREF(done);
        PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
CopyOut_rows(CopyOut *self, void *closure)
{
    return PyLong_FromLongLong(self->rows);
}

static PyMethodDef CopyOut_methods[] = {
    {"close", (PyCFunction)CopyOut_close, METH_NOARGS,
     "read and drop the rows left, collect the COPY's result"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef CopyOut_getset[] = {
    {"rows", (getter)CopyOut_rows, NULL, "rows read so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CopyOutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sinks._loadfast.CopyOut",
    .tp_basicsize = sizeof(CopyOut),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CopyOut(libpq_path, pgconn_ptr, query): a COPY ... TO STDOUT's rows, from libpq",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)CopyOut_init,
    .tp_dealloc = (destructor)CopyOut_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)CopyOut_iternext,
    .tp_methods = CopyOut_methods,
    .tp_getset = CopyOut_getset,
};

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
    Buf value, key, scratch;
    Py_ssize_t *starts, *ends;  /* each field's span in value, per row */
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
    PyMem_Free(self->kinds);
    PyMem_Free(self->key_columns);
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    buf_free(&self->value);
    buf_free(&self->key);
    buf_free(&self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Table(producer, topic, headers, kinds, fallbacks, key_columns, middle, tail) */
static int
Table_init(Table *self, PyObject *args, PyObject *kwargs)
{
    Producer *producer;
    const char *topic;
    PyObject *headers, *kinds, *fallbacks, *keys, *middle, *tail;
    if (!PyArg_ParseTuple(args, "O!sO!O!O!O!SS", &ProducerType, &producer, &topic,
                          &PyList_Type, &headers, &PyTuple_Type, &kinds, &PyTuple_Type,
                          &fallbacks, &PyTuple_Type, &keys, &middle, &tail))
        return -1;
    if (self->producer != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Table is initialized once");
        return -1;
    }
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
        if (kind < 0 || kind >= K_COUNT || !PyCallable_Check(fallback)) {
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
    Py_INCREF(middle);
    self->middle = middle;
    Py_INCREF(tail);
    self->tail = tail;
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

/* the Row record of one COPY line (its fields separated by tabs, \N for null) */
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
        self->starts[i] = self->value.size;
        if (n == 2 && field[0] == '\\' && field[1] == 'N') {
            if (put_byte(&self->value, 0) < 0)
                return -1;
        }
        else if (put_field(self, i, field, n) < 0)
            return -1;
        self->ends[i] = self->value.size;
        at += n + 1;
    }
    if (at <= size) {
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
            PyErr_Format(PyExc_RuntimeError, "the load's Kafka producer refused a message: %s",
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

/* the key and the value of the read event of one COPY line, into self->key, self->value */
static int
encode_line(Table *self, const char *line, Py_ssize_t size, long long ordinal, long long now_ms)
{
    self->value.size = 0;
    self->key.size = 0;
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

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sinks._loadfast.Table",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Table(producer, topic, headers, kinds, fallbacks, key_columns, middle, tail)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sinks._loadfast",
    "The initial load's COPY rows straight to Kafka as Avro read events (sinks/loadfast.py).",
    -1, NULL,
};

PyMODINIT_FUNC
PyInit__loadfast(void)
{
    if (PyType_Ready(&ProducerType) < 0 || PyType_Ready(&TableType) < 0
        || PyType_Ready(&CopyOutType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    const char *names[] = {"FALLBACK", "TEXT", "INT", "LONG", "BOOLEAN", "FLOAT", "DOUBLE",
                           "NUMERIC", "DATE", "TIMESTAMP", "INT_ARRAY"};
    for (int i = 0; i < K_COUNT; i++)
        if (PyModule_AddIntConstant(m, names[i], i) < 0)
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
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
