/*
 * vmar-guest: guest-private caching inside a guest, without a kernel patch.
 *
 * VMAR's second cache mode (vmar:guest_cache=private): the host caches base
 * data once, and each guest caches only its private data.  The rule is the
 * one of the P policy of "functional partitioning": data of files not
 * modified since boot is base data, files written after boot are private.
 * Base data is dropped (posix_fadvise POSIX_FADV_DONTNEED) --grace seconds
 * after the last close of its file, the nearest a program can come to the
 * paper's O_DIRECT reads; while a base file stays open its data is dropped
 * every --hold seconds.  Private files are never touched.  The base data is
 * still in the host's page cache, so a later read costs a virtio round
 * trip, not a disk read, and the memory the guest frees goes back to the
 * host through the balloon's free page reporting.
 *
 * How it finds the files (doc/source/guest.rst has the measurements):
 *  - at start, and every --rescan seconds, a walk of the root filesystem
 *    (never crossing mounts) picks up base files with cached pages;
 *  - in between, fanotify (FAN_MARK_FILESYSTEM, FAN_OPEN and
 *    FAN_CLOSE_NOWRITE) reports every file opened and closed on that
 *    filesystem, with an fd; the base ones are tracked until --linger
 *    seconds after their last open.
 * A close arms the file's drop; every --interval seconds a pass drops what
 * has been held past --hold.  mincore counts what each drop frees.
 *
 * The host says whether a server is guest-private: Nova's vmar backend puts
 * "vmar:guest_cache=private" or "vmar:guest_cache=auto" into the SMBIOS OEM
 * strings (type 11).  With --mode auto (the default) vmar-guest exits at
 * once on any other server, so images can carry it whatever flavor boots
 * them.  On an "auto" server the host switches the mode at run time: it
 * writes "mode=private" or "mode=default" lines into the virtio-serial
 * port --channel (org.opendev.vmar.guest.0), and vmar-guest answers each
 * with its status line.  In default mode it tracks nothing and leaves the
 * guest's cache and the kernel's settings as they were.
 *
 * Memory comes back to the host through the balloon's free page reporting,
 * which reports free blocks of 2^page_reporting_order pages only.  The
 * drops free scattered 4 KiB pages, so while private, vmar-guest lowers
 * /sys/module/page_reporting/parameters/page_reporting_order to
 * --reporting-order (or the OEM string vmar:guest_reporting_order=N), and
 * puts the kernel's value back when it leaves private mode.
 *
 * Counters (cumulative) go to --status after each pass, one line of
 * key=value pairs, so its cost can be measured and bounded.
 *
 * This work is licensed under the Apache License, Version 2.0.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TABLE_BITS  14                  /* tracked files: up to 16384 */
#define TABLE_SIZE  (1u << TABLE_BITS)
#define BATCH_MS    100                 /* fanotify reads at most 10/s */
#define WALK_LOOK   64                  /* walked files between looks at
                                           the clock */
#define MS          1000LL
/* seconds an auto guest waits for its channel's device node */
#define CHANNEL_WAIT_S 300
#define OEM_KEY     "vmar:guest_cache="
#define OEM_ORDER   "vmar:guest_reporting_order="
#define OEM_COMPACT "vmar:guest_compact="
#define DMI_OEM     "/sys/firmware/dmi/entries/11-%d/raw"
#define ORDER_KNOB  "/sys/module/page_reporting/parameters/page_reporting_order"
#define COMPACT_KNOB "/proc/sys/vm/compact_memory"
#define COMPACT_MIN (16ull << 20)       /* dropped before a compaction */
#define COMPACT_GAP (30 * MS)           /* between two compactions */

/* A tracked base file: an fd on it, and its times (monotonic ms) */
typedef struct Tracked {
    dev_t dev;
    ino_t ino;
    int fd;                             /* -1: free slot */
    int64_t since;                      /* held since (came into view, or
                                           its last drop) */
    int64_t opened;                     /* last opened */
    int64_t due;                        /* drop armed by a close, or 0 */
} Tracked;

