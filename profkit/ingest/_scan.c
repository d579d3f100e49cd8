/* profkit's columnar scanner for a chunk of a Kineto trace: `[ev, ev, ...]` -> fixed-width columns.
 *
 * Built on first use by profkit/ingest/scan.py (cc -O2 -shared) and loaded with ctypes; when no C
 * compiler is there, profkit decodes with msgspec instead (same tables). The scanner is a strict
 * subset of that decoder: it accepts exactly the events msgspec's typed decode accepts (see
 * columnar.py: FX and the other phases' structs) and returns a negative code for anything else
 * (a type it does not expect, an unknown phase, a number it cannot represent exactly, ...), so the
 * caller falls back to msgspec, which then gives its verdict. No per-event allocation: strings are
 * interned in a hash table of spans into the chunk and returned as ids; numbers go to arrays.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

enum { E_SYNTAX = -1, E_TYPE = -2, E_CAP = -3, E_NUMBER = -4, E_PHASE = -5 };

/* validity bits per event */
enum { V_TS = 1, V_DUR = 2, V_CORR = 4, V_EXT = 8, V_STREAM = 16, V_DEVICE = 32, V_BYTES = 64, V_ARGS = 128 /* an args object */ };

typedef struct {
    /* per-event outputs (capacity cap) */
    int8_t *ph;
    int32_t *name, *cat, *pid, *tid; /* string ids; 0 = "" (absent name/cat), 1 = "0" (absent pid/tid) */
    double *ts, *dur;
    int64_t *corr, *ext, *stream, *device, *nbytes;
    uint8_t *valid;
    int64_t cap;
    /* string table: spans into the chunk (raw JSON string content, escapes not resolved) */
    int64_t *s_off;
    int32_t *s_len;
    uint8_t *s_esc; /* 1: the raw span holds a backslash escape */
    int64_t s_cap, s_n;
    int32_t *slots; /* hash table of string ids, -1 = empty; size power of two */
    int64_t n_slots;
    int64_t shapes; /* set when an args object holds "Input Dims" (record_shapes): ingest/shapes.py reads them */
    /* per event: the string id of the raw JSON text of its args' "Input Dims" and "Input type" (interned with
     * esc = 2: a JSON value, not a string's content), -1 where absent */
    int32_t *dims, *types;
} Out;

static const char *PHASES = "BEiIbnesStTpFfPNODMVvRcC()X";

static inline const char *ws(const char *p, const char *e) {
    if (p < e && (unsigned char)*p > ' ') return p; /* compact JSON: no whitespace at all */
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static inline int hexd(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* p at the opening quote; returns the position after the closing quote and sets the content span.
 * Validates as a JSON decoder does: no raw control characters, only the defined escapes. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
/* bytes of w that are '"', '\\' or below 0x20 (8 at a time) */
static inline uint64_t specials(uint64_t w) {
    uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
    return (((q - ONES) & ~q) | ((b - ONES) & ~b) | ((w - ONES * 0x20) & ~w)) & HIGHS;
}

static inline const char *str_span(const char *p, const char *e, const char **s, int64_t *n, int *esc) {
    p++;
    *s = p;
    *esc = 0;
    while (p < e) {
#ifdef __SSE2__
        /* 16 bytes at a time: jump to the first '"', '\\' or control character */
        const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), c1f = _mm_set1_epi8(0x1F);
        while (p + 16 <= e) {
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                       _mm_cmpeq_epi8(_mm_max_epu8(x, c1f), c1f));
            int m = _mm_movemask_epi8(hit);
            if (m) { p += __builtin_ctz((unsigned)m); break; }
            p += 16;
        }
#else
        while (p + 8 <= e) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (specials(w)) break;
            p += 8;
        }
#endif
        if (p >= e) break;
        unsigned char c = (unsigned char)*p;
        if (c == '"') { *n = p - *s; return p + 1; }
        if (c == '\\') {
            *esc = 1;
            if (p + 1 >= e) return NULL;
            char x = p[1];
            if (x == 'u') {
                if (p + 5 >= e || !hexd(p[2]) || !hexd(p[3]) || !hexd(p[4]) || !hexd(p[5])) return NULL;
                p += 6;
                continue;
            }
            if (x != '"' && x != '\\' && x != '/' && x != 'b' && x != 'f' && x != 'n' && x != 'r' && x != 't') return NULL;
            p += 2;
            continue;
        }
        if (c < 0x20) return NULL;
        p++;
    }
    return NULL;
}

static inline int is_null(const char *p, const char *e) { return e - p >= 4 && memcmp(p, "null", 4) == 0; }
static inline const char *num_token(const char *p, const char *e, int *is_int);

