/* bandit._colparse: a conservative recognizer of block-log lines (schema v1, DESIGN.md) that
 * writes columns directly. The compiled fast path of bandit.logs.load_logs (bandit/fastload.py).
 *
 * It accepts exactly one spelling family: every line is one JSON object of schema v1 (JSON
 * whitespace anywhere, keys in any order, strict JSON numbers and strings, ints where ints
 * belong) whose checks all pass, holding exactly the drafters it was told to expect. Anything
 * else it does not fully understand (an unknown field, null/true/false, NaN/Infinity, a
 * duplicate key, an escaped key, a blank line, an int over 18 digits, invalid or surrogate
 * UTF-8, ...) makes `feed` return False: the caller then reads the file on a slower path,
 * which reports the error or loads the file. Whatever it accepts yields exactly what
 * Python's json module and bandit.logs' checks make of it:
 *   - floats are correctly rounded: Clinger's exact fast path (the digits an integer up to
 *     2**53, the power of ten within +-22: one IEEE multiply or divide of exact operands), else
 *     strtod_l in the C locale on the token text (glibc's is correctly rounded, as is Python's
 *     float());
 *   - an int where a float belongs converts as Python's float(int) does ("-0" is +0.0);
 *   - strings are returned raw (between the quotes) and decoded by Python's json module.
 * It is fed untrusted bytes: every read is bounds-checked against the end of the line.
 *
 * Parser(names: sequence of bytes, keep: sequence of bool)
 *   .feed(buffer) -> bool   parse every complete line; the unfinished last line is kept
 *   .finish() -> bool       parse the kept last line (a file without a final newline)
 *   .take() -> tuple        the records parsed since the last take, as bytes of native arrays:
 *       (n, pos int64, block int64 (-1 absent), target_ms float64 (NaN absent), code int32,
 *        new_pairs [(workload_raw, prompt_id_raw), ...], drafters)
 *       where code indexes every distinct raw (workload, prompt_id) pair of this parser, in
 *       order of first appearance (new_pairs: those first seen since the last take), and
 *       drafters[j] is None (keep[j] false: checked, not kept) or (accepted int64, len int64,
 *       expected_accepted float64, ms float64 (both NaN absent), conf float64 and entropy
 *       float64 laid end to end).
 *   .why, .lines            why it failed (a short text, for tests), lines parsed so far
 * The GIL is released while parsing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __FAST_MATH__
#error "bandit._colparse needs IEEE arithmetic: do not build it with -ffast-math"
#endif
/* The exact fast path needs double arithmetic rounded once (SSE2, not x87's extended precision). */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define EXACT_FAST_FLOATS 1
#else
#define EXACT_FAST_FLOATS 0
#endif

#if defined(__GLIBC__)
#define HAVE_STRTOD_L 1
static locale_t c_locale = (locale_t)0;
#else
#define HAVE_STRTOD_L 0
#endif

#define MAX_LINE ((size_t)1 << 28)   /* longer lines: not for this parser */
#define MAX_TOKEN 400                /* longer number tokens: not for this parser */
#define MAX_INT_DIGITS 18            /* every such int fits int64 */
#define MAX_DRAFTERS 4096

/* ------------------------------------------------------------------ growable byte vectors */

typedef struct {
    char *p;
    size_t n, cap;   /* bytes */
} Vec;

static int vec_reserve(Vec *v, size_t extra)
{
    if (extra <= v->cap - v->n)
        return 0;
    if (extra > SIZE_MAX / 4 - v->n)
        return -1;
    size_t cap = v->cap ? v->cap : 256;
    while (cap - v->n < extra) {
        if (cap > SIZE_MAX / 4)
            return -1;
        cap *= 2;
    }
    char *q = realloc(v->p, cap);
    if (!q)
        return -1;
    v->p = q;
    v->cap = cap;
    return 0;
}

static void vec_free(Vec *v)
{
    free(v->p);
    v->p = NULL;
    v->n = v->cap = 0;
}

#define VEC_AT(v, T, i) (((T *)(v).p)[i])

static inline int vec_push_double(Vec *v, double x)
{
    if (v->cap - v->n < sizeof(double) && vec_reserve(v, sizeof(double) * 64) < 0)
        return -1;
    memcpy(v->p + v->n, &x, sizeof x);
    v->n += sizeof x;
    return 0;
}

/* ------------------------------------------------------------------ the parser object */

typedef struct {
    size_t off, wlen, plen;   /* raw workload at arena[off], raw prompt_id right after it */
    uint64_t hash;
} Pair;

typedef struct {
    PyObject_HEAD
    int busy, dead;
    const char *why;
    Py_ssize_t lines;          /* lines parsed */
    int D;
    char **name;
    size_t *namelen;
    char *keep;
    Vec carry;                 /* the unfinished last line of the input so far */
    Py_ssize_t n;              /* records since the last take */
    Vec pos, block, tms, code;
    Vec *acc, *len, *ea, *ms, *conf, *ent;   /* D each */
    Vec arena, pairs;          /* distinct raw (workload, prompt_id) pairs */
    size_t *slots;             /* open addressing: pair index + 1, 0 = empty */
    size_t nslots, pairs_taken;
    int32_t last_code;
    unsigned char *seen;       /* D: drafters seen in the current record */
} Parser;

#define FAIL(msg) do { P->why = (msg); return NULL; } while (0)

static inline const char *skip_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