/* Files whose drop a close armed, in the order they were armed */
typedef struct Closed {
    dev_t dev;
    ino_t ino;
    int64_t due;                        /* as armed */
} Closed;

typedef struct Options {
    const char *root, *status, *mode, *channel;
    int64_t interval, grace, hold, linger, rescan;    /* ms */
    int reporting_order;                /* -1: leave the kernel's */
    bool compact;
    bool once;
    time_t boot_time;
} Options;

static Options opt = {
    .root = "/", .status = "/run/vmar-guest.status", .mode = "auto",
    .channel = "/dev/virtio-ports/org.opendev.vmar.guest.0",
    .interval = 5 * MS, .grace = 1 * MS, .hold = 10 * MS,
    .linger = 120 * MS, .rescan = 600 * MS, .reporting_order = 0,
};

static Tracked table[TABLE_SIZE];
static unsigned tracked;
static Closed closed[TABLE_SIZE];
static unsigned closed_head, closed_len;
static long page_size;
static int64_t now;
static pid_t self;

static int64_t clock_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * MS + t.tv_nsec / 1000000;
}

static struct {
    uint64_t passes, events, closes, walks, walked_files, drops,
             close_drops, dropped_bytes, mincores, syscalls, full,
             compactions, switches;
} stats;

/* Whether base data is being dropped now (private mode) */
static bool active;
static int fan = -1;                    /* fanotify, while active */
static int chan = -1;                   /* the host's channel, if any */
static int saved_order = -1;            /* the kernel's, while we set ours */
static uint64_t compacted_at_bytes;     /* dropped_bytes at the last one */
static int64_t compacted_at;
static int64_t walk_served;             /* when a walk last served events */

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static bool is_base(const struct stat *st)
{
    return S_ISREG(st->st_mode) && st->st_size > 0 &&
        st->st_mtime < opt.boot_time && st->st_ctime < opt.boot_time;
}

/* The slot of (dev, ino), or the free slot where it would go, or NULL */
static Tracked *slot(dev_t dev, ino_t ino)
{
    uint64_t h = ((uint64_t)dev * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)ino;
    uint32_t i, n;

    h *= 0xff51afd7ed558ccdULL;
    i = (uint32_t)(h >> (64 - TABLE_BITS));
    for (n = 0; n < TABLE_SIZE; n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        Tracked *t = &table[i];
        if (t->fd < 0 || (t->dev == dev && t->ino == ino)) {
            return t;
        }
    }
    return NULL;
}

static void untrack(Tracked *t)
{
    close(t->fd);
    stats.syscalls++;
    t->fd = -1;
    tracked--;
    /* Linear probing: re-place the run that follows the freed slot */
    for (uint32_t i = (t - table + 1) & (TABLE_SIZE - 1);
         table[i].fd >= 0; i = (i + 1) & (TABLE_SIZE - 1)) {
        Tracked moved = table[i];
        table[i].fd = -1;
        *slot(moved.dev, moved.ino) = moved;
    }
}

/*
 * Take a file the kernel handed us (an fanotify event's fd or one the walk
 * opened): track it if it is base data, else close it.  Owns @fd.  Returns
 * the file's entry if it is tracked now.
 */
static Tracked *offer(int fd, const struct stat *st)
{
    Tracked *t = slot(st->st_dev, st->st_ino);

    if (t && t->fd < 0 && is_base(st) && tracked < TABLE_SIZE * 3 / 4) {
        *t = (Tracked){ st->st_dev, st->st_ino, fd, now, now, 0 };
        tracked++;
        return t;
    }
    close(fd);
    stats.syscalls++;
    if (t && t->fd >= 0) {
        if (is_base(st)) {
            t->opened = now;
            return t;
        }
        untrack(t);                     /* written since: private now */
    } else if (is_base(st)) {
        stats.full++;                   /* waits for the next walk */
    }
    return NULL;
}

