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

/* Shifting a CRC register over zero bytes is linear: zeros_long[k][b] is what byte k of the register, worth b,
   becomes after LONG_BLOCK zero bytes (and zeros_short likewise), so three streams checksummed side by side (the
   crc32 instruction has a latency of three cycles but issues one a cycle) join with four lookups each. */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256
static uint32_t zeros_long[4][256], zeros_short[4][256];

static uint32_t gf2_times(const uint32_t *matrix, uint32_t vector)
{
    uint32_t sum = 0;
    for (; vector; vector >>= 1, matrix++)
        if (vector & 1)
            sum ^= *matrix;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *matrix)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(matrix, matrix[n]);
}

/* The lookup tables of the operator that shifts a register over `length` zero bytes (a power of two). */
static void zeros_tables_init(uint32_t zeros[4][256], size_t length)
{
    uint32_t one_bit[32], even[32], odd[32];
    one_bit[0] = 0x82F63B78u;  /* the operator for one zero bit */
    for (int n = 1; n < 32; n++)
        one_bit[n] = 1u << (n - 1);
    gf2_square(even, one_bit);  /* two zero bits */
    gf2_square(odd, even);      /* four */
    gf2_square(even, odd);      /* one zero byte */
    uint32_t *operator = even, *other = odd;
    for (; length > 1; length >>= 1) {
        gf2_square(other, operator);
        uint32_t *swap = operator;
        operator = other;
        other = swap;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++)
            zeros[k][n] = gf2_times(operator, n << (8 * k));
}

static inline uint32_t shift_over_zeros(uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^ zeros[3][crc >> 24];
}

static inline uint64_t load_word(const uint8_t *p)
{
    uint64_t word;
    memcpy(&word, p, 8);
    return word;
}

/* The SSE4.2 crc32 instruction, eight bytes at a time, three streams at once over long stretches; chosen at
   import when the CPU has it. */
__attribute__((target("sse4.2"))) static uint32_t crc_hardware(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        n--;
    }
    uint64_t wide = crc;
    for (size_t block = LONG_BLOCK; block >= SHORT_BLOCK; block = block == LONG_BLOCK ? SHORT_BLOCK : 0) {
        uint32_t (*zeros)[256] = block == LONG_BLOCK ? zeros_long : zeros_short;
        while (n >= 3 * block) {
            uint64_t second = 0, third = 0;
            const uint8_t *end = p + block;
            do {
                wide = _mm_crc32_u64(wide, load_word(p));
                second = _mm_crc32_u64(second, load_word(p + block));
                third = _mm_crc32_u64(third, load_word(p + 2 * block));
                p += 8;
            } while (p < end);
            wide = shift_over_zeros(zeros, (uint32_t)wide) ^ (uint32_t)second;
            wide = shift_over_zeros(zeros, (uint32_t)wide) ^ (uint32_t)third;
            p += 2 * block;
            n -= 3 * block;
        }
    }
    while (n >= 8) {
        wide = _mm_crc32_u64(wide, load_word(p));
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

/* ---- verification: a chunk of a shard's records checked in one call ------------------- */

/* The chunk's bytes data (offsets[0] to offsets[count] of the data file) are checksummed on, from the running data
   CRC `crc`, and record k's CRC32C compared with checksums[k] (little-endian uint32, or none if the shard has no
   record checksums); offsets (count + 1 little-endian uint64) must never decrease and end at the data's end.
   Returns the running CRC and the positions k of the records whose checksum is wrong. */
static inline uint32_t expected_crc(const uint8_t *checksums, Py_ssize_t k)
{
    uint32_t expected;
    memcpy(&expected, checksums + 4 * k, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    expected = __builtin_bswap32(expected);
#endif
    return expected;
}

/* The CRC register over n bytes is linear in its start: it is Z_n(start) ^ F(0), where F(0) is the register after the
   bytes from 0 and Z_n the shift over n zero bytes, the product with x**(8n) modulo the polynomial. So one pass over
   a record gives F(0), from which come both its own CRC32C, ~(Z_n(~0) ^ F(0)), and the data file's register after
   it, Z_n(before) ^ F(0): verification reads each byte once. */
#define SHIFT_TABLE 4096
static uint32_t x_power_bytes[SHIFT_TABLE];  /* x**(8n) modulo the polynomial, reflected (bit 31 is x**0) */
static uint32_t x_power_large[64];           /* x**(8 * SHIFT_TABLE * 2**k) */

/* a(x) * b(x) modulo the polynomial, reflected, bit by bit (varstore/format/checksum.py's _multiply_mod_p). */
static uint32_t multiply_software(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (uint32_t bit = 1u << 31; a; bit >>= 1) {
        if (a & bit) {
            product ^= b;
            a ^= bit;
        }
        b = b & 1 ? (b >> 1) ^ 0x82F63B78u : b >> 1;
    }
    return product;
}

static void shift_tables_init(void)
{
    x_power_bytes[0] = 1u << 31;
    for (int n = 1; n < SHIFT_TABLE; n++)
        x_power_bytes[n] = multiply_software(x_power_bytes[n - 1], 1u << 23);  /* times x**8 */
    x_power_large[0] = multiply_software(x_power_bytes[SHIFT_TABLE - 1], 1u << 23);
    for (int k = 1; k < 64; k++)
        x_power_large[k] = multiply_software(x_power_large[k - 1], x_power_large[k - 1]);
}

#ifdef HAVE_HARDWARE_CRC
#include <wmmintrin.h>

/* multiply_software by one carry-less multiplication; the 64-bit product (reflected: shifted up by one) is
   reduced by the crc32 instruction, which multiplies its 32-bit operand by x**32 modulo the polynomial. */
__attribute__((target("sse4.2,pclmul"))) static inline uint32_t multiply_hardware(uint32_t a, uint32_t b)
{
    __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)b), 0);
    uint64_t wide = (uint64_t)_mm_cvtsi128_si64(product) << 1;
    return _mm_crc32_u32(0, (uint32_t)wide) ^ (uint32_t)(wide >> 32);
}

