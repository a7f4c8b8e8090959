/*
 * Block driver for VMAR block maps (read-only)
 *
 * A VMAR map (doc/source/map-format.rst of vmar-openstack) describes a
 * virtual disk as extents of blocks read from other images ("targets");
 * blocks no extent covers read as zeros.  The map file is the "file" child;
 * target i is either the raw file <base-dir>/<uuid> (opened here, read-only,
 * cache.direct=off unless base-cache-direct=on), or the existing node named
 * <base-node-prefix><id> where <id> is the UUID in 22 characters of
 * base64url (node names are limited to 31 characters), or whatever the
 * "targets" list gives for it; the last two let several vmar nodes share
 * one node per base file.
 *
 * The read counters of a node are its format-specific image information
 * (ImageInfoSpecificVmar: query-named-block-nodes, qemu-img info).  With
 * record-window=N the node also records which blocks its reads touch
 * during the N seconds after its first read (a boot's working set), as a
 * bitmap in that information ("touched", base64, bit b % 8 of byte b / 8).
 * Diagnostics are trace events (block/trace-events: vmar_*).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qapi/error.h"
#include "qemu/bitmap.h"
#include "qemu/cutils.h"
#include "qemu/memalign.h"
#include "qemu/module.h"
#include "qemu/option.h"
#include "qemu/stats64.h"
#include "qemu/timer.h"
#include "block/block_int.h"
#include "block/block-io.h"
#include "block/aio_task.h"
#include "trace.h"

#include "vmar-compat.h"
#include "vmar-map.h"

#define VMAR_OPT_BASE_DIR           "base-dir"
#define VMAR_OPT_BASE_NODE_PREFIX   "base-node-prefix"
#define VMAR_OPT_BASE_CACHE_DIRECT  "base-cache-direct"
#define VMAR_OPT_GATHER_GAP         "gather-gap"
#define VMAR_OPT_RECORD_WINDOW      "record-window"

/* Largest map file we load (a map holds 16 bytes per extent) */
#define VMAR_MAX_MAP_FILE_SIZE      (1ULL << 30)
#define VMAR_READ_CHUNK             (64 * 1024 * 1024)
#define VMAR_MAX_WORKERS            8
/*
 * Runs of one request that go to the same target close to each other are
 * read with one target read: up to VMAR_MAX_GAP bytes between two runs are
 * read into a scratch buffer and dropped, and one read spans at most
 * VMAR_MAX_SPAN bytes.  Maps often interleave short extents of two
 * targets, and each target read costs a thread pool round trip.
 */
#define VMAR_MAX_GAP                (32 * 1024)   /* largest gather-gap */
#define VMAR_MAX_SPAN               (1024 * 1024)
/* Target reads being gathered at once, per request */
#define VMAR_GROUPS                 2

typedef struct BDRVVmarState {
    VmarMap *map;
    uint32_t n_targets;
    BdrvChild **targets;

    /*
     * Counters (vmar_get_specific_info).  Requests of one node may run in
     * several threads at once (multiqueue): nothing on the read path
     * writes the state but these, and a request adds its counts once, at
     * its end.  Its map lookups keep their cursor on its stack.
     */
    Stat64 requests;
    Stat64 errors;
    Stat64 bytes_read;
    Stat64 bytes_zero;
    Stat64 target_reads;
    Stat64 block_status_calls;
    Stat64 bytes_gap;
    Stat64 lookups;
    Stat64 probes;

    /* Destination of the gaps between gathered runs, never read */
    void *gap_buf;
    uint64_t gather_gap;

    /*
     * Blocks read in the record window after the first read, or NULL (set
     * with atomic operations; the first read sets record_start_ns once)
     */
    unsigned long *touched;
    int64_t record_window_ns;
    int64_t record_start_ns;        /* 0: no read yet */
} BDRVVmarState;

/*
 * One target read: either one run, straight into the request's @qiov at
 * @qiov_offset, or (@gathered) several runs and the gaps between them,
 * through @local, which points into the request's qiov and gap_buf.
 */