/* Bytes of the file's pages in the page cache */
static uint64_t cached_bytes(int fd, off_t size)
{
    size_t pages = (size + page_size - 1) / page_size;
    unsigned char *vec;
    uint64_t n = 0;
    void *map;

    map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    stats.syscalls++;
    stats.mincores++;
    if (map == MAP_FAILED) {
        return 0;
    }
    vec = malloc(pages);
    if (vec && mincore(map, size, vec) == 0) {
        for (size_t i = 0; i < pages; i++) {
            n += vec[i] & 1;
        }
    }
    stats.syscalls += 2;                /* mincore, munmap */
    free(vec);
    munmap(map, size);
    return n * page_size;
}

/*
 * Drop @t's cached data if it is still base data; false if it is not (the
 * caller untracks it).  Counts what it frees.
 */
static bool drop(Tracked *t, bool *dropped)
{
    struct stat st;
    uint64_t bytes;

    *dropped = false;
    stats.syscalls++;
    if (fstat(t->fd, &st) < 0 || !is_base(&st)) {
        return false;
    }
    bytes = cached_bytes(t->fd, st.st_size);
    if (bytes) {
        posix_fadvise(t->fd, 0, 0, POSIX_FADV_DONTNEED);
        stats.syscalls++;
        stats.drops++;
        stats.dropped_bytes += bytes;
        t->since = now;                 /* what is read again gets its own */
        *dropped = true;
    }
    return true;
}

/* Drop what has been held past --hold; forget what went quiet */
static void pass(void)
{
    stats.passes++;
    for (uint32_t i = 0; i < TABLE_SIZE; i++) {
        Tracked *t = &table[i];
        bool dropped;

        if (t->fd < 0 || now - t->since < opt.hold) {
            continue;
        }
        if (!drop(t, &dropped) ||
            (!dropped && !t->due && now - t->opened >= opt.linger)) {
            untrack(t);
            i--;                        /* the slot may hold a moved one */
        }
    }
}

/*
 * A tracked file was closed: drop its data --grace from now.  Closes while
 * a drop is armed do not put it off, so a file reopened all the time is
 * still dropped every --grace.
 */
static void arm(Tracked *t)
{
    if (t->due) {
        return;
    }
    if (closed_len == TABLE_SIZE) {
        return;                         /* the pass sees to it */
    }
    t->due = now + opt.grace;
    closed[(closed_head + closed_len++) % TABLE_SIZE] =
        (Closed){ t->dev, t->ino, t->due };
}

/*
 * Drop the files whose drop a close armed and that are due now; returns
 * the ms until the next one falls due, or -1 if none is armed.
 */
static int64_t drop_closed(void)
{
    while (closed_len) {
        Closed c = closed[closed_head];
        Tracked *t;
        bool dropped;

        if (c.due > now) {
            return c.due - now;
        }
        closed_head = (closed_head + 1) % TABLE_SIZE;
        closed_len--;
        t = slot(c.dev, c.ino);
        if (!t || t->fd < 0 || t->due != c.due) {
            continue;                   /* forgotten since */
        }
        t->due = 0;
        if (!drop(t, &dropped)) {
            untrack(t);
        } else if (dropped) {
            stats.close_drops++;
        }
    }
    return -1;
}

static int drain(int fan);

/*
 * A walk of a guest's whole filesystem can take a minute under TCG on a
 * loaded host (seen in the cloud user path: the first walk outlasted the
 * test probe's 60 s, and what the probe read stayed cached until its end).
 * So between its files, every BATCH_MS, the walk serves what fanotify saw
 * and drops what is due, its own finds among them.
 */
static int serve_during_walk(void)
{
    if (stats.walked_files % WALK_LOOK) {
        return 0;
    }
    now = clock_ms();
    if (now - walk_served < BATCH_MS) {
        return 0;
    }
    walk_served = now;
    if (fan >= 0 && drain(fan) < 0) {
        return -1;
    }
    drop_closed();
    pass();
    return 0;
}

static int visit(const char *path, const struct stat *st, int flag,
                 struct FTW *ftw)
{
    Tracked *t;
    int fd;

