/*
 * Block driver for VMAR base mirrors
 *
 * A mirror is a local sparse copy of one base image (a VMAR map target),
 * filled on demand: a read of blocks the mirror does not hold yet fetches
 * them from the "fetch" child (any node that yields the base's raw bytes:
 * an NBD client, a format node over a remote protocol node, a local file),
 * checks every block against its digest from the image library, writes the
 * good blocks into the "file" child and only then serves the read from
 * there.  Unverified bytes never reach the mirror file or a reader: a
 * failed fetch or a digest mismatch fails the read with EIO and marks
 * nothing present.
 *
 * Files (doc/source/mirror-format.rst of vmar-openstack):
 *  - "digests": the base's digest list, one SHA-256 per block, an all-zero
 *    row for a zero block (zero blocks are never fetched: a hole reads as
 *    zeros);
 *  - "present": which blocks the mirror file holds, one bit per block.  A
 *    bit is written only after the data it stands for was synced
 *    (bdrv_co_flush of "file" first), and bits only ever go from 0 to 1, so
 *    after a crash a block is either present and good or fetched again.
 *
 * Concurrent misses on the same blocks wait for the one fetch in flight
 * (block/reqlist.h); a missing run is extended by up to "readahead" bytes
 * of missing blocks after it.  One mirror node per base: every vmar node
 * that reads the base shares it.
 *
 * The AioContext only waits: the SHA-256 of fetched runs and the writes of
 * the present file go to the thread pool (thread_pool_submit_co), as
 * qcow2-threads.c does with compression.  Diagnostics are trace events
 * (block/trace-events: vmar_mirror_*).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qapi/error.h"
#include "qemu/bitmap.h"
#include "qemu/cutils.h"
#include "qemu/error-report.h"
#include "qemu/memalign.h"
#include "qemu/module.h"
#include "qemu/option.h"
#include "qemu/timer.h"
#include "block/block_int.h"
#include "block/block-io.h"
#include "block/reqlist.h"
#include "trace.h"

#include "vmar-compat.h"

#include <openssl/evp.h>

#define MIRROR_OPT_DIGESTS          "digests"
#define MIRROR_OPT_PRESENT          "present"
#define MIRROR_OPT_READAHEAD        "readahead"
#define MIRROR_OPT_VERIFY_THREADS   "verify-in-threads"

#define MIRROR_DIGESTS_MAGIC        "VMARDGST"
#define MIRROR_PRESENT_MAGIC        "VMARPRES"
#define MIRROR_FORMAT_VERSION       1
#define MIRROR_DIGESTS_HEADER_SIZE  64
#define MIRROR_PRESENT_HEADER_SIZE  4096
#define MIRROR_DIGEST_SIZE          32      /* SHA-256 */
#define MIRROR_MIN_BLOCK            512
#define MIRROR_MAX_BLOCK            (64 * 1024)

#define MIRROR_DEFAULT_READAHEAD    (64 * 1024)
#define MIRROR_MAX_READAHEAD        (16 * 1024 * 1024)
/* Largest single fetch (a long missing run is fetched in pieces) */
#define MIRROR_MAX_FETCH            (4 * 1024 * 1024)
/* How long written blocks wait before their present bits are synced */
#define MIRROR_FLUSH_DELAY_NS       (50 * SCALE_MS)

/* The fixed part of both headers (little-endian on disk) */
typedef struct QEMU_PACKED MirrorHeader {
    char magic[8];
    uint32_t version;
    uint32_t block_size;
    uint64_t size;              /* bytes of the base */
    uint8_t image_id[16];       /* the base's UUID */
    uint32_t digest_size;       /* digests only: 32 (SHA-256) */
} MirrorHeader;

typedef struct BDRVVmarMirrorState {
    BdrvChild *fetch;           /* bs->file is the mirror file */
    uint32_t block_size;
    unsigned block_bits;
    uint64_t size;
    uint64_t n_blocks;
    uint64_t readahead_blocks;
    uint8_t *digests;           /* n_blocks rows of MIRROR_DIGEST_SIZE */
    EVP_MD *sha256;             /* shared by threads: only read */
    bool verify_in_threads;     /* hash in the thread pool */

    /* Verified and in the mirror file (zero blocks from the start) */
    unsigned long *present;
    /* Written to the file, present bits not yet synced */
    unsigned long *pending;
    /* The bitmap of the present file, as on disk */
    uint8_t *disk_bits;
    int present_fd;
    char *present_path;
    QEMUTimer *flush_timer;
    bool flushing;

    BlockReqList inflight;      /* fetches in flight */
    bool fetch_failing;         /* the last fetch failed (reported once) */

    /* Counters: vmar_mirror_get_specific_info */
    uint64_t requests;
    uint64_t fetches;
    uint64_t bytes_fetched;
    uint64_t waits;
    uint64_t fetch_errors;
    uint64_t digest_mismatches;
    uint64_t write_errors;
    uint64_t flush_errors;
} BDRVVmarMirrorState;