typedef struct VmarAioTask {
    AioTask task;
    BdrvChild *child;
    uint64_t offset;        /* in the target */
    uint64_t bytes;
    QEMUIOVector *qiov;
    size_t qiov_offset;
    bool gathered;
    QEMUIOVector local;     /* heap iov array only, so the task can move */
} VmarAioTask;

static QemuOptsList vmar_runtime_opts = {
    .name = "vmar",
    .head = QTAILQ_HEAD_INITIALIZER(vmar_runtime_opts.head),
    .desc = {
        {
            .name = VMAR_OPT_BASE_DIR,
            .type = QEMU_OPT_STRING,
            .help = "Directory holding the target images named by UUID",
        },
        {
            .name = VMAR_OPT_BASE_NODE_PREFIX,
            .type = QEMU_OPT_STRING,
            .help = "Use existing nodes named <prefix><base64url id> as "
                    "targets",
        },
        {
            .name = VMAR_OPT_BASE_CACHE_DIRECT,
            .type = QEMU_OPT_BOOL,
            .help = "Open targets in base-dir with cache.direct=on "
                    "(default: off)",
        },
        {
            .name = VMAR_OPT_GATHER_GAP,
            .type = QEMU_OPT_SIZE,
            .help = "Read runs of one target at most this many bytes apart "
                    "with one read (default: 0, only touching runs)",
        },
        {
            .name = VMAR_OPT_RECORD_WINDOW,
            .type = QEMU_OPT_NUMBER,
            .help = "Record the blocks read in this many seconds after the "
                    "first read (default: 0, none)",
        },
        { /* end of list */ }
    },
};

static const char *const vmar_strong_runtime_opts[] = {
    VMAR_OPT_BASE_DIR,
    VMAR_OPT_BASE_NODE_PREFIX,

    NULL
};

/*
 * Load and validate the map from the "file" child.  The block layer knows
 * a node's length only to 512 bytes, so the header's file size, if it
 * rounds to that length, is the map's length.
 */
static int GRAPH_RDLOCK vmar_load_map(BlockDriverState *bs,
                                      BDRVVmarState *s, Error **errp)
{
    const char *name = bs->file->bs->filename;
    char err[VMAR_ERR_LEN];
    VmarHeader hdr;
    int64_t len, off;
    uint8_t *buf;
    int ret;

    len = bdrv_getlength(bs->file->bs);
    if (len < 0) {
        error_setg_errno(errp, -len, "vmar map %s: cannot get its size",
                         name);
        return len;
    }
    if (len > VMAR_MAX_MAP_FILE_SIZE) {
        error_setg(errp, "vmar map %s: file too large (%" PRId64 " bytes)",
                   name, len);
        return -EFBIG;
    }
    if (len < VMAR_HEADER_SIZE) {
        error_setg(errp, "vmar map %s: file too short (%" PRId64 " bytes)",
                   name, len);
        return -EINVAL;
    }

    buf = g_try_malloc(len);
    if (!buf) {
        error_setg(errp, "vmar map %s: cannot allocate %" PRId64 " bytes",
                   name, len);
        return -ENOMEM;
    }
    for (off = 0; off < len; off += VMAR_READ_CHUNK) {
        int64_t n = MIN(len - off, VMAR_READ_CHUNK);
        ret = bdrv_pread(bs->file, off, n, buf + off, 0);
        if (ret < 0) {
            error_setg_errno(errp, -ret, "vmar map %s: read error", name);
            g_free(buf);
            return ret;
        }
    }

    if (vmar_header_parse(buf, len, &hdr, NULL, 0) == 0 &&
        ROUND_UP(hdr.file_size, BDRV_SECTOR_SIZE) == len) {
        len = hdr.file_size;
    }

    ret = vmar_map_parse(buf, len, &s->map, err, sizeof(err));
    g_free(buf);
    if (ret < 0) {
        error_setg(errp, "vmar map %s: %s", name, err);
        return -EINVAL;
    }
    trace_vmar_open(bs, name, s->map->hdr.n_extents, s->map->hdr.n_targets);
    return 0;
}

/* Whether @options hold a reference or options for the child @key */
static bool vmar_has_child_options(QDict *options, const char *key)
{
    size_t len = strlen(key);
    const QDictEntry *e;

    for (e = qdict_first(options); e; e = qdict_next(options, e)) {
        const char *k = qdict_entry_key(e);
        if (!strncmp(k, key, len) && (k[len] == '\0' || k[len] == '.')) {
            return true;
        }
    }
    return false;
}