/* a whole JSON value, validated (depth-limited); NULL when it is not valid JSON */
static const char *skip_value_d(const char *p, const char *e, int depth) {
    if (p >= e || depth > 256) return NULL;
    char c = *p;
    if ((c >= '0' && c <= '9') || c == '-') { /* numbers first: the values profkit skips are mostly ids */
        int is_int;
        return num_token(p, e, &is_int);
    }
    if (c == '"') {
        const char *s; int64_t n; int esc;
        return str_span(p, e, &s, &n, &esc);
    }
    if (c == '{') {
        p = ws(p + 1, e);
        if (p < e && *p == '}') return p + 1;
        for (;;) {
            if (p >= e || *p != '"') return NULL;
            const char *s; int64_t n; int esc;
            p = str_span(p, e, &s, &n, &esc);
            if (!p) return NULL;
            p = ws(p, e);
            if (p >= e || *p != ':') return NULL;
            p = skip_value_d(ws(p + 1, e), e, depth + 1);
            if (!p) return NULL;
            p = ws(p, e);
            if (p >= e) return NULL;
            if (*p == ',') { p = ws(p + 1, e); continue; }
            if (*p == '}') return p + 1;
            return NULL;
        }
    }
    if (c == '[') {
        p = ws(p + 1, e);
        if (p < e && *p == ']') return p + 1;
        for (;;) {
            p = skip_value_d(p, e, depth + 1);
            if (!p) return NULL;
            p = ws(p, e);
            if (p >= e) return NULL;
            if (*p == ',') { p = ws(p + 1, e); continue; }
            if (*p == ']') return p + 1;
            return NULL;
        }
    }
    if (is_null(p, e)) return p + 4;
    if (e - p >= 4 && memcmp(p, "true", 4) == 0) return p + 4;
    if (e - p >= 5 && memcmp(p, "false", 5) == 0) return p + 5;
    int is_int;
    return num_token(p, e, &is_int);
}

static inline const char *skip_value(const char *p, const char *e) { return skip_value_d(p, e, 1); }

/* length, first 8 and last 16 bytes: enough to spread the names a trace repeats (equal hashes are
 * told apart by the full compare in intern) */
static inline uint64_t hash_bytes(const char *s, int64_t n) {
    uint64_t h = 0x243F6A8885A308D3ULL ^ (uint64_t)n, w;
    if (n >= 16) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        memcpy(&w, s + n - 16, 8);
        h = (h ^ (h >> 29) ^ w) * 0x9E3779B97F4A7C15ULL;
        memcpy(&w, s + n - 8, 8);
        h = (h ^ (h >> 29) ^ w) * 0x9E3779B97F4A7C15ULL;
        return h ^ (h >> 32);
    }
    while (n >= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, s, (size_t)n);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 32);
}

/* a == b over n bytes: short strings (ids, categories) compared here, longer ones by memcmp */
static inline int same_bytes(const char *a, const char *b, int64_t n) {
    if (n > 16) return memcmp(a, b, (size_t)n) == 0;
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static int32_t intern(Out *o, const char *base, const char *s, int64_t n, int esc) {
    uint64_t h = hash_bytes(s, n);
    int64_t mask = o->n_slots - 1;
    int64_t i = (int64_t)(h & (uint64_t)mask);
    for (;;) {
        int32_t id = o->slots[i];
        if (id < 0) break;
        if (o->s_len[id] == n && same_bytes(base + o->s_off[id], s, n)) return id;
        i = (i + 1) & mask;
    }
    if (o->s_n >= o->s_cap || o->s_n * 2 >= o->n_slots) return E_CAP;
    int32_t id = (int32_t)o->s_n++;
    o->s_off[id] = s - base;
    o->s_len[id] = (int32_t)n;
    o->s_esc[id] = (uint8_t)esc;
    o->slots[i] = id;
    return id;
}

/* the end of the run of ASCII digits at q (8 bytes at a time: a byte b is a digit when neither
 * b - '0' nor b - '0' + 0x76 has its high bit set; borrows and carries only move towards later
 * bytes, so the first flagged byte is the first non-digit) */
static inline const char *skip_digits(const char *q, const char *e) {
    while (e - q >= 8) {
        uint64_t w;
        memcpy(&w, q, 8);
        uint64_t x = w - 0x3030303030303030ULL;
        uint64_t nd = (x | (x + 0x7676767676767676ULL)) & 0x8080808080808080ULL;
        if (nd) return q + (__builtin_ctzll(nd) >> 3);
        q += 8;
    }
    while (q < e && *q >= '0' && *q <= '9') q++;
    return q;
}

/* the value of 8 ASCII digits (first digit most significant) */
static inline uint64_t parse8(const char *s) {
    uint64_t v;
    memcpy(&v, s, 8);
    v -= 0x3030303030303030ULL;
    v = (v * 10 + (v >> 8)) & 0x00FF00FF00FF00FFULL;
    v = (v * 100 + (v >> 16)) & 0x0000FFFF0000FFFFULL;
    return (v * 10000 + (v >> 32)) & 0xFFFFFFFFULL;
}

/* m * 10^n + the value of the n digits at s (wrapping past 2^64: callers check the digit count) */
static inline uint64_t acc_digits(uint64_t m, const char *s, int64_t n) {
    for (; n >= 8; s += 8, n -= 8) m = m * 100000000ULL + parse8(s);
    for (; n > 0; s++, n--) m = m * 10 + (uint64_t)(*s - '0');
    return m;
}

/* a JSON number token at p: its end, and whether it is an integer literal */
static inline const char *num_token(const char *p, const char *e, int *is_int) {
    const char *q = p;
    if (q < e && *q == '-') q++;
    if (q >= e || *q < '0' || *q > '9') return NULL;
    if (*q == '0' && q + 1 < e && q[1] >= '0' && q[1] <= '9') return NULL; /* leading zero */
    q = skip_digits(q, e);
    *is_int = 1;
    if (q < e && *q == '.') {
        *is_int = 0;
        q++;
        if (q >= e || *q < '0' || *q > '9') return NULL;
        q = skip_digits(q, e);
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        *is_int = 0;
        q++;
        if (q < e && (*q == '+' || *q == '-')) q++;
        if (q >= e || *q < '0' || *q > '9') return NULL;
        q = skip_digits(q, e);
    }
    return q;
}

static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* One pass over a JSON number: its end (NULL if it is not one) and its decimal parts. */
typedef struct { uint64_t m; int digits, frac, ex, eneg, neg, is_int; } Num;

static inline const char *scan_number(const char *p, const char *e, Num *x) {
    x->m = 0; x->digits = 0; x->frac = 0; x->ex = 0; x->eneg = 0; x->neg = 0; x->is_int = 1;
    if (p < e && *p == '-') { x->neg = 1; p++; }
    if (p >= e || *p < '0' || *p > '9') return NULL;
    if (*p == '0' && p + 1 < e && p[1] >= '0' && p[1] <= '9') return NULL; /* leading zero */
    const char *d = skip_digits(p, e);
    x->m = acc_digits(0, p, d - p);
    x->digits = (int)(d - p);
    p = d;
    if (p < e && *p == '.') {
        x->is_int = 0;
        p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        d = skip_digits(p, e);
        x->m = acc_digits(x->m, p, d - p);
        x->digits += (int)(d - p);
        x->frac = (int)(d - p);
        p = d;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        x->is_int = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) { x->eneg = *p == '-'; p++; }
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9') { if (x->ex < 100000) x->ex = x->ex * 10 + (*p - '0'); p++; }
    }
    return p;
}

