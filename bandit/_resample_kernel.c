/* Optional compiled kernel for bandit/resample.py: one level's packed run sums in one pass.
 *
 * level_sums(capsule, D, need, L, k, cut, tables, parts)
 *
 *   capsule the bit generator's "BitGenerator" capsule (numpy's bitgen_t). The level's D x n words
 *           are read from ceil(D * n * bits / 64) outputs of its next_raw, the very function behind
 *           random_raw, each read little-endian (word q of an output: its bits q*bits .. q*bits +
 *           bits - 1), the rest of the last output discarded: the words, and the state left
 *           behind, are those of random_raw. The caller holds the bit generator's lock.
 *           Word j * n + i is the j-th word of the i-th live resample.
 *   D, need (n,) int64: resample i reads only its words j < need[i]; D = max(need)
 *   L       draws per run: word j of resample i adds into run j / L
 *   k, cut  the stratum's cluster count and acceptance bound cut = k * (2**bits // k) (a word w is
 *           accepted when w < cut); words are 16-bit when k <= 2**16, else 32-bit
 *   tables  tuple of uint64 tables, one per packed word. 16-bit words: 65536 entries, indexed by the
 *           word itself (rejected words find 0). 32-bit words: k + 1 entries, indexed by w % k for an
 *           accepted word and by k for a rejected one
 *   parts   tuple of uint64 run-sum arrays (at least ceil(D / L) * n entries, C-contiguous), one per
 *           table: parts[t][r * n + i] += tables[t][index(word j of resample i)] for every read word j
 *           of run r
 *
 * Exactly the numpy path's integer sums (uint64 addition, wrapping alike), in one pass per word
 * instead of generate, reject, cast, take and sum. Every argument is checked, and every index
 * bounded by the buffers' lengths, before the loop, which runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_TABLES 16

typedef struct {   /* numpy/random/bitgen.h */
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} bitgen_t;

static char
code(const Py_buffer *b)
{
    const char *f = b->format ? b->format : "B";
    const uint16_t one = 1;
    if (*f == '<' && *(const unsigned char *)&one != 1)   /* little-endian data on a big-endian machine */
        return '?';
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return strlen(f) == 1 ? *f : '?';
}

static int
item_ok(const Py_buffer *b, Py_ssize_t itemsize, const char *kinds, const char *what)
{
    char c = code(b);
    if (b->itemsize != itemsize || c == '?' || strchr(kinds, c) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: %s of %zd bytes required (got format '%s', itemsize %zd)", what,
                     strchr(kinds, 'q') ? "signed integers" : "unsigned integers", itemsize,
                     b->format ? b->format : "B", b->itemsize);
        return 0;
    }
    return 1;
}

