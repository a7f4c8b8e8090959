/*
 * Native block hashing for vmar_openstack.fingerprint.
 *
 * One call hashes every block of a buffer with OpenSSL's EVP interface and
 * writes one digest per block into a caller-owned array; an all-zero block
 * gets an all-zero row instead (never a digest).  The GIL is released for
 * the whole loop, so one Python thread per core hashes in parallel.
 *
 * Python's hashlib costs about 0.7 us per call on top of the 2.2 us that
 * SHA-256 of a 4 KiB block takes here; this loop pays that once per buffer.
 * The pure-Python path in fingerprint/__init__.py computes the same result
 * and is used when this module is not built.
 *
 * The data may be a memory map of the image file (no copy from the page
 * cache: 12 % faster here). A file truncated while it is mapped makes the
 * reading thread take SIGBUS; a handler installed at import turns that
 * fault, inside this loop only, into OSError(EFAULT) instead of the death
 * of the process. Faults elsewhere go to the handler that was there before
 * (or kill the process, as they would have).
 *
 * Built by setup.py (optional extension): needs a C compiler, the Python
 * headers and libssl-dev.
 */
#define PY_SSIZE_T_CLEAN
/* SHA256_Init and friends: deprecated in OpenSSL 3, still its fastest
 * path for many small messages (10 % here). */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

/* Set while this thread is inside the hashing loop. */
static __thread sigjmp_buf *bus_guard;
static struct sigaction prev_bus;

static void
on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    if (bus_guard != NULL) {
        siglongjmp(*bus_guard, 1);
    }
    /* not a fault of ours: hand it over */
    if (prev_bus.sa_flags & SA_SIGINFO) {
        prev_bus.sa_sigaction(sig, info, uctx);
    } else if (prev_bus.sa_handler != SIG_DFL
               && prev_bus.sa_handler != SIG_IGN) {
        prev_bus.sa_handler(sig);
    } else {
        /* the faulting access repeats on return, now with the default
         * action: the process dies as it would have without us */
        sigaction(SIGBUS, &prev_bus, NULL);
    }
}

static int
block_is_zero(const unsigned char *p, size_t len)
{
    const uint64_t *w = (const uint64_t *)p;
    size_t i, j;

    /* one cache line at a time: a data block usually fails on the first */
    for (i = 0; i < len / 8; i += 8) {
        uint64_t acc = 0;

        for (j = 0; j < 8; j++) {
            acc |= w[i + j];
        }
        if (acc) {
            return 0;
        }
    }
    return 1;
}

/* The loop, with the GIL released. Returns 0 if OpenSSL failed; sets
 * *faulted when the data could not be read (SIGBUS). */
static int
hash_loop(const EVP_MD *md, int sha256, EVP_MD_CTX *ctx,
          const unsigned char *data, unsigned char *out, Py_ssize_t n,
          Py_ssize_t block_size, int dsize, Py_ssize_t *nonzero,
          int *faulted)
{
    sigjmp_buf env;
    volatile Py_ssize_t i;
    volatile Py_ssize_t count = 0;
    volatile int ok = 1;

    if (sigsetjmp(env, 1) != 0) {
        bus_guard = NULL;
        *faulted = 1;
        *nonzero = count;
        return 1;
    }
    bus_guard = &env;
    for (i = 0; i < n && ok; i++) {
        const unsigned char *blk = data + i * block_size;
        unsigned char *row = out + i * dsize;

        if (block_is_zero(blk, (size_t)block_size)) {
            memset(row, 0, (size_t)dsize);
            continue;
        }
        if (sha256) {
            /* the same code EVP runs, without its per-call dispatch */
            SHA256_CTX c;

            ok = SHA256_Init(&c) && SHA256_Update(&c, blk, block_size)
                 && SHA256_Final(row, &c);
        } else {
            ok = EVP_DigestInit_ex2(ctx, md, NULL)
                 && EVP_DigestUpdate(ctx, blk, (size_t)block_size)
                 && EVP_DigestFinal_ex(ctx, row, NULL);
        }
        count++;
    }
    bus_guard = NULL;
    *nonzero = count;
    return ok;
}

PyDoc_STRVAR(hash_blocks_doc,
"hash_blocks(algorithm, block_size, data, out) -> int\n\n"
"Hash each block_size block of data (a multiple of block_size bytes)\n"
"with the OpenSSL digest ``algorithm`` into consecutive rows of the\n"
"writable buffer out (digest_size bytes per block). All-zero blocks get\n"
"an all-zero row. Returns the number of non-zero blocks.");

static PyObject *
hash_blocks(PyObject *self, PyObject *args)
{
    const char *algorithm;
    Py_ssize_t block_size;
    Py_buffer data, out;
    const EVP_MD *md;
    EVP_MD_CTX *ctx;
    Py_ssize_t n, nonzero = 0;
    int dsize, sha256, ok, faulted = 0;

    if (!PyArg_ParseTuple(args, "sny*w*", &algorithm, &block_size, &data,
                          &out)) {
        return NULL;
    }
    md = EVP_get_digestbyname(algorithm);
    if (md == NULL) {
        PyErr_Format(PyExc_ValueError, "unknown digest %s", algorithm);
        goto fail;
    }
    dsize = EVP_MD_get_size(md);
    sha256 = EVP_MD_is_a(md, "SHA256");
    if (block_size < 4096 || block_size % 4096 || data.len % block_size) {
        PyErr_SetString(PyExc_ValueError,
                        "data must be whole blocks of a multiple of 4096");
        goto fail;
    }
    n = data.len / block_size;
    if (out.len < n * dsize) {
        PyErr_SetString(PyExc_ValueError, "out is too small");
        goto fail;
    }
    ctx = EVP_MD_CTX_new();
    if (ctx == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = hash_loop(md, sha256, ctx, (const unsigned char *)data.buf,
                   (unsigned char *)out.buf, n, block_size, dsize,
                   &nonzero, &faulted);
    Py_END_ALLOW_THREADS
    EVP_MD_CTX_free(ctx);
    if (faulted) {
        PyObject *exc_args = Py_BuildValue(
            "(is)", EFAULT, "the data vanished while it was read "
            "(a mapped file was truncated)");

        if (exc_args != NULL) {
            PyErr_SetObject(PyExc_OSError, exc_args);
            Py_DECREF(exc_args);
        }
        goto fail;
    }
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL digest failed");
        goto fail;
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(nonzero);

fail:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"hash_blocks", hash_blocks, METH_VARARGS, hash_blocks_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_blockhash",
    "Native block hashing (see _blockhash.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__blockhash(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &prev_bus) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    return PyModule_Create(&module);
}
