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
 * "vmar:guest_cache=private" into the SMBIOS OEM strings (type 11).  With
 * --mode auto (the default) vmar-guest exits at once on any other server,
 * so images can carry it whatever flavor boots them.
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
#define MS          1000LL
#define OEM_KEY     "vmar:guest_cache="
#define DMI_OEM     "/sys/firmware/dmi/entries/11-%d/raw"

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
    const char *root, *status, *mode;
    int64_t interval, grace, hold, linger, rescan;    /* ms */
    bool once;
    time_t boot_time;
} Options;

static Options opt = {
    .root = "/", .status = "/run/vmar-guest.status", .mode = "auto",
    .interval = 5 * MS, .grace = 1 * MS, .hold = 10 * MS,
    .linger = 120 * MS, .rescan = 600 * MS,
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
             close_drops, dropped_bytes, mincores, syscalls, full;
} stats;

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
 * Until the next pass: take events as they come and drop what closes
 * armed, or just sleep.
 */
static int wait_events(int fan)
{
    int64_t end = clock_ms() + opt.interval;

    for (;;) {
        struct pollfd p = { fan, POLLIN, 0 };
        int64_t ms, due;

        now = clock_ms();
        due = drop_closed();
        ms = end - now;
        if (ms <= 0 || stopping) {
            return 0;
        }
        if (due >= 0 && due < ms) {
            ms = due;
        }
        if (fan < 0) {
            nanosleep(&(struct timespec){ ms / MS, ms % MS * 1000000L },
                      NULL);
            continue;
        }
        stats.syscalls++;
        if (poll(&p, 1, (int)ms) > 0) {
            if (drain(fan) < 0) {
                return -1;
            }
            /* Let events batch up: one wakeup per BATCH_MS at most */
            nanosleep(&(struct timespec){ 0, BATCH_MS * 1000000L }, NULL);
        }
    }
}

/* The host's word on this server: SMBIOS OEM string vmar:guest_cache= */
static bool host_says_private(void)
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
            if (!strncmp(s, OEM_KEY, strlen(OEM_KEY))) {
                return !strcmp(s + strlen(OEM_KEY), "private");
            }
        }
    }
    return false;
}

static time_t read_boot_time(void)
{
    char line[256];
    FILE *f = fopen("/proc/stat", "r");
    long long t = 0;

    if (!f) {
        return 0;
    }
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "btime %lld", &t) == 1) {
            break;
        }
    }
    fclose(f);
    return (time_t)t;
}

static void write_status(void)
{
    char tmp[4096];
    struct rusage ru;
    FILE *f;

    getrusage(RUSAGE_SELF, &ru);
    snprintf(tmp, sizeof(tmp), "%s.tmp", opt.status);
    f = fopen(tmp, "w");
    if (!f) {
        return;
    }
    fprintf(f, "passes=%" PRIu64 " tracked=%u events=%" PRIu64
            " closes=%" PRIu64 " walks=%" PRIu64
            " walked_files=%" PRIu64 " drops=%" PRIu64
            " close_drops=%" PRIu64
            " dropped_bytes=%" PRIu64 " mincores=%" PRIu64
            " syscalls=%" PRIu64 " table_full=%" PRIu64
            " cpu_user_s=%ld.%06ld cpu_sys_s=%ld.%06ld\n",
            stats.passes, tracked, stats.events, stats.closes, stats.walks,
            stats.walked_files,
            stats.drops, stats.close_drops, stats.dropped_bytes,
            stats.mincores,
            stats.syscalls, stats.full,
            (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec,
            (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec);
    fclose(f);
    rename(tmp, opt.status);
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s [--mode auto|private] [--root DIR] "
            "[--grace S] [--hold S] [--interval S] [--linger S] "
            "[--rescan S] [--once] [--status FILE] [--boot-time EPOCH]\n"
            "(S: seconds, fractions allowed)\n", argv0);
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

int main(int argc, char **argv)
{
    struct rlimit nofile = { TABLE_SIZE + 256, TABLE_SIZE + 256 };
    int64_t last_walk;
    int fan = -1;

    if (parse_options(argc, argv)) {
        return 2;
    }
    if (!strcmp(opt.mode, "auto") && !host_says_private()) {
        printf("vmar-guest: the host did not ask for guest-private caching "
               "(no %sprivate SMBIOS OEM string); nothing to do\n", OEM_KEY);
        return 0;
    }
    page_size = sysconf(_SC_PAGESIZE);
    self = getpid();
    if (!opt.boot_time) {
        opt.boot_time = read_boot_time();
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
    printf("vmar-guest: guest-private caching of %s: grace %.1f s after "
           "close, hold %.1f s, %s\n", opt.root, opt.grace / 1e3,
           opt.hold / 1e3, fan >= 0 ? "fanotify" : "walks only");
    fflush(stdout);

    now = clock_ms();
    if (walk() < 0) {
        return 1;
    }
    last_walk = now;
    while (!stopping) {
        now = clock_ms();
        pass();
        write_status();
        if (opt.once) {
            break;
        }
        if (wait_events(fan) < 0) {
            fprintf(stderr, "vmar-guest: fanotify: %s\n", strerror(errno));
            return 1;
        }
        now = clock_ms();
        if (fan < 0 || (opt.rescan && now - last_walk >= opt.rescan)) {
            if (walk() < 0) {
                return 1;
            }
            last_walk = now;
        }
    }
    return 0;
}