    (void)ftw;
    if (stopping) {
        return 1;
    }
    if (flag != FTW_F || !is_base(st)) {
        return 0;
    }
    stats.walked_files++;
    if (serve_during_walk() < 0) {
        return -1;
    }
    t = slot(st->st_dev, st->st_ino);
    if (t && t->fd >= 0) {
        return 0;                       /* tracked: the pass sees to it */
    }
    fd = open(path, O_RDONLY | O_NOATIME | O_CLOEXEC | O_NOFOLLOW);
    stats.syscalls++;
    if (fd < 0 && errno == EPERM) {     /* O_NOATIME on another's file */
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        stats.syscalls++;
    }
    if (fd < 0) {
        return 0;
    }
    if (cached_bytes(fd, st->st_size)) {
        t = offer(fd, st);
        if (t) {
            /* Cached before we looked: its grace period is long over */
            t->since = now - opt.hold;
        }
    } else {
        close(fd);
        stats.syscalls++;
    }
    return 0;
}

static int walk(void)
{
    stats.walks++;
    if (nftw(opt.root, visit, 32, FTW_PHYS | FTW_MOUNT) < 0) {
        fprintf(stderr, "vmar-guest: walking %s: %s\n", opt.root,
                strerror(errno));
        return -1;
    }
    return 0;
}

/*
 * The mark covers the whole filesystem; with a --root below its top, keep
 * only the files under it (one readlink per event).
 */
static bool under_root(int fd)
{
    char link[64], path[4096];
    size_t n = strlen(opt.root);
    ssize_t len;

    if (!strcmp(opt.root, "/")) {
        return true;
    }
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    len = readlink(link, path, sizeof(path) - 1);
    stats.syscalls++;
    if (len < 0) {
        return false;
    }
    path[len] = 0;
    return !strncmp(path, opt.root, n) && path[n] == '/';
}

/* Read all pending fanotify events; returns -1 on a fatal error */
static int drain(int fan)
{
    char buf[8192] __attribute__((aligned(__alignof__(
        struct fanotify_event_metadata))));

    for (;;) {
        const struct fanotify_event_metadata *ev;
        ssize_t len = read(fan, buf, sizeof(buf));

        stats.syscalls++;
        if (len < 0) {
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        }
        now = clock_ms();
        for (ev = (void *)buf; FAN_EVENT_OK(ev, len);
             ev = FAN_EVENT_NEXT(ev, len)) {
            struct stat st;
            Tracked *t;

            if (ev->vers != FANOTIFY_METADATA_VERSION) {
                errno = EPROTO;
                return -1;
            }
            if (ev->fd < 0) {           /* FAN_Q_OVERFLOW: the walk */
                continue;               /* catches what we missed */
            }
            if (ev->pid == self) {      /* the walk's own opens */
                close(ev->fd);
                stats.syscalls++;
                continue;
            }
            stats.events++;
            stats.syscalls++;
            if (fstat(ev->fd, &st) < 0 || !under_root(ev->fd)) {
                close(ev->fd);
                continue;
            }
            t = offer(ev->fd, &st);
            if (t && (ev->mask & FAN_CLOSE_NOWRITE)) {
                stats.closes++;
                arm(t);
            }
        }
    }
}

/*
 * Lines from the host: "mode=private" or "mode=default".  Returns the mode
 * the last complete line asked for (1 private, 0 default), or -1 if none.
 */
static int read_channel(void)
{
    static char buf[256];
    static size_t len;
    int want = -1;

    for (;;) {
        ssize_t n = read(chan, buf + len, sizeof(buf) - 1 - len);
        char *line, *nl;

        if (n <= 0) {
            return want;                /* EAGAIN, or the host went away */
        }
        len += n;
        buf[len] = 0;
        line = buf;
        while ((nl = strchr(line, '\n'))) {
            *nl = 0;
            if (!strcmp(line, "mode=private")) {
                want = 1;
            } else if (!strcmp(line, "mode=default")) {
                want = 0;
            }
            line = nl + 1;
        }
        len -= line - buf;
        memmove(buf, line, len);
        if (len == sizeof(buf) - 1) {
            len = 0;                    /* a line too long: not ours */
        }
    }
}