static int have_multiply_hardware;  /* the CPU has PCLMULQDQ and multiply_hardware agrees with multiply_software */

__attribute__((target("sse4.2,pclmul"))) static uint32_t x_power_of(uint64_t bytes)
{
    uint32_t power = x_power_bytes[bytes % SHIFT_TABLE];
    bytes /= SHIFT_TABLE;
    for (int k = 0; bytes; k++, bytes >>= 1)
        if (bytes & 1)
            power = multiply_hardware(power, x_power_large[k]);
    return power;
}

/* The first word of a record of `length` bytes at `start` of `bytes`: its first length % 8 bytes at the top,
   zeros below (zeros leave a register at 0 unchanged), so the rest of the record is whole words. */
static inline uint64_t head_word(const uint8_t *bytes, uint64_t start, uint64_t length)
{
    uint64_t head = length & 7, word;
    if (start + head >= 8) {
        word = load_word(bytes + start + head - 8);
    } else {
        uint8_t padded[8] = {0};
        memcpy(padded + 8 - head, bytes + start, (size_t)head);
        word = load_word(padded);
    }
    return word & ((uint64_t)-(int64_t)(head != 0) << (8 * (8 - head) & 63));
}

/* The register from 0 over words [from, to) (in words) at p. */
__attribute__((target("sse4.2"))) static inline uint64_t crc_words(uint64_t crc, const uint8_t *p, uint64_t from, uint64_t to)
{
    for (uint64_t word = from; word < to; word++)
        crc = _mm_crc32_u64(crc, load_word(p + 8 * word));
    return crc;
}

/* Each record's CRC compared with its checksum, and the data register carried over all of them (see above): a
   record shorter than SHIFT_TABLE from its head word and whole words, with no branch on its length but the loop's
   (records side by side gained nothing measurable), a longer one on crc_hardware's three streams. */
__attribute__((target("sse4.2,pclmul"))) static uint32_t records_crc_hardware(
    const uint8_t *bytes, const uint64_t *starts, const uint64_t *ends, Py_ssize_t count, const uint8_t *checksums,
    uint8_t *wrong, uint32_t data)
{
    for (Py_ssize_t k = 0; k < count; k++) {
        uint64_t start = starts[k], length = ends[k] - start;
        uint32_t from_zero, shift;
        if (length < SHIFT_TABLE) {
            uint64_t crc = _mm_crc32_u64(0, head_word(bytes, start, length));
            from_zero = (uint32_t)crc_words(crc, bytes + start + (length & 7), 0, length >> 3);
            shift = x_power_bytes[length];
        } else {
            from_zero = crc_hardware(0, bytes + start, (size_t)length);
            shift = x_power_of(length);
        }
        wrong[k] = ~(from_zero ^ multiply_hardware(0xFFFFFFFFu, shift)) != expected_crc(checksums, k);
        data = multiply_hardware(data, shift) ^ from_zero;
    }
    return data;
}
#endif

/* Whether each record's CRC32C differs from its stored checksum, and the data register (inverted CRC) `data`
   carried over the records: 0, or -1 if an offset changed (a shared map) since they were checked (each is loaded
   once and checked again). */
#define CRC_GROUP 256
static int verify_ranges(const uint8_t *bytes, uint64_t size, const uint8_t *bounds, const uint8_t *checksums,
                         Py_ssize_t count, uint8_t *wrong, uint32_t *data)
{
    uint64_t base = load_le64(bounds), previous = base, starts[CRC_GROUP], ends[CRC_GROUP];
    for (Py_ssize_t first = 0; first < count; first += CRC_GROUP) {
        Py_ssize_t group = count - first < CRC_GROUP ? count - first : CRC_GROUP;
        for (Py_ssize_t k = 0; k < group; k++) {
            uint64_t end = load_le64(bounds + 8 * (first + k) + 8);
            if (end < previous || end - base > size)
                return -1;
            starts[k] = previous - base;
            ends[k] = end - base;
            previous = end;
        }
#ifdef HAVE_HARDWARE_CRC
        if (have_multiply_hardware) {
            *data = records_crc_hardware(bytes, starts, ends, group, checksums + 4 * first, wrong + first, *data);
            continue;
        }
#endif
        for (Py_ssize_t k = 0; k < group; k++) {
            size_t length = (size_t)(ends[k] - starts[k]);
            wrong[first + k] = crc32c_of(bytes + starts[k], length) != expected_crc(checksums, first + k);
            *data = crc_update(*data, bytes + starts[k], length);
        }
    }
    return 0;
}