/* The exact fast path (Clinger): a decimal significand below 2^53 times or over a power of ten up
 * to 1e22 is one correctly rounded operation on exact operands; anything else goes to strtod. */
static inline int fast_double(const Num *x, double *out) {
    if (x->digits > 19 || x->m > (1ULL << 53)) return 0;
    int e10 = (x->eneg ? -x->ex : x->ex) - x->frac;
    if (e10 < -22 || e10 > 22) return 0;
    double v = (double)x->m;
    v = e10 < 0 ? v / POW10[-e10] : v * POW10[e10];
    *out = x->neg ? -v : v;
    return 1;
}

/* float | None field */
static inline const char *read_float(const char *p, const char *e, double *out, int *valid, int *err) {
    if (is_null(p, e)) { *valid = 0; return p + 4; }
    Num x;
    const char *q = scan_number(p, e, &x);
    if (!q) { *err = E_TYPE; return NULL; }
    int64_t n = q - p;
    if (x.is_int && x.digits > 18) { *err = E_NUMBER; return NULL; } /* beyond 64-bit integers: msgspec decides */
    double v;
    if (!fast_double(&x, &v)) {
        char buf[64];
        if (n >= (int64_t)sizeof buf) { *err = E_NUMBER; return NULL; }
        memcpy(buf, p, (size_t)n);
        buf[n] = 0;
        v = strtod(buf, NULL);
    }
    if (isinf(v)) { *err = E_NUMBER; return NULL; }
    *out = v;
    *valid = 1;
    return q;
}

/* int | None field (ints up to 18 digits) */
static inline const char *read_int(const char *p, const char *e, int64_t *out, int *valid, int *err) {
    if (is_null(p, e)) { *valid = 0; return p + 4; }
    int is_int;
    const char *q = num_token(p, e, &is_int);
    if (!q || !is_int) { *err = E_TYPE; return NULL; }
    const char *d = p;
    int neg = 0;
    if (*d == '-') { neg = 1; d++; }
    if (q - d > 18) { *err = E_NUMBER; return NULL; }
    int64_t v = (int64_t)acc_digits(0, d, q - d);
    *out = neg ? -v : v;
    *valid = 1;
    return q;
}

/* str field: interned id */
/* intern, first trying the id this field had in the previous event (cat, pid and tid rarely change) */
static inline int32_t intern_last(Out *o, const char *base, const char *s, int64_t n, int esc, int32_t *last) {
    int32_t l = *last;
    if (l >= 0 && o->s_len[l] == n && same_bytes(base + o->s_off[l], s, n)) return l;
    int32_t k = intern(o, base, s, n, esc);
    if (k >= 0) *last = k;
    return k;
}

static inline const char *read_str(Out *o, const char *base, const char *p, const char *e, int32_t *id, int *err, int32_t *last) {
    if (*p != '"') { *err = E_TYPE; return NULL; }
    const char *s; int64_t n; int esc;
    const char *q = str_span(p, e, &s, &n, &esc);
    if (!q) { *err = E_SYNTAX; return NULL; }
    int32_t k = last ? intern_last(o, base, s, n, esc, last) : intern(o, base, s, n, esc);
    if (k < 0) { *err = k; return NULL; }
    *id = k;
    return q;
}