/*
 * Until the next pass: take events as they come and drop what closes
 * armed, or just sleep; read what the host says.  Returns 1 if the host
 * asked for a change of mode, -1 on a fatal error.
 */
static int wait_events(void)
{
    int64_t end = clock_ms() + opt.interval;
    bool hup = false;

    for (;;) {
        struct pollfd p[2] = { { fan, POLLIN, 0 },
                               { hup ? -1 : chan, POLLIN, 0 } };
        int64_t ms, due;
        int want;

        now = clock_ms();
        due = active ? drop_closed() : -1;
        ms = end - now;
        if (ms <= 0 || stopping) {
            return 0;
        }
        if (due >= 0 && due < ms) {
            ms = due;
        }
        stats.syscalls++;
        if (poll(p, 2, (int)ms) <= 0) {
            continue;
        }
        if (p[1].revents & POLLIN) {
            want = read_channel();
            if (want >= 0 && want != active) {
                return 1;
            }
        } else if (p[1].revents & (POLLHUP | POLLERR)) {
            /* no host on the other end: look again at the next pass */
            hup = true;
        }
        if (p[0].revents & POLLIN) {
            if (drain(fan) < 0) {
                return -1;
            }
            /* Let events batch up: one wakeup per BATCH_MS at most */
            nanosleep(&(struct timespec){ 0, BATCH_MS * 1000000L }, NULL);
        }
    }
}

/*
 * The value of the SMBIOS OEM string (type 11) "@key<value>", copied into
 * @out; false if the server has none.
 */
static bool oem_value(const char *key, char *out, size_t size)
{
    for (int n = 0; n < 16; n++) {
        unsigned char raw[4096];
        char path[64];
        size_t len, i;
        FILE *f;

        snprintf(path, sizeof(path), DMI_OEM, n);
        f = fopen(path, "rb");
        if (!f) {
            break;
        }
        len = fread(raw, 1, sizeof(raw) - 1, f);
        fclose(f);
        if (len < 5 || raw[0] != 11 || raw[1] >= len) {
            continue;
        }
        raw[len] = 0;
        /* Strings follow the formatted area, each NUL-terminated */
        for (i = raw[1]; i < len && raw[i]; i += strlen((char *)raw + i) + 1) {
            const char *s = (const char *)raw + i;
            if (!strncmp(s, key, strlen(key))) {
                snprintf(out, size, "%s", s + strlen(key));
                return true;
            }
        }
    }
    return false;
}

/* An integer sysfs/procfs knob; -1 if it cannot be read */
static int read_knob(const char *path)
{
    FILE *f = fopen(path, "r");
    int v = -1;

    if (f) {
        if (fscanf(f, "%d", &v) != 1) {
            v = -1;
        }
        fclose(f);
    }
    return v;
}

static bool write_knob(const char *path, int value)
{
    FILE *f = fopen(path, "w");
    bool ok;

    if (!f) {
        return false;
    }
    ok = fprintf(f, "%d\n", value) > 0;
    ok &= fclose(f) == 0;
    return ok;
}

/*
 * While private: keep the kernel's page reporting order at ours.  The
 * balloon driver sets it when it registers (after we may have started),
 * so each pass looks again.
 */
static void hold_reporting_order(void)
{
    int cur;

    if (opt.reporting_order < 0) {
        return;
    }
    cur = read_knob(ORDER_KNOB);
    if (cur < 0 || cur == opt.reporting_order) {
        return;                         /* no free page reporting here */
    }
    if (saved_order < 0) {
        saved_order = cur;
    }
    if (!write_knob(ORDER_KNOB, opt.reporting_order)) {
        fprintf(stderr, "vmar-guest: setting %s to %d: %s\n", ORDER_KNOB,
                opt.reporting_order, strerror(errno));
        opt.reporting_order = -1;       /* do not try every pass */
    }
}

static void restore_reporting_order(void)
{
    if (saved_order >= 0) {
        write_knob(ORDER_KNOB, saved_order);
        saved_order = -1;
    }
}