static PyObject *verify_checksums(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "verify_checksums(data, offsets, checksums, crc) takes 4 arguments");
        return NULL;
    }
    unsigned long crc = PyLong_AsUnsignedLong(args[3]);
    if (crc == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (crc > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "a CRC32C is below 2**32");
        return NULL;
    }
    Py_buffer data, offsets, checksums = {0};
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &offsets, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    int has_checksums = args[2] != Py_None;
    if (has_checksums && PyObject_GetBuffer(args[2], &checksums, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&offsets);
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL, *wrong_flags = NULL;
    Py_ssize_t count = offsets.len / 8 - 1;
    const uint8_t *bounds = offsets.buf;
    if (offsets.len % 8 != 0 || count < 0) {
        PyErr_Format(PyExc_ValueError, "offsets must be at least one little-endian uint64, got %zd bytes", offsets.len);
        goto done;
    }
    if (has_checksums && checksums.len != 4 * count) {
        PyErr_Format(PyExc_ValueError, "%zd records need %zd bytes of checksums, got %zd", count, 4 * count, checksums.len);
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        if (load_le64(bounds + 8 * k + 8) < load_le64(bounds + 8 * k)) {
            PyErr_Format(PyExc_ValueError, "offset %zd is below the one before it", k + 1);
            goto done;
        }
    }
    if (load_le64(bounds + 8 * count) - load_le64(bounds) != (uint64_t)data.len) {
        PyErr_Format(PyExc_ValueError, "offsets span %llu bytes but data holds %zd",
                     (unsigned long long)(load_le64(bounds + 8 * count) - load_le64(bounds)), data.len);
        goto done;
    }
    wrong_flags = PyBytes_FromStringAndSize(NULL, has_checksums ? count : 0);
    if (wrong_flags == NULL)
        goto done;
    uint8_t *wrong = (uint8_t *)PyBytes_AS_STRING(wrong_flags);
    uint32_t running = ~(uint32_t)crc;
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS;  /* the caller's buffers are held; shards verified on other threads run meanwhile */
    if (has_checksums)
        changed = verify_ranges(data.buf, (uint64_t)data.len, bounds, checksums.buf, count, wrong, &running);
    else
        running = crc_update(running, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS;
    running = ~running;
    if (changed) {
        PyErr_SetString(PyExc_ValueError, "offsets changed while they were checksummed");
        goto done;
    }
    PyObject *positions = PyList_New(0);
    for (Py_ssize_t k = 0; positions != NULL && k < PyBytes_GET_SIZE(wrong_flags); k++) {
        if (!wrong[k])
            continue;
        PyObject *position = PyLong_FromSsize_t(k);
        if (position == NULL || PyList_Append(positions, position) < 0)
            Py_CLEAR(positions);
        Py_XDECREF(position);
    }
    if (positions != NULL)
        result = Py_BuildValue("(kN)", (unsigned long)running, positions);
done:
    Py_XDECREF(wrong_flags);
    if (has_checksums)
        PyBuffer_Release(&checksums);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return result;
}

/* ---- msgpack: the writer's packing of structured records ------------------------------- */

/* What msgpack.packb(record, default=..., use_bin_type=True) writes, for records made only of exact dicts (str or
   int keys), lists, tuples, str, bytes, int, float, bool, None and C-contiguous, non-empty ndarrays of a dtype the
   caller lists (varstore/format/codecs.py packs the same bytes in Python): anything else is declined, and the
   caller's Python path packs it, or refuses it with its message. A packed record is returned only if
   msgpack_check_passes accepts it, so what a reader would refuse is always left to the Python path too. */

#define PACK_MAX_DEPTH 64      /* deeper records are declined: the Python path decides them */
#define PACK_KEPT_ROOM (1 << 20)  /* the scratch buffer is freed after a call that grew it past this */

typedef struct {
    uint8_t *bytes;
    Py_ssize_t size, room;
} Packed;

typedef struct {
    PyTypeObject *array_type;   /* numpy.ndarray */
    PyObject *dtypes;           /* a tuple of (dtype, its stored name as bytes) pairs, matched by identity */
} PackTypes;

static Packed scratch;
static Frame pack_frames[MAX_DEPTH + 1];
static MapKey pack_keys[KEY_ROOM];
static PyObject *dtype_name;  /* "dtype", interned */

/* Room for `more` bytes; -1 with MemoryError set if there is none. */
static int packed_reserve(Packed *out, Py_ssize_t more)
{
    if (out->room - out->size >= more)
        return 0;
    Py_ssize_t room = out->room ? out->room : 4096;
    while (room - out->size < more) {
        if (room > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        room *= 2;
    }
    uint8_t *bytes = PyMem_Realloc(out->bytes, (size_t)room);
    if (bytes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out->bytes = bytes;
    out->room = room;
    return 0;
}

static int put(Packed *out, const void *bytes, Py_ssize_t size)
{
    if (packed_reserve(out, size) < 0)
        return -1;
    memcpy(out->bytes + out->size, bytes, (size_t)size);
    out->size += size;
    return 0;
}

/* `byte`, then `value` big-endian in `size` bytes (0 to 8). */
static int put_head(Packed *out, uint8_t byte, int size, uint64_t value)
{
    if (packed_reserve(out, 1 + size) < 0)
        return -1;
    uint8_t *p = out->bytes + out->size;
    *p = byte;
    for (int k = size; k > 0; k--, value >>= 8)
        p[k] = (uint8_t)value;
    out->size += 1 + size;
    return 0;
}

/* The header of a str (`bin` 0) or bin of `length` bytes, or of an array or map of `length` elements. */
static int put_length(Packed *out, uint64_t length, uint8_t fix, uint64_t fix_limit, uint8_t head8, uint8_t head16,
                      uint8_t head32)
{
    if (length < fix_limit)
        return put_head(out, (uint8_t)(fix | length), 0, 0);
    if (head8 && length < 256)
        return put_head(out, head8, 1, length);
    if (length < 65536)
        return put_head(out, head16, 2, length);
    return put_head(out, head32, 4, length);
}

static int put_int(Packed *out, PyObject *value)
{
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (number == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0)
        return 0;
    if (overflow > 0) {
        unsigned long long large = PyLong_AsUnsignedLongLong(value);
        if (large == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;  /* past 2**64: the Python path names it */
        }
        return put_head(out, 0xCF, 8, large) < 0 ? -1 : 1;
    }
    int done;
    if (number >= 0) {
        if (number < 0x80) done = put_head(out, (uint8_t)number, 0, 0);
        else if (number < 0x100) done = put_head(out, 0xCC, 1, (uint64_t)number);
        else if (number < 0x10000) done = put_head(out, 0xCD, 2, (uint64_t)number);
        else if (number < 0x100000000LL) done = put_head(out, 0xCE, 4, (uint64_t)number);
        else done = put_head(out, 0xCF, 8, (uint64_t)number);
    } else {
        if (number >= -0x20) done = put_head(out, (uint8_t)(int8_t)number, 0, 0);
        else if (number >= -0x80) done = put_head(out, 0xD0, 1, (uint64_t)number & 0xFF);
        else if (number >= -0x8000) done = put_head(out, 0xD1, 2, (uint64_t)number & 0xFFFF);
        else if (number >= -0x80000000LL) done = put_head(out, 0xD2, 4, (uint64_t)number & 0xFFFFFFFF);
        else done = put_head(out, 0xD3, 8, (uint64_t)number);
    }
    return done < 0 ? -1 : 1;
}

/* An ndarray as extension type 1 (spec §2.2): its dtype's name, its dimensions and its C-order bytes. */
static int put_array(Packed *out, PyObject *value, const PackTypes *types)
{
    PyObject *dtype = PyObject_GetAttr(value, dtype_name);
    if (dtype == NULL)
        return -1;
    PyObject *name = NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(types->dtypes);
    for (Py_ssize_t k = 0; k < count && name == NULL; k++) {
        PyObject *pair = PyTuple_GET_ITEM(types->dtypes, k);
        if (PyTuple_GET_ITEM(pair, 0) == dtype)
            name = PyTuple_GET_ITEM(pair, 1);
    }
    Py_DECREF(dtype);
    if (name == NULL)
        return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(value, &view, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;  /* not C-contiguous */
    }
    Py_ssize_t name_size = PyBytes_GET_SIZE(name);
    uint64_t length = (uint64_t)(2 + name_size + 8 * view.ndim) + (uint64_t)view.len;
    int done = 0;  /* declined: 32 dimensions or more, no element (§2.2's empty shapes), or 2**32 bytes */
    if (view.ndim < 32 && view.len > 0 && length < ((uint64_t)1 << 32)) {
        int fixed = length == 1 ? 0xD4 : length == 2 ? 0xD5 : length == 4 ? 0xD6 : length == 8 ? 0xD7
                  : length == 16 ? 0xD8 : 0;
        int failed = fixed ? put_head(out, (uint8_t)fixed, 0, 0)
                   : length < 256 ? put_head(out, 0xC7, 1, length)
                   : length < 65536 ? put_head(out, 0xC8, 2, length) : put_head(out, 0xC9, 4, length);
        uint8_t head[3] = {1, (uint8_t)name_size, (uint8_t)view.ndim};  /* the extension type, the name's size */
        failed = failed || put(out, head, 2) || put(out, PyBytes_AS_STRING(name), name_size) || put(out, head + 2, 1);
        for (int axis = 0; axis < view.ndim && !failed; axis++) {
            uint8_t dimension[8];
            uint64_t extent = (uint64_t)view.shape[axis];
            for (int k = 0; k < 8; k++, extent >>= 8)
                dimension[k] = (uint8_t)extent;
            failed = put(out, dimension, 8);
        }
        done = failed || put(out, view.buf, view.len) ? -1 : 1;
    }
    PyBuffer_Release(&view);
    return done;
}

/* Append `value` packed: 1 if packed, 0 if declined (no error set), -1 on an error (MemoryError). */
static int pack_value(Packed *out, PyObject *value, const PackTypes *types, int depth)
{
    PyTypeObject *type = Py_TYPE(value);
    if (value == Py_None)
        return put_head(out, 0xC0, 0, 0) < 0 ? -1 : 1;
    if (value == Py_True || value == Py_False)
        return put_head(out, value == Py_True ? 0xC3 : 0xC2, 0, 0) < 0 ? -1 : 1;
    if (type == &PyLong_Type)
        return put_int(out, value);
    if (type == &PyFloat_Type) {
        union { double number; uint64_t bits; } both;
        both.number = PyFloat_AS_DOUBLE(value);
        return put_head(out, 0xCB, 8, both.bits) < 0 ? -1 : 1;
    }
    if (type == &PyUnicode_Type) {
        Py_ssize_t size;
        const char *text = PyUnicode_AsUTF8AndSize(value, &size);
        if (text == NULL) {
            PyErr_Clear();
            return 0;  /* not encodable as UTF-8 (a lone surrogate) */
        }
        if ((uint64_t)size >= ((uint64_t)1 << 32))
            return 0;
        return put_length(out, (uint64_t)size, 0xA0, 32, 0xD9, 0xDA, 0xDB) < 0 || put(out, text, size) < 0 ? -1 : 1;
    }
    if (type == &PyBytes_Type) {
        Py_ssize_t size = PyBytes_GET_SIZE(value);
        if ((uint64_t)size >= ((uint64_t)1 << 32))
            return 0;
        return put_length(out, (uint64_t)size, 0, 0, 0xC4, 0xC5, 0xC6) < 0
               || put(out, PyBytes_AS_STRING(value), size) < 0 ? -1 : 1;
    }
    if (type == types->array_type)
        return put_array(out, value, types);
    if (depth >= PACK_MAX_DEPTH)
        return 0;
    if (type == &PyList_Type || type == &PyTuple_Type) {
        /* a private reference to each item: nothing here runs Python code, but an item is read once */
        Py_ssize_t count = PySequence_Fast_GET_SIZE(value);
        if ((uint64_t)count >= ((uint64_t)1 << 32))
            return 0;
        if (put_length(out, (uint64_t)count, 0x90, 16, 0, 0xDC, 0xDD) < 0)
            return -1;
        PyObject **items = PySequence_Fast_ITEMS(value);
        for (Py_ssize_t k = 0; k < count; k++) {
            int done = pack_value(out, items[k], types, depth + 1);
            if (done <= 0)
                return done;
        }
        return 1;
    }
    if (type == &PyDict_Type) {
        Py_ssize_t count = PyDict_GET_SIZE(value), position = 0;
        if ((uint64_t)count >= ((uint64_t)1 << 32))
            return 0;
        if (put_length(out, (uint64_t)count, 0x80, 16, 0, 0xDE, 0xDF) < 0)
            return -1;
        PyObject *key, *item;
        while (PyDict_Next(value, &position, &key, &item)) {
            if (Py_TYPE(key) != &PyUnicode_Type && Py_TYPE(key) != &PyLong_Type)
                return 0;
            int done = pack_value(out, key, types, depth + 1);
            if (done > 0)
                done = pack_value(out, item, types, depth + 1);
            if (done <= 0)
                return done;
        }
        return 1;
    }
    return 0;
}

/* The record packed as bytes, Py_None if declined, NULL on an error. */
static PyObject *pack_record(PyObject *record, const PackTypes *types)
{
    scratch.size = 0;
    int done = pack_value(&scratch, record, types, 0);
    if (done < 0)
        return NULL;
    if (done == 0 || !msgpack_check_passes(scratch.bytes, scratch.size, 1, pack_frames, pack_keys, KEY_ROOM))
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)scratch.bytes, scratch.size);
}

static void scratch_trim(void)
{
    if (scratch.room > PACK_KEPT_ROOM) {
        PyMem_Free(scratch.bytes);
        scratch.bytes = NULL;
        scratch.room = scratch.size = 0;
    }
}

static int pack_types(PyObject *const *args, Py_ssize_t nargs, const char *signature, PackTypes *types)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s takes 3 arguments", signature);
        return -1;
    }
    if (!PyType_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_Format(PyExc_TypeError, "%s: array_type must be a type and dtypes a tuple", signature);
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(args[2]);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *pair = PyTuple_GET_ITEM(args[2], k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))
            || PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1)) > 255) {
            PyErr_Format(PyExc_TypeError, "%s: dtypes must be (dtype, name of at most 255 bytes) pairs", signature);
            return -1;
        }
    }
    types->array_type = (PyTypeObject *)args[1];
    types->dtypes = args[2];
    return 0;
}