static QemuOptsList vmar_mirror_runtime_opts = {
    .name = "vmar-mirror",
    .head = QTAILQ_HEAD_INITIALIZER(vmar_mirror_runtime_opts.head),
    .desc = {
        {
            .name = MIRROR_OPT_DIGESTS,
            .type = QEMU_OPT_STRING,
            .help = "The base's digest list file",
        },
        {
            .name = MIRROR_OPT_PRESENT,
            .type = QEMU_OPT_STRING,
            .help = "The mirror's present-block bitmap file",
        },
        {
            .name = MIRROR_OPT_READAHEAD,
            .type = QEMU_OPT_SIZE,
            .help = "Missing bytes fetched after a missing run (default: "
                    "64 KiB)",
        },
        {
            .name = MIRROR_OPT_VERIFY_THREADS,
            .type = QEMU_OPT_BOOL,
            .help = "Check fetched blocks in the thread pool, not in the "
                    "AioContext (default: on)",
        },
        { /* end of list */ }
    },
};

static const char *const vmar_mirror_strong_runtime_opts[] = {
    MIRROR_OPT_DIGESTS,
    MIRROR_OPT_PRESENT,

    NULL
};

static bool mirror_is_zero_digest(const uint8_t *d)
{
    return buffer_is_zero(d, MIRROR_DIGEST_SIZE);
}

static uint8_t *mirror_digest(BDRVVmarMirrorState *s, uint64_t block)
{
    return s->digests + block * MIRROR_DIGEST_SIZE;
}

static void mirror_hex(const uint8_t *d, char *out)
{
    int i;

    for (i = 0; i < MIRROR_DIGEST_SIZE; i++) {
        sprintf(out + 2 * i, "%02x", d[i]);
    }
}

/*
 * Read (or, with @write, write) exactly @len bytes at @off of @fd: 0, or
 * -errno, or -EINVAL if the file ends first.
 */
static int mirror_io_full(int fd, void *buf, size_t len, off_t off,
                          bool write)
{
    ssize_t n;

    while (len) {
        n = write ? pwrite(fd, buf, len, off) : pread(fd, buf, len, off);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return -errno;
        }
        if (n == 0) {
            return -EINVAL;
        }
        buf = (uint8_t *)buf + n;
        len -= n;
        off += n;
    }
    return 0;
}

static int mirror_pread_full(int fd, void *buf, size_t len, off_t off)
{
    return mirror_io_full(fd, buf, len, off, false);
}

static int mirror_pwrite_full(int fd, const void *buf, size_t len, off_t off)
{
    return mirror_io_full(fd, (void *)buf, len, off, true);
}

/* Check the fixed header fields shared by both files */
static int mirror_check_header(const MirrorHeader *h, const char *magic,
                               const char *path, Error **errp)
{
    uint32_t bsize = le32_to_cpu(h->block_size);

    if (memcmp(h->magic, magic, sizeof(h->magic))) {
        error_setg(errp, "vmar-mirror: %s is not a %.8s file", path, magic);
        return -EINVAL;
    }
    if (le32_to_cpu(h->version) != MIRROR_FORMAT_VERSION) {
        error_setg(errp, "vmar-mirror: %s has version %" PRIu32 ", not %d",
                   path, le32_to_cpu(h->version), MIRROR_FORMAT_VERSION);
        return -EINVAL;
    }
    if (bsize < MIRROR_MIN_BLOCK || bsize > MIRROR_MAX_BLOCK ||
        !is_power_of_2(bsize)) {
        error_setg(errp, "vmar-mirror: %s has block size %" PRIu32, path,
                   bsize);
        return -EINVAL;
    }
    if (!le64_to_cpu(h->size)) {
        error_setg(errp, "vmar-mirror: %s describes an empty base", path);
        return -EINVAL;
    }
    return 0;
}