/*
 * With --compact: once the drops freed COMPACT_MIN since the last one (and
 * no sooner than COMPACT_GAP), compact memory, so that the freed pages form
 * blocks free page reporting takes at the kernel's order.
 */
static void maybe_compact(void)
{
    if (!opt.compact ||
        stats.dropped_bytes - compacted_at_bytes < COMPACT_MIN ||
        (compacted_at && now - compacted_at < COMPACT_GAP)) {
        return;
    }
    if (write_knob(COMPACT_KNOB, 1)) {
        stats.compactions++;
    }
    compacted_at_bytes = stats.dropped_bytes;
    compacted_at = clock_ms();
}


/*
 * The number of the first line of @path (a /proc file of "key value"
 * lines) that @format, a scanf format with one %lld, matches; 0 if none.
 */
static long long proc_value(const char *path, const char *format)
{
    char line[256];
    long long v = 0;
    FILE *f = fopen(path, "r");

    if (!f) {
        return 0;
    }
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, format, &v) == 1) {
            break;
        }
    }
    fclose(f);
    return v;
}

/* The status line, to the status file and to the host's channel */
static void write_status(void)
{
    char line[1024], tmp[4096];
    struct rusage ru;
    int len;
    FILE *f;

    getrusage(RUSAGE_SELF, &ru);
    len = snprintf(line, sizeof(line),
            "mode=%s passes=%" PRIu64 " tracked=%u events=%" PRIu64
            " closes=%" PRIu64 " walks=%" PRIu64
            " walked_files=%" PRIu64 " drops=%" PRIu64
            " close_drops=%" PRIu64
            " dropped_bytes=%" PRIu64 " mincores=%" PRIu64
            " syscalls=%" PRIu64 " table_full=%" PRIu64
            " compactions=%" PRIu64 " switches=%" PRIu64
            " reporting_order=%d mem_free_kb=%lld refaulted_bytes=%lld"
            " cpu_user_s=%ld.%06ld cpu_sys_s=%ld.%06ld\n",
            active ? "private" : "default",
            stats.passes, tracked, stats.events, stats.closes, stats.walks,
            stats.walked_files,
            stats.drops, stats.close_drops, stats.dropped_bytes,
            stats.mincores,
            stats.syscalls, stats.full, stats.compactions, stats.switches,
            read_knob(ORDER_KNOB), proc_value("/proc/meminfo",
                                              "MemFree: %lld kB"),
            /* file pages read again soon after they were reclaimed: a
             * page cache too small for what the guest reads */
            proc_value("/proc/vmstat", "workingset_refault_file %lld") *
            page_size,
            (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec,
            (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec);
    if (chan >= 0 && write(chan, line, len) < 0) {
        /* the host is not listening: it reads the next one */
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", opt.status);
    f = fopen(tmp, "w");
    if (!f) {
        return;
    }
    fputs(line, f);
    fclose(f);
    rename(tmp, opt.status);
}

/* Start dropping base data: fanotify, the first walk, our reporting order */
static int enter_private(void)
{
    if (!opt.once) {
        fan = fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK,
                            O_RDONLY | O_LARGEFILE | O_CLOEXEC | O_NOATIME);
        if (fan < 0 ||
            fanotify_mark(fan, FAN_MARK_ADD | FAN_MARK_FILESYSTEM,
                          FAN_OPEN | FAN_CLOSE_NOWRITE, AT_FDCWD,
                          opt.root) < 0) {
            fprintf(stderr, "vmar-guest: fanotify on %s: %s; walking every "
                    "%.1f s instead\n", opt.root, strerror(errno),
                    opt.interval / 1e3);
            if (fan >= 0) {
                close(fan);
            }
            fan = -1;
        }
    }
    active = true;
    hold_reporting_order();
    printf("vmar-guest: guest-private caching of %s: grace %.1f s after "
           "close, hold %.1f s, %s, page reporting order %d\n", opt.root,
           opt.grace / 1e3, opt.hold / 1e3,
           fan >= 0 ? "fanotify" : "walks only", read_knob(ORDER_KNOB));
    fflush(stdout);
    now = clock_ms();
    return walk();
}

/* Stop: forget every file, leave the cache and the kernel as they were */
static void leave_private(void)
{
    if (fan >= 0) {
        close(fan);
        fan = -1;
    }
    for (uint32_t i = 0; i < TABLE_SIZE; i++) {
        if (table[i].fd >= 0) {
            close(table[i].fd);
            table[i].fd = -1;
        }
    }
    tracked = 0;
    closed_head = closed_len = 0;
    restore_reporting_order();
    active = false;
    printf("vmar-guest: guest-private caching off\n");
    fflush(stdout);
}

/*
 * The channel's device node, waiting up to wait_s seconds for it: udev
 * makes /dev/virtio-ports/<name> when it has seen the port, and on a
 * loaded host that can be after this service started (seen in the cloud
 * user path: vmar-guest gave up 21 s into a boot, and an auto server
 * never heard from the host).
 */
static int open_channel(const char *path, int wait_s)
{
    for (int tries = 0;; tries++) {
        int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);

        if (fd >= 0 || errno != ENOENT || tries >= wait_s * 2) {
            return fd;
        }
        if (!tries) {
            printf("vmar-guest: waiting up to %d s for the channel %s\n",
                   wait_s, path);
            fflush(stdout);
        }
        nanosleep(&(struct timespec){ 0, 500 * 1000000L }, NULL);
    }
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s [--mode auto|private] [--root DIR] "
            "[--grace S] [--hold S] [--interval S] [--linger S] "
            "[--rescan S] [--once] [--status FILE] [--boot-time EPOCH] "
            "[--channel PATH] [--reporting-order N] [--compact]\n"
            "(S: seconds, fractions allowed; N: -1 leaves the kernel's)\n",
            argv0);
    return 2;
}