/*
 * Open target i as child "targets.<i>": as given by the user in the
 * "targets" list if it is there, else as node <prefix><id> (base-node-prefix)
 * or as file <base-dir>/<uuid> (base-dir).
 */
static int GRAPH_UNLOCKED
vmar_open_targets(BlockDriverState *bs, BDRVVmarState *s, QDict *options,
                  const char *base_dir, const char *prefix, bool cache_direct,
                  Error **errp)
{
    VmarMap *map = s->map;
    uint32_t i;

    s->n_targets = map->hdr.n_targets;
    s->targets = g_new0(BdrvChild *, s->n_targets);

    for (i = 0; i < s->n_targets; i++) {
        const VmarTarget *t = &map->targets[i];
        g_autofree char *key = g_strdup_printf("targets.%" PRIu32, i);
        g_autofree char *path = NULL;
        char uuid[37];

        vmar_uuid_format(t->image_id, uuid);
        if (vmar_has_child_options(options, key)) {
            /* given explicitly, e.g. "targets": ["node-a", "node-b"] */
        } else if (prefix) {
            char id[VMAR_ID_B64_LEN + 1];
            g_autofree char *node = NULL;

            vmar_id_b64url(t->image_id, id);
            node = g_strdup_printf("%s%s", prefix, id);
            qdict_put_str(options, key, node);
        } else if (base_dir) {
            g_autofree char *k_driver = g_strdup_printf("%s.driver", key);
            g_autofree char *k_file = g_strdup_printf("%s.filename", key);
            g_autofree char *k_ro = g_strdup_printf("%s.read-only", key);
            g_autofree char *k_direct =
                g_strdup_printf("%s." BDRV_OPT_CACHE_DIRECT, key);

            path = g_strdup_printf("%s/%s", base_dir, uuid);
            qdict_put_str(options, k_driver, "file");
            qdict_put_str(options, k_file, path);
            qdict_put_str(options, k_ro, "on");
            /* Host page cache for base files whatever the parent's mode */
            qdict_put_str(options, k_direct, cache_direct ? "on" : "off");
        } else {
            error_setg(errp, "vmar target %" PRIu32 " (%s): no '%s' given, "
                       "and neither '" VMAR_OPT_BASE_DIR "' nor '"
                       VMAR_OPT_BASE_NODE_PREFIX "'", i, uuid, key);
            return -EINVAL;
        }

        s->targets[i] = bdrv_open_child(NULL, options, key, bs, &child_of_bds,
                                        BDRV_CHILD_DATA, false, errp);
        if (!s->targets[i]) {
            error_prepend(errp, "vmar target %" PRIu32 " (%s): ", i, uuid);
            return -EINVAL;
        }
    }
    return 0;
}

/* Each target must be as long as the map says (to 512 bytes) */
static int GRAPH_RDLOCK vmar_check_targets(BDRVVmarState *s, Error **errp)
{
    uint32_t i;

    for (i = 0; i < s->n_targets; i++) {
        const VmarTarget *t = &s->map->targets[i];
        int64_t len = bdrv_getlength(s->targets[i]->bs);
        char uuid[37];

        vmar_uuid_format(t->image_id, uuid);
        if (len < 0) {
            error_setg_errno(errp, -len, "vmar target %" PRIu32 " (%s): "
                             "cannot get its size", i, uuid);
            return len;
        }
        if ((uint64_t)len != ROUND_UP(t->size, BDRV_SECTOR_SIZE)) {
            error_setg(errp, "vmar target %" PRIu32 " (%s): size is %" PRId64
                       " bytes, the map says %" PRIu64, i, uuid, len,
                       t->size);
            return -EINVAL;
        }
    }
    return 0;
}

/*
 * Free what the node holds.  The block layer drops the children of a node
 * it closes, but after a failed open only its "file": @unref_targets drops
 * the targets then.
 */
