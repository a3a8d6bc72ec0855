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
 *
 * A binary value ('b', pgoutput's binary option) of a common type is read in C too:
 * decoder/_fastrow_binary.h has the BinaryDecoder that decoder/binary.py gives such a
 * column, and decode_row calls it on the value where it lies in the message.
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

#include "_fastrow_binary.h"

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

static PyMethodDef methods[] = {
    {"tuple_data", (PyCFunction)(void (*)(void))tuple_data, METH_FASTCALL,
     "tuple_data(buf, pos, unchanged) -> (values, end): the TupleData at pos."},
    {"decode_row", (PyCFunction)(void (*)(void))decode_row, METH_FASTCALL,
     "decode_row(buf, pos, columns) -> (row, unchanged_names, end): TupleData as a typed row."},
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