/* Seconds (a fraction allowed) as ms; false unless a number >= 0 */
static bool seconds(const char *arg, int64_t *ms)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= 0 && v < 1e9)) {
        return false;
    }
    *ms = (int64_t)(v * MS + 0.5);
    return true;
}

/* A page order, -1 to 10 (MAX_ORDER of x86); false otherwise */
static bool order(const char *arg, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < -1 || v > 10) {
        return false;
    }
    *out = (int)v;
    return true;
}

static int parse_options(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"mode", required_argument, NULL, 'm'},
        {"root", required_argument, NULL, 'r'},
        {"interval", required_argument, NULL, 'i'},
        {"grace", required_argument, NULL, 'g'},
        {"hold", required_argument, NULL, 'h'},
        {"linger", required_argument, NULL, 'l'},
        {"rescan", required_argument, NULL, 'R'},
        {"once", no_argument, NULL, 'o'},
        {"status", required_argument, NULL, 's'},
        {"boot-time", required_argument, NULL, 'b'},
        {"channel", required_argument, NULL, 'c'},
        {"reporting-order", required_argument, NULL, 'O'},
        {"compact", no_argument, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    bool ok = true;
    int c;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': opt.mode = optarg; break;
        case 'r': opt.root = optarg; break;
        case 'i': ok &= seconds(optarg, &opt.interval); break;
        case 'g': ok &= seconds(optarg, &opt.grace); break;
        case 'h': ok &= seconds(optarg, &opt.hold); break;
        case 'l': ok &= seconds(optarg, &opt.linger); break;
        case 'R': ok &= seconds(optarg, &opt.rescan); break;
        case 'o': opt.once = true; break;
        case 's': opt.status = optarg; break;
        case 'b': opt.boot_time = (time_t)atoll(optarg); break;
        case 'c': opt.channel = optarg; break;
        case 'O': ok &= order(optarg, &opt.reporting_order); break;
        case 'C': opt.compact = true; break;
        default: return usage(argv[0]);
        }
    }
    if (!ok || optind != argc || opt.interval < 100 ||
        opt.linger < opt.hold || opt.linger < opt.grace ||
        (strcmp(opt.mode, "auto") && strcmp(opt.mode, "private"))) {
        return usage(argv[0]);
    }
    return 0;
}

