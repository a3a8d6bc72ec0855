/*
 * CopyOut: a COPY ... TO STDOUT's rows read from libpq itself, on psycopg's connection.
 * Part of sinks/_loadfast.c (included there once; static functions).
 */
#ifndef PGCDC_LOADFAST_LIBPQ_H
#define PGCDC_LOADFAST_LIBPQ_H

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
    const Symbol symbols[] = {
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
    if (resolve("libpq", path, symbols, sizeof(symbols) / sizeof(symbols[0])) < 0)
        return -1;
    lp_loaded = 1;
    return 0;
}

typedef struct {
    PyObject_HEAD
    PGconn *conn;
    int nonblocking;  /* the connection's mode before the COPY */
    int state;        /* 0: not started, 1: rows to read, 2: ended */
} CopyOut;

static PyTypeObject CopyOutType;
static PyObject *CopyError;  /* sinks._loadfast.CopyError, a ConnectionError */

static PyObject *
copy_error(CopyOut *self, const char *what, const char *message)
{
    return PyErr_Format(CopyError, "COPY %s: %s", what,
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
    if (size > 0)
        return size;
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

static PyMethodDef CopyOut_methods[] = {
    {"close", (PyCFunction)CopyOut_close, METH_NOARGS,
     "read and drop the rows left, collect the COPY's result"},
    {NULL, NULL, 0, NULL},
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
};

#endif
