/*
 * libFuzzer harness for the VMAR map parser and lookup (vmar-map.c), the
 * same code the QEMU vmar driver uses.
 *
 * Each input is parsed twice: as is (so the CRC checks are exercised) and
 * with both CRCs recomputed (so mutations get past the CRCs into the
 * structural checks).  Every map that parses is then walked with lookups,
 * and each answer is checked against a plain binary search over all
 * extents and against the spec's probe bound; a wrong answer aborts.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "vmar-map.h"

#define CHECK(cond) do { if (!(cond)) { __builtin_trap(); } } while (0)

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = v;
    p[1] = v >> 8;
    p[2] = v >> 16;
    p[3] = v >> 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    int i;

    for (i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Reference lookup: the extent covering @b, or -1 and the next start */
static int64_t ref_lookup(const VmarMap *m, uint64_t b, uint64_t *next)
{
    uint64_t lo = 0, hi = m->hdr.n_extents;

    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (m->extents[mid].src_block <= b) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo > 0 && b < (uint64_t)m->extents[lo - 1].src_block +
                      m->extents[lo - 1].length) {
        return (int64_t)(lo - 1);
    }
    *next = lo < m->hdr.n_extents ? m->extents[lo].src_block : m->n_blocks;
    return -1;
}

static uint64_t probe_bound(uint32_t count)
{
    uint64_t bits = 0;

    while (((uint64_t)1 << bits) < (uint64_t)count + 1) {
        bits++;
    }
    return bits;
}

static void check_lookup(const VmarMap *m, VmarCursor *c, uint64_t b,
                         uint64_t limit)
{
    const VmarSection *s = &m->sections[b >> m->hdr.section_shift];
    uint64_t probes = c->probes, lookups = c->lookups, next = 0;
    uint64_t lim = limit > m->n_blocks ? m->n_blocks : limit;
    int64_t e;
    VmarRun run;

    vmar_map_lookup(m, c, b, limit, &run);
    CHECK(c->lookups == lookups + 1);
    CHECK(c->probes - probes <= probe_bound(s->count));
    CHECK(run.n_blocks >= 1 && b + run.n_blocks <= lim);

    e = ref_lookup(m, b, &next);
    if (e >= 0) {
        const VmarExtent *x = &m->extents[e];
        CHECK(run.mapped && run.extent == (uint64_t)e);
        CHECK(run.target_block == x->target_block + (b - x->src_block));
        CHECK(b + run.n_blocks <= (uint64_t)x->src_block + x->length);
        CHECK(b + run.n_blocks == lim ||
              b + run.n_blocks == (uint64_t)x->src_block + x->length);
        CHECK(run.target_block + run.n_blocks <=
              m->targets[x->target].n_blocks);
    } else {
        CHECK(!run.mapped);
        CHECK(b + run.n_blocks <= next);
    }
}

static void exercise(VmarMap *m, const uint8_t *data, size_t size)
{
    uint64_t b = 0, seed = size * 0x9e3779b97f4a7c15ULL;
    char uuid[37], id[VMAR_ID_B64_LEN + 1];
    VmarCursor walk, other;
    int i;

    vmar_cursor_init(m, &walk);
    vmar_cursor_init(m, &other);
    vmar_uuid_format(m->targets[0].image_id, uuid);
    vmar_id_b64url(m->targets[0].image_id, id);
    CHECK(strlen(uuid) == 36 && strlen(id) == VMAR_ID_B64_LEN);

    /*
     * Sequential walk, as a full read of the disk does, with the lookups
     * of another reader interleaved: its cursor must not change this one's
     * answers (each request of the QEMU driver has a cursor of its own)
     */
    for (i = 0; i < 2048 && b < m->n_blocks; i++) {
        uint64_t before = b;
        VmarRun run;

        check_lookup(m, &walk, b, m->n_blocks);
        check_lookup(m, &other, (b * 7 + 3) % m->n_blocks, m->n_blocks);
        vmar_map_lookup(m, &walk, b, m->n_blocks, &run);
        b += run.n_blocks;
        CHECK(b > before);
    }
    /* Random lookups with random limits */
    for (i = 0; i < 64; i++) {
        uint64_t lim;

        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL +
               (i < (int)size ? data[i] : 0);
        b = (seed >> 11) % m->n_blocks;
        lim = b + 1 + ((seed >> 3) % 64);
        check_lookup(m, &walk, b, lim);
    }
}

static void parse_and_exercise(const uint8_t *data, size_t size)
{
    char err[VMAR_ERR_LEN];
    VmarMap *m = NULL;

    if (vmar_map_parse(data, size, &m, err, sizeof(err)) == 0) {
        CHECK(m != NULL);
        exercise(m, data, size);
        vmar_map_free(m);
    } else {
        CHECK(m == NULL);
        CHECK(err[0] != '\0');
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;
    uint64_t end;

    parse_and_exercise(data, size);
    if (size < VMAR_HEADER_SIZE) {
        return 0;
    }

    copy = malloc(size);
    if (!copy) {
        return 0;
    }
    memcpy(copy, data, size);
    end = get_le64(copy + 112);
    if (end > size || end < VMAR_HEADER_SIZE) {
        end = size;
    }
    put_le32(copy + 120, crc32(0, copy + VMAR_HEADER_SIZE,
                               end - VMAR_HEADER_SIZE));
    put_le32(copy + 124, crc32(0, copy, 124));
    parse_and_exercise(copy, size);
    free(copy);
    return 0;
}