/* Length of one strictly valid UTF-8 multi-byte sequence at p (no overlongs, no surrogates,
 * at most U+10FFFF), else 0. */
static inline int utf8_seq(const unsigned char *p, const unsigned char *e)
{
    unsigned char c = p[0];
    ptrdiff_t left = e - p;
#define CONT(i) (left > (i) && (p[i] & 0xC0) == 0x80)
    if (c >= 0xC2 && c <= 0xDF)
        return CONT(1) ? 2 : 0;
    if (c == 0xE0)
        return (left > 1 && p[1] >= 0xA0 && p[1] <= 0xBF && CONT(2)) ? 3 : 0;
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        return (CONT(1) && CONT(2)) ? 3 : 0;
    if (c == 0xED)  /* U+D000..U+D7FF only: encoded surrogates are refused */
        return (left > 1 && p[1] >= 0x80 && p[1] <= 0x9F && CONT(2)) ? 3 : 0;
    if (c == 0xF0)
        return (left > 1 && p[1] >= 0x90 && p[1] <= 0xBF && CONT(2) && CONT(3)) ? 4 : 0;
    if (c >= 0xF1 && c <= 0xF3)
        return (CONT(1) && CONT(2) && CONT(3)) ? 4 : 0;
    if (c == 0xF4)
        return (left > 1 && p[1] >= 0x80 && p[1] <= 0x8F && CONT(2) && CONT(3)) ? 4 : 0;
    return 0;
#undef CONT
}

static inline int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Eight bytes at a time where the bytes are little-endian in a uint64 (the first byte lowest). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && defined(__GNUC__)
#define SWAR 1
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