static PyObject *
level_sums(PyObject *self, PyObject *args)
{
    PyObject *capsule, *need_obj, *tables_obj, *parts_obj;
    Py_ssize_t D, L;
    unsigned long long k, cut;
    Py_buffer nb = {0};
    Py_buffer tb[MAX_TABLES], pb[MAX_TABLES];
    Py_ssize_t nt = 0, got_t = 0, got_p = 0, t;
    PyObject *result = NULL;
    (void)self;

    if (!PyArg_ParseTuple(args, "OnOnKKOO", &capsule, &D, &need_obj, &L, &k, &cut, &tables_obj, &parts_obj))
        return NULL;
    bitgen_t *bg = (bitgen_t *)PyCapsule_GetPointer(capsule, "BitGenerator");
    if (bg == NULL)
        return NULL;
    if (bg->next_raw == NULL || bg->state == NULL) {
        PyErr_SetString(PyExc_ValueError, "bit generator without next_raw");
        return NULL;
    }
    if (!PyTuple_Check(tables_obj) || !PyTuple_Check(parts_obj)) {
        PyErr_SetString(PyExc_TypeError, "tables and parts must be tuples");
        return NULL;
    }
    nt = PyTuple_GET_SIZE(tables_obj);
    if (nt < 1 || nt > MAX_TABLES || PyTuple_GET_SIZE(parts_obj) != nt) {
        PyErr_SetString(PyExc_ValueError, "tables and parts: 1 to 16 of each, as many parts as tables");
        return NULL;
    }
    if (PyObject_GetBuffer(need_obj, &nb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    for (; got_t < nt; got_t++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(tables_obj, got_t), &tb[got_t], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
    for (; got_p < nt; got_p++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(parts_obj, got_p), &pb[got_p],
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
            goto done;
    if (!item_ok(&nb, 8, "ql", "need"))
        goto done;
    for (t = 0; t < nt; t++)
        if (!item_ok(&tb[t], 8, "QL", "tables") || !item_ok(&pb[t], 8, "QL", "parts"))
            goto done;

    const Py_ssize_t n = nb.len / 8;
    const int64_t *need = (const int64_t *)nb.buf;
    if (n < 1 || D < 0 || L < 1 || k < 1 || k > (1ULL << 32) - 1) {
        PyErr_SetString(PyExc_ValueError, "bad need, D, L or k");
        goto done;
    }
    const int wide = k > (1ULL << 16);
    const unsigned bits = wide ? 32 : 16;
    if (cut != (1ULL << bits) / k * k) {
        PyErr_SetString(PyExc_ValueError, "cut must be k * (2**bits // k)");
        goto done;
    }
    int64_t least = INT64_MAX, most = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (need[i] < least)
            least = need[i];
        if (need[i] > most)
            most = need[i];
    }
    if (least < 0 || most != D) {
        PyErr_SetString(PyExc_ValueError, "need must be >= 0, with max(need) == D");
        goto done;
    }
    if (D > PY_SSIZE_T_MAX / n) {
        PyErr_SetString(PyExc_OverflowError, "level too large");
        goto done;
    }
    const Py_ssize_t tlen = wide ? (Py_ssize_t)k + 1 : (Py_ssize_t)1 << 16;
    const Py_ssize_t runs = D ? (D - 1) / L + 1 : 0;
    for (t = 0; t < nt; t++) {
        if (tb[t].len / 8 != tlen) {
            PyErr_Format(PyExc_ValueError, "table %zd: %zd entries, %zd required", t, tb[t].len / 8, tlen);
            goto done;
        }
        if (pb[t].len / 8 < runs * n) {
            PyErr_Format(PyExc_ValueError, "parts %zd: %zd entries, %zd runs x %zd required", t, pb[t].len / 8, runs, n);
            goto done;
        }
    }

    {
        const uint64_t *tab[MAX_TABLES];
        uint64_t *par[MAX_TABLES];
        for (t = 0; t < nt; t++) {
            tab[t] = (const uint64_t *)tb[t].buf;
            par[t] = (uint64_t *)pb[t].buf;
        }
        uint64_t (*next_raw)(void *) = bg->next_raw;
        void *state = bg->state;
        const uint32_t k32 = (uint32_t)k;
        const uint64_t cut64 = cut;

        Py_BEGIN_ALLOW_THREADS
        if (!wide) {
            /* 16-bit words index the 65536-entry tables directly: every w < 65536 == tlen */
            uint64_t cur = 0;
            unsigned avail = 0;
            for (Py_ssize_t j = 0; j < D; j++) {
                const Py_ssize_t off = (j / L) * n;
                const int all = j < least;    /* every resample still reads row j */
                if (nt == 1 && all) {         /* the common case: one packed word, a full row */
                    const uint64_t *t0 = tab[0];
                    uint64_t *p0 = par[0] + off;
                    Py_ssize_t i = 0;
                    for (; i < n && avail; i++, avail--, cur >>= 16)   /* the rest of the last output */
                        p0[i] += t0[cur & 0xFFFF];
                    for (; i + 4 <= n; i += 4) {
                        const uint64_t r = next_raw(state);
                        p0[i] += t0[r & 0xFFFF];
                        p0[i + 1] += t0[(r >> 16) & 0xFFFF];
                        p0[i + 2] += t0[(r >> 32) & 0xFFFF];
                        p0[i + 3] += t0[r >> 48];
                    }
                    if (i < n) {
                        cur = next_raw(state);
                        avail = 4;
                        for (; i < n; i++, avail--, cur >>= 16)
                            p0[i] += t0[cur & 0xFFFF];
                    }
                    continue;
                }
                for (Py_ssize_t i = 0; i < n; i++) {
                    if (!avail) {
                        cur = next_raw(state);
                        avail = 4;
                    }
                    const uint64_t w = cur & 0xFFFF;
                    cur >>= 16;
                    avail--;
                    if (!all && j >= need[i])
                        continue;
                    for (Py_ssize_t q = 0; q < nt; q++)
                        par[q][off + i] += tab[q][w];
                }
            }
        } else {
            /* 32-bit words: the drawn cluster w % k < k, or k for a rejected word; both < tlen */
            uint64_t cur = 0;
            unsigned avail = 0;
            for (Py_ssize_t j = 0; j < D; j++) {
                const Py_ssize_t off = (j / L) * n;
                const int all = j < least;
                for (Py_ssize_t i = 0; i < n; i++) {
                    if (!avail) {
                        cur = next_raw(state);
                        avail = 2;
                    }
                    const uint64_t w = cur & 0xFFFFFFFFULL;
                    cur >>= 32;
                    avail--;
                    if (!all && j >= need[i])
                        continue;
                    const Py_ssize_t idx = w < cut64 ? (Py_ssize_t)((uint32_t)w % k32) : (Py_ssize_t)k32;
                    for (Py_ssize_t q = 0; q < nt; q++)
                        par[q][off + i] += tab[q][idx];
                }
            }
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_None;
    Py_INCREF(result);

done:
    for (t = 0; t < got_p; t++)
        PyBuffer_Release(&pb[t]);
    for (t = 0; t < got_t; t++)
        PyBuffer_Release(&tb[t]);
    if (nb.obj)
        PyBuffer_Release(&nb);
    return result;
}

static PyMethodDef methods[] = {
    {"level_sums", level_sums, METH_VARARGS, "One level's packed run sums in one pass (see bandit/_resample_kernel.c)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resample_kernel",
                                    "Optional compiled kernel for bandit/resample.py.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC
PyInit__resample_kernel(void)
{
    return PyModule_Create(&module);
}
