/*
 * Standalone VMAR map checker, using the same parser as the QEMU driver.
 *
 *   vmar-check MAP
 *       validate MAP; print "valid ..." and exit 0, or "invalid: <why>" and
 *       exit 1 (exit 2 on usage or I/O errors)
 *   vmar-check --dump MAP
 *       validate and print targets and extents as JSON
 *   vmar-check --read BASE_DIR SUFFIX OUT MAP
 *       validate, then rebuild the source image into OUT by looking up every
 *       run (as the driver does) and reading target <BASE_DIR>/<uuid><SUFFIX>;
 *       prints the lookup and probe counters and checks each lookup's probe
 *       count against the spec's bound
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmar-map.h"

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0, got;

    if (!f) {
        fprintf(stderr, "vmar-check: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            buf = realloc(buf, cap);
            if (!buf) {
                fclose(f);
                return NULL;
            }
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

static int ceil_log2_plus1(uint64_t count)
{
    int bits = 0;

    while (((uint64_t)1 << bits) < count + 1) {
        bits++;
    }
    return bits;
}

static void dump(const VmarMap *m)
{
    char uuid[37];
    uint32_t i;

    vmar_uuid_format(m->hdr.image_id, uuid);
    printf("{\"image_id\": \"%s\", \"block_size\": %u, \"virtual_size\": "
           "%llu, \"map_version\": %llu, \"targets\": [", uuid,
           m->hdr.block_size, (unsigned long long)m->hdr.virtual_size,
           (unsigned long long)m->hdr.map_version);
    for (i = 0; i < m->hdr.n_targets; i++) {
        vmar_uuid_format(m->targets[i].image_id, uuid);
        printf("%s{\"image_id\": \"%s\", \"size\": %llu, \"flags\": %u}",
               i ? ", " : "", uuid, (unsigned long long)m->targets[i].size,
               m->targets[i].flags);
    }
    printf("], \"extents\": [");
    for (i = 0; i < m->hdr.n_extents; i++) {
        const VmarExtent *e = &m->extents[i];
        printf("%s[%u, %u, %u, %u]", i ? ", " : "", e->src_block, e->length,
               e->target_block, e->target);
    }
    printf("]}\n");
}

static int rebuild(const VmarMap *m, const char *base_dir,
                   const char *suffix, const char *out_path)
{
    uint64_t bsz = m->hdr.block_size, vsize = m->hdr.virtual_size;
    VmarCursor cursor;
    FILE **files = calloc(m->hdr.n_targets, sizeof(*files));
    FILE *out = fopen(out_path, "wb");
    uint8_t *buf = malloc(bsz);
    uint64_t b = 0;
    int ret = 2;
    uint32_t i;

    if (!files || !out || !buf) {
        fprintf(stderr, "vmar-check: cannot open %s\n", out_path);
        goto done;
    }
    for (i = 0; i < m->hdr.n_targets; i++) {
        char uuid[37], path[4096];
        long size;

        vmar_uuid_format(m->targets[i].image_id, uuid);
        snprintf(path, sizeof(path), "%s/%s%s", base_dir, uuid, suffix);
        files[i] = fopen(path, "rb");
        if (!files[i]) {
            /* Unused targets may be absent */
            continue;
        }
        fseek(files[i], 0, SEEK_END);
        size = ftell(files[i]);
        if ((uint64_t)size != m->targets[i].size) {
            fprintf(stderr, "vmar-check: %s is %ld bytes, map says %llu\n",
                    path, size, (unsigned long long)m->targets[i].size);
            goto done;
        }
    }

    vmar_cursor_init(m, &cursor);
    while (b < m->n_blocks) {
        uint64_t before = cursor.probes, k, probes;
        const VmarSection *s = &m->sections[b >> m->hdr.section_shift];
        VmarRun run;

        vmar_map_lookup(m, &cursor, b, m->n_blocks, &run);
        probes = cursor.probes - before;
        if (probes > (uint64_t)ceil_log2_plus1(s->count)) {
            fprintf(stderr, "vmar-check: lookup of block %llu cost %llu "
                    "probes, section count %u\n", (unsigned long long)b,
                    (unsigned long long)probes, s->count);
            goto done;
        }
        if (run.n_blocks == 0 || b + run.n_blocks > m->n_blocks) {
            fprintf(stderr, "vmar-check: bad run at block %llu\n",
                    (unsigned long long)b);
            goto done;
        }
        for (k = 0; k < run.n_blocks; k++) {
            uint64_t off = (b + k) * bsz;
            uint64_t n = vsize - off < bsz ? vsize - off : bsz;

            if (run.mapped) {
                FILE *f = files[m->extents[run.extent].target];
                if (!f ||
                    fseek(f, (long)((run.target_block + k) * bsz),
                          SEEK_SET) != 0 ||
                    fread(buf, 1, n, f) != n) {
                    fprintf(stderr, "vmar-check: read error on target %u\n",
                            m->extents[run.extent].target);
                    goto done;
                }
            } else {
                memset(buf, 0, n);
            }
            if (fwrite(buf, 1, n, out) != n) {
                goto done;
            }
        }
        b += run.n_blocks;
    }
    printf("lookups %llu probes %llu\n", (unsigned long long)cursor.lookups,
           (unsigned long long)cursor.probes);
    ret = 0;

done:
    if (files) {
        for (i = 0; i < m->hdr.n_targets; i++) {
            if (files[i]) {
                fclose(files[i]);
            }
        }
    }
    free(files);
    free(buf);
    if (out && fclose(out) != 0) {
        ret = 2;
    }
    return ret;
}

int main(int argc, char **argv)
{
    char err[VMAR_ERR_LEN];
    const char *path;
    VmarMap *m;
    uint8_t *buf;
    size_t len;
    int ret;

    if (argc == 2) {
        path = argv[1];
    } else if (argc == 3 && !strcmp(argv[1], "--dump")) {
        path = argv[2];
    } else if (argc == 6 && !strcmp(argv[1], "--read")) {
        path = argv[5];
    } else {
        fprintf(stderr, "usage: vmar-check [--dump | --read BASE_DIR SUFFIX "
                "OUT] MAP\n");
        return 2;
    }

    buf = read_file(path, &len);
    if (!buf) {
        return 2;
    }
    ret = vmar_map_parse(buf, len, &m, err, sizeof(err));
    free(buf);
    if (ret < 0) {
        printf("invalid: %s\n", err);
        return 1;
    }

    if (argc == 2) {
        printf("valid: %u targets, %u extents, %llu blocks\n",
               m->hdr.n_targets, m->hdr.n_extents,
               (unsigned long long)m->n_blocks);
    } else if (argc == 3) {
        dump(m);
    } else {
        ret = rebuild(m, argv[2], argv[3], argv[4]);
    }
    vmar_map_free(m);
    return ret;
}