static int mirror_load_digests(BDRVVmarMirrorState *s, const char *path,
                               MirrorHeader *hdr, Error **errp)
{
    struct stat st;
    uint64_t want;
    int fd, ret;

    fd = qemu_open(path, O_RDONLY, errp);
    if (fd < 0) {
        error_prepend(errp, "vmar-mirror digests: ");
        return fd;
    }
    ret = mirror_pread_full(fd, hdr, sizeof(*hdr), 0);
    if (ret < 0) {
        error_setg_errno(errp, -ret, "vmar-mirror: cannot read the header "
                         "of %s", path);
        goto out;
    }
    ret = mirror_check_header(hdr, MIRROR_DIGESTS_MAGIC, path, errp);
    if (ret < 0) {
        goto out;
    }
    if (le32_to_cpu(hdr->digest_size) != MIRROR_DIGEST_SIZE) {
        error_setg(errp, "vmar-mirror: %s holds %" PRIu32 "-byte digests, "
                   "not SHA-256", path, le32_to_cpu(hdr->digest_size));
        ret = -EINVAL;
        goto out;
    }
    s->block_size = le32_to_cpu(hdr->block_size);
    s->block_bits = ctz32(s->block_size);
    s->size = le64_to_cpu(hdr->size);
    s->n_blocks = DIV_ROUND_UP(s->size, s->block_size);
    want = MIRROR_DIGESTS_HEADER_SIZE + s->n_blocks * MIRROR_DIGEST_SIZE;
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != want) {
        error_setg(errp, "vmar-mirror: %s is not %" PRIu64 " bytes long "
                   "(%" PRIu64 " blocks of the base)", path, want,
                   s->n_blocks);
        ret = -EINVAL;
        goto out;
    }
    s->digests = g_try_malloc(s->n_blocks * MIRROR_DIGEST_SIZE);
    if (!s->digests) {
        error_setg(errp, "vmar-mirror: cannot allocate the digests of %s",
                   path);
        ret = -ENOMEM;
        goto out;
    }
    ret = mirror_pread_full(fd, s->digests, s->n_blocks * MIRROR_DIGEST_SIZE,
                            MIRROR_DIGESTS_HEADER_SIZE);
    if (ret < 0) {
        error_setg_errno(errp, -ret, "vmar-mirror: cannot read %s", path);
    }
out:
    qemu_close(fd);
    return ret;
}

/*
 * Open the present file, check that it belongs to the digest list @dig and
 * load its bits.  Zero blocks are present from the start.
 */
static int mirror_load_present(BDRVVmarMirrorState *s, const char *path,
                               const MirrorHeader *dig, Error **errp)
{
    size_t nbytes = DIV_ROUND_UP(s->n_blocks, 8);
    MirrorHeader hdr;
    uint64_t b;
    int ret;

    s->present_fd = qemu_open(path, O_RDWR, errp);
    if (s->present_fd < 0) {
        error_prepend(errp, "vmar-mirror present file: ");
        return s->present_fd;
    }
    s->present_path = g_strdup(path);
    ret = mirror_pread_full(s->present_fd, &hdr, sizeof(hdr), 0);
    if (ret < 0) {
        error_setg_errno(errp, -ret, "vmar-mirror: cannot read the header "
                         "of %s", path);
        return ret;
    }
    ret = mirror_check_header(&hdr, MIRROR_PRESENT_MAGIC, path, errp);
    if (ret < 0) {
        return ret;
    }
    if (hdr.block_size != dig->block_size || hdr.size != dig->size ||
        memcmp(hdr.image_id, dig->image_id, sizeof(hdr.image_id))) {
        error_setg(errp, "vmar-mirror: %s does not describe the base of its "
                   "digest list", path);
        return -EINVAL;
    }

    s->disk_bits = g_malloc0(nbytes);
    ret = mirror_pread_full(s->present_fd, s->disk_bits, nbytes,
                            MIRROR_PRESENT_HEADER_SIZE);
    if (ret < 0) {
        error_setg_errno(errp, -ret, "vmar-mirror: cannot read the bitmap "
                         "of %s", path);
        return ret;
    }
    s->present = bitmap_new(s->n_blocks);
    s->pending = bitmap_new(s->n_blocks);
    for (b = 0; b < s->n_blocks; b++) {
        if ((s->disk_bits[b >> 3] >> (b & 7)) & 1 ||
            mirror_is_zero_digest(mirror_digest(s, b))) {
            set_bit(b, s->present);
        }
    }
    return 0;
}

/* A byte range of the present file's bitmap to write (not synced) */
typedef struct MirrorBitsWrite {
    int fd;
    const uint8_t *bytes;
    size_t len;
    off_t offset;
} MirrorBitsWrite;

/*
 * Set the bits of @bits in the bitmap as on disk; fill @w with the byte
 * range that changed, and return whether there is one.
 */
static bool mirror_set_disk_bits(BDRVVmarMirrorState *s,
                                 const unsigned long *bits, MirrorBitsWrite *w)
{
    uint64_t b, lo = UINT64_MAX, hi = 0;

    for (b = find_first_bit(bits, s->n_blocks); b < s->n_blocks;
         b = find_next_bit(bits, s->n_blocks, b + 1)) {
        s->disk_bits[b >> 3] |= 1 << (b & 7);
        lo = MIN(lo, b >> 3);
        hi = MAX(hi, b >> 3);
    }
    *w = (MirrorBitsWrite) {
        .fd = s->present_fd,
        .bytes = s->disk_bits + lo,
        .len = hi - lo + 1,
        .offset = MIRROR_PRESENT_HEADER_SIZE + lo,
    };
    return lo <= hi;
}

/* Thread pool function: a MirrorBitsWrite */
static int mirror_bits_write_func(void *opaque)
{
    MirrorBitsWrite *w = opaque;

    return mirror_pwrite_full(w->fd, w->bytes, w->len, w->offset);
}