static PyObject *msgpack_pack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PackTypes types;
    if (pack_types(args, nargs, "msgpack_pack(record, array_type, dtypes)", &types) < 0)
        return NULL;
    PyObject *result = pack_record(args[0], &types);
    scratch_trim();
    return result;
}

static PyObject *msgpack_pack_each(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PackTypes types;
    if (pack_types(args, nargs, "msgpack_pack_each(records, array_type, dtypes)", &types) < 0)
        return NULL;
    if (!PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "msgpack_pack_each takes a list of records");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(args[0]);
    PyObject *result = PyList_New(count);
    for (Py_ssize_t k = 0; k < count && result != NULL; k++) {
        PyObject *payload = pack_record(PyList_GET_ITEM(args[0], k), &types);
        if (payload == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, k, payload);
    }
    scratch_trim();
    return result;
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

/* ---- zstd frames: an accept-only twin of check_frame in varstore/format/compression.py -- */

#define FRAME_MAX_WINDOW ((uint64_t)1 << 23)  /* compression.MAX_WINDOW_SIZE */
#define FRAME_MAX_BLOCK ((uint64_t)128 << 10)  /* RFC 8878's Block_Maximum_Size */

static inline uint64_t load_le(const uint8_t *p, int size)
{
    uint64_t value = 0;
    for (int k = size - 1; k >= 0; k--)
        value = value << 8 | p[k];
    return value;
}

/* 1 if the `length` bytes at p are exactly one zstd frame (RFC 8878 §3.1.1) that declares `declared` content bytes,
   names dictionary `expected` (0: none), has a window within FRAME_MAX_WINDOW and whose blocks, each within the
   frame's block maximum, end (with the optional content checksum) at its last byte: the frames check_frame accepts. */
static int frame_check_passes(const uint8_t *p, uint64_t length, uint64_t declared, uint64_t expected)
{
    static const int id_bytes[4] = {0, 1, 2, 4};
    if (length < 6 || memcmp(p, "\x28\xb5\x2f\xfd", 4) != 0)
        return 0;
    uint8_t descriptor = p[4];
    if (descriptor & 0x08)
        return 0;
    int single_segment = (descriptor & 0x20) != 0;
    uint64_t position = 5, window = 0;
    if (!single_segment) {
        uint64_t base = (uint64_t)1 << (10 + (p[5] >> 3));
        window = base + (base >> 3) * (p[5] & 7);
        position = 6;
    }
    int id_size = id_bytes[descriptor & 3], flag = descriptor >> 6;
    int content_bytes = flag == 0 ? single_segment : 1 << flag;
    if (content_bytes == 0 || position + id_size + content_bytes > length)
        return 0;
    uint64_t number = load_le(p + position, id_size);
    position += id_size;
    uint64_t content = load_le(p + position, content_bytes) + (content_bytes == 2 ? 256 : 0);
    position += content_bytes;
    if (content != declared || (!single_segment && window > FRAME_MAX_WINDOW) || number != expected)
        return 0;
    uint64_t block_limit = single_segment ? content : window;
    if (block_limit > FRAME_MAX_BLOCK)
        block_limit = FRAME_MAX_BLOCK;
    for (;;) {
        if (position + 3 > length)
            return 0;
        uint32_t block = (uint32_t)p[position] | (uint32_t)p[position + 1] << 8 | (uint32_t)p[position + 2] << 16;
        uint32_t kind = (block >> 1) & 3, size = block >> 3;
        if (kind == 3 || size > block_limit)
            return 0;
        position += 3 + (kind == 1 ? 1 : size);
        if (block & 1)
            break;
    }
    return position + (descriptor & 0x04 ? 4 : 0) == length;
}

/* A position, size or dictionary ID argument as a uint64 in *value: 1, or 0 (no error set: check_frame decides)
   if it is no integer, or a negative or too large one. */
static int frame_argument(PyObject *argument, uint64_t *value)
{
    PyObject *number = PyNumber_Index(argument);
    if (number == NULL) {
        PyErr_Clear();
        return 0;
    }
    int overflow, known = 1;
    long long signed_value = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (overflow > 0) {
        *value = PyLong_AsUnsignedLongLong(number);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            known = 0;
        }
    } else if (overflow < 0 || signed_value < 0) {
        known = 0;
    } else {
        *value = (uint64_t)signed_value;
    }
    Py_DECREF(number);
    return known;
}

