/*
 * A growable byte buffer and the Avro primitives written into it, shared by the compiled
 * encoders (sinks/_fastavro.c: events; sinks/_loadfast.c: the initial load's COPY rows).
 * Static functions: each module gets its own copy.  Include after <Python.h>.
 */
#ifndef PGCDC_AVROBUF_H
#define PGCDC_AVROBUF_H

#include <stdint.h>
#include <string.h>

/* --- a growable byte buffer, on the stack until it outgrows it ------------------------ */

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
    char small[512];
} Buf;

static void
buf_init(Buf *b)
{
    b->data = b->small;
    b->size = 0;
    b->capacity = sizeof(b->small);
}

static void
buf_free(Buf *b)
{
    if (b->data != b->small)
        PyMem_Free(b->data);
    buf_init(b);
}

static int
buf_reserve(Buf *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity;
    while (capacity < b->size + more) {
        if (capacity > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        capacity *= 2;
    }
    char *data;
    if (b->data == b->small) {
        data = PyMem_Malloc(capacity);
        if (data != NULL)
            memcpy(data, b->small, b->size);
    }
    else {
        data = PyMem_Realloc(b->data, capacity);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int
put(Buf *b, const void *data, Py_ssize_t size)
{
    if (buf_reserve(b, size) < 0)
        return -1;
    memcpy(b->data + b->size, data, size);
    b->size += size;
    return 0;
}

static int
put_byte(Buf *b, unsigned char c)
{
    if (buf_reserve(b, 1) < 0)
        return -1;
    b->data[b->size++] = (char)c;
    return 0;
}

static uint64_t
zigzag(int64_t value)
{
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
}

/* a varint of an already zigzagged number */
static int
put_varint(Buf *b, uint64_t n)
{
    if (buf_reserve(b, 10) < 0)
        return -1;
    char *at = b->data + b->size;
    while (n > 0x7F) {
        *at++ = (char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *at++ = (char)n;
    b->size = at - b->data;
    return 0;
}

static int
put_bytes_object(Buf *b, PyObject *bytes)
{
    return put(b, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

/* an Avro string: its length, then its UTF-8 */
static int
put_text(Buf *b, const char *data, Py_ssize_t size)
{
    if (put_varint(b, (uint64_t)size << 1) < 0)
        return -1;
    return put(b, data, size);
}

#endif