static void GRAPH_UNLOCKED vmar_free_state(BlockDriverState *bs,
                                           BDRVVmarState *s,
                                           bool unref_targets)
{
    uint32_t i;

    if (s->targets && unref_targets) {
        vmar_graph_wrlock();
        for (i = 0; i < s->n_targets; i++) {
            if (s->targets[i]) {
                bdrv_unref_child(bs, s->targets[i]);
            }
        }
        vmar_graph_wrunlock();
    }
    g_clear_pointer(&s->targets, g_free);
    s->n_targets = 0;
    qemu_vfree(s->gap_buf);
    s->gap_buf = NULL;
    g_free(s->touched);
    s->touched = NULL;
    vmar_map_free(s->map);
    s->map = NULL;
}

static int GRAPH_UNLOCKED vmar_open(BlockDriverState *bs, QDict *options,
                                    int flags, Error **errp)
{
    BDRVVmarState *s = bs->opaque;
    QemuOpts *opts;
    const char *base_dir, *prefix;
    bool cache_direct;
    uint64_t window;
    int ret;

    vmar_graph_rdlock_main_loop();
    ret = bdrv_apply_auto_read_only(bs, "vmar images are read-only", errp);
    vmar_graph_rdunlock_main_loop();
    if (ret < 0) {
        return ret;
    }

    opts = qemu_opts_create(&vmar_runtime_opts, NULL, 0, &error_abort);
    if (!qemu_opts_absorb_qdict(opts, options, errp)) {
        ret = -EINVAL;
        goto out;
    }
    base_dir = qemu_opt_get(opts, VMAR_OPT_BASE_DIR);
    prefix = qemu_opt_get(opts, VMAR_OPT_BASE_NODE_PREFIX);
    cache_direct = qemu_opt_get_bool(opts, VMAR_OPT_BASE_CACHE_DIRECT, false);
    s->gather_gap = qemu_opt_get_size(opts, VMAR_OPT_GATHER_GAP, 0);
    window = qemu_opt_get_number(opts, VMAR_OPT_RECORD_WINDOW, 0);
    if (window > 24 * 3600) {
        error_setg(errp, "vmar option '" VMAR_OPT_RECORD_WINDOW "' is above "
                   "a day");
        ret = -EINVAL;
        goto out;
    }
    if (s->gather_gap > VMAR_MAX_GAP) {
        error_setg(errp, "vmar option '" VMAR_OPT_GATHER_GAP "' is above %d",
                   VMAR_MAX_GAP);
        ret = -EINVAL;
        goto out;
    }
    if (base_dir && prefix) {
        error_setg(errp, "vmar options '" VMAR_OPT_BASE_DIR "' and '"
                   VMAR_OPT_BASE_NODE_PREFIX "' are mutually exclusive");
        ret = -EINVAL;
        goto out;
    }
    if (prefix && strlen(prefix) + VMAR_ID_B64_LEN >= sizeof(bs->node_name)) {
        error_setg(errp, "vmar option '" VMAR_OPT_BASE_NODE_PREFIX "' is "
                   "longer than %zu characters",
                   sizeof(bs->node_name) - 1 - VMAR_ID_B64_LEN);
        ret = -EINVAL;
        goto out;
    }

    ret = bdrv_open_file_child(NULL, options, "file", bs, errp);
    if (ret < 0) {
        goto out;
    }

    vmar_graph_rdlock_main_loop();
    ret = vmar_load_map(bs, s, errp);
    vmar_graph_rdunlock_main_loop();
    if (ret < 0) {
        goto out;
    }

    ret = vmar_open_targets(bs, s, options, base_dir, prefix, cache_direct,
                            errp);
    if (ret < 0) {
        goto out;
    }
    vmar_graph_rdlock_main_loop();
    ret = vmar_check_targets(s, errp);
    vmar_graph_rdunlock_main_loop();
    if (ret < 0) {
        goto out;
    }

    /* Page aligned, so O_DIRECT targets need no bounce buffer for it */
    s->gap_buf = qemu_try_memalign(qemu_real_host_page_size(),
                                   MAX(s->gather_gap, 4096));
    if (!s->gap_buf) {
        error_setg(errp, "vmar: cannot allocate the gap buffer");
        ret = -ENOMEM;
        goto out;
    }

    if (window) {
        s->touched = bitmap_try_new(s->map->n_blocks);
        if (!s->touched) {
            error_setg(errp, "vmar: cannot allocate the record bitmap");
            ret = -ENOMEM;
            goto out;
        }
        s->record_window_ns = window * NANOSECONDS_PER_SECOND;
    }

    bs->total_sectors = DIV_ROUND_UP(s->map->hdr.virtual_size,
                                     BDRV_SECTOR_SIZE);
    ret = 0;

out:
    if (ret < 0) {
        vmar_free_state(bs, s, true);
    }
    qemu_opts_del(opts);
    return ret;
}