static PyObject *frame_passes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "frame_passes(data, start, end, declared, expected_dictionary) takes 5 arguments");
        return NULL;
    }
    uint64_t values[4];
    for (int k = 0; k < 4; k++)
        if (!frame_argument(args[k + 1], &values[k]))
            Py_RETURN_FALSE;
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    uint64_t start = values[0], end = values[1];
    int passes = start <= end && end <= (uint64_t)data.len
                 && frame_check_passes((const uint8_t *)data.buf + start, end - start, values[2], values[3]);
    PyBuffer_Release(&data);
    return PyBool_FromLong(passes);
}

/* ---- compressed records: what both slicers below share -------------------------------- */

/* decompress(frame, size) over the `length` stored bytes at `frame`: exactly `size` decoded bytes; NULL without an
   error set to decline (the call failed or returned anything else), NULL with one set on a memory error. */
static PyObject *call_decompress(PyObject *decompress, const uint8_t *frame, uint64_t length, uint64_t size)
{
    PyObject *stored = PyBytes_FromStringAndSize((const char *)frame, (Py_ssize_t)length);
    PyObject *size_object = stored ? PyLong_FromUnsignedLongLong(size) : NULL;
    PyObject *decoded = size_object ? PyObject_CallFunctionObjArgs(decompress, stored, size_object, NULL) : NULL;
    Py_XDECREF(stored);
    Py_XDECREF(size_object);
    if (decoded != NULL && PyBytes_CheckExact(decoded) && (uint64_t)PyBytes_GET_SIZE(decoded) == size)
        return decoded;
    Py_XDECREF(decoded);
    if (!PyErr_Occurred() || !PyErr_ExceptionMatches(PyExc_MemoryError))
        PyErr_Clear();
    return NULL;
}