/* int | str field (pid, tid): the id of its text (an int's canonical digits, or the string) */
static inline const char *read_id(Out *o, const char *base, const char *p, const char *e, int32_t *id, int *err, int32_t *last) {
    if (*p == '"') return read_str(o, base, p, e, id, err, last);
    int is_int;
    const char *q = num_token(p, e, &is_int);
    if (!q || !is_int) { *err = E_TYPE; return NULL; }
    if (q - p - (p[0] == '-') > 18 || (q - p == 2 && p[0] == '-' && p[1] == '0')) { *err = E_NUMBER; return NULL; }
    int32_t k = intern_last(o, base, p, q - p, 0, last);
    if (k < 0) { *err = k; return NULL; }
    *id = k | (int32_t)0x40000000; /* marks "text of an int" (no quotes to strip, never escaped) */
    return q;
}

static inline void set_valid(uint8_t *valid, int bit, int on) {
    *valid = (uint8_t)(on ? (*valid | bit) : (*valid & ~bit));
}

/* int | None field with a validity bit */
static inline const char *read_int_field(const char *p, const char *e, int64_t *out, uint8_t *valid, int bit, int *err) {
    int v = 0;
    p = read_int(p, e, out, &v, err);
    if (p) set_valid(valid, bit, v);
    return p;
}

static inline int key_is(const char *s, int64_t n, const char *lit, int64_t ln) {
    return n == ln && same_bytes(s, lit, ln);
}

/* args object: the typed fields; returns position after '}' */
/* the raw JSON text of the value at p, interned (esc = 2): the position after it, NULL on an error */
static inline const char *read_raw(Out *o, const char *base, const char *p, const char *e, int32_t *id, int *err) {
    const char *q = skip_value(p, e);
    if (!q) { *err = E_SYNTAX; return NULL; }
    int32_t got = intern(o, base, p, q - p, 2);
    if (got < 0) { *err = got; return NULL; }
    *id = got;
    return q;
}

static const char *read_args(Out *o, const char *base, int64_t k, const char *p, const char *e, int *err) {
    p++; /* '{' */
    o->valid[k] &= (uint8_t)(V_TS | V_DUR); /* a repeated "args" replaces the earlier one, as in msgspec */
    o->valid[k] |= V_ARGS;
    o->dims[k] = o->types[k] = -1;
    p = ws(p, e);
    if (p < e && *p == '}') return p + 1;
    for (;;) {
        p = ws(p, e);
        if (p >= e || *p != '"') { *err = E_SYNTAX; return NULL; }
        const char *s; int64_t n; int esc;
        p = str_span(p, e, &s, &n, &esc);
        if (!p) { *err = E_SYNTAX; return NULL; }
        p = ws(p, e);
        if (p >= e || *p != ':') { *err = E_SYNTAX; return NULL; }
        p = ws(p + 1, e);
        if (p >= e) { *err = E_SYNTAX; return NULL; }
        if (esc) { *err = E_TYPE; return NULL; } /* an escaped key: let msgspec decide */
        if (key_is(s, n, "correlation", 11)) {
            if (!(p = read_int_field(p, e, &o->corr[k], &o->valid[k], V_CORR, err))) return NULL;
        } else if (key_is(s, n, "External id", 11)) {
            if (!(p = read_int_field(p, e, &o->ext[k], &o->valid[k], V_EXT, err))) return NULL;
        } else if (key_is(s, n, "stream", 6)) {
            if (!(p = read_int_field(p, e, &o->stream[k], &o->valid[k], V_STREAM, err))) return NULL;
        } else if (key_is(s, n, "device", 6)) {
            if (!(p = read_int_field(p, e, &o->device[k], &o->valid[k], V_DEVICE, err))) return NULL;
        } else if (key_is(s, n, "bytes", 5)) {
            /* int | str | None; a string of ASCII digits counts as its int, any other string as None */
            if (*p == '"') {
                const char *bs; int64_t bn; int besc;
                p = str_span(p, e, &bs, &bn, &besc);
                if (!p) { *err = E_SYNTAX; return NULL; }
                int digits = bn > 0 && bn <= 18 && !besc;
                for (int64_t i = 0; digits && i < bn; i++) digits = bs[i] >= '0' && bs[i] <= '9';
                if (!digits) {
                    /* non-ASCII digits (str.isdigit) or escapes: msgspec's path decides */
                    for (int64_t i = 0; i < bn; i++) if ((unsigned char)bs[i] >= 0x80 || bs[i] == '\\') { *err = E_TYPE; return NULL; }
                    if (bn > 18) { int all = 1; for (int64_t i = 0; i < bn; i++) all = all && bs[i] >= '0' && bs[i] <= '9'; if (all) { *err = E_NUMBER; return NULL; } }
                    o->valid[k] &= (uint8_t)~V_BYTES;
                } else {
                    int64_t x = 0;
                    for (int64_t i = 0; i < bn; i++) x = x * 10 + (bs[i] - '0');
                    o->nbytes[k] = x;
                    o->valid[k] |= V_BYTES;
                }
            } else {
                if (!(p = read_int_field(p, e, &o->nbytes[k], &o->valid[k], V_BYTES, err))) return NULL;
            }
        } else {
            if (n == 10 && key_is(s, n, "Input Dims", 10)) {
                o->shapes = 1;
                if (!(p = read_raw(o, base, p, e, &o->dims[k], err))) return NULL;
            } else if (n == 10 && key_is(s, n, "Input type", 10)) {
                if (!(p = read_raw(o, base, p, e, &o->types[k], err))) return NULL;
            } else {
                p = skip_value(p, e);
                if (!p) { *err = E_SYNTAX; return NULL; }
            }
        }
        p = ws(p, e);
        if (p >= e) { *err = E_SYNTAX; return NULL; }
        if (*p == ',') { p++; continue; }
        if (*p == '}') return p + 1;
        *err = E_SYNTAX;
        return NULL;
    }
}