/* Write the present bits of @bits to the present file, outside coroutines */
static int mirror_write_bits(BDRVVmarMirrorState *s, const unsigned long *bits)
{
    MirrorBitsWrite w;

    if (!mirror_set_disk_bits(s, bits, &w)) {
        return 0;
    }
    return mirror_bits_write_func(&w);
}

/* The same from a coroutine: the write goes to the thread pool */
static int coroutine_fn mirror_co_write_bits(BlockDriverState *bs,
                                             BDRVVmarMirrorState *s,
                                             const unsigned long *bits)
{
    MirrorBitsWrite w;

    if (!mirror_set_disk_bits(s, bits, &w)) {
        return 0;
    }
    return vmar_thread_pool_submit_co(bs, mirror_bits_write_func, &w);
}

/*
 * Make the blocks written so far durable, then record them as present:
 * the data first (fdatasync of the mirror file), the bits after.
 */
static void coroutine_fn mirror_co_flush_present(void *opaque)
{
    BlockDriverState *bs = opaque;
    BDRVVmarMirrorState *s = bs->opaque;
    unsigned long *batch = bitmap_new(s->n_blocks);
    int ret;

    bitmap_copy(batch, s->pending, s->n_blocks);
    bitmap_zero(s->pending, s->n_blocks);
    vmar_graph_co_rdlock();
    ret = bdrv_co_flush(bs->file->bs);
    vmar_graph_co_rdunlock();
    if (ret == 0) {
        ret = mirror_co_write_bits(bs, s, batch);
    }
    trace_vmar_mirror_flush_present(bs, bitmap_count_one(batch, s->n_blocks),
                                    ret);
    if (ret < 0) {
        /* Keep them pending: they are tried again with the next batch */
        bitmap_or(s->pending, s->pending, batch, s->n_blocks);
        s->flush_errors++;
        error_report_once("vmar-mirror %s: cannot record fetched blocks in "
                          "%s: %s", bdrv_get_node_name(bs), s->present_path,
                          strerror(-ret));
    }
    g_free(batch);
    s->flushing = false;
    if (!bitmap_empty(s->pending, s->n_blocks)) {
        timer_mod(s->flush_timer, qemu_clock_get_ns(QEMU_CLOCK_REALTIME) +
                  MIRROR_FLUSH_DELAY_NS);
    }
    bdrv_dec_in_flight(bs);
}

static void mirror_flush_timer_cb(void *opaque)
{
    BlockDriverState *bs = opaque;
    BDRVVmarMirrorState *s = bs->opaque;
    Coroutine *co;

    if (s->flushing || bitmap_empty(s->pending, s->n_blocks)) {
        return;
    }
    s->flushing = true;
    bdrv_inc_in_flight(bs);
    co = qemu_coroutine_create(mirror_co_flush_present, bs);
    aio_co_enter(bdrv_get_aio_context(bs), co);
}

static void mirror_schedule_flush(BDRVVmarMirrorState *s)
{
    if (!s->flushing && !timer_pending(s->flush_timer)) {
        timer_mod(s->flush_timer, qemu_clock_get_ns(QEMU_CLOCK_REALTIME) +
                  MIRROR_FLUSH_DELAY_NS);
    }
}

/*
 * The check of a fetched run: blocks [@first, @end) in @buf.  On return,
 * @bad is the first block that is not what the digest list says (@end if
 * none) and @got its digest.  Runs in the thread pool or in the coroutine;
 * it reads only what no one changes while the fetch is in flight.
 */
typedef struct MirrorVerify {
    const BDRVVmarMirrorState *s;
    const uint8_t *buf;
    uint64_t first;
    uint64_t end;
    uint64_t bad;
    uint8_t got[MIRROR_DIGEST_SIZE];
} MirrorVerify;

/* Whether @buf holds block @b of the base; its digest goes to @got */
static bool mirror_block_ok(const BDRVVmarMirrorState *s, uint64_t b,
                            const uint8_t *buf, uint8_t *got)
{
    const uint8_t *want = s->digests + b * MIRROR_DIGEST_SIZE;
    unsigned int n = MIRROR_DIGEST_SIZE;

    if (mirror_is_zero_digest(want)) {
        memset(got, 0, MIRROR_DIGEST_SIZE);
        return buffer_is_zero(buf, s->block_size);
    }
    if (!EVP_Digest(buf, s->block_size, got, &n, s->sha256, NULL)) {
        memset(got, 0, MIRROR_DIGEST_SIZE);
        return false;
    }
    return !memcmp(got, want, MIRROR_DIGEST_SIZE);
}

/* Thread pool function: a MirrorVerify */
static int mirror_verify_func(void *opaque)
{
    MirrorVerify *v = opaque;
    uint64_t b;

    for (b = v->first; b < v->end; b++) {
        if (!mirror_block_ok(v->s, b,
                             v->buf + ((b - v->first) << v->s->block_bits),
                             v->got)) {
            break;
        }
    }
    v->bad = b;
    return 0;
}

