/*
 * decoder/_fastrow_binary.h: binary column values of the common types, for _fastrow.c
 * (included there, one translation unit: setup.py builds _fastrow.c alone).
 */

/* --- Binary values: the send formats of the hot types, compiled -----------------------------
 *
 * BinaryDecoder(kind, fallback, element=None, element_oid=0) is a callable that turns the
 * bytes of one binary column value (pgoutput's binary option: the type's send function
 * output) into the Python value decoder/binary.py returns for them.  decode_row calls it
 * on the value where it lies in the message, without a bytes object or a Python frame.
 *
 * The C code reads only the common case of each format.  Whatever it cannot turn into
 * exactly the reference's value (infinity, BC and years past 9999, NaN and infinite
 * numerics, a length that is not the type's, invalid UTF-8, an array with an element of
 * that kind, any malformed byte) goes, value by value, to `fallback`: the column's Python
 * decoder (decoder/binary.py), which returns the value or raises the error naming the
 * type.  tests/unit/test_fastrow_binary.py checks both against each other.
 *
 * Formats (the *_send functions in PostgreSQL's src/backend/utils/adt/): integers and
 * floats big-endian; numeric is ndigits, weight, sign, dscale (Int16 each), then ndigits
 * base-10000 digits; dates are Int32 days and timestamps Int64 microseconds since
 * 2000-01-01; jsonb a version byte (1) and its text; arrays ndim, flags, element OID,
 * (size, lower bound) per dimension, then each element as Int32 length (-1: NULL) and its
 * bytes.
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