/* The `length` bytes at `bytes` as a record: bytes, or (as_str) str; NULL without an error set when not UTF-8. */
static PyObject *record_object(const char *bytes, Py_ssize_t length, int as_str)
{
    if (!as_str)
        return PyBytes_FromStringAndSize(bytes, length);
    PyObject *text = PyUnicode_DecodeUTF8(bytes, length, "strict");
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return text;
}

/* ---- compressed records: the frame read of a 2.x shard's bytes and str records --------- */

/* One 2.x shard's single reads: bounds, the frame check, then the owning thread's zstd context, called through its
   `decompress(frame, size)`; every decline (None) sends the read to the Python path, which words the error. A
   context is not thread-safe, so reads from any thread but the one that made the slicer decline too. */
typedef struct {
    PyObject_HEAD
    Py_buffer index;
    Py_buffer sizes;
    Py_buffer data;
    Py_ssize_t offsets_start;
    Py_ssize_t count;
    uint64_t dictionary_id;
    PyObject *decompress;
    unsigned long owner;
    int as_str;
    int holding;
} FrameSlicer;

static void frames_release(FrameSlicer *self)
{
    if (self->holding) {
        self->holding = 0;
        PyBuffer_Release(&self->index);
        PyBuffer_Release(&self->sizes);
        PyBuffer_Release(&self->data);
    }
    Py_CLEAR(self->decompress);
}

static int frames_init(FrameSlicer *self, PyObject *args, PyObject *kwargs)
{
    PyObject *index, *sizes, *data, *decompress;
    Py_ssize_t offsets_start, count;
    unsigned long long dictionary_id;
    int as_str;
    static char *names[] = {"index", "offsets_start", "count", "sizes", "data", "as_str", "dictionary_id", "decompress", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnnOOpKO", names, &index, &offsets_start, &count, &sizes, &data,
                                     &as_str, &dictionary_id, &decompress))
        return -1;
    frames_release(self);
    if (offsets_start < 0 || count < 0 || !PyCallable_Check(decompress)) {
        PyErr_SetString(PyExc_ValueError, "offsets_start and count must not be negative and decompress must be callable");
        return -1;
    }
    if (PyObject_GetBuffer(index, &self->index, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(sizes, &self->sizes, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&self->index);
        return -1;
    }
    if (PyObject_GetBuffer(data, &self->data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&self->index);
        PyBuffer_Release(&self->sizes);
        return -1;
    }
    if ((self->index.len - offsets_start) / 8 <= count || self->sizes.len / 4 < count) {
        PyBuffer_Release(&self->index);
        PyBuffer_Release(&self->sizes);
        PyBuffer_Release(&self->data);
        PyErr_Format(PyExc_ValueError, "an index of %zd bytes (sizes of %zd) has no room for %zd records",
                     self->index.len, self->sizes.len, count);
        return -1;
    }
    self->offsets_start = offsets_start;
    self->count = count;
    self->dictionary_id = dictionary_id;
    self->decompress = Py_NewRef(decompress);
    self->owner = PyThread_get_thread_ident();
    self->as_str = as_str;
    self->holding = 1;
    return 0;
}