/* Check a fetched run, in the thread pool unless verify-in-threads=off */
static void coroutine_fn mirror_co_verify(BlockDriverState *bs,
                                          BDRVVmarMirrorState *s,
                                          MirrorVerify *v)
{
    if (s->verify_in_threads) {
        vmar_thread_pool_submit_co(bs, mirror_verify_func, v);
    } else {
        mirror_verify_func(v);
    }
}

static void mirror_fetch_failed(BlockDriverState *bs, BDRVVmarMirrorState *s,
                                uint64_t off, uint64_t len, int ret)
{
    s->fetch_errors++;
    if (!s->fetch_failing) {
        error_report("vmar-mirror %s: fetching %" PRIu64 " bytes at %" PRIu64
                     " failed: %s (reads of missing blocks fail until a "
                     "fetch works again)", bdrv_get_node_name(bs), len, off,
                     strerror(-ret));
        s->fetch_failing = true;
    }
}

/*
 * Fetch blocks [@first, @end) (missing, and in nobody else's fetch),
 * verify them, write them into the mirror file and mark them present.
 */
static int coroutine_fn GRAPH_RDLOCK
mirror_co_fetch(BlockDriverState *bs, BDRVVmarMirrorState *s,
                uint64_t first, uint64_t end)
{
    uint64_t off = first << s->block_bits;
    uint64_t span = (end - first) << s->block_bits;
    uint64_t len = MIN(off + span, s->size) - off;
    MirrorVerify v;
    BlockReq req;
    uint8_t *buf;
    int ret;

    reqlist_init_req(&s->inflight, &req, off, span);
    buf = qemu_try_blockalign(bs->file->bs, span);
    if (!buf) {
        ret = -ENOMEM;
        goto out;
    }
    s->fetches++;
    trace_vmar_mirror_fetch(bs, off, len);
    ret = bdrv_co_pread(s->fetch, off, len, buf, 0);
    if (ret < 0) {
        mirror_fetch_failed(bs, s, off, len, ret);
        goto out;
    }
    s->bytes_fetched += len;
    /* A partial last block is hashed zero-padded, as the library does */
    memset(buf + len, 0, span - len);
    v = (MirrorVerify) { .s = s, .buf = buf, .first = first, .end = end };
    mirror_co_verify(bs, s, &v);
    if (v.bad < end) {
        char want_hex[2 * MIRROR_DIGEST_SIZE + 1];
        char got_hex[2 * MIRROR_DIGEST_SIZE + 1];

        mirror_hex(mirror_digest(s, v.bad), want_hex);
        mirror_hex(v.got, got_hex);
        s->digest_mismatches++;
        trace_vmar_mirror_digest_mismatch(bs, v.bad);
        error_report("vmar-mirror %s: block %" PRIu64 " (byte %" PRIu64
                     ") fetched with digest %s, the library says %s: "
                     "not used", bdrv_get_node_name(bs), v.bad,
                     v.bad << s->block_bits, got_hex, want_hex);
        ret = -EIO;
        goto out;
    }
    ret = bdrv_co_pwrite(bs->file, off, len, buf, 0);
    if (ret < 0) {
        s->write_errors++;
        error_report("vmar-mirror %s: cannot write %" PRIu64 " fetched "
                     "bytes at %" PRIu64 " into the mirror: %s",
                     bdrv_get_node_name(bs), len, off, strerror(-ret));
        goto out;
    }
    if (s->fetch_failing) {
        error_report("vmar-mirror %s: fetching works again",
                     bdrv_get_node_name(bs));
        s->fetch_failing = false;
    }
    bitmap_set(s->present, first, end - first);
    bitmap_set(s->pending, first, end - first);
    mirror_schedule_flush(s);
out:
    trace_vmar_mirror_fetch_done(bs, off, len, ret < 0 ? ret : 0);
    qemu_vfree(buf);
    reqlist_remove_req(&req);
    return ret < 0 ? ret : 0;
}

/*
 * The end of the fetch of the missing run [@first, @end) that reaches
 * @req_end, the end of the request: up to readahead_blocks more missing
 * blocks that no other fetch holds, within MIRROR_MAX_FETCH in all.
 */
static uint64_t mirror_fetch_end(BDRVVmarMirrorState *s, uint64_t first,
                                 uint64_t end, uint64_t req_end)
{
    uint64_t max_blocks = MIRROR_MAX_FETCH >> s->block_bits;
    uint64_t limit;
    BlockReq *other;

    end = MIN(end, first + max_blocks);
    if (end < req_end || !s->readahead_blocks) {
        return end;
    }
    limit = MIN(MIN(s->n_blocks, end + s->readahead_blocks),
                first + max_blocks);
    limit = find_next_bit(s->present, limit, end);
    /* Stop before the first fetch in flight (they start at or after end) */
    while (limit > end &&
           (other = reqlist_find_conflict(&s->inflight,
                                          end << s->block_bits,
                                          (limit - end) << s->block_bits))) {
        limit = MAX(end, (uint64_t)other->offset >> s->block_bits);
    }
    return limit;
}