enum { K_OTHER, K_PH, K_NAME, K_CAT, K_TS, K_DUR, K_PID, K_TID, K_ARGS };

#define LE4(a, b, c, d) ((uint64_t)(a) | (uint64_t)(b) << 8 | (uint64_t)(c) << 16 | (uint64_t)(d) << 24)
#define LE5(a, b, c, d, f) (LE4(a, b, c, d) | (uint64_t)(f) << 32)
#define LE6(a, b, c, d, f, g) (LE5(a, b, c, d, f) | (uint64_t)(g) << 40)

/* p at the opening quote of an event's key: the position after its closing quote, the key's code
 * and whether it holds an escape. The keys Kineto writes are told from the first bytes, quotes
 * included (so `"ph"` never matches `"phase"`); any other key is read as a string. */
static inline const char *event_key(const char *p, const char *e, int *code, int *esc) {
    *esc = 0;
    if (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t w4 = w & 0xFFFFFFFFULL, w5 = w & 0xFFFFFFFFFFULL, w6 = w & 0xFFFFFFFFFFFFULL;
        if (w4 == LE4('"', 'p', 'h', '"')) { *code = K_PH; return p + 4; }
        if (w4 == LE4('"', 't', 's', '"')) { *code = K_TS; return p + 4; }
        if (w5 == LE5('"', 'c', 'a', 't', '"')) { *code = K_CAT; return p + 5; }
        if (w5 == LE5('"', 'd', 'u', 'r', '"')) { *code = K_DUR; return p + 5; }
        if (w5 == LE5('"', 'p', 'i', 'd', '"')) { *code = K_PID; return p + 5; }
        if (w5 == LE5('"', 't', 'i', 'd', '"')) { *code = K_TID; return p + 5; }
        if (w6 == LE6('"', 'n', 'a', 'm', 'e', '"')) { *code = K_NAME; return p + 6; }
        if (w6 == LE6('"', 'a', 'r', 'g', 's', '"')) { *code = K_ARGS; return p + 6; }
    }
    const char *s; int64_t n;
    p = str_span(p, e, &s, &n, esc);
    if (!p) return NULL;
    *code = key_is(s, n, "ph", 2) ? K_PH : key_is(s, n, "name", 4) ? K_NAME : key_is(s, n, "cat", 3) ? K_CAT
          : key_is(s, n, "ts", 2) ? K_TS : key_is(s, n, "dur", 3) ? K_DUR : key_is(s, n, "pid", 3) ? K_PID
          : key_is(s, n, "tid", 3) ? K_TID : key_is(s, n, "args", 4) ? K_ARGS : K_OTHER;
    return p;
}

/* Scan `[ev, ...]`. Returns the number of events, or a negative error code. */
int64_t profkit_scan(const char *buf, int64_t len, Out *o) {
    const char *p = buf, *e = buf + len;
    int err = 0;
    p = ws(p, e);
    if (p >= e || *p != '[') return E_SYNTAX;
    p = ws(p + 1, e);
    int64_t k = 0;
    int32_t last_cat = -1, last_pid = -1, last_tid = -1;
    if (p < e && *p == ']') return ws(p + 1, e) == e ? 0 : E_SYNTAX;
    for (;;) {
        if (p >= e || *p != '{') return E_TYPE;
        if (k >= o->cap) return E_CAP;
        o->ph[k] = -1;
        o->name[k] = 0;
        o->cat[k] = 0;
        o->pid[k] = 1;
        o->tid[k] = 1;
        o->dims[k] = o->types[k] = -1;
        o->valid[k] = 0;
        int have_args_null = 0;
        p = ws(p + 1, e);
        if (p < e && *p == '}') {
            p++;
        } else {
            for (;;) {
                p = ws(p, e);
                if (p >= e || *p != '"') return E_SYNTAX;
                int key, esc;
                p = event_key(p, e, &key, &esc);
                if (!p) return E_SYNTAX;
                p = ws(p, e);
                if (p >= e || *p != ':') return E_SYNTAX;
                p = ws(p + 1, e);
                if (p >= e) return E_SYNTAX;
                if (esc) return E_TYPE;
                int v = 0;
                if (key == K_PH) {
                    const char *ps; int64_t pn; int pesc;
                    if (*p != '"') return E_TYPE;
                    p = str_span(p, e, &ps, &pn, &pesc);
                    if (!p) return E_SYNTAX;
                    if (pn != 1 || pesc) return E_PHASE;
                    const char *f = strchr(PHASES, ps[0]);
                    if (!f || ps[0] == 0) return E_PHASE;
                    o->ph[k] = (int8_t)(f - PHASES);
                } else if (key == K_NAME) {
                    p = read_str(o, buf, p, e, &o->name[k], &err, NULL);
                } else if (key == K_CAT) {
                    p = read_str(o, buf, p, e, &o->cat[k], &err, &last_cat);
                } else if (key == K_TS) {
                    p = read_float(p, e, &o->ts[k], &v, &err);
                    if (p) set_valid(&o->valid[k], V_TS, v);
                } else if (key == K_DUR) {
                    p = read_float(p, e, &o->dur[k], &v, &err);
                    if (p) set_valid(&o->valid[k], V_DUR, v);
                } else if (key == K_PID) {
                    p = read_id(o, buf, p, e, &o->pid[k], &err, &last_pid);
                } else if (key == K_TID) {
                    p = read_id(o, buf, p, e, &o->tid[k], &err, &last_tid);
                } else if (key == K_ARGS) {
                    if (*p == '{') {
                        have_args_null = 0;
                        p = read_args(o, buf, k, p, e, &err);
                    } else if (is_null(p, e)) {
                        have_args_null = 1;
                        o->valid[k] &= (uint8_t)(V_TS | V_DUR);
                        p += 4;
                    } else {
                        return E_TYPE;
                    }
                } else {
                    p = skip_value(p, e);
                    if (!p) return E_SYNTAX;
                }
                if (!p) return err ? err : E_SYNTAX;
                p = ws(p, e);
                if (p >= e) return E_SYNTAX;
                if (*p == ',') { p++; continue; }
                if (*p == '}') { p++; break; }
                return E_SYNTAX;
            }
        }
        if (o->ph[k] < 0) return E_PHASE; /* no "ph": not a tagged event */
        if (have_args_null && PHASES[o->ph[k]] == 'X') return E_TYPE; /* columnar.FX: args is not Optional */
        k++;
        p = ws(p, e);
        if (p >= e) return E_SYNTAX;
        if (*p == ',') { p = ws(p + 1, e); continue; }
        if (*p == ']') return ws(p + 1, e) == e ? k : E_SYNTAX;
        return E_SYNTAX;
    }
}