static void frames_dealloc(FrameSlicer *self)
{
    frames_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The decoded record, or None (a decline) when anything is not as a sound record's would be. */
static PyObject *frames_get(FrameSlicer *self, PyObject *index)
{
    if (!self->holding || !PyLong_CheckExact(index) || PyThread_get_thread_ident() != self->owner)
        Py_RETURN_NONE;
    Py_ssize_t position = PyLong_AsSsize_t(index);
    if (position == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (position < 0)
        position += self->count;
    if (position < 0 || position >= self->count)
        Py_RETURN_NONE;
    const uint8_t *at = (const uint8_t *)self->index.buf + self->offsets_start + 8 * position;
    uint64_t start = load_le64(at), end = load_le64(at + 8);
    uint32_t size = (uint32_t)load_le((const uint8_t *)self->sizes.buf + 4 * position, 4);
    if (start > end || end > (uint64_t)self->data.len
        || !frame_check_passes((const uint8_t *)self->data.buf + start, end - start, size, self->dictionary_id))
        Py_RETURN_NONE;
    PyObject *payload = call_decompress(self->decompress, (const uint8_t *)self->data.buf + start, end - start, size);
    if (payload == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (!self->as_str)
        return payload;
    PyObject *text = record_object(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), 1);
    Py_DECREF(payload);
    if (text == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return text;
}

static PyObject *frames_release_method(FrameSlicer *self, PyObject *unused)
{
    frames_release(self);
    Py_RETURN_NONE;
}

static PyMethodDef frames_methods[] = {
    {"get", (PyCFunction)frames_get, METH_O,
     "Record `index` decoded, or None if it is out of range, its offsets or frame unsound, its decoding failed, "
     "(str) its bytes are not UTF-8, or this is not the thread that made the slicer."},
    {"release", (PyCFunction)frames_release_method, METH_NOARGS, "Let go of the maps; every read returns None after."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FrameSlicerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "varstore._speedups.FrameSlicer",
    .tp_basicsize = sizeof(FrameSlicer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FrameSlicer(index, offsets_start, count, sizes, data, as_str, dictionary_id, decompress): single reads "
              "of a compressed (2.x) shard's bytes or str records.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)frames_init,
    .tp_dealloc = (destructor)frames_dealloc,
    .tp_methods = frames_methods,
};

/* ---- compressed blocks: single reads of a 3.x shard's bytes and str records ------------ */

/* One 3.x shard's single reads (spec/FORMAT.md §1.7): the record's block found by the spec's bisect and checked,
   its stored frame checked against its CRC32C and frame header, decoded by the owning thread's zstd context and
   kept for the next read of the same block; every decline (None) sends the read to the Python path, which words
   the error. Reads from any thread but the one that made the slicer decline too. */
typedef struct {
    PyObject_HEAD
    Py_buffer offsets;          /* N + 1 u64, decoded space */
    Py_buffer block_offsets;    /* B + 1 u64, stored */
    Py_buffer block_records;    /* B + 1 u64 */
    Py_buffer block_checksums;  /* B u32 */
    Py_buffer data;
    Py_ssize_t count;           /* N */
    Py_ssize_t blocks;          /* B */
    uint64_t dictionary_id;
    PyObject *decompress;
    PyObject *kept;             /* the block decoded last (bytes), or NULL */
    Py_ssize_t kept_number;
    unsigned long owner;
    int as_str;
    int holding;
} BlockSlicer;

static void block_slicer_release(BlockSlicer *self)
{
    if (self->holding) {
        self->holding = 0;
        PyBuffer_Release(&self->offsets);
        PyBuffer_Release(&self->block_offsets);
        PyBuffer_Release(&self->block_records);
        PyBuffer_Release(&self->block_checksums);
        PyBuffer_Release(&self->data);
    }
    Py_CLEAR(self->decompress);
    Py_CLEAR(self->kept);
    self->kept_number = -1;
}

static int block_slicer_init(BlockSlicer *self, PyObject *args, PyObject *kwargs)
{
    PyObject *views[5], *decompress;
    unsigned long long dictionary_id;
    int as_str;
    static char *names[] = {"offsets", "block_offsets", "block_records", "block_checksums", "data", "as_str",
                            "dictionary_id", "decompress", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOpKO", names, &views[0], &views[1], &views[2], &views[3],
                                     &views[4], &as_str, &dictionary_id, &decompress))
        return -1;
    block_slicer_release(self);
    if (!PyCallable_Check(decompress)) {
        PyErr_SetString(PyExc_TypeError, "decompress must be callable");
        return -1;
    }
    Py_buffer *buffers[5] = {&self->offsets, &self->block_offsets, &self->block_records, &self->block_checksums, &self->data};
    for (int k = 0; k < 5; k++)
        if (PyObject_GetBuffer(views[k], buffers[k], PyBUF_SIMPLE) < 0) {
            while (k-- > 0)
                PyBuffer_Release(buffers[k]);
            return -1;
        }
    Py_ssize_t count = self->offsets.len / 8 - 1, blocks = self->block_offsets.len / 8 - 1;
    if (count < 0 || blocks < 0 || self->offsets.len % 8 || self->block_offsets.len % 8
        || self->block_records.len != self->block_offsets.len || self->block_checksums.len != 4 * blocks) {
        for (int k = 0; k < 5; k++)
            PyBuffer_Release(buffers[k]);
        PyErr_SetString(PyExc_ValueError, "offsets, block_offsets, block_records and block_checksums do not agree in size");
        return -1;
    }
    self->count = count;
    self->blocks = blocks;
    self->dictionary_id = dictionary_id;
    self->decompress = Py_NewRef(decompress);
    self->kept = NULL;
    self->kept_number = -1;
    self->owner = PyThread_get_thread_ident();
    self->as_str = as_str;
    self->holding = 1;
    return 0;
}

static void block_slicer_dealloc(BlockSlicer *self)
{
    block_slicer_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline uint64_t entry(const Py_buffer *table, Py_ssize_t k)
{
    return load_le64((const uint8_t *)table->buf + 8 * k);
}

/* The decoded bytes of block `number`, checked (CRC32C, frame header, decoded size) and kept; NULL without an
   error set to decline, with one set if Python failed (memory). */
static PyObject *decoded_block(BlockSlicer *self, Py_ssize_t number, uint64_t start, uint64_t end, uint64_t size)
{
    if (number == self->kept_number && self->kept != NULL)
        return Py_NewRef(self->kept);
    const uint8_t *frame = (const uint8_t *)self->data.buf + start;
    uint32_t expected = (uint32_t)load_le((const uint8_t *)self->block_checksums.buf + 4 * number, 4);
    if (~crc_update(0xFFFFFFFFu, frame, (size_t)(end - start)) != expected
        || !frame_check_passes(frame, end - start, size, self->dictionary_id))
        return NULL;
    PyObject *decoded = call_decompress(self->decompress, frame, end - start, size);
    if (decoded == NULL)
        return NULL;
    Py_XSETREF(self->kept, Py_NewRef(decoded));
    self->kept_number = number;
    return decoded;
}

static PyObject *block_slicer_get(BlockSlicer *self, PyObject *index)
{
    if (!self->holding || !PyLong_CheckExact(index) || PyThread_get_thread_ident() != self->owner)
        Py_RETURN_NONE;
    Py_ssize_t position = PyLong_AsSsize_t(index);
    if (position == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (position < 0)
        position += self->count;
    if (position < 0 || position >= self->count)
        Py_RETURN_NONE;
    Py_ssize_t low = 0, high = self->blocks + 1;  /* bisect_right over all B + 1 entries, as §1.7 spells it out */
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if ((uint64_t)position < entry(&self->block_records, middle))
            high = middle;
        else
            low = middle + 1;
    }
    Py_ssize_t number = low - 1;
    if (number < 0 || number >= self->blocks)
        Py_RETURN_NONE;
    uint64_t first = entry(&self->block_records, number), last = entry(&self->block_records, number + 1);
    uint64_t start = entry(&self->block_offsets, number), end = entry(&self->block_offsets, number + 1);
    if (!(first <= (uint64_t)position && (uint64_t)position < last && last <= (uint64_t)self->count)
        || !(start <= end && end <= (uint64_t)self->data.len))
        Py_RETURN_NONE;
    uint64_t base = entry(&self->offsets, (Py_ssize_t)first), top = entry(&self->offsets, (Py_ssize_t)last);
    uint64_t record_start = entry(&self->offsets, position), record_end = entry(&self->offsets, position + 1);
    if (!(base <= record_start && record_start <= record_end && record_end <= top) || top - base > 0xFFFFFFFFu)
        Py_RETURN_NONE;
    PyObject *block = decoded_block(self, number, start, end, top - base);
    if (block == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    const char *bytes = PyBytes_AS_STRING(block) + (record_start - base);
    Py_ssize_t length = (Py_ssize_t)(record_end - record_start);
    PyObject *record = record_object(bytes, length, self->as_str);
    Py_DECREF(block);
    if (record == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return record;
}

static PyObject *block_slicer_release_method(BlockSlicer *self, PyObject *unused)
{
    block_slicer_release(self);
    Py_RETURN_NONE;
}

static PyMethodDef block_slicer_methods[] = {
    {"get", (PyCFunction)block_slicer_get, METH_O,
     "Record `index` decoded, or None if it is out of range, its block or offsets unsound, its block's CRC32C or "
     "frame wrong, its decoding failed, (str) its bytes are not UTF-8, or this is not the thread that made the slicer."},
    {"release", (PyCFunction)block_slicer_release_method, METH_NOARGS, "Let go of the maps and the kept block."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BlockSlicerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "varstore._speedups.BlockSlicer",
    .tp_basicsize = sizeof(BlockSlicer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlockSlicer(offsets, block_offsets, block_records, block_checksums, data, as_str, dictionary_id, "
              "decompress): single reads of a 3.x shard's bytes or str records.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)block_slicer_init,
    .tp_dealloc = (destructor)block_slicer_dealloc,
    .tp_methods = block_slicer_methods,
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
    {"verify_checksums", (PyCFunction)(void (*)(void))verify_checksums, METH_FASTCALL,
     "verify_checksums(data, offsets, checksums, crc) -> (crc, wrong): the running CRC32C continued over data, and "
     "the positions of the records data[offsets[k] - offsets[0]:offsets[k + 1] - offsets[0]] whose CRC32C is not "
     "checksums[k] (none if checksums is None)."},
    {"msgpack_passes", (PyCFunction)(void (*)(void))msgpack_passes, METH_FASTCALL,
     "msgpack_passes(payload, ext_type) -> bool: True only if varstore.format.msgpack_bounds.check_msgpack accepts it."},
    {"msgpack_pack", (PyCFunction)(void (*)(void))msgpack_pack, METH_FASTCALL,
     "msgpack_pack(record, array_type, dtypes) -> bytes or None: the record as MsgpackCodec packs it, or None where "
     "that is left to the Python path."},
    {"msgpack_pack_each", (PyCFunction)(void (*)(void))msgpack_pack_each, METH_FASTCALL,
     "msgpack_pack_each(records, array_type, dtypes) -> list: msgpack_pack of each record of a list."},
    {"frame_passes", (PyCFunction)(void (*)(void))frame_passes, METH_FASTCALL,
     "frame_passes(data, start, end, declared, expected_dictionary) -> bool: True only if "
     "varstore.format.compression.check_frame accepts the frame data[start:end]; False for anything else, "
     "arguments it cannot read included."},
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
    shift_tables_init();
    fixed_sizes_init();
    dtype_name = PyUnicode_InternFromString("dtype");
    if (dtype_name == NULL)
        return NULL;
#ifdef HAVE_HARDWARE_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        zeros_tables_init(zeros_long, LONG_BLOCK);
        zeros_tables_init(zeros_short, SHORT_BLOCK);
        crc_update = crc_hardware;
        have_multiply_hardware = __builtin_cpu_supports("pclmul")
                                 && multiply_hardware(0x12345678u, 0x9ABCDEF0u) == multiply_software(0x12345678u, 0x9ABCDEF0u)
                                 && multiply_hardware(0xFFFFFFFFu, 0x80000001u) == multiply_software(0xFFFFFFFFu, 0x80000001u);
    }
#endif
    if (PyType_Ready(&RecordSlicerType) < 0 || PyType_Ready(&FrameSlicerType) < 0
        || PyType_Ready(&BlockSlicerType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "RecordSlicer", (PyObject *)&RecordSlicerType) < 0
        || PyModule_AddObjectRef(module, "FrameSlicer", (PyObject *)&FrameSlicerType) < 0
        || PyModule_AddObjectRef(module, "BlockSlicer", (PyObject *)&BlockSlicerType) < 0
        || PyModule_AddIntConstant(module, "HARDWARE_CRC32C", crc_update != crc_software) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