/* Make blocks [@first, @end) present, fetching what is missing */
static int coroutine_fn GRAPH_RDLOCK
mirror_co_fill(BlockDriverState *bs, BDRVVmarMirrorState *s,
               uint64_t first, uint64_t end)
{
    uint64_t b = first, run_end;
    int ret;

    for (;;) {
        b = find_next_zero_bit(s->present, end, b);
        if (b >= end) {
            return 0;
        }
        run_end = find_next_bit(s->present, end, b);
        if (reqlist_wait_one(&s->inflight, b << s->block_bits,
                             (run_end - b) << s->block_bits, NULL)) {
            /* Somebody fetched some of it meanwhile: look again */
            s->waits++;
            trace_vmar_mirror_wait(bs, b << s->block_bits,
                                   (run_end - b) << s->block_bits);
            continue;
        }
        ret = mirror_co_fetch(bs, s, b,
                              mirror_fetch_end(s, b, run_end, end));
        if (ret < 0) {
            return ret;
        }
    }
}

static coroutine_fn GRAPH_RDLOCK int
vmar_mirror_co_preadv_part(BlockDriverState *bs, int64_t offset, int64_t bytes,
                           QEMUIOVector *qiov, size_t qiov_offset,
                           BdrvRequestFlags flags)
{
    BDRVVmarMirrorState *s = bs->opaque;
    uint64_t first, end;
    int ret;

    s->requests++;
    if (offset >= s->size) {
        qemu_iovec_memset(qiov, qiov_offset, 0, bytes);
        return 0;
    }
    first = offset >> s->block_bits;
    end = MIN(DIV_ROUND_UP(offset + bytes, s->block_size), s->n_blocks);
    ret = mirror_co_fill(bs, s, first, end);
    if (ret < 0) {
        return ret;
    }
    return bdrv_co_preadv_part(bs->file, offset, bytes, qiov, qiov_offset,
                               0);
}

/*
 * Zero blocks are known from the digest list, whether fetched or not:
 * report them as zeros (an NBD server then sends holes, qemu-img skips
 * them); everything else is data.  Holes of the mirror file say nothing:
 * they are blocks not fetched yet.
 */
