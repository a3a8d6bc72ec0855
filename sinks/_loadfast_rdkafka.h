/*
 * The initial load's librdkafka producer: the part of librdkafka's public C API it uses,
 * resolved at run time from the library confluent_kafka loaded, and the Producer type.
 * Part of sinks/_loadfast.c (included there once; static functions).
 */
#ifndef PGCDC_LOADFAST_RDKAFKA_H
#define PGCDC_LOADFAST_RDKAFKA_H

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
static PyObject *ProduceError;  /* sinks._loadfast.ProduceError: Kafka refused or failed */

typedef struct { void **slot; const char *name; } Symbol;

/* every symbol of a library (already loaded by the process, or loaded now): 0 or -1 */
static int
resolve(const char *what, const char *path, const Symbol *symbols, size_t count)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot load %s from %s: %s", what, path, dlerror());
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        *symbols[i].slot = dlsym(lib, symbols[i].name);
        if (*symbols[i].slot == NULL) {
            PyErr_Format(PyExc_ImportError, "%s at %s lacks %s", what, path, symbols[i].name);
            return -1;
        }
    }
    return 0;
}

static int
load_library(const char *path)
{
    const Symbol symbols[] = {
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
    if (resolve("librdkafka", path, symbols, sizeof(symbols) / sizeof(symbols[0])) < 0)
        return -1;
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
    long long failed, produced;  /* successes are not reported (delivery.report.only.error) */
    char error[512];  /* the first failed delivery, or "" */
} Producer;

static void
delivery_report(rk_t *handle, const rk_message_t *message, void *opaque)
{
    Producer *self = (Producer *)opaque;
    if (message->err == 0)
        return;
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
        return PyErr_Format(ProduceError, "the load's Kafka producer failed: %s", fatal);
    if (self->failed)
        return PyErr_Format(ProduceError, "%s (%lld messages failed)", self->error,
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

static PyMethodDef Producer_methods[] = {
    {"poll", (PyCFunction)Producer_poll, METH_O, "poll(timeout_ms) -> events served"},
    {"flush", (PyCFunction)Producer_flush, METH_O,
     "flush(timeout_ms) -> messages still queued; raises the first delivery failure"},
    {"close", (PyCFunction)Producer_close, METH_NOARGS, "destroy the producer (idempotent)"},
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

#endif