static inline uint64_t load8(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Non-zero in (at least) the byte of the first non-digit of v; bytes after it may be wrong. */
static inline uint64_t non_digits(uint64_t v)
{
    return ((v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL) |
           (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL);
}

/* The value of eight ASCII digits, the first one most significant */
static inline uint64_t eight_digits(uint64_t v)
{
    const uint64_t mask = 0x000000FF000000FFULL, mul1 = 0x000F424000000064ULL, mul2 = 0x0000271000000001ULL;
    v -= 0x3030303030303030ULL;
    v = (v * 10) + (v >> 8);
    return (((v & mask) * mul1) + (((v >> 16) & mask) * mul2)) >> 32;
}

/* Bit 7 set in the byte of the first '"', '\\', control character or non-ASCII byte of v (and
 * maybe in later bytes: only the lowest flag is exact). */
static inline uint64_t string_specials(uint64_t v)
{
    uint64_t q = v ^ (ONES * '"'), b = v ^ (ONES * '\\');
    return (((q - ONES) & ~q) | ((b - ONES) & ~b) | ((v - ONES * 0x20) & ~v) | v) & HIGHS;
}
#else
#define SWAR 0
#endif

static const uint64_t U10[20] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
                                 100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL,
                                 1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
                                 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
                                 1000000000000000000ULL, 10000000000000000000ULL};

/* A run of ASCII digits at p: returns its end; *val its value when the run has at most 19 digits
 * (else *val is meaningless). */
static inline const char *digit_run(const char *p, const char *e, uint64_t *val)
{
    uint64_t m = 0;
#if SWAR
    while (e - p >= 8) {
        uint64_t v = load8(p), bad = non_digits(v);
        if (!bad) {
            m = m * 100000000ULL + eight_digits(v);
            p += 8;
            continue;
        }
        int k = __builtin_ctzll(bad) >> 3;
        if (k) {
            uint64_t w = (v << (8 * (8 - k))) | (0x3030303030303030ULL >> (8 * k));
            m = m * U10[k] + eight_digits(w);
            p += k;
        }
        *val = m;
        return p;
    }
#endif
    while (p < e && *p >= '0' && *p <= '9') {
        m = m * 10 + (uint64_t)(*p - '0');
        p++;
    }
    *val = m;
    return p;
}

/* A JSON string at p (which holds '"'): its raw content [*s, *s + *n) and whether it holds an
 * escape. Returns the position after the closing quote, or NULL. */
static const char *scan_string(Parser *P, const char *p, const char *e, const char **s, size_t *n, int *esc)
{
    const unsigned char *q = (const unsigned char *)p + 1, *ue = (const unsigned char *)e;
    const unsigned char *start = q;
    int escaped = 0;
    for (;;) {
#if SWAR
        while (ue - q >= 8) {
            uint64_t sp = string_specials(load8((const char *)q));
            if (sp) {
                q += __builtin_ctzll(sp) >> 3;
                break;
            }
            q += 8;
        }
#endif
        while (q < ue && *q >= 0x20 && *q < 0x80 && *q != '"' && *q != '\\')
            q++;
        if (q >= ue)
            FAIL("unterminated string");
        unsigned char c = *q;
        if (c == '"')
            break;
        if (c == '\\') {
            escaped = 1;
            if (ue - q < 2)
                FAIL("unterminated string");
            unsigned char x = q[1];
            if (x == 'u') {
                if (ue - q < 6 || !is_hex(q[2]) || !is_hex(q[3]) || !is_hex(q[4]) || !is_hex(q[5]))
                    FAIL("bad \\u escape");
                q += 6;
            } else if (x == '"' || x == '\\' || x == '/' || x == 'b' || x == 'f' || x == 'n' || x == 'r' || x == 't') {
                q += 2;
            } else {
                FAIL("bad escape");
            }
            continue;
        }
        if (c < 0x20)
            FAIL("control character in a string");
        int k = utf8_seq(q, ue);
        if (!k)
            FAIL("invalid or surrogate UTF-8 in a string");
        q += k;
    }
    *s = (const char *)start;
    *n = (size_t)(q - start);
    *esc = escaped;
    return (const char *)q + 1;
}

/* A key: a string without escapes, then ':' */
static inline const char *scan_key(Parser *P, const char *p, const char *e, const char **s, size_t *n)
{
    int esc;
    if (p >= e || *p != '"')
        FAIL("expected a key");
#if SWAR
    if (e - p >= 17) {  /* a plain ASCII key of at most 15 bytes: its closing quote is the first special byte */
        const char *q = p + 1;
        uint64_t sp = string_specials(load8(q));
        if (!sp) {
            q += 8;
            sp = string_specials(load8(q));
        }
        if (sp) {
            q += __builtin_ctzll(sp) >> 3;
            if (*q == '"') {
                *s = p + 1;
                *n = (size_t)(q - p - 1);
                p = q + 1;
                if (p < e && *p == ':')
                    return skip_ws(p + 1, e);
                goto colon;
            }
        }
    }
#endif
    p = scan_string(P, p, e, s, n, &esc);
    if (!p)
        return NULL;
    if (esc)
        FAIL("escaped key");
#if SWAR
colon:
#endif
    p = skip_ws(p, e);
    if (p >= e || *p != ':')
        FAIL("expected ':'");
    return skip_ws(p + 1, e);
}

typedef struct {
    int is_int;      /* no fraction, no exponent */
    int small;       /* an int of at most MAX_INT_DIGITS digits: `i` holds it */
    int64_t i;
    double d;        /* the value as Python's float() / float(int) gives it (finite) */
} Num;

static const double P10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A strict JSON number at p: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? . With `want_double`
 * also its float value (else only ints are wanted and a float token fails). NULL on failure,
 * including a float that is not finite and an int too long for `small` where a double is wanted. */
static const char *scan_number(Parser *P, const char *p, const char *e, Num *x, int want_double)
{
    const char *s = p, *q;
    int neg = 0;
    uint64_t ip = 0, fp = 0;
    size_t ilen, flen = 0;
    int64_t ex = 0;
    if (p < e && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= e)
        FAIL("bad number");
    if (*p == '0') {
        p++;
        ilen = 1;
    } else if (*p >= '1' && *p <= '9') {
        q = digit_run(p, e, &ip);
        ilen = (size_t)(q - p);
        p = q;
    } else {
        FAIL("bad number");
    }
    x->is_int = 1;
    if (p < e && *p == '.') {
        x->is_int = 0;
        q = digit_run(p + 1, e, &fp);
        flen = (size_t)(q - p - 1);
        if (!flen)
            FAIL("bad number");
        p = q;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        x->is_int = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        if (p >= e || *p < '0' || *p > '9')
            FAIL("bad number");
        while (p < e && *p >= '0' && *p <= '9') {
            if (ex < 1000000000)
                ex = ex * 10 + (*p - '0');
            p++;
        }
        if (eneg)
            ex = -ex;
    }
    if (x->is_int) {
        x->small = ilen <= MAX_INT_DIGITS;
        x->i = x->small ? (neg ? -(int64_t)ip : (int64_t)ip) : 0;
        if (!want_double)
            return p;
        if (!x->small)
            FAIL("int too long");
        x->d = (double)x->i;   /* Python's float(int): correctly rounded, and -0 is +0.0 */
        return p;
    }
    if (!want_double)
        FAIL("float where an int belongs");
    /* the digits as one integer m and a power of ten, when they fit 19 digits */
    int64_t e10 = ex - (int64_t)flen;
    double v;
    if (ilen + flen <= 19) {
        uint64_t m = ip * U10[flen] + fp;   /* < 10**19: no overflow */
        if (m == 0) {
            x->d = neg ? -0.0 : 0.0;
            return p;
        }
        /* Clinger: m and 10**|e10| exact doubles, so one IEEE operation rounds correctly */
        if (EXACT_FAST_FLOATS && m <= ((uint64_t)1 << 53) && e10 >= -22 && e10 <= 22) {
            v = e10 < 0 ? (double)m / P10[-e10] : (double)m * P10[e10];
            x->d = neg ? -v : v;
            return p;
        }
    }
    {
        char buf[MAX_TOKEN + 1], *end;
        size_t n = (size_t)(p - s);
        if (n > MAX_TOKEN)
            FAIL("number token too long");
        memcpy(buf, s, n);
        buf[n] = 0;
#if HAVE_STRTOD_L
        if (c_locale == (locale_t)0)
            FAIL("no C locale for strtod_l");
        v = strtod_l(buf, &end, c_locale);
#else
        v = strtod(buf, &end);   /* begin() checked that the locale's decimal point is '.' */
#endif
        if (end != buf + n)
            FAIL("strtod did not read the whole number");
        if (!isfinite(v))
            FAIL("number not finite");
        x->d = v;   /* its sign included */
        return p;
    }
}

/* the next ',' (then more follows) or the closer; *more says which */
static inline const char *next_item(Parser *P, const char *p, const char *e, char closer, int *more)
{
    p = skip_ws(p, e);
    if (p < e && *p == ',') {
        *more = 1;
        return skip_ws(p + 1, e);
    }
    if (p < e && *p == closer) {
        *more = 0;
        return p + 1;
    }
    FAIL("expected ',' or a closing bracket");
}

#define KEY_IS(lit) (kn == sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)

#if SWAR && EXACT_FAST_FLOATS
/* The common spelling of a small non-negative float, one integer digit, '.', 1 to 7 fraction
 * digits and no exponent (0.7224, 1.15): its end and *v, as scan_number would give them, and
 * *over_one whether it exceeds 1 (decided on the digits: then no branch waits for the division);
 * or NULL for anything else, which scan_number then reads. */
static inline const char *quick_decimal(const char *p, const char *e, double *v, int *over_one)
{
    if (e - p < 10)
        return NULL;
    unsigned d0 = (unsigned)((unsigned char)p[0] - '0');
    if (d0 > 9 || p[1] != '.')
        return NULL;
    uint64_t w = load8(p + 2), bad = non_digits(w);
    if (!bad)
        return NULL;
    int k = __builtin_ctzll(bad) >> 3;
    if (k == 0 || p[2 + k] == 'e' || p[2 + k] == 'E')
        return NULL;
    uint64_t m = d0 * U10[k] + eight_digits((w << (8 * (8 - k))) | (0x3030303030303030ULL >> (8 * k)));
    *v = m ? (double)m / P10[k] : 0.0;   /* m < 10**8 and 10**k exact: one correctly rounded division */
    *over_one = m > U10[k];                /* then m / 10**k >= 1 + 10**-7: never rounds to 1.0 */
    return p + 2 + k;
}

/* The common spelling of an int, 1 to 7 digits without sign or leading zero: its end, or NULL. */
static inline const char *quick_int(const char *p, const char *e)
{
    if (e - p < 9)
        return NULL;
    uint64_t bad = non_digits(load8(p));
    if (!bad)
        return NULL;
    int k = __builtin_ctzll(bad) >> 3;
    if (k == 0 || (k > 1 && p[0] == '0') || p[k] == '.' || p[k] == 'e' || p[k] == 'E')
        return NULL;
    return p + k;
}
#endif

/* A list of numbers >= 0 (and <= 1 with `unit`) into `out` (when given); *count its length. */
static const char *scan_floats(Parser *P, const char *p, const char *e, Vec *out, int unit, size_t *count)
{
    size_t c = 0;
    int more = 1;
    if (p >= e || *p != '[')
        FAIL("expected a list");
    p = skip_ws(p + 1, e);
    if (p < e && *p == ']') {
        *count = 0;
        return p + 1;
    }
    while (more) {
        double v;
        const char *q = NULL;
        int over_one;
#if SWAR && EXACT_FAST_FLOATS
        q = quick_decimal(p, e, &v, &over_one);
#endif
        if (q) {
            p = q;
            if (unit && over_one)
                FAIL("value out of range");
        } else {
            Num x;
            p = scan_number(P, p, e, &x, 1);
            if (!p)
                return NULL;
            v = x.d;
            if (!(v >= 0.0 && (!unit || v <= 1.0)))
                FAIL("value out of range");
        }
        if (out && vec_push_double(out, v) < 0)
            FAIL("out of memory");
        c++;
        if (p < e && *p == ',') {  /* the usual case, without whitespace */
            p = skip_ws(p + 1, e);
            continue;
        }
        p = next_item(P, p, e, ']', &more);
        if (!p)
            return NULL;
    }
    *count = c;
    return p;
}

static const char *scan_ints(Parser *P, const char *p, const char *e, size_t *count)
{
    size_t c = 0;
    int more = 1;
    if (p >= e || *p != '[')
        FAIL("expected a list");
    p = skip_ws(p + 1, e);
    if (p < e && *p == ']') {
        *count = 0;
        return p + 1;
    }
    while (more) {
        const char *q = NULL;
#if SWAR && EXACT_FAST_FLOATS
        q = quick_int(p, e);
#endif
        if (q) {
            p = q;
        } else {
            Num x;
            p = scan_number(P, p, e, &x, 0);
            if (!p)
                return NULL;
            if (!x.small)
                FAIL("int too long");
        }
        c++;
        if (p < e && *p == ',') {
            p = skip_ws(p + 1, e);
            continue;
        }
        p = next_item(P, p, e, ']', &more);
        if (!p)
            return NULL;
    }
    *count = c;
    return p;
}

/* An int >= 0 of at most MAX_INT_DIGITS digits ("-0" is 0, as in Python) */
static const char *scan_count(Parser *P, const char *p, const char *e, int64_t *v)
{
    Num x;
    p = scan_number(P, p, e, &x, 0);
    if (!p)
        return NULL;
    if (!x.small || x.i < 0)
        FAIL("expected an int >= 0");
    *v = x.i;
    return p;
}

/* A finite number >= 0 (an int converts as float(int) does) */
static const char *scan_nonneg(Parser *P, const char *p, const char *e, double *v)
{
    Num x;
    p = scan_number(P, p, e, &x, 1);
    if (!p)
        return NULL;
    if (!(x.d >= 0.0))
        FAIL("expected a number >= 0");
    *v = x.d;
    return p;
}

enum { F_TOKENS = 1, F_ACCEPTED = 2, F_CONF = 4, F_ENTROPY = 8, F_EXPECTED = 16, F_MS = 32 };

/* One draft record, drafter j, into row n of its columns. */
static const char *scan_draft(Parser *P, const char *p, const char *e, int j, Py_ssize_t n)
{
    unsigned seen = 0;
    size_t ntok = 0, nconf = 0, nent = 0;
    int64_t acc = 0;
    double ea = NAN, ms = NAN;
    int more = 1, keep = P->keep[j];
    if (p >= e || *p != '{')
        FAIL("a draft is not an object");
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}')
        FAIL("empty draft");
    while (more) {
        const char *k;
        size_t kn;
        unsigned bit;
        p = scan_key(P, p, e, &k, &kn);
        if (!p)
            return NULL;
        if (KEY_IS("tokens")) {
            bit = F_TOKENS;
            p = scan_ints(P, p, e, &ntok);
        } else if (KEY_IS("conf")) {
            bit = F_CONF;
            p = scan_floats(P, p, e, keep ? &P->conf[j] : NULL, 1, &nconf);
        } else if (KEY_IS("entropy")) {
            bit = F_ENTROPY;
            p = scan_floats(P, p, e, keep ? &P->ent[j] : NULL, 0, &nent);
        } else if (KEY_IS("accepted")) {
            bit = F_ACCEPTED;
            p = scan_count(P, p, e, &acc);
        } else if (KEY_IS("expected_accepted")) {
            bit = F_EXPECTED;
            p = scan_nonneg(P, p, e, &ea);
        } else if (KEY_IS("ms")) {
            bit = F_MS;
            p = scan_nonneg(P, p, e, &ms);
        } else {
            FAIL("unknown field in a draft");
        }
        if (!p)
            return NULL;
        if (seen & bit)
            FAIL("duplicate key in a draft");
        seen |= bit;
        p = next_item(P, p, e, '}', &more);
        if (!p)
            return NULL;
    }
    if ((seen & (F_TOKENS | F_ACCEPTED | F_CONF | F_ENTROPY)) != (F_TOKENS | F_ACCEPTED | F_CONF | F_ENTROPY))
        FAIL("a draft field is missing");
    if (nconf != ntok || nent != ntok)
        FAIL("conf/entropy lengths differ from tokens");
    if ((uint64_t)acc > (uint64_t)ntok)
        FAIL("accepted > len(tokens)");
    if ((seen & F_EXPECTED) && ea > (double)(int64_t)ntok + 1e-9)   /* as numpy: L + 1e-9 in float64 */
        FAIL("expected_accepted > len(tokens)");
    if (keep) {
        VEC_AT(P->acc[j], int64_t, n) = acc;
        VEC_AT(P->len[j], int64_t, n) = (int64_t)ntok;
        VEC_AT(P->ea[j], double, n) = ea;
        VEC_AT(P->ms[j], double, n) = ms;
    }
    return p;
}