static bool vmar_recording(BDRVVmarState *s, int64_t now)
{
    int64_t start = qatomic_read(&s->record_start_ns);

    return !start || now - start <= s->record_window_ns;
}

/* Mark the blocks of a read in the record window */
static void vmar_record(BDRVVmarState *s, uint64_t offset, uint64_t bytes)
{
    uint64_t vsize = s->map->hdr.virtual_size;
    uint32_t shift = s->map->block_shift;
    int64_t now = qemu_clock_get_ns(QEMU_CLOCK_REALTIME);
    uint64_t first;

    if (!vmar_recording(s, now) || offset >= vsize || !bytes) {
        return;
    }
    /* the first read starts the window; a concurrent first read loses */
    qatomic_cmpxchg(&s->record_start_ns, 0, now);
    bytes = MIN(bytes, vsize - offset);
    first = offset >> shift;
    bitmap_set_atomic(s->touched, first,
                      ((offset + bytes - 1) >> shift) - first + 1);
}

/* The touched bitmap as base64, each word read atomically */
static char *vmar_touched_base64(BDRVVmarState *s)
{
    size_t words = BITS_TO_LONGS(s->map->n_blocks), i;
    g_autofree unsigned long *copy = g_new(unsigned long, words);

    for (i = 0; i < words; i++) {
        copy[i] = qatomic_read(&s->touched[i]);
    }
    return g_base64_encode((const guchar *)copy,
                           DIV_ROUND_UP(s->map->n_blocks, 8));
}

static ImageInfoSpecific * GRAPH_RDLOCK
vmar_get_specific_info(BlockDriverState *bs, Error **errp)
{
    BDRVVmarState *s = bs->opaque;
    ImageInfoSpecific *spec = g_new0(ImageInfoSpecific, 1);
    ImageInfoSpecificVmar *info = g_new0(ImageInfoSpecificVmar, 1);

    *info = (ImageInfoSpecificVmar) {
        .requests       = stat64_get(&s->requests),
        .bytes_read     = stat64_get(&s->bytes_read),
        .bytes_zero     = stat64_get(&s->bytes_zero),
        .target_reads   = stat64_get(&s->target_reads),
        .errors         = stat64_get(&s->errors),
        .extents        = s->map ? s->map->hdr.n_extents : 0,
        .lookups        = stat64_get(&s->lookups),
        .probes         = stat64_get(&s->probes),
    };
    if (s->touched) {
        info->has_recording = true;
        info->recording = vmar_recording(
            s, qemu_clock_get_ns(QEMU_CLOCK_REALTIME));
        VMAR_QAPI_SET_HAS(info, touched);
        info->touched = vmar_touched_base64(s);
    }
    spec->type = IMAGE_INFO_SPECIFIC_KIND_VMAR;
    spec->u.vmar.data = info;
    return spec;
}

static void GRAPH_UNLOCKED vmar_close(BlockDriverState *bs)
{
    BDRVVmarState *s = bs->opaque;

    trace_vmar_close(bs, stat64_get(&s->requests),
                     stat64_get(&s->bytes_read), stat64_get(&s->bytes_zero),
                     stat64_get(&s->target_reads),
                     stat64_get(&s->block_status_calls),
                     stat64_get(&s->bytes_gap), stat64_get(&s->lookups),
                     stat64_get(&s->probes));
    vmar_free_state(bs, s, false);
}

static int GRAPH_UNLOCKED vmar_reopen_prepare(BDRVReopenState *state,
                               BlockReopenQueue *queue, Error **errp)
{
    if (state->flags & BDRV_O_RDWR) {
        error_setg(errp, "vmar images are read-only");
        return -EPERM;
    }
    return 0;
}

