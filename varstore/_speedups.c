/* varstore._speedups: the per-record loops that cost most from Python, compiled.

   Every routine here has a pure-Python twin that decides whenever this one
   declines: a read returns None (and the caller takes its Python path, which
   raises the error with its message) unless the record is in range and its
   offsets are sound; msgpack_passes answers True only for payloads the Python
   check (varstore/format/msgpack_bounds.py) accepts, and False for anything it
   is not sure of. So this module can make varstore faster, never different.
   varstore/_native.py imports it, or None when it was not built. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78) ------------------------------- */

static uint32_t crc_table[8][256];

static void crc_tables_init(void)
{
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        crc_table[0][byte] = crc;
    }
    for (uint32_t byte = 0; byte < 256; byte++)
        for (int slice = 1; slice < 8; slice++)
            crc_table[slice][byte] = (crc_table[slice - 1][byte] >> 8) ^ crc_table[0][crc_table[slice - 1][byte] & 0xFF];
}

/* Slicing-by-8 over the inverted state `crc`. */
static uint32_t crc_software(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][low & 0xFF] ^ crc_table[6][(low >> 8) & 0xFF] ^ crc_table[5][(low >> 16) & 0xFF]
            ^ crc_table[4][low >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HARDWARE_CRC 1

/* The SSE4.2 crc32 instruction, eight bytes at a time; chosen at import when the CPU has it. */
__attribute__((target("sse4.2"))) static uint32_t crc_hardware(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        n--;
    }
    uint64_t wide = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        wide = _mm_crc32_u64(wide, word);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)wide;
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

static uint32_t (*crc_update)(uint32_t, const uint8_t *, size_t) = crc_software;

static inline uint32_t crc32c_of(const uint8_t *p, size_t n)
{
    return ~crc_update(0xFFFFFFFFu, p, n);
}

/* Bytes at which to let other threads run while checksumming. */
#define RELEASE_GIL_BYTES (1 << 16)

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t value;
    memcpy(&value, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    value = __builtin_bswap64(value);
#endif
    return value;
}

/* 0, or -1 if an offset changed (another thread, a shared map) since they were checked: each range is loaded once
   and checked again before it is read. */
static int checksum_ranges(const uint8_t *bytes, uint64_t size, const uint8_t *bounds, Py_ssize_t count, uint8_t *out)
{
    for (Py_ssize_t k = 0; k < count; k++) {
        uint64_t start = load_le64(bounds + 8 * k), end = load_le64(bounds + 8 * k + 8);
        if (start > end || end > size)
            return -1;
        uint32_t value = crc32c_of(bytes + start, (size_t)(end - start));
        memcpy(out + 4 * k, &value, 4);
    }
    return 0;
}

static PyObject *crc32c_ranges(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "crc32c_ranges(data, offsets) takes 2 arguments");
        return NULL;
    }
    Py_buffer data, offsets;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &offsets, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    if (offsets.len % 8 != 0 || offsets.len < 8) {
        PyErr_Format(PyExc_ValueError, "offsets must be at least one little-endian uint64, got %zd bytes", offsets.len);
        goto done;
    }
    Py_ssize_t count = offsets.len / 8 - 1;
    const uint8_t *bounds = offsets.buf, *bytes = data.buf;
    uint64_t previous = load_le64(bounds), total = 0;
    for (Py_ssize_t k = 1; k <= count; k++) {
        uint64_t next = load_le64(bounds + 8 * k);
        if (next < previous) {
            PyErr_Format(PyExc_ValueError, "offset %zd (%llu) is below the one before it (%llu)", k,
                         (unsigned long long)next, (unsigned long long)previous);
            goto done;
        }
        total += next - previous;
        previous = next;
    }
    if (previous > (uint64_t)data.len) {
        PyErr_Format(PyExc_ValueError, "offsets end at %llu, past the %zd bytes of data", (unsigned long long)previous, data.len);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, 4 * count);
    if (result == NULL)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    int changed;
    if (total < RELEASE_GIL_BYTES) {
        changed = checksum_ranges(bytes, (uint64_t)data.len, bounds, count, out);
    } else {
        Py_BEGIN_ALLOW_THREADS;
        changed = checksum_ranges(bytes, (uint64_t)data.len, bounds, count, out);
        Py_END_ALLOW_THREADS;
    }
    if (changed) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError, "offsets changed while they were checksummed");
    }