static const char *scan_drafts(Parser *P, const char *p, const char *e, Py_ssize_t n)
{
    int more = 1;
    if (p >= e || *p != '{')
        FAIL("drafts is not an object");
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}')
        FAIL("no drafters");
    while (more) {
        const char *k;
        size_t kn;
        int j;
        p = scan_key(P, p, e, &k, &kn);
        if (!p)
            return NULL;
        for (j = 0; j < P->D; j++)
            if (P->namelen[j] == kn && memcmp(P->name[j], k, kn) == 0)
                break;
        if (j == P->D)
            FAIL("a drafter not expected");
        if (P->seen[j])
            FAIL("duplicate drafter");
        P->seen[j] = 1;
        p = scan_draft(P, p, e, j, n);
        if (!p)
            return NULL;
        p = next_item(P, p, e, '}', &more);
        if (!p)
            return NULL;
    }
    return p;
}

static uint64_t fnv(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int pair_rehash(Parser *P)
{
    size_t ns = P->nslots ? P->nslots * 2 : 1024;
    size_t *slots = calloc(ns, sizeof *slots);
    if (!slots)
        return -1;
    size_t np = P->pairs.n / sizeof(Pair);
    for (size_t i = 0; i < np; i++) {
        size_t s = (size_t)VEC_AT(P->pairs, Pair, i).hash & (ns - 1);
        while (slots[s])
            s = (s + 1) & (ns - 1);
        slots[s] = i + 1;
    }
    free(P->slots);
    P->slots = slots;
    P->nslots = ns;
    return 0;
}

/* The code of a raw (workload, prompt_id) pair, added when new; -1 on failure */
static int64_t pair_code(Parser *P, const char *w, size_t wn, const char *pid, size_t pn)
{
    if (P->last_code >= 0) {
        Pair *q = &VEC_AT(P->pairs, Pair, P->last_code);
        if (q->wlen == wn && q->plen == pn && memcmp(P->arena.p + q->off, w, wn) == 0 &&
            memcmp(P->arena.p + q->off + wn, pid, pn) == 0)
            return P->last_code;
    }
    uint64_t h = fnv(pid, pn, fnv(w, wn, 1469598103934665603ULL) ^ 0xff);
    size_t np = P->pairs.n / sizeof(Pair);
    if ((np + 1) * 2 > P->nslots && pair_rehash(P) < 0)
        return -1;
    size_t s = (size_t)h & (P->nslots - 1);
    while (P->slots[s]) {
        size_t i = P->slots[s] - 1;
        Pair *q = &VEC_AT(P->pairs, Pair, i);
        if (q->hash == h && q->wlen == wn && q->plen == pn && memcmp(P->arena.p + q->off, w, wn) == 0 &&
            memcmp(P->arena.p + q->off + wn, pid, pn) == 0) {
            P->last_code = (int32_t)i;
            return (int64_t)i;
        }
        s = (s + 1) & (P->nslots - 1);
    }
    if (np >= INT32_MAX || vec_reserve(&P->arena, wn + pn) < 0 || vec_reserve(&P->pairs, sizeof(Pair)) < 0)
        return -1;
    Pair q = {P->arena.n, wn, pn, h};
    memcpy(P->arena.p + P->arena.n, w, wn);
    memcpy(P->arena.p + P->arena.n + wn, pid, pn);
    P->arena.n += wn + pn;
    memcpy(P->pairs.p + P->pairs.n, &q, sizeof q);
    P->pairs.n += sizeof q;
    P->slots[s] = np + 1;
    P->last_code = (int32_t)np;
    return (int64_t)np;
}

enum { T_V = 1, T_WORKLOAD = 2, T_PROMPT = 4, T_POS = 8, T_BLOCK = 16, T_DRAFTS = 32, T_TARGET = 64 };

/* Room for row n in every per-record column */
static int reserve_row(Parser *P)
{
    if (vec_reserve(&P->pos, 8) < 0 || vec_reserve(&P->block, 8) < 0 || vec_reserve(&P->tms, 8) < 0 ||
        vec_reserve(&P->code, 4) < 0)
        return -1;
    for (int j = 0; j < P->D; j++)
        if (P->keep[j] && (vec_reserve(&P->acc[j], 8) < 0 || vec_reserve(&P->len[j], 8) < 0 ||
                           vec_reserve(&P->ea[j], 8) < 0 || vec_reserve(&P->ms[j], 8) < 0))
            return -1;
    return 0;
}

/* One line [p, e) (its newline excluded): one record. Returns non-NULL on success. */
static const char *parse_line(Parser *P, const char *p, const char *e)
{
    unsigned seen = 0;
    int more = 1;
    const char *w = NULL, *pid = NULL;
    size_t wn = 0, pn = 0;
    int64_t pos = 0, block = -1;
    double tms = NAN;
    Py_ssize_t n = P->n;
    if ((size_t)(e - p) > MAX_LINE)
        FAIL("line too long");
    if (reserve_row(P) < 0)
        FAIL("out of memory");
    memset(P->seen, 0, (size_t)P->D);
    p = skip_ws(p, e);
    if (p >= e || *p != '{')
        FAIL("a line is not an object (or is blank)");
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}')
        FAIL("empty object");
    while (more) {
        const char *k;
        size_t kn;
        unsigned bit;
        p = scan_key(P, p, e, &k, &kn);
        if (!p)
            return NULL;
        if (KEY_IS("drafts")) {
            bit = T_DRAFTS;
            if (seen & bit)
                FAIL("duplicate key");
            p = scan_drafts(P, p, e, n);
        } else if (KEY_IS("v")) {
            Num x;
            bit = T_V;
            p = scan_number(P, p, e, &x, 0);
            if (p && !(x.small && x.i == 1))
                FAIL("unknown schema version");
        } else if (KEY_IS("workload") || KEY_IS("prompt_id")) {
            const char *s;
            size_t sn;
            int esc;
            bit = kn == 8 ? T_WORKLOAD : T_PROMPT;
            if (p >= e || *p != '"')
                FAIL("expected a string");
            p = scan_string(P, p, e, &s, &sn, &esc);
            if (!p)
                return NULL;
            if (sn == 0)
                FAIL("empty string");
            if (bit == T_WORKLOAD)
                w = s, wn = sn;
            else
                pid = s, pn = sn;
        } else if (KEY_IS("pos")) {
            bit = T_POS;
            p = scan_count(P, p, e, &pos);
        } else if (KEY_IS("block")) {
            bit = T_BLOCK;
            p = scan_count(P, p, e, &block);
            /* the exact path carries block through float64: larger values would round there */
            if (p && block > ((int64_t)1 << 53))
                FAIL("block beyond 2**53");
        } else if (KEY_IS("target_ms")) {
            bit = T_TARGET;
            p = scan_nonneg(P, p, e, &tms);
        } else {
            FAIL("unknown field");
        }
        if (!p)
            return NULL;
        if (seen & bit)
            FAIL("duplicate key");
        seen |= bit;
        p = next_item(P, p, e, '}', &more);
        if (!p)
            return NULL;
    }
    if (skip_ws(p, e) != e)
        FAIL("more than one object on a line");
    if ((seen & (T_V | T_WORKLOAD | T_PROMPT | T_POS | T_DRAFTS)) != (T_V | T_WORKLOAD | T_PROMPT | T_POS | T_DRAFTS))
        FAIL("a field is missing");
    for (int j = 0; j < P->D; j++)
        if (!P->seen[j])
            FAIL("an expected drafter is missing");
    int64_t c = pair_code(P, w, wn, pid, pn);
    if (c < 0)
        FAIL("out of memory");
    VEC_AT(P->pos, int64_t, n) = pos;
    VEC_AT(P->block, int64_t, n) = block;
    VEC_AT(P->tms, double, n) = tms;
    VEC_AT(P->code, int32_t, n) = (int32_t)c;
    P->n = n + 1;
    P->pos.n += 8;
    P->block.n += 8;
    P->tms.n += 8;
    P->code.n += 4;
    for (int j = 0; j < P->D; j++)
        if (P->keep[j]) {
            P->acc[j].n += 8;
            P->len[j].n += 8;
            P->ea[j].n += 8;
            P->ms[j].n += 8;
        }
    return p;
}