static int coroutine_fn GRAPH_RDLOCK
vmar_mirror_co_block_status(BlockDriverState *bs, VmarBlockStatusMode mode,
                            int64_t offset, int64_t bytes, int64_t *pnum,
                            int64_t *map, BlockDriverState **file)
{
    BDRVVmarMirrorState *s = bs->opaque;
    uint64_t b = offset >> s->block_bits;
    uint64_t end = MIN(DIV_ROUND_UP(offset + bytes, s->block_size),
                       s->n_blocks);
    bool zero = mirror_is_zero_digest(mirror_digest(s, b));

    while (++b < end && mirror_is_zero_digest(mirror_digest(s, b)) == zero) {
        /* extend the run of one kind */
    }
    *pnum = MIN((int64_t)(b << s->block_bits), offset + bytes) - offset;
    return zero ? BDRV_BLOCK_ZERO : BDRV_BLOCK_DATA;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_mirror_co_pwritev_part(BlockDriverState *bs, int64_t offset,
                            int64_t bytes, QEMUIOVector *qiov,
                            size_t qiov_offset, BdrvRequestFlags flags)
{
    return -EPERM;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_mirror_co_pwrite_zeroes(BlockDriverState *bs, int64_t offset,
                             int64_t bytes, BdrvRequestFlags flags)
{
    return -EPERM;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_mirror_co_pdiscard(BlockDriverState *bs, int64_t offset, int64_t bytes)
{
    return -EPERM;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_mirror_co_truncate(BlockDriverState *bs, int64_t offset, bool exact,
                        PreallocMode prealloc, BdrvRequestFlags flags,
                        Error **errp)
{
    error_setg(errp, "vmar-mirror nodes cannot be resized");
    return -EPERM;
}

static void GRAPH_RDLOCK
vmar_mirror_child_perm(BlockDriverState *bs, BdrvChild *c, BdrvChildRole role,
                       BlockReopenQueue *reopen_queue, uint64_t perm,
                       uint64_t shared, uint64_t *nperm, uint64_t *nshared)
{
    if (role & BDRV_CHILD_PRIMARY) {
        /* The mirror file: this node is its only writer */
        *nperm = BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE;
        *nshared = BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED;
    } else {
        /* The source is only read */
        *nperm = BLK_PERM_CONSISTENT_READ;
        *nshared = BLK_PERM_ALL;
    }
}

static void vmar_mirror_attach_aio_context(BlockDriverState *bs,
                                           AioContext *ctx)
{
    BDRVVmarMirrorState *s = bs->opaque;

    s->flush_timer = aio_timer_new(ctx, QEMU_CLOCK_REALTIME, SCALE_NS,
                                   mirror_flush_timer_cb, bs);
    if (!bitmap_empty(s->pending, s->n_blocks)) {
        mirror_schedule_flush(s);
    }
}

static void vmar_mirror_detach_aio_context(BlockDriverState *bs)
{
    BDRVVmarMirrorState *s = bs->opaque;

    g_clear_pointer(&s->flush_timer, timer_free);
}

static void vmar_mirror_free_state(BDRVVmarMirrorState *s)
{
    g_clear_pointer(&s->flush_timer, timer_free);
    if (s->present_fd >= 0) {
        qemu_close(s->present_fd);
        s->present_fd = -1;
    }
    g_clear_pointer(&s->present_path, g_free);
    g_clear_pointer(&s->present, g_free);
    g_clear_pointer(&s->pending, g_free);
    g_clear_pointer(&s->disk_bits, g_free);
    g_clear_pointer(&s->digests, g_free);
    g_clear_pointer(&s->sha256, EVP_MD_free);
}

static int GRAPH_RDLOCK
vmar_mirror_check_length(BdrvChild *c, const char *what, uint64_t size,
                         Error **errp)
{
    int64_t len = bdrv_getlength(c->bs);

    if (len < 0) {
        error_setg_errno(errp, -len, "vmar-mirror: cannot get the size of "
                         "its %s", what);
        return len;
    }
    /* Only protocol nodes know their size to the byte */
    if ((uint64_t)len != size &&
        (uint64_t)len != ROUND_UP(size, BDRV_SECTOR_SIZE)) {
        error_setg(errp, "vmar-mirror: its %s is %" PRId64 " bytes, the "
                   "digest list describes %" PRIu64, what, len, size);
        return -EINVAL;
    }
    return 0;
}

static int GRAPH_UNLOCKED
vmar_mirror_open(BlockDriverState *bs, QDict *options, int flags,
                 Error **errp)
{
    BDRVVmarMirrorState *s = bs->opaque;
    const char *digests, *present;
    MirrorHeader hdr;
    uint64_t readahead;
    QemuOpts *opts;
    int ret;

    s->present_fd = -1;
    QLIST_INIT(&s->inflight);
    opts = qemu_opts_create(&vmar_mirror_runtime_opts, NULL, 0,
                            &error_abort);
    if (!qemu_opts_absorb_qdict(opts, options, errp)) {
        ret = -EINVAL;
        goto out;
    }
    digests = qemu_opt_get(opts, MIRROR_OPT_DIGESTS);
    present = qemu_opt_get(opts, MIRROR_OPT_PRESENT);
    readahead = qemu_opt_get_size(opts, MIRROR_OPT_READAHEAD,
                                  MIRROR_DEFAULT_READAHEAD);
    s->verify_in_threads = qemu_opt_get_bool(opts, MIRROR_OPT_VERIFY_THREADS,
                                             true);
    if (!digests || !present) {
        error_setg(errp, "vmar-mirror needs the options '"
                   MIRROR_OPT_DIGESTS "' and '" MIRROR_OPT_PRESENT "'");
        ret = -EINVAL;
        goto out;
    }
    if (readahead > MIRROR_MAX_READAHEAD) {
        error_setg(errp, "vmar-mirror option '" MIRROR_OPT_READAHEAD "' is "
                   "above %d", MIRROR_MAX_READAHEAD);
        ret = -EINVAL;
        goto out;
    }
    if (bdrv_is_read_only(bs)) {
        error_setg(errp, "vmar-mirror nodes write their mirror file: open "
                   "them read-write (readers still cannot write)");
        ret = -EINVAL;
        goto out;
    }

    s->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!s->sha256) {
        error_setg(errp, "vmar-mirror: OpenSSL has no SHA-256");
        ret = -ENOTSUP;
        goto out;
    }
    ret = mirror_load_digests(s, digests, &hdr, errp);
    if (ret < 0) {
        goto out;
    }
    s->readahead_blocks = readahead >> s->block_bits;
    ret = mirror_load_present(s, present, &hdr, errp);
    if (ret < 0) {
        goto out;
    }

    ret = bdrv_open_file_child(NULL, options, "file", bs, errp);
    if (ret < 0) {
        goto out;
    }
    s->fetch = bdrv_open_child(NULL, options, "fetch", bs, &child_of_bds,
                               BDRV_CHILD_DATA, false, errp);
    if (!s->fetch) {
        ret = -EINVAL;
        goto out;
    }
    vmar_graph_rdlock_main_loop();
    ret = vmar_mirror_check_length(bs->file, "mirror file", s->size, errp);
    if (ret == 0) {
        ret = vmar_mirror_check_length(s->fetch, "source", s->size, errp);
    }
    vmar_graph_rdunlock_main_loop();
    if (ret < 0) {
        goto out;
    }

    s->flush_timer = aio_timer_new(bdrv_get_aio_context(bs),
                                   QEMU_CLOCK_REALTIME, SCALE_NS,
                                   mirror_flush_timer_cb, bs);
    bs->total_sectors = DIV_ROUND_UP(s->size, BDRV_SECTOR_SIZE);
    trace_vmar_mirror_open(bs, s->n_blocks, bitmap_count_one(s->present,
                                                             s->n_blocks));
    ret = 0;

out:
    if (ret < 0) {
        /* After a failed open the block layer drops only "file" */
        if (s->fetch) {
            vmar_graph_wrlock();
            bdrv_unref_child(bs, s->fetch);
            vmar_graph_wrunlock();
            s->fetch = NULL;
        }
        vmar_mirror_free_state(s);
    }
    qemu_opts_del(opts);
    return ret;
}

static void GRAPH_UNLOCKED vmar_mirror_close(BlockDriverState *bs)
{
    BDRVVmarMirrorState *s = bs->opaque;
    int ret;

    /* Drained: no fetch and no flush in flight; record what is pending */
    if (s->flush_timer) {
        timer_del(s->flush_timer);
    }
    if (!bitmap_empty(s->pending, s->n_blocks)) {
        vmar_graph_rdlock_main_loop();
        ret = bdrv_flush(bs->file->bs);
        vmar_graph_rdunlock_main_loop();
        if (ret == 0 && mirror_write_bits(s, s->pending) == 0) {
            bitmap_zero(s->pending, s->n_blocks);
        }
    }
    if (s->present_fd >= 0 && qemu_fdatasync(s->present_fd) < 0) {
        error_report("vmar-mirror %s: cannot sync %s: %s",
                     bdrv_get_node_name(bs), s->present_path,
                     strerror(errno));
    }
    trace_vmar_mirror_close(bs, s->requests, s->fetches, s->bytes_fetched,
                            s->waits);
    /* The block layer drops the children after this */
    s->fetch = NULL;
    vmar_mirror_free_state(s);
}

static int64_t coroutine_fn GRAPH_RDLOCK
vmar_mirror_co_getlength(BlockDriverState *bs)
{
    BDRVVmarMirrorState *s = bs->opaque;

    return s->size;
}

/* The base's block size is the cluster size (qemu-img info, qemu-io info) */
static int coroutine_fn GRAPH_RDLOCK
vmar_mirror_co_get_info(BlockDriverState *bs, BlockDriverInfo *bdi)
{
    BDRVVmarMirrorState *s = bs->opaque;

    bdi->cluster_size = s->block_size;
    return 0;
}

static ImageInfoSpecific * GRAPH_RDLOCK
vmar_mirror_get_specific_info(BlockDriverState *bs, Error **errp)
{
    BDRVVmarMirrorState *s = bs->opaque;
    ImageInfoSpecific *spec = g_new0(ImageInfoSpecific, 1);
    ImageInfoSpecificVmarMirror *info = g_new0(ImageInfoSpecificVmarMirror,
                                               1);

    *info = (ImageInfoSpecificVmarMirror) {
        .blocks             = s->n_blocks,
        .present_blocks     = bitmap_count_one(s->present, s->n_blocks),
        .requests           = s->requests,
        .fetches            = s->fetches,
        .bytes_fetched      = s->bytes_fetched,
        .waits              = s->waits,
        .fetch_errors       = s->fetch_errors,
        .digest_mismatches  = s->digest_mismatches,
        .write_errors       = s->write_errors,
        .flush_errors       = s->flush_errors,
    };
    spec->type = IMAGE_INFO_SPECIFIC_KIND_VMAR_MIRROR;
    spec->u.vmar_mirror.data = info;
    return spec;
}

static BlockDriver bdrv_vmar_mirror = {
    .format_name                = "vmar-mirror",
    .instance_size              = sizeof(BDRVVmarMirrorState),
    .is_format                  = true,

    .bdrv_open                  = vmar_mirror_open,
    .bdrv_close                 = vmar_mirror_close,
    .bdrv_child_perm            = vmar_mirror_child_perm,
    VMAR_DRV_GETLENGTH          = vmar_mirror_co_getlength,
    VMAR_DRV_GET_INFO           = vmar_mirror_co_get_info,
    .bdrv_get_specific_info     = vmar_mirror_get_specific_info,
    .bdrv_attach_aio_context    = vmar_mirror_attach_aio_context,
    .bdrv_detach_aio_context    = vmar_mirror_detach_aio_context,

    .bdrv_co_preadv_part        = vmar_mirror_co_preadv_part,
    .bdrv_co_block_status       = vmar_mirror_co_block_status,
    .bdrv_co_pwritev_part       = vmar_mirror_co_pwritev_part,
    .bdrv_co_pwrite_zeroes      = vmar_mirror_co_pwrite_zeroes,
    .bdrv_co_pdiscard           = vmar_mirror_co_pdiscard,
    .bdrv_co_truncate           = vmar_mirror_co_truncate,

    .strong_runtime_opts        = vmar_mirror_strong_runtime_opts,
};

static void bdrv_vmar_mirror_init(void)
{
    bdrv_register(&bdrv_vmar_mirror);
}

block_init(bdrv_vmar_mirror_init);