done:
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return result;
}

static PyObject *crc32c_each(PyObject *module, PyObject *payloads)
{
    /* A private copy of the list: a payload's buffer export could run code that changes the caller's. */
    PyObject *sequence = PySequence_List(payloads);
    if (sequence == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    PyObject **items = PySequence_Fast_ITEMS(sequence);
    PyObject *result = PyBytes_FromStringAndSize(NULL, 4 * count);
    if (result != NULL) {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
        for (Py_ssize_t k = 0; k < count; k++) {
            uint32_t value;
            if (PyBytes_CheckExact(items[k])) {
                value = crc32c_of((const uint8_t *)PyBytes_AS_STRING(items[k]), (size_t)PyBytes_GET_SIZE(items[k]));
            } else {
                Py_buffer view;
                if (PyObject_GetBuffer(items[k], &view, PyBUF_SIMPLE) < 0) {
                    Py_CLEAR(result);
                    break;
                }
                value = crc32c_of(view.buf, (size_t)view.len);
                PyBuffer_Release(&view);
            }
            memcpy(out + 4 * k, &value, 4);
        }
    }
    Py_DECREF(sequence);
    return result;
}

/* ---- msgpack: an accept-only twin of varstore/format/msgpack_bounds.py ----------------- */

#define MAX_DEPTH 512
#define MAX_MAP_KEYS 32  /* a larger map is left to the Python check, whose key set is a hash set */

typedef struct {
    int is_string;   /* else an integer */
    int negative;    /* integers: below zero, `bits` then holding the int64 */
    uint64_t bits;   /* an integer's value, or a string's length */
    const uint8_t *text;
} MapKey;

typedef struct {
    Py_ssize_t remaining;  /* elements still expected, keys and values both for a map */
    int is_map;
    int first_key;         /* a map's first key in the key stack */
} Frame;

static inline uint64_t load_be(const uint8_t *p, int size)
{
    uint64_t value = 0;
    for (int k = 0; k < size; k++)
        value = value << 8 | p[k];
    return value;
}

/* The fixed size (header + body) of a scalar's or fixstr's first byte, 0 for a container, longer string, bin,
   extension or 0xc1; and its cost by spec §2.2 (a fixstr's taken as ASCII), as msgpack_bounds.py's tables. */
static uint8_t fixed_size[256];
static uint8_t fixed_cost[256];

/* spec §2.2's memory rule, as msgpack_bounds.py states it. */
#define COST_PER_BYTE 16
#define COST_ALLOWANCE (128 << 10)
#define SMALL_COST 8
#define NUMBER_COST 40
#define ARRAY_COST 80
#define MAP_COST 144
#define MAP_ENTRY_COST 72
#define ASCII_STR_COST 72
#define STR_COST 88
#define STR_BYTE_COST 4
#define BIN_COST 56
#define EXT_COST 288
#define EXT_BYTE_COST 3

/* The cost of a str of `length` bytes at `text`. */
static int64_t str_cost(const uint8_t *text, uint64_t length)
{
    if (length <= 1) return SMALL_COST;
    for (uint64_t k = 0; k < length; k++)
        if (text[k] & 0x80) return STR_COST + STR_BYTE_COST * (int64_t)length;
    return ASCII_STR_COST + (int64_t)length;
}

static void fixed_sizes_init(void)
{
    for (int byte = 0x00; byte < 0x80; byte++) fixed_size[byte] = 1;
    for (int byte = 0xE0; byte < 0x100; byte++) fixed_size[byte] = 1;
    for (int byte = 0xA0; byte < 0xC0; byte++) fixed_size[byte] = (uint8_t)(1 + (byte & 0x1F));
    static const uint8_t sized[][2] = {{0xC0, 1}, {0xC2, 1}, {0xC3, 1}, {0xCA, 5}, {0xCB, 9}, {0xCC, 2}, {0xCD, 3},
                                       {0xCE, 5}, {0xCF, 9}, {0xD0, 2}, {0xD1, 3}, {0xD2, 5}, {0xD3, 9}};
    for (size_t k = 0; k < sizeof sized / sizeof sized[0]; k++) fixed_size[sized[k][0]] = sized[k][1];
    for (int byte = 0; byte < 256; byte++) {
        int small = byte < 0x80 || byte >= 0xFB || byte == 0xC0 || byte == 0xC2 || byte == 0xC3 || byte == 0xCC;
        if (byte >= 0xA0 && byte < 0xC0)
            fixed_cost[byte] = (byte & 0x1F) <= 1 ? SMALL_COST : (uint8_t)(ASCII_STR_COST + (byte & 0x1F));
        else if (fixed_size[byte])
            fixed_cost[byte] = small ? SMALL_COST : NUMBER_COST;
    }
}

/* Read the map key at p (before end) into key; its size in bytes, or 0 if it is not a str or an integer in bounds. */
static Py_ssize_t read_key(const uint8_t *p, const uint8_t *end, MapKey *key)
{
    uint8_t byte = *p;
    key->is_string = 0;
    key->negative = 0;
    key->text = NULL;
    if (byte < 0x80) { key->bits = byte; return 1; }
    if (byte >= 0xE0) { key->negative = 1; key->bits = (uint64_t)(int64_t)(int8_t)byte; return 1; }
    int size = 0, is_signed = 0, length_size = 0;
    Py_ssize_t header;
    uint64_t length;
    switch (byte) {
    case 0xCC: size = 1; break;
    case 0xCD: size = 2; break;
    case 0xCE: size = 4; break;
    case 0xCF: size = 8; break;
    case 0xD0: size = 1; is_signed = 1; break;
    case 0xD1: size = 2; is_signed = 1; break;
    case 0xD2: size = 4; is_signed = 1; break;
    case 0xD3: size = 8; is_signed = 1; break;
    case 0xD9: length_size = 1; break;
    case 0xDA: length_size = 2; break;
    case 0xDB: length_size = 4; break;
    default:
        if (byte >= 0xA0 && byte < 0xC0) {
            header = 1;
            length = byte & 0x1F;
            goto string;
        }
        return 0;
    }
    if (size) {
        if (end - p < 1 + size) return 0;
        uint64_t value = load_be(p + 1, size);
        if (is_signed) {
            int shift = 64 - 8 * size;
            int64_t signed_value = (int64_t)(value << shift) >> shift;
            key->negative = signed_value < 0;
            value = (uint64_t)signed_value;
        }
        key->bits = value;
        return 1 + size;
    }
    if (end - p < 1 + length_size) return 0;
    header = 1 + length_size;
    length = load_be(p + 1, length_size);
string:
    if ((uint64_t)(end - p - header) < length) return 0;
    key->is_string = 1;
    key->bits = length;
    key->text = p + header;
    return header + (Py_ssize_t)length;
}

static int same_key(const MapKey *a, const MapKey *b)
{
    if (a->is_string != b->is_string || a->bits != b->bits || a->negative != b->negative) return 0;
    return !a->is_string || memcmp(a->text, b->text, (size_t)a->bits) == 0;
}

/* 1 if the payload is one well-formed, bounded msgpack object as msgpack_bounds.py defines it, 0 if unsure. */
static int msgpack_check_passes(const uint8_t *p, Py_ssize_t length, int ext_type, Frame *frames, MapKey *keys, int key_room)
{
    const uint8_t *end = p + length;
    const int64_t limit = (int64_t)COST_PER_BYTE * length + COST_ALLOWANCE;
    int64_t cost = 0;
    int depth = 0, key_count = 0;
    frames[0].remaining = 1;
    frames[0].is_map = 0;
    frames[0].first_key = 0;
    Frame *frame = &frames[0];
    for (;;) {
        if (frame->remaining == 0) {
            if (depth == 0) break;
            key_count = frame->first_key;
            frame = &frames[--depth];
            continue;
        }
        if (p >= end) return 0;
        if (frame->is_map && !(frame->remaining & 1)) {
            if (key_count >= key_room || key_count - frame->first_key >= MAX_MAP_KEYS) return 0;
            MapKey *key = &keys[key_count];
            Py_ssize_t size = read_key(p, end, key);
            if (size == 0) return 0;
            for (int k = frame->first_key; k < key_count; k++)
                if (same_key(&keys[k], key)) return 0;
            cost += key->is_string ? str_cost(key->text, key->bits) : fixed_cost[*p];
            key_count++;
            p += size;
            frame->remaining--;
            continue;
        }
        frame->remaining--;
        uint8_t byte = *p;
        uint8_t size = fixed_size[byte];
        if (size) {
            if (end - p < size) return 0;
            cost += byte >= 0xA0 && byte < 0xC0 ? str_cost(p + 1, byte & 0x1F) : fixed_cost[byte];
            p += size;
            continue;
        }
        Py_ssize_t header;
        uint64_t count;
        int is_map = 0;
        if (byte >= 0x80 && byte < 0x90) { header = 1; count = byte & 0x0F; is_map = 1; }
        else if (byte >= 0x90 && byte < 0xA0) { header = 1; count = byte & 0x0F; }
        else if (byte == 0xDC || byte == 0xDE) { header = 3; if (end - p < 3) return 0; count = load_be(p + 1, 2); is_map = byte == 0xDE; }
        else if (byte == 0xDD || byte == 0xDF) { header = 5; if (end - p < 5) return 0; count = load_be(p + 1, 4); is_map = byte == 0xDF; }
        else {
            uint64_t body;
            int code = 256;  /* not an extension */
            switch (byte) {
            case 0xC4: case 0xD9: header = 2; break;
            case 0xC5: case 0xDA: header = 3; break;
            case 0xC6: case 0xDB: header = 5; break;
            case 0xC7: header = 3; break;
            case 0xC8: header = 4; break;
            case 0xC9: header = 6; break;
            case 0xD4: case 0xD5: case 0xD6: case 0xD7: case 0xD8: header = 2; break;
            default: return 0;  /* 0xc1 */
            }
            if (end - p < header) return 0;
            if (byte >= 0xD4 && byte <= 0xD8) {
                body = (uint64_t)1 << (byte - 0xD4);
                code = (int8_t)p[1];
            } else if (byte >= 0xC7 && byte <= 0xC9) {
                body = load_be(p + 1, (int)header - 2);
                code = (int8_t)p[header - 1];
            } else {
                body = load_be(p + 1, (int)header - 1);
            }
            if (code != 256 && code != ext_type) return 0;
            if ((uint64_t)(end - p - header) < body) return 0;
            if (code != 256) cost += EXT_COST + EXT_BYTE_COST * (int64_t)body;
            else if (byte >= 0xD9) cost += str_cost(p + header, body);
            else cost += body <= 1 ? SMALL_COST : BIN_COST + (int64_t)body;
            p += header + (Py_ssize_t)body;
            continue;
        }
        p += header;
        uint64_t elements = is_map ? 2 * count : count;
        if (elements > (uint64_t)(end - p)) return 0;
        if (depth >= MAX_DEPTH) return 0;
        cost += is_map ? MAP_COST + MAP_ENTRY_COST * (int64_t)count : ARRAY_COST;
        if (cost > limit) return 0;
        frame = &frames[++depth];
        frame->remaining = (Py_ssize_t)elements;
        frame->is_map = is_map;
        frame->first_key = key_count;
    }
    return p == end && cost <= limit;
}

#define KEY_ROOM 1024

static PyObject *msgpack_passes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "msgpack_passes(payload, ext_type) takes 2 arguments");
        return NULL;
    }
    long ext_type = PyLong_AsLong(args[1]);
    if (ext_type == -1 && PyErr_Occurred())
        return NULL;
    if (ext_type < -128 || ext_type > 127) {
        PyErr_Format(PyExc_ValueError, "an extension type is in [-128, 127], not %ld", ext_type);
        return NULL;
    }
    Py_buffer payload;
    if (PyObject_GetBuffer(args[0], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    Frame frames[MAX_DEPTH + 1];
    MapKey keys[KEY_ROOM];
    int passes = msgpack_check_passes(payload.buf, payload.len, (int)ext_type, frames, keys, KEY_ROOM);
    PyBuffer_Release(&payload);
    return PyBool_FromLong(passes);
}

/* ---- RecordSlicer: a shard's single and batch reads of bytes and str records ----------- */

typedef struct {
    PyObject_HEAD
    Py_buffer index;        /* the index file's map */
    Py_buffer data;         /* the data file's map */
    Py_ssize_t offsets_start, count;
    int as_str;             /* decode records as UTF-8 */
    int holding;            /* the buffers are still held */
} RecordSlicer;

static void slicer_release(RecordSlicer *self)
{
    if (self->holding) {
        self->holding = 0;
        PyBuffer_Release(&self->index);
        PyBuffer_Release(&self->data);
    }
}

static int slicer_init(RecordSlicer *self, PyObject *args, PyObject *kwargs)
{
    PyObject *index, *data;
    Py_ssize_t offsets_start, count;
    int as_str;
    static char *names[] = {"index", "offsets_start", "count", "data", "as_str", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnnOp", names, &index, &offsets_start, &count, &data, &as_str))
        return -1;
    slicer_release(self);
    if (offsets_start < 0 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets_start and count must not be negative");
        return -1;
    }
    if (PyObject_GetBuffer(index, &self->index, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(data, &self->data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&self->index);
        return -1;
    }
    if ((self->index.len - offsets_start) / 8 <= count) {
        PyBuffer_Release(&self->index);
        PyBuffer_Release(&self->data);
        PyErr_Format(PyExc_ValueError, "an index of %zd bytes has no room for %zd offsets at byte %zd",
                     self->index.len, count + 1, offsets_start);
        return -1;
    }
    self->offsets_start = offsets_start;
    self->count = count;
    self->as_str = as_str;
    self->holding = 1;
    return 0;
}

static void slicer_dealloc(RecordSlicer *self)
{
    slicer_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Record `position` (already in range) as a new object; NULL without an error set if its offsets or bytes
   are not sound, NULL with an error set if Python failed (memory). */
static PyObject *slice_record(RecordSlicer *self, Py_ssize_t position)
{
    const uint8_t *at = (const uint8_t *)self->index.buf + self->offsets_start + 8 * position;
    uint64_t start = load_le64(at), end = load_le64(at + 8);
    if (start > end || end > (uint64_t)self->data.len)
        return NULL;
    const char *bytes = (const char *)self->data.buf + start;
    if (!self->as_str)
        return PyBytes_FromStringAndSize(bytes, (Py_ssize_t)(end - start));
    PyObject *text = PyUnicode_DecodeUTF8(bytes, (Py_ssize_t)(end - start), "strict");
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return text;
}

static inline int resolve(RecordSlicer *self, Py_ssize_t *position)
{
    if (*position < 0)
        *position += self->count;
    return *position >= 0 && *position < self->count;
}

static PyObject *slicer_get(RecordSlicer *self, PyObject *index)
{
    if (!self->holding || !PyLong_CheckExact(index))
        Py_RETURN_NONE;
    Py_ssize_t position = PyLong_AsSsize_t(index);
    if (position == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!resolve(self, &position))
        Py_RETURN_NONE;
    PyObject *record = slice_record(self, position);
    if (record == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return record;
}

/* The positions of a list or tuple of ints, or of a 1-D buffer of int64; 0 if `indices` is neither (or one is
   not an int), -1 on a Python error. */
static int gather_positions(PyObject *indices, Py_ssize_t **positions, Py_ssize_t *count)
{
    if (PyList_CheckExact(indices) || PyTuple_CheckExact(indices)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(indices);
        PyObject **items = PySequence_Fast_ITEMS(indices);
        Py_ssize_t *out = PyMem_Malloc(sizeof(Py_ssize_t) * (n ? n : 1));
        if (out == NULL) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t k = 0; k < n; k++) {
            if (!PyLong_CheckExact(items[k])) { PyMem_Free(out); return 0; }
            out[k] = PyLong_AsSsize_t(items[k]);
            if (out[k] == -1 && PyErr_Occurred()) { PyErr_Clear(); PyMem_Free(out); return 0; }
        }
        *positions = out;
        *count = n;
        return 1;
    }
    if (!PyObject_CheckBuffer(indices))
        return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(indices, &view, PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *format = view.format ? view.format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@')
        format++;
    int is_int64 = view.ndim == 1 && view.itemsize == 8 && (strcmp(format, "l") == 0 || strcmp(format, "q") == 0);
    Py_ssize_t n = is_int64 ? view.shape[0] : 0;
    Py_ssize_t *out = is_int64 ? PyMem_Malloc(sizeof(Py_ssize_t) * (n ? n : 1)) : NULL;
    if (is_int64 && out == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    if (is_int64)
        for (Py_ssize_t k = 0; k < n; k++) {
            int64_t value;
            memcpy(&value, (const char *)view.buf + 8 * k, 8);
            out[k] = (Py_ssize_t)value;
        }
    PyBuffer_Release(&view);
    if (!is_int64)
        return 0;
    *positions = out;
    *count = n;
    return 1;
}

static PyObject *slicer_get_batch(RecordSlicer *self, PyObject *indices)
{
    Py_ssize_t *positions, count;
    int gathered = gather_positions(indices, &positions, &count);
    if (gathered < 0)
        return NULL;
    if (gathered == 0)
        Py_RETURN_NONE;
    /* PyList_New may collect, and finalizers (or threads they let run) may release the maps: check after it. */
    PyObject *records = PyList_New(count);
    if (records != NULL && !self->holding) {
        Py_DECREF(records);
        PyMem_Free(positions);
        Py_RETURN_NONE;
    }
    for (Py_ssize_t k = 0; records != NULL && k < count; k++) {
        PyObject *record = resolve(self, &positions[k]) ? slice_record(self, positions[k]) : NULL;
        if (record == NULL) {
            Py_CLEAR(records);
            if (!PyErr_Occurred())
                records = Py_NewRef(Py_None);
            break;
        }
        PyList_SET_ITEM(records, k, record);
    }
    PyMem_Free(positions);
    return records;
}

static PyObject *slicer_release_method(RecordSlicer *self, PyObject *unused)
{
    slicer_release(self);
    Py_RETURN_NONE;
}

static PyMethodDef slicer_methods[] = {
    {"get", (PyCFunction)slicer_get, METH_O,
     "Record `index` (an int; negative counts from the end), or None if it is out of range, its offsets unsound or "
     "(str) its bytes not UTF-8."},
    {"get_batch", (PyCFunction)slicer_get_batch, METH_O,
     "Records at `indices` (a list or tuple of ints, or a 1-D int64 array) as a list, or None if any would be None."},
    {"release", (PyCFunction)slicer_release_method, METH_NOARGS, "Let go of both maps; every read returns None after."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecordSlicerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "varstore._speedups.RecordSlicer",
    .tp_basicsize = sizeof(RecordSlicer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordSlicer(index, offsets_start, count, data, as_str): bytes or str records sliced from a shard's maps.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)slicer_init,
    .tp_dealloc = (destructor)slicer_dealloc,
    .tp_methods = slicer_methods,
};

/* ---- the module ------------------------------------------------------------------------ */

static PyObject *software_crc32c(PyObject *module, PyObject *argument)
{
    Py_buffer data;
    if (PyObject_GetBuffer(argument, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t value = ~crc_software(0xFFFFFFFFu, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(value);
}

static PyMethodDef module_methods[] = {
    {"crc32c_ranges", (PyCFunction)(void (*)(void))crc32c_ranges, METH_FASTCALL,
     "crc32c_ranges(data, offsets) -> bytes: the CRC32C of each data[offsets[k]:offsets[k + 1]] as native uint32, "
     "offsets being N + 1 little-endian uint64."},
    {"crc32c_each", (PyCFunction)crc32c_each, METH_O,
     "crc32c_each(payloads) -> bytes: the CRC32C of each bytes-like payload as native uint32."},
    {"msgpack_passes", (PyCFunction)(void (*)(void))msgpack_passes, METH_FASTCALL,
     "msgpack_passes(payload, ext_type) -> bool: True only if varstore.format.msgpack_bounds.check_msgpack accepts it."},
    {"software_crc32c", (PyCFunction)software_crc32c, METH_O,
     "The table-driven CRC32C, for tests of the path CPUs without SSE4.2 take."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "varstore._speedups", "varstore's per-record loops in C (see varstore/_native.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    crc_tables_init();
    fixed_sizes_init();
#ifdef HAVE_HARDWARE_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        crc_update = crc_hardware;
#endif
    if (PyType_Ready(&RecordSlicerType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "RecordSlicer", (PyObject *)&RecordSlicerType) < 0
        || PyModule_AddIntConstant(module, "HARDWARE_CRC32C", crc_update != crc_software) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