/* ---- the scanned events of a chunk -> the rows of profkit's four tables ------------------------ */

typedef struct {
    /* per local string id (the scan's ids): the file's id, and for categories the file's id of
     * the canonical spelling and the table (0 GPU ops, 1 runtime calls, 2 CPU events, 3 GPU
     * annotations, -1 none) */
    const uint32_t *gid, *canon;
    const int8_t *table;
    /* rows (capacity: the chunk's event count), grouped by table: table t at [start[t], start[t] + count[t]) */
    uint32_t *name, *cat, *pid, *tid;
    int64_t *ts, *dur, *end, *corr, *ext, *stream, *device, *nbytes;
    uint8_t *valid;
    int64_t start[4], count[4];
    int64_t unusable[3]; /* 'X' events without a timestamp; without a duration (with one); with a negative duration */
    double tmin;         /* the earliest timestamp of any event (has_tmin: there is one) */
    int64_t has_tmin;
    /* the CPU rows' "Input Dims" and "Input type" (file ids of their raw JSON text, UINT32_MAX where absent);
     * NULL: not wanted (the chunk has no "Input Dims") */
    uint32_t *dims, *types;
    uint32_t cpu_op; /* the file id of "cpu_op" */
    int64_t cpu_op_without_args; /* CPU rows of category cpu_op with no args object (ingest/shapes.py reads those apart) */
} Emit;

/* µs -> ns as tables.normalize_events computes it: the whole µs times 1000 in integers, plus the
 * fraction's ns rounded half to even (so an epoch timestamp of ~1.7e15 µs keeps every ns: us * 1000
 * in floating point would not), none (0) beyond US_LIMIT (~285 years) */
#define US_LIMIT 9.0e15
static inline int to_ns(double us, int64_t *out) {
    if (!(us > -US_LIMIT && us < US_LIMIT)) return 0;
    double whole = trunc(us);
    *out = (int64_t)whole * 1000 + (int64_t)nearbyint((us - whole) * 1000.0);
    return 1;
}

/* one 'X' event: its table when it is usable (a timestamp, a duration >= 0 and a table), else -1;
 * counts the unusable ones as tables.unusable_counts does */
static inline int usable_row(const Out *o, const Emit *e, int64_t k, int64_t *ts, int64_t *dur, int64_t *unusable) {
    int has_ts = (o->valid[k] & V_TS) && to_ns(o->ts[k], ts);
    int has_dur = (o->valid[k] & V_DUR) && to_ns(o->dur[k], dur);
    if (unusable) {
        if (!has_ts) unusable[0]++;
        else if (!has_dur) unusable[1]++;
        if (has_dur && *dur < 0) unusable[2]++;
    }
    if (!has_ts || !has_dur || *dur < 0) return -1;
    return e->table[o->cat[k]];
}