/* Every complete line of [p, e); the rest goes to carry. 0 ok, -1 failed (P->why). No GIL. */
static int parse_buffer(Parser *P, const char *p, const char *e)
{
    if (P->carry.n) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        size_t take = (size_t)((nl ? nl : e) - p);
        if (P->carry.n + take > MAX_LINE) {
            P->why = "line too long";
            return -1;
        }
        if (vec_reserve(&P->carry, take) < 0) {
            P->why = "out of memory";
            return -1;
        }
        memcpy(P->carry.p + P->carry.n, p, take);
        P->carry.n += take;
        if (!nl)
            return 0;
        P->lines++;
        if (!parse_line(P, P->carry.p, P->carry.p + P->carry.n))
            return -1;
        P->carry.n = 0;
        p = nl + 1;
    }
    while (p < e) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        if (!nl) {
            size_t rest = (size_t)(e - p);
            if (rest > MAX_LINE) {
                P->why = "line too long";
                return -1;
            }
            if (vec_reserve(&P->carry, rest) < 0) {
                P->why = "out of memory";
                return -1;
            }
            memcpy(P->carry.p, p, rest);
            P->carry.n = rest;
            return 0;
        }
        P->lines++;
        if (!parse_line(P, p, nl))
            return -1;
        p = nl + 1;
    }
    return 0;
}