/*
 * The host's word: "private" or "auto" (the host switches at run time);
 * anything else, or no word, is "none".  Also the host's settings of the
 * reporting order and compaction, which win over the command line.
 */
static const char *host_mode(void)
{
    char value[64];

    if (oem_value(OEM_ORDER, value, sizeof(value)) &&
        !order(value, &opt.reporting_order)) {
        fprintf(stderr, "vmar-guest: ignoring %s%s\n", OEM_ORDER, value);
    }
    if (oem_value(OEM_COMPACT, value, sizeof(value))) {
        opt.compact = !strcmp(value, "1");
    }
    if (!oem_value(OEM_KEY, value, sizeof(value))) {
        return "none";
    }
    if (!strcmp(value, "private")) {
        return "private";
    }
    return strcmp(value, "auto") ? "none" : "auto";
}

int main(int argc, char **argv)
{
    struct rlimit nofile = { TABLE_SIZE + 256, TABLE_SIZE + 256 };
    const char *mode = "private";
    int64_t last_walk;

    if (parse_options(argc, argv)) {
        return 2;
    }
    if (!strcmp(opt.mode, "auto")) {
        mode = host_mode();
    }
    if (!strcmp(mode, "none")) {
        printf("vmar-guest: the host did not ask for guest-private caching "
               "(no %sprivate or %sauto SMBIOS OEM string); nothing to "
               "do\n", OEM_KEY, OEM_KEY);
        return 0;
    }
    chan = open_channel(opt.channel, !strcmp(mode, "auto")
                        ? CHANNEL_WAIT_S : 0);
    if (chan < 0 && !strcmp(mode, "auto")) {
        fprintf(stderr, "vmar-guest: the host switches this server's mode "
                "but there is no channel %s: %s; nothing to do\n",
                opt.channel, strerror(errno));
        return 0;
    }
    page_size = sysconf(_SC_PAGESIZE);
    self = getpid();
    if (!opt.boot_time) {
        opt.boot_time = (time_t)proc_value("/proc/stat", "btime %lld");
    }
    if (!opt.boot_time) {
        fprintf(stderr, "vmar-guest: no boot time in /proc/stat\n");
        return 1;
    }
    for (uint32_t i = 0; i < TABLE_SIZE; i++) {
        table[i].fd = -1;
    }
    setrlimit(RLIMIT_NOFILE, &nofile);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);

    if (!strcmp(mode, "private") && enter_private() < 0) {
        return 1;
    }
    if (!active) {
        printf("vmar-guest: the host switches guest-private caching on %s; "
               "off until it asks\n", opt.channel);
        fflush(stdout);
    }
    last_walk = clock_ms();
    while (!stopping) {
        int changed;

        now = clock_ms();
        if (chan < 0) {
            /* a private guest does not wait for the channel at start: its
             * device node may come later (udev on a loaded host), and the
             * host learns the guest's mode only through it */
            chan = open(opt.channel, O_RDWR | O_NONBLOCK | O_CLOEXEC);
            if (chan >= 0) {
                printf("vmar-guest: the channel %s is there now\n",
                       opt.channel);
                fflush(stdout);
            }
        }
        if (active) {
            hold_reporting_order();
            pass();
            maybe_compact();
        }
        write_status();
        if (opt.once) {
            break;
        }
        changed = wait_events();
        if (changed < 0) {
            fprintf(stderr, "vmar-guest: fanotify: %s\n", strerror(errno));
            restore_reporting_order();
            return 1;
        }
        if (changed > 0) {
            stats.switches++;
            if (active) {
                leave_private();
            } else if (enter_private() < 0) {
                restore_reporting_order();
                return 1;
            }
            last_walk = clock_ms();
            continue;
        }
        now = clock_ms();
        if (active &&
            (fan < 0 || (opt.rescan && now - last_walk >= opt.rescan))) {
            if (walk() < 0) {
                restore_reporting_order();
                return 1;
            }
            last_walk = now;
        }
    }
    restore_reporting_order();
    return 0;
}