int64_t profkit_emit(const Out *o, int64_t n, Emit *e) {
    const int8_t X = (int8_t)(strchr(PHASES, 'X') - PHASES);
    int64_t ts = 0, dur = 0, cursor[4];
    for (int t = 0; t < 4; t++) e->count[t] = 0;
    for (int u = 0; u < 3; u++) e->unusable[u] = 0;
    e->has_tmin = 0;
    e->cpu_op_without_args = 0;
    for (int64_t k = 0; k < n; k++) {
        if ((o->valid[k] & V_TS) && (!e->has_tmin || o->ts[k] < e->tmin)) { e->tmin = o->ts[k]; e->has_tmin = 1; }
        if (o->ph[k] != X) continue;
        int t = usable_row(o, e, k, &ts, &dur, e->unusable);
        if (t >= 0) e->count[t]++;
    }
    int64_t at = 0;
    for (int t = 0; t < 4; t++) { e->start[t] = cursor[t] = at; at += e->count[t]; }
    for (int64_t k = 0; k < n; k++) {
        if (o->ph[k] != X) continue;
        int t = usable_row(o, e, k, &ts, &dur, NULL);
        if (t < 0) continue;
        int64_t r = cursor[t]++;
        uint32_t cat = e->canon[o->cat[k]];
        e->name[r] = e->gid[o->name[k]];
        e->pid[r] = e->gid[o->pid[k] & ~0x40000000];
        e->tid[r] = e->gid[o->tid[k] & ~0x40000000];
        e->ts[r] = ts;
        e->dur[r] = dur;
        e->end[r] = (int64_t)((uint64_t)ts + (uint64_t)dur); /* wraps like polars' addition */
        e->valid[r] = o->valid[k];
        /* only the columns of the row's table (coded.py's GPU_CODED, CALLS_CODED, CPU_CODED): the rest of
         * the rows' arrays is never written, so its pages are never touched (each is a page fault) */
        if (t == 0) {
            e->cat[r] = cat;
            e->corr[r] = o->corr[k];
            e->stream[r] = o->stream[k];
            e->device[r] = o->device[k];
            e->nbytes[r] = o->nbytes[k];
        } else if (t == 1) {
            e->corr[r] = o->corr[k];
            e->ext[r] = o->ext[k];
        } else {
            e->cat[r] = cat;
            e->ext[r] = o->ext[k];
        }
        if (t == 2) {
            if (e->dims) {
                e->dims[r] = o->dims[k] >= 0 ? e->gid[o->dims[k]] : UINT32_MAX;
                e->types[r] = o->types[k] >= 0 ? e->gid[o->types[k]] : UINT32_MAX;
            }
            if (cat == e->cpu_op && !(o->valid[k] & V_ARGS)) e->cpu_op_without_args++;
        }
    }
    return at;
}

/* ---------------------------------------------------------------- analysis: exclusive time in gaps
 *
 * One thread's events, given as two streams (its CPU events and its runtime calls), each ordered by
 * ts (ties in any order): (ts, end, name id). Name ids are in the names' order, so the events are
 * swept in (ts, -end, name id) order, the two streams merged here (events of equal ts sorted by
 * (-end, name id) as they come). Gaps [g0, g1) disjoint and ordered by g0. Each instant of a gap goes
 * to the event latest in that order that has started and not yet ended (for nested spans: the
 * innermost); per gap, the `top` names with the most such time, most first (ties: the smaller name
 * id), written to out_name / out_ns (-1 / 0 where fewer). One pass over the events and the gaps.
 * Returns 0, -1 when out of memory, -2 when a stream is not ordered by ts. */
typedef struct { int32_t name; int64_t ns; } Acc;

static void acc_add(Acc **acc, int64_t *n, int64_t *cap, int32_t name, int64_t ns) {
    for (int64_t i = 0; i < *n; i++) if ((*acc)[i].name == name) { (*acc)[i].ns += ns; return; }
    if (*n == *cap) {
        int64_t c = *cap * 2;
        Acc *a = realloc(*acc, (size_t)c * sizeof(Acc));
        if (!a) return; /* keeps what fits: the top entries come from the time already counted */
        *acc = a; *cap = c;
    }
    (*acc)[*n].name = name; (*acc)[*n].ns = ns; (*n)++;
}

typedef struct { int64_t end; int32_t name; } Ev;

/* (-end, name) order: the longer event first, then the smaller name id */
static int ev_cmp(const void *x, const void *y) {
    const Ev *a = x, *b = y;
    if (a->end != b->end) return a->end > b->end ? -1 : 1;
    return (a->name > b->name) - (a->name < b->name);
}

/* The merged event order, a run of equal starts at a time. */
typedef struct {
    const int64_t *ts[2], *end[2];
    const int32_t *name[2];
    int64_t n[2], i[2];
    Ev *run;
    int64_t rn, ri, rcap, run_ts;
    int err;
} Cursor;

