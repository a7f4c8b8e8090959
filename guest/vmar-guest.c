/*
 * vmar-guest: guest-private caching inside a guest, without a kernel patch.
 *
 * VMAR's second cache mode (vmar:guest_cache=private): the host caches base
 * data once, and each guest caches only its private data.  The rule is the
 * one of the P policy of "functional partitioning": data of files not
 * modified since boot is base data, files written after boot are private.
 * Every --interval seconds this walks one filesystem (the root by default,
 * never crossing mounts); for each regular file whose mtime and ctime are
 * both before boot, it counts the file's pages in the page cache (mmap +
 * mincore) and, once they have stayed there for --grace seconds, drops them
 * (posix_fadvise POSIX_FADV_DONTNEED).  Files written since boot are never
 * touched.  The base data is still in the host's page cache, so a later
 * read costs an NBD round trip, not a disk read.
 *
 * After each pass it writes one line of counters to --status (default
 * /run/vmar-guest.status): files seen, base files with cached pages, bytes
 * dropped, system calls made and CPU seconds used, so its cost can be
 * measured and bounded.
 *
 * Usage: vmar-guest [--root DIR] [--interval S] [--grace S] [--once]
 *                   [--status FILE] [--boot-time EPOCH]
 *
 * This work is licensed under the Apache License, Version 2.0.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TABLE_BITS  16                  /* tracked files: up to 65536 */
#define TABLE_SIZE  (1u << TABLE_BITS)

/* A base file seen with cached pages: since when (pass start time) */
struct seen {
    dev_t dev;
    ino_t ino;
    time_t since;                       /* 0: free slot */
};

static struct seen table[TABLE_SIZE];
static long page_size;
static time_t boot_time, pass_start;
static long grace = 30;

static struct {
    uint64_t files, base_cached, dropped_files, dropped_bytes,
             cached_bytes, syscalls;
} pass;

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static struct seen *lookup(dev_t dev, ino_t ino, int insert)
{
    uint64_t h = ((uint64_t)dev * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)ino;
    uint32_t i, n;

    h *= 0xff51afd7ed558ccdULL;
    i = (uint32_t)(h >> (64 - TABLE_BITS));
    for (n = 0; n < TABLE_SIZE; n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        struct seen *s = &table[i];
        if (s->since && s->dev == dev && s->ino == ino) {
            return s;
        }
        if (!s->since) {
            if (!insert) {
                return NULL;
            }
            s->dev = dev;
            s->ino = ino;
            s->since = pass_start;
            return s;
        }
    }
    return NULL;                        /* full: the file waits a pass */
}

/* Bytes of the file's pages in the page cache */
static uint64_t cached_bytes(int fd, off_t size)
{
    size_t pages = (size + page_size - 1) / page_size;
    unsigned char *vec;
    uint64_t n = 0;
    void *map;
    size_t i;

    map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    pass.syscalls++;
    if (map == MAP_FAILED) {
        return 0;
    }
    vec = malloc(pages);
    if (vec && mincore(map, size, vec) == 0) {
        for (i = 0; i < pages; i++) {
            n += vec[i] & 1;
        }
    }
    pass.syscalls += 2;                 /* mincore, munmap */
    free(vec);
    munmap(map, size);
    return n * page_size;
}

static int visit(const char *path, const struct stat *st, int flag,
                 struct FTW *ftw)
{
    struct seen *s;
    uint64_t bytes;
    int fd;

    (void)ftw;
    if (stopping) {
        return 1;
    }
    if (flag != FTW_F || !S_ISREG(st->st_mode) || st->st_size == 0) {
        return 0;
    }
    pass.files++;
    if (st->st_mtime >= boot_time || st->st_ctime >= boot_time) {
        return 0;                       /* private: written since boot */
    }
    fd = open(path, O_RDONLY | O_NOATIME | O_CLOEXEC | O_NOFOLLOW);
    pass.syscalls++;
    if (fd < 0 && errno == EPERM) {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        pass.syscalls++;
    }
    if (fd < 0) {
        return 0;
    }
    bytes = cached_bytes(fd, st->st_size);
    if (bytes == 0) {
        s = lookup(st->st_dev, st->st_ino, 0);
        if (s) {
            s->since = pass_start;      /* re-armed when read again */
        }
    } else {
        pass.base_cached++;
        pass.cached_bytes += bytes;
        s = lookup(st->st_dev, st->st_ino, 1);
        if (s && pass_start - s->since >= grace) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            pass.syscalls++;
            pass.dropped_files++;
            pass.dropped_bytes += bytes;
            s->since = pass_start;
        }
    }
    close(fd);
    pass.syscalls++;
    return 0;
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

static double cpu_seconds(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec
        + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void write_status(const char *path, double cpu, double wall)
{
    char tmp[4096];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f) {
        return;
    }
    fprintf(f, "files=%" PRIu64 " base_cached_files=%" PRIu64
            " base_cached_bytes=%" PRIu64 " dropped_files=%" PRIu64
            " dropped_bytes=%" PRIu64 " syscalls=%" PRIu64
            " cpu_s=%.3f wall_s=%.3f\n", pass.files, pass.base_cached,
            pass.cached_bytes, pass.dropped_files, pass.dropped_bytes,
            pass.syscalls, cpu, wall);
    fclose(f);
    rename(tmp, path);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"root", required_argument, NULL, 'r'},
        {"interval", required_argument, NULL, 'i'},
        {"grace", required_argument, NULL, 'g'},
        {"once", no_argument, NULL, 'o'},
        {"status", required_argument, NULL, 's'},
        {"boot-time", required_argument, NULL, 'b'},
        {NULL, 0, NULL, 0},
    };
    const char *root = "/", *status = "/run/vmar-guest.status";
    long interval = 10;
    int once = 0, c;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r': root = optarg; break;
        case 'i': interval = atol(optarg); break;
        case 'g': grace = atol(optarg); break;
        case 'o': once = 1; break;
        case 's': status = optarg; break;
        case 'b': boot_time = (time_t)atoll(optarg); break;
        default:
            fprintf(stderr, "usage: %s [--root DIR] [--interval S] "
                    "[--grace S] [--once] [--status FILE] "
                    "[--boot-time EPOCH]\n", argv[0]);
            return 2;
        }
    }
    if (interval < 1 || grace < 0) {
        fprintf(stderr, "vmar-guest: --interval must be >= 1, --grace "
                ">= 0\n");
        return 2;
    }
    page_size = sysconf(_SC_PAGESIZE);
    if (!boot_time) {
        boot_time = read_boot_time();
    }
    if (!boot_time) {
        fprintf(stderr, "vmar-guest: no boot time in /proc/stat\n");
        return 1;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    while (!stopping) {
        struct timespec t0, t1;
        double cpu0 = cpu_seconds();

        memset(&pass, 0, sizeof(pass));
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pass_start = time(NULL);
        if (nftw(root, visit, 64, FTW_PHYS | FTW_MOUNT) < 0) {
            fprintf(stderr, "vmar-guest: walking %s: %s\n", root,
                    strerror(errno));
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        write_status(status, cpu_seconds() - cpu0,
                     (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
        if (once) {
            break;
        }
        sleep(interval);
    }
    return 0;
}