static int64_t coroutine_fn GRAPH_RDLOCK
vmar_co_getlength(BlockDriverState *bs)
{
    BDRVVmarState *s = bs->opaque;

    return s->map->hdr.virtual_size;
}

/* The map's block size is the cluster size (qemu-img info, qemu-io info) */
static int coroutine_fn GRAPH_RDLOCK
vmar_co_get_info(BlockDriverState *bs, BlockDriverInfo *bdi)
{
    BDRVVmarState *s = bs->opaque;

    bdi->cluster_size = s->map->hdr.block_size;
    return 0;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_co_read_task_entry(AioTask *task)
{
    VmarAioTask *t = container_of(task, VmarAioTask, task);
    int ret;

    trace_vmar_target_read(t->child->bs, t->offset, t->bytes, t->gathered);
    if (!t->gathered) {
        return bdrv_co_preadv_part(t->child, t->offset, t->bytes, t->qiov,
                                   t->qiov_offset, 0);
    }
    ret = bdrv_co_preadv(t->child, t->offset, t->bytes, &t->local, 0);
    qemu_iovec_destroy(&t->local);
    return ret;
}

/* Hand @t to @pool (created if needed), which frees the copy it makes */
static coroutine_fn void vmar_start_read_task(AioTaskPool **pool,
                                              const VmarAioTask *t)
{
    VmarAioTask *task = g_memdup2(t, sizeof(*t));

    if (!*pool) {
        *pool = aio_task_pool_new(VMAR_MAX_WORKERS);
    }
    aio_task_pool_start_task(*pool, &task->task);
}

/*
 * Add the run of @bytes at @offset in @child, for @qiov at @qiov_offset, to
 * read @t if it fits: same target, at most VMAR_MAX_GAP bytes after its
 * end, and the read stays within VMAR_MAX_SPAN bytes and IOV_MAX.
 */
static bool vmar_gather(BDRVVmarState *s, VmarAioTask *t, BdrvChild *child,
                        uint64_t offset, uint64_t bytes, QEMUIOVector *qiov,
                        size_t qiov_offset, uint64_t *bytes_gap)
{
    uint64_t end = t->offset + t->bytes;
    int niov;

    if (t->child != child || offset < end || offset - end > s->gather_gap ||
        offset + bytes - t->offset > VMAR_MAX_SPAN) {
        return false;
    }
    niov = qemu_iovec_subvec_niov(qiov, qiov_offset, bytes) + 1;
    if (!t->gathered) {
        niov += qemu_iovec_subvec_niov(t->qiov, t->qiov_offset, t->bytes);
        if (niov > IOV_MAX) {
            return false;
        }
        qemu_iovec_init(&t->local, MAX(niov, 8));
        qemu_iovec_concat(&t->local, t->qiov, t->qiov_offset, t->bytes);
        t->gathered = true;
    } else if (t->local.niov + niov > IOV_MAX) {
        return false;
    }
    if (offset > end) {
        qemu_iovec_add(&t->local, s->gap_buf, offset - end);
        *bytes_gap += offset - end;
    }
    qemu_iovec_concat(&t->local, qiov, qiov_offset, bytes);
    t->bytes = offset + bytes - t->offset;
    return true;
}

/*
 * Read a request's runs.  Zero runs are filled in place.  Mapped runs are
 * gathered into at most VMAR_GROUPS target reads at a time (see
 * VMAR_MAX_GAP); a read that cannot grow any more goes to an AioTaskPool
 * created on demand, and the last one is done in this coroutine.  So a
 * request that needs one target read (the common case: the NBD server asks
 * block status first and reads one run at a time) costs no pool, no
 * coroutine and no allocation.
 */
static coroutine_fn GRAPH_RDLOCK int
vmar_co_preadv_part(BlockDriverState *bs, int64_t offset, int64_t bytes,
                    QEMUIOVector *qiov, size_t qiov_offset,
                    BdrvRequestFlags flags)
{
    BDRVVmarState *s = bs->opaque;
    VmarMap *map = s->map;
    uint32_t shift = map->block_shift;
    uint64_t mask = ((uint64_t)1 << shift) - 1;
    uint64_t vsize = map->hdr.virtual_size;
    int64_t req_offset = offset, req_bytes = bytes;
    uint64_t bytes_read = 0, bytes_zero = 0, bytes_gap = 0, target_reads = 0;
    AioTaskPool *aio = NULL;
    VmarAioTask group[VMAR_GROUPS];
    VmarCursor cursor;
    int n_groups = 0;
    int i, ret = 0;

    vmar_cursor_init(map, &cursor);
    trace_vmar_co_preadv(bs, offset, bytes);
    if (s->touched) {
        vmar_record(s, offset, bytes);
    }

    /* Bytes past virtual_size (up to the next sector) read as zeros */
    if ((uint64_t)offset + bytes > vsize) {
        uint64_t start = MAX((uint64_t)offset, vsize);
        uint64_t tail = (uint64_t)offset + bytes - start;
        qemu_iovec_memset(qiov, qiov_offset + (start - offset), 0, tail);
        bytes_zero += tail;
        bytes -= tail;
    }

    while (bytes > 0 && aio_task_pool_status(aio) == 0) {
        uint64_t end = (uint64_t)offset + bytes;
        uint64_t block = (uint64_t)offset >> shift;
        uint64_t cur, toff;
        BdrvChild *child;
        VmarRun run;

        vmar_map_lookup(map, &cursor, block, (end + mask) >> shift, &run);
        cur = MIN((block + run.n_blocks) << shift, end) - offset;

        if (!run.mapped) {
            qemu_iovec_memset(qiov, qiov_offset, 0, cur);
            bytes_zero += cur;
            goto next;
        }

        child = s->targets[map->extents[run.extent].target];
        toff = (run.target_block << shift) + (offset & mask);
        bytes_read += cur;
        for (i = 0; i < n_groups; i++) {
            if (vmar_gather(s, &group[i], child, toff, cur, qiov,
                            qiov_offset, &bytes_gap)) {
                goto next;
            }
        }
        if (n_groups == VMAR_GROUPS) {
            /* Send the oldest read on its way */
            vmar_start_read_task(&aio, &group[0]);
            memmove(&group[0], &group[1], sizeof(group[0]) * --n_groups);
        }
        group[n_groups++] = (VmarAioTask) {
            .task.func = vmar_co_read_task_entry,
            .child = child,
            .offset = toff,
            .bytes = cur,
            .qiov = qiov,
            .qiov_offset = qiov_offset,
        };
        target_reads++;

next:
        bytes -= cur;
        offset += cur;
        qiov_offset += cur;
    }

    for (i = 0; i < n_groups; i++) {
        if (aio_task_pool_status(aio) < 0) {
            /* A read failed: drop the others */
            if (group[i].gathered) {
                qemu_iovec_destroy(&group[i].local);
            }
        } else if (i < n_groups - 1) {
            vmar_start_read_task(&aio, &group[i]);
        } else {
            ret = vmar_co_read_task_entry(&group[i].task);
        }
    }
    if (aio) {
        aio_task_pool_wait_all(aio);
        if (ret == 0) {
            ret = aio_task_pool_status(aio);
        }
        aio_task_pool_free(aio);
    }
    stat64_add(&s->requests, 1);
    stat64_add(&s->bytes_read, bytes_read);
    stat64_add(&s->bytes_zero, bytes_zero);
    stat64_add(&s->bytes_gap, bytes_gap);
    stat64_add(&s->target_reads, target_reads);
    stat64_add(&s->lookups, cursor.lookups);
    stat64_add(&s->probes, cursor.probes);
    if (ret < 0) {
        stat64_add(&s->errors, 1);
        trace_vmar_co_preadv_error(bs, req_offset, req_bytes, ret);
    }
    return ret;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_co_block_status(BlockDriverState *bs, VmarBlockStatusMode mode,
                     int64_t offset, int64_t bytes, int64_t *pnum,
                     int64_t *map, BlockDriverState **file)
{
    BDRVVmarState *s = bs->opaque;
    VmarMap *m = s->map;
    uint32_t shift = m->block_shift;
    uint64_t mask = ((uint64_t)1 << shift) - 1;
    uint64_t vsize = m->hdr.virtual_size;
    uint64_t block, end, limit;
    uint32_t n_extents;
    VmarCursor cursor;
    VmarRun run, first;

    stat64_add(&s->block_status_calls, 1);
    if ((uint64_t)offset >= vsize) {
        /* Tail of the last sector past virtual_size */
        *pnum = bytes;
        return BDRV_BLOCK_ZERO;
    }

    /*
     * The block layer clamps *pnum to @bytes, so look no further than the
     * end of the request: finding the end of a long zero run would scan
     * the occupancy filter for nothing.
     */
    block = (uint64_t)offset >> shift;
    limit = ((uint64_t)offset + bytes + mask) >> shift;
    vmar_cursor_init(m, &cursor);
    vmar_map_lookup(m, &cursor, block, limit, &first);
    end = block + first.n_blocks;

    /*
     * Report consecutive runs of the same kind as one: maps often hold
     * long stretches of small adjacent extents, and the NBD server sends a
     * chunk and issues a read per block status answer.  One read over
     * several extents lets vmar_co_preadv_part() read them in parallel.
     */
    n_extents = first.mapped;
    while (end < limit) {
        vmar_map_lookup(m, &cursor, end, limit, &run);
        if (run.mapped != first.mapped) {
            break;
        }
        n_extents += run.mapped;
        end += run.n_blocks;
    }
    *pnum = MIN(end << shift, vsize) - offset;
    stat64_add(&s->lookups, cursor.lookups);
    stat64_add(&s->probes, cursor.probes);

    if (!first.mapped) {
        return BDRV_BLOCK_ZERO;
    }
    if (n_extents > 1) {
        /* Several extents: no single offset in a single target */
        return BDRV_BLOCK_DATA;
    }
    *map = (first.target_block << shift) + (offset & mask);
    *file = s->targets[m->extents[first.extent].target]->bs;
    return BDRV_BLOCK_DATA | BDRV_BLOCK_OFFSET_VALID;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_co_pwritev_part(BlockDriverState *bs, int64_t offset, int64_t bytes,
                     QEMUIOVector *qiov, size_t qiov_offset,
                     BdrvRequestFlags flags)
{
    return -EPERM;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_co_pwrite_zeroes(BlockDriverState *bs, int64_t offset, int64_t bytes,
                      BdrvRequestFlags flags)
{
    return -EPERM;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_co_pdiscard(BlockDriverState *bs, int64_t offset, int64_t bytes)
{
    return -EPERM;
}

static coroutine_fn GRAPH_RDLOCK int
vmar_co_truncate(BlockDriverState *bs, int64_t offset, bool exact,
                 PreallocMode prealloc, BdrvRequestFlags flags, Error **errp)
{
    error_setg(errp, "vmar images are read-only");
    return -EPERM;
}

static BlockDriver bdrv_vmar = {
    .format_name                = "vmar",
    .instance_size              = sizeof(BDRVVmarState),
    .is_format                  = true,

    .bdrv_open                  = vmar_open,
    .bdrv_close                 = vmar_close,
    .bdrv_reopen_prepare        = vmar_reopen_prepare,
    .bdrv_child_perm            = bdrv_default_perms,
    VMAR_DRV_GETLENGTH          = vmar_co_getlength,
    VMAR_DRV_GET_INFO           = vmar_co_get_info,
    .bdrv_get_specific_info     = vmar_get_specific_info,

    .bdrv_co_preadv_part        = vmar_co_preadv_part,
    .bdrv_co_block_status       = vmar_co_block_status,
    .bdrv_co_pwritev_part       = vmar_co_pwritev_part,
    .bdrv_co_pwrite_zeroes      = vmar_co_pwrite_zeroes,
    .bdrv_co_pdiscard           = vmar_co_pdiscard,
    .bdrv_co_truncate           = vmar_co_truncate,

    .strong_runtime_opts        = vmar_strong_runtime_opts,
};

static void bdrv_vmar_init(void)
{
    bdrv_register(&bdrv_vmar);
}

block_init(bdrv_vmar_init);