static int begin(Parser *P)
{
    if (P->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Parser is in use by another thread");
        return -1;
    }
    if (P->D < 1) {
        PyErr_SetString(PyExc_RuntimeError, "Parser not initialised");
        return -1;
    }
#if !HAVE_STRTOD_L
    {
        struct lconv *lc = localeconv();
        if (!lc || strcmp(lc->decimal_point, ".") != 0) {
            P->dead = 1;
            P->why = "the locale's decimal point is not '.'";
        }
    }
#endif
    P->busy = 1;
    return 0;
}

static PyObject *Parser_feed(Parser *P, PyObject *arg)
{
    Py_buffer view;
    int rc;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (begin(P) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (P->dead) {
        P->busy = 0;
        PyBuffer_Release(&view);
        Py_RETURN_FALSE;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = parse_buffer(P, (const char *)view.buf, (const char *)view.buf + view.len);
    Py_END_ALLOW_THREADS
    P->busy = 0;
    PyBuffer_Release(&view);
    if (rc < 0) {
        P->dead = 1;
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyObject *Parser_finish(Parser *P, PyObject *Py_UNUSED(ignored))
{
    const char *ok = "";
    if (begin(P) < 0)
        return NULL;
    if (!P->dead && P->carry.n) {
        Py_BEGIN_ALLOW_THREADS
        P->lines++;
        ok = parse_line(P, P->carry.p, P->carry.p + P->carry.n);
        P->carry.n = 0;
        Py_END_ALLOW_THREADS
        if (!ok)
            P->dead = 1;
    }
    P->busy = 0;
    return PyBool_FromLong(!P->dead);
}

static PyObject *vec_bytes(Vec *v)
{
    return PyBytes_FromStringAndSize(v->p ? v->p : "", (Py_ssize_t)v->n);
}

static PyObject *Parser_take(Parser *P, PyObject *Py_UNUSED(ignored))
{
    PyObject *pairs = NULL, *drafters = NULL, *out = NULL;
    if (P->dead) {
        PyErr_SetString(PyExc_RuntimeError, "Parser failed: nothing to take");
        return NULL;
    }
    if (begin(P) < 0)
        return NULL;
    size_t np = P->pairs.n / sizeof(Pair);
    if (!(pairs = PyList_New(0)) || !(drafters = PyList_New(P->D)))
        goto done;
    for (size_t i = P->pairs_taken; i < np; i++) {
        Pair *q = &VEC_AT(P->pairs, Pair, i);
        PyObject *t = Py_BuildValue("(y#y#)", P->arena.p + q->off, (Py_ssize_t)q->wlen,
                                    P->arena.p + q->off + q->wlen, (Py_ssize_t)q->plen);
        if (!t || PyList_Append(pairs, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    for (int j = 0; j < P->D; j++) {
        PyObject *t;
        if (P->keep[j]) {
            t = Py_BuildValue("(NNNNNN)", vec_bytes(&P->acc[j]), vec_bytes(&P->len[j]), vec_bytes(&P->ea[j]),
                              vec_bytes(&P->ms[j]), vec_bytes(&P->conf[j]), vec_bytes(&P->ent[j]));
            if (!t)
                goto done;
        } else {
            t = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(drafters, j, t);
    }
    out = Py_BuildValue("(nNNNNOO)", P->n, vec_bytes(&P->pos), vec_bytes(&P->block), vec_bytes(&P->tms),
                        vec_bytes(&P->code), pairs, drafters);
    if (!out)
        goto done;
    P->pairs_taken = np;
    P->n = 0;
    P->pos.n = P->block.n = P->tms.n = P->code.n = 0;
    for (int j = 0; j < P->D; j++)
        P->acc[j].n = P->len[j].n = P->ea[j].n = P->ms[j].n = P->conf[j].n = P->ent[j].n = 0;
done:
    Py_XDECREF(pairs);
    Py_XDECREF(drafters);
    P->busy = 0;
    return out;
}

static void Parser_clear_all(Parser *P)
{
    if (P->name)
        for (int j = 0; j < P->D; j++)
            free(P->name[j]);
    free(P->name);
    free(P->namelen);
    free(P->keep);
    free(P->seen);
    Vec *arrays[] = {P->acc, P->len, P->ea, P->ms, P->conf, P->ent};
    for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++) {
        if (arrays[a])
            for (int j = 0; j < P->D; j++)
                vec_free(&arrays[a][j]);
        free(arrays[a]);
    }
    vec_free(&P->carry);
    vec_free(&P->pos);
    vec_free(&P->block);
    vec_free(&P->tms);
    vec_free(&P->code);
    vec_free(&P->arena);
    vec_free(&P->pairs);
    free(P->slots);
    P->name = NULL;
    P->namelen = NULL;
    P->keep = NULL;
    P->seen = NULL;
    P->acc = P->len = P->ea = P->ms = P->conf = P->ent = NULL;
    P->slots = NULL;
    P->D = 0;
}

static void Parser_dealloc(Parser *P)
{
    Parser_clear_all(P);
    Py_TYPE(P)->tp_free((PyObject *)P);
}

static int Parser_init(Parser *P, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"names", "keep", NULL};
    PyObject *names, *keep, *ns = NULL, *ks = NULL;
    int rc = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &names, &keep))
        return -1;
    if (P->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Parser is in use");
        return -1;
    }
    Parser_clear_all(P);
    P->dead = 0;
    P->why = NULL;
    P->lines = 0;
    P->n = 0;
    P->nslots = P->pairs_taken = 0;
    P->last_code = -1;
    if (!(ns = PySequence_Fast(names, "names must be a sequence")) || !(ks = PySequence_Fast(keep, "keep must be a sequence")))
        goto done;
    Py_ssize_t D = PySequence_Fast_GET_SIZE(ns);
    if (D < 1 || D > MAX_DRAFTERS || PySequence_Fast_GET_SIZE(ks) != D) {
        PyErr_SetString(PyExc_ValueError, "names: 1 to 4096 drafter names, and keep as long");
        goto done;
    }
    size_t Dz = (size_t)D;
    P->name = calloc(Dz, sizeof *P->name);
    P->namelen = calloc(Dz, sizeof *P->namelen);
    P->keep = calloc(Dz, 1);
    P->seen = calloc(Dz, 1);
    P->acc = calloc(Dz, sizeof(Vec));
    P->len = calloc(Dz, sizeof(Vec));
    P->ea = calloc(Dz, sizeof(Vec));
    P->ms = calloc(Dz, sizeof(Vec));
    P->conf = calloc(Dz, sizeof(Vec));
    P->ent = calloc(Dz, sizeof(Vec));
    if (!P->name || !P->namelen || !P->keep || !P->seen || !P->acc || !P->len || !P->ea || !P->ms || !P->conf || !P->ent) {
        P->D = (int)D;
        PyErr_NoMemory();
        goto done;
    }
    P->D = (int)D;
    for (Py_ssize_t j = 0; j < D; j++) {
        char *s;
        Py_ssize_t sn;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(ns, j), &s, &sn) < 0)
            goto done;
        if (!(P->name[j] = malloc((size_t)sn + 1))) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(P->name[j], s, (size_t)sn + 1);
        P->namelen[j] = (size_t)sn;
        int k = PyObject_IsTrue(PySequence_Fast_GET_ITEM(ks, j));
        if (k < 0)
            goto done;
        P->keep[j] = (char)k;
    }
    rc = 0;
done:
    Py_XDECREF(ns);
    Py_XDECREF(ks);
    if (rc < 0)
        Parser_clear_all(P);
    return rc;
}

static PyObject *Parser_get_why(Parser *P, void *Py_UNUSED(c))
{
    if (!P->why)
        Py_RETURN_NONE;
    return PyUnicode_FromString(P->why);
}

static PyObject *Parser_get_lines(Parser *P, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(P->lines);
}

static PyMethodDef Parser_methods[] = {
    {"feed", (PyCFunction)Parser_feed, METH_O, "Parse every complete line of a bytes-like chunk; False: not for this parser."},
    {"finish", (PyCFunction)Parser_finish, METH_NOARGS, "Parse the last line if it had no newline; False: not for this parser."},
    {"take", (PyCFunction)Parser_take, METH_NOARGS, "The columns parsed since the last take (see the module doc)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Parser_getset[] = {
    {"why", (getter)Parser_get_why, NULL, "why the parser refused its input (None while it has not)", NULL},
    {"lines", (getter)Parser_get_lines, NULL, "lines parsed so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ParserType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bandit._colparse.Parser",
    .tp_basicsize = sizeof(Parser),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A schema-v1 block-log line parser writing columns (see the module doc).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Parser_init,
    .tp_dealloc = (destructor)Parser_dealloc,
    .tp_methods = Parser_methods,
    .tp_getset = Parser_getset,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "bandit._colparse",
    "Conservative compiled parser of schema-v1 block logs into columns (see bandit/_colparse.c).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__colparse(void)
{
#if HAVE_STRTOD_L
    if (c_locale == (locale_t)0)
        c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
#endif
    if (PyType_Ready(&ParserType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&ParserType);
    if (PyModule_AddObject(m, "Parser", (PyObject *)&ParserType) < 0) {
        Py_DECREF(&ParserType);
        Py_DECREF(m);
        return NULL;
    }
    /* bandit/fastload.py uses the module only when this matches what it expects (a stale build
     * left from an older checkout is ignored rather than trusted) */
    if (PyModule_AddIntConstant(m, "API_VERSION", 1) < 0 ||
        PyModule_AddIntConstant(m, "EXACT_FAST_FLOATS", EXACT_FAST_FLOATS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