/* the next run of events starting at one time into c->run; 0 when none is left (or on an error) */
static int cursor_fill(Cursor *c) {
    c->rn = c->ri = 0;
    if (c->err) return 0;
    int64_t t = INT64_MAX;
    int any = 0;
    for (int s = 0; s < 2; s++)
        if (c->i[s] < c->n[s] && (!any || c->ts[s][c->i[s]] < t)) { t = c->ts[s][c->i[s]]; any = 1; }
    if (!any) return 0;
    for (int s = 0; s < 2; s++) {
        while (c->i[s] < c->n[s] && c->ts[s][c->i[s]] == t) {
            if (c->rn == c->rcap) {
                int64_t cap = c->rcap * 2;
                Ev *r = realloc(c->run, (size_t)cap * sizeof(Ev));
                if (!r) { c->err = -1; return 0; }
                c->run = r; c->rcap = cap;
            }
            c->run[c->rn].end = c->end[s][c->i[s]]; c->run[c->rn].name = c->name[s][c->i[s]]; c->rn++; c->i[s]++;
        }
        if (c->i[s] < c->n[s] && c->ts[s][c->i[s]] < t) { c->err = -2; return 0; } /* not ordered by ts */
    }
    if (c->rn > 16) qsort(c->run, (size_t)c->rn, sizeof(Ev), ev_cmp);
    else
        for (int64_t a = 1; a < c->rn; a++) { /* insertion sort: runs are short */
            Ev v = c->run[a];
            int64_t b = a;
            while (b > 0 && ev_cmp(&c->run[b - 1], &v) > 0) { c->run[b] = c->run[b - 1]; b--; }
            c->run[b] = v;
        }
    c->run_ts = t;
    return 1;
}

/* 1 when an event is left, its start in *ts */
static inline int cursor_peek(Cursor *c, int64_t *ts) {
    if (c->ri == c->rn && !cursor_fill(c)) return 0;
    *ts = c->run_ts;
    return 1;
}

int64_t profkit_gap_exclusive(const int64_t *ts_a, const int64_t *end_a, const int32_t *name_a, int64_t na,
                              const int64_t *ts_b, const int64_t *end_b, const int32_t *name_b, int64_t nb,
                              const int64_t *g0, const int64_t *g1, int64_t m, int32_t top,
                              int32_t *out_name, int64_t *out_ns) {
    int64_t n = na + nb;
    Cursor c = {{ts_a, ts_b}, {end_a, end_b}, {name_a, name_b}, {na, nb}, {0, 0}, NULL, 0, 0, 64, 0, 0};
    c.run = malloc((size_t)c.rcap * sizeof(Ev));
    int64_t *st_end = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    int32_t *st_name = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int64_t acap = 64, an = 0;
    Acc *acc = malloc((size_t)acap * sizeof(Acc));
    if (!st_end || !st_name || !acc || !c.run) { free(st_end); free(st_name); free(acc); free(c.run); return -1; }
    int64_t sp = 0, nt = 0;
#define PUSH() do { Ev *e_ = &c.run[c.ri++]; \
        while (sp > 0 && st_end[sp - 1] <= nt) sp--; \
        st_end[sp] = e_->end; st_name[sp] = e_->name; sp++; } while (0)
    for (int64_t j = 0; j < m; j++) {
        int64_t a = g0[j], b = g1[j];
        /* the events that start at or before the gap's start: pushed (ended tops popped first) */
        while (cursor_peek(&c, &nt) && nt <= a) PUSH();
        an = 0;
        int64_t t = a;
        for (;;) {
            int has = cursor_peek(&c, &nt);
            int64_t next = (has && nt < b) ? nt : b;
            while (t < next) {
                while (sp > 0 && st_end[sp - 1] <= t) sp--;
                if (sp == 0) { t = next; break; }
                int64_t e = st_end[sp - 1] < next ? st_end[sp - 1] : next;
                acc_add(&acc, &an, &acap, st_name[sp - 1], e - t);
                t = e;
            }
            if (next == b) break;
            PUSH();
        }
        for (int32_t r = 0; r < top; r++) {
            int64_t best = -1;
            for (int64_t i = 0; i < an; i++) {
                if (acc[i].ns <= 0) continue;
                if (best < 0 || acc[i].ns > acc[best].ns || (acc[i].ns == acc[best].ns && acc[i].name < acc[best].name)) best = i;
            }
            if (best < 0) { out_name[j * top + r] = -1; out_ns[j * top + r] = 0; continue; }
            out_name[j * top + r] = acc[best].name; out_ns[j * top + r] = acc[best].ns;
            acc[best].ns = -acc[best].ns - 1; /* taken */
        }
    }
#undef PUSH
    free(st_end); free(st_name); free(acc); free(c.run);
    return c.err;
}

/* ---------------------------------------------------------------- analysis: the span around points
 *
 * One thread's spans (ts, end), ordered by (ts, -end, row), and points ordered by ts. For each
 * point: the index of the innermost span holding it (span.ts <= t <= span.end; the latest such span
 * in that order), or -1. A span starting at a point's time holds it. Returns 0, or -1 when out of
 * memory. */
int64_t profkit_point_owner(const int64_t *ts, const int64_t *end, int64_t n, const int64_t *pt, int64_t m, int64_t *out) {
    int64_t *st = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!st) return -1;
    int64_t sp = 0, k = 0;
    for (int64_t j = 0; j < m; j++) {
        int64_t t = pt[j];
        while (k < n && ts[k] <= t) {
            while (sp > 0 && end[st[sp - 1]] < ts[k]) sp--;
            st[sp++] = k++;
        }
        /* the latest pushed span that has not ended before t (a span below an ended one is found
           by looking down: the stack holds every span pushed since its parent was popped) */
        int64_t got = -1;
        for (int64_t i = sp - 1; i >= 0; i--) if (end[st[i]] >= t) { got = st[i]; break; }
        while (sp > 0 && end[st[sp - 1]] < t) sp--;
        out[j] = got;
    }
    free(st);
    return 0;
}
