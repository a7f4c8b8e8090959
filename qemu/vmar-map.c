/*
 * VMAR block map: parser, validator and lookup (format v1)
 *
 * Follows doc/source/map-format.rst of vmar-openstack.  Standard C and zlib
 * only: this file is compiled into the QEMU "vmar" block driver, the
 * libFuzzer harness and the standalone vector checker.
 *
 * All arithmetic on values read from the file is done in 64 bits on
 * operands that are at most 32 bits wide (or checked before use), so it
 * cannot overflow.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "vmar-map.h"

static void vmar_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void vmar_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (!err || !err_len) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static uint32_t vmar_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) |
           ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t vmar_le64(const uint8_t *p)
{
    return (uint64_t)vmar_le32(p) | ((uint64_t)vmar_le32(p + 4) << 32);
}

/* CRC-32 (zlib) over a buffer that may be larger than zlib's uInt */
static uint32_t vmar_crc32(const uint8_t *p, uint64_t len)
{
    uLong crc = crc32(0L, Z_NULL, 0);

    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return (uint32_t)crc;
}

static uint64_t vmar_div_round_up(uint64_t n, uint32_t shift)
{
    return (n >> shift) + ((n & (((uint64_t)1 << shift) - 1)) != 0);
}

void vmar_uuid_format(const uint8_t id[16], char out[37])
{
    static const char hex[] = "0123456789abcdef";
    int i, j = 0;

    for (i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            out[j++] = '-';
        }
        out[j++] = hex[id[i] >> 4];
        out[j++] = hex[id[i] & 15];
    }
    out[j] = '\0';
}

void vmar_id_b64url(const uint8_t id[16], char out[VMAR_ID_B64_LEN + 1])
{
    static const char b64[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    uint32_t acc = 0;
    int bits = 0, i, j = 0;

    for (i = 0; i < 16; i++) {
        acc = (acc << 8) | id[i];
        bits += 8;
        while (bits >= 6) {
            bits -= 6;
            out[j++] = b64[(acc >> bits) & 63];
        }
    }
    out[j++] = b64[(acc << (6 - bits)) & 63];   /* 128 = 21 * 6 + 2 */
    out[j] = '\0';
}

/* Smallest shift in [0, VMAR_MAX_SHIFT] with ceil(n >> shift) <= max_units */
static uint32_t vmar_smallest_shift(uint64_t n, uint64_t max_units,
                                    uint32_t per_byte)
{
    uint32_t s;

    for (s = 0; s < VMAR_MAX_SHIFT; s++) {
        uint64_t units = vmar_div_round_up(n, s);
        if (per_byte > 1) {
            units = (units + per_byte - 1) / per_byte;
        }
        if (units <= max_units) {
            return s;
        }
    }
    return VMAR_MAX_SHIFT;
}

int vmar_header_parse(const uint8_t *buf, size_t len, VmarHeader *h,
                      char *err, size_t err_len)
{
    uint64_t n_blocks, expect, max_units;
    uint32_t shift;

    if (len < VMAR_HEADER_SIZE) {
        vmar_err(err, err_len, "file too short for the header (%zu < %d "
                 "bytes)", len, VMAR_HEADER_SIZE);
        return -1;
    }
    if (memcmp(buf, VMAR_MAGIC, 8) != 0) {
        vmar_err(err, err_len, "bad magic (not a VMAR map)");
        return -1;
    }

    memset(h, 0, sizeof(*h));
    h->format_version = vmar_le32(buf + 8);
    h->header_size = vmar_le32(buf + 12);
    h->block_size = vmar_le32(buf + 16);
    h->flags = vmar_le32(buf + 20);
    h->virtual_size = vmar_le64(buf + 24);
    h->map_version = vmar_le64(buf + 32);
    memcpy(h->image_id, buf + 40, 16);
    h->n_targets = vmar_le32(buf + 56);
    h->n_extents = vmar_le32(buf + 60);
    h->section_shift = vmar_le32(buf + 64);
    h->n_sections = vmar_le32(buf + 68);
    h->filter_shift = vmar_le32(buf + 72);
    h->filter_bytes = vmar_le32(buf + 76);
    h->targets_off = vmar_le64(buf + 80);
    h->extents_off = vmar_le64(buf + 88);
    h->index_off = vmar_le64(buf + 96);
    h->filter_off = vmar_le64(buf + 104);
    h->file_size = vmar_le64(buf + 112);
    h->body_crc = vmar_le32(buf + 120);
    h->header_crc = vmar_le32(buf + 124);

    if (vmar_crc32(buf, 124) != h->header_crc) {
        vmar_err(err, err_len, "header CRC mismatch (stored 0x%08x, "
                 "computed 0x%08x)", h->header_crc, vmar_crc32(buf, 124));
        return -1;
    }
    if (h->format_version != VMAR_FORMAT_VERSION) {
        vmar_err(err, err_len, "unsupported format_version %u",
                 h->format_version);
        return -1;
    }
    if (h->header_size != VMAR_HEADER_SIZE) {
        vmar_err(err, err_len, "header_size %u is not %d", h->header_size,
                 VMAR_HEADER_SIZE);
        return -1;
    }
    if (h->block_size < VMAR_MIN_BLOCK_SIZE ||
        h->block_size > VMAR_MAX_BLOCK_SIZE ||
        (h->block_size & (h->block_size - 1)) != 0) {
        vmar_err(err, err_len, "block_size %u is not a power of two in "
                 "[4096, 2 MiB]", h->block_size);
        return -1;
    }
    if (h->flags != 0) {
        vmar_err(err, err_len, "unknown header flags 0x%x", h->flags);
        return -1;
    }
    if (h->virtual_size == 0) {
        vmar_err(err, err_len, "virtual_size is 0");
        return -1;
    }
    if (h->map_version < 1) {
        vmar_err(err, err_len, "map_version is 0");
        return -1;
    }
    if (h->n_targets < 1 || h->n_targets > VMAR_MAX_TARGETS) {
        vmar_err(err, err_len, "n_targets %u not in [1, %d]", h->n_targets,
                 VMAR_MAX_TARGETS);
        return -1;
    }

    for (shift = 0; ((uint32_t)1 << shift) < h->block_size; shift++) {
        /* block_size is a power of two, checked above */
    }
    n_blocks = vmar_div_round_up(h->virtual_size, shift);
    if (n_blocks >= ((uint64_t)1 << 32)) {
        vmar_err(err, err_len, "virtual_size %llu gives %llu blocks "
                 "(must be below 2^32)",
                 (unsigned long long)h->virtual_size,
                 (unsigned long long)n_blocks);
        return -1;
    }

    if (h->section_shift > VMAR_MAX_SHIFT) {
        vmar_err(err, err_len, "section_shift %u > %d", h->section_shift,
                 VMAR_MAX_SHIFT);
        return -1;
    }
    expect = vmar_div_round_up(n_blocks, h->section_shift);
    if (h->n_sections != expect) {
        vmar_err(err, err_len, "n_sections %u, expected %llu",
                 h->n_sections, (unsigned long long)expect);
        return -1;
    }
    max_units = h->n_extents > 1 ? h->n_extents : 1;
    expect = vmar_smallest_shift(n_blocks, max_units, 1);
    if (h->section_shift != expect) {
        vmar_err(err, err_len, "section_shift %u is not the smallest with "
                 "n_sections <= max(1, n_extents) (%llu)", h->section_shift,
                 (unsigned long long)expect);
        return -1;
    }

    if (h->filter_shift > VMAR_MAX_SHIFT) {
        vmar_err(err, err_len, "filter_shift %u > %d", h->filter_shift,
                 VMAR_MAX_SHIFT);
        return -1;
    }
    expect = (vmar_div_round_up(n_blocks, h->filter_shift) + 7) / 8;
    if (h->filter_bytes != expect) {
        vmar_err(err, err_len, "filter_bytes %u, expected %llu",
                 h->filter_bytes, (unsigned long long)expect);
        return -1;
    }
    max_units = 2 * (uint64_t)h->n_extents;
    if (max_units < 8) {
        max_units = 8;
    }
    expect = vmar_smallest_shift(n_blocks, max_units, 8);
    if (h->filter_shift != expect) {
        vmar_err(err, err_len, "filter_shift %u is not the smallest with "
                 "filter_bytes <= max(8, 2 * n_extents) (%llu)",
                 h->filter_shift, (unsigned long long)expect);
        return -1;
    }

    /* Section offsets: every operand is below 2^40, no overflow */
    if (h->targets_off != VMAR_HEADER_SIZE) {
        vmar_err(err, err_len, "targets_off %llu is not %d",
                 (unsigned long long)h->targets_off, VMAR_HEADER_SIZE);
        return -1;
    }
    expect = h->targets_off + (uint64_t)VMAR_TARGET_SIZE * h->n_targets;
    if (h->extents_off != expect) {
        vmar_err(err, err_len, "extents_off %llu, expected %llu",
                 (unsigned long long)h->extents_off,
                 (unsigned long long)expect);
        return -1;
    }
    expect = h->extents_off + (uint64_t)VMAR_EXTENT_SIZE * h->n_extents;
    if (h->index_off != expect) {
        vmar_err(err, err_len, "index_off %llu, expected %llu",
                 (unsigned long long)h->index_off,
                 (unsigned long long)expect);
        return -1;
    }
    expect = h->index_off + (uint64_t)VMAR_SECTION_SIZE * h->n_sections;
    if (h->filter_off != expect) {
        vmar_err(err, err_len, "filter_off %llu, expected %llu",
                 (unsigned long long)h->filter_off,
                 (unsigned long long)expect);
        return -1;
    }
    expect = (h->filter_off + h->filter_bytes + 7) & ~(uint64_t)7;
    if (h->file_size != expect) {
        vmar_err(err, err_len, "file_size %llu, expected %llu",
                 (unsigned long long)h->file_size,
                 (unsigned long long)expect);
        return -1;
    }
    return 0;
}

static int vmar_cmp_target_id(const void *a, const void *b)
{
    const VmarTarget *ta = *(const VmarTarget * const *)a;
    const VmarTarget *tb = *(const VmarTarget * const *)b;

    return memcmp(ta->image_id, tb->image_id, 16);
}

static int vmar_parse_targets(VmarMap *m, const uint8_t *buf,
                              char *err, size_t err_len)
{
    const VmarHeader *h = &m->hdr;
    const VmarTarget **sorted;
    uint32_t i, n_self = 0;
    char uuid[37];

    for (i = 0; i < h->n_targets; i++) {
        const uint8_t *p = buf + h->targets_off + (uint64_t)i *
                           VMAR_TARGET_SIZE;
        VmarTarget *t = &m->targets[i];
        uint32_t reserved = vmar_le32(p + 28);

        memcpy(t->image_id, p, 16);
        t->size = vmar_le64(p + 16);
        t->flags = vmar_le32(p + 24);
        vmar_uuid_format(t->image_id, uuid);
        if (t->size == 0) {
            vmar_err(err, err_len, "target %u (%s): size is 0", i, uuid);
            return -1;
        }
        t->n_blocks = vmar_div_round_up(t->size, m->block_shift);
        if (t->flags & ~VMAR_TARGET_FLAG_SELF) {
            vmar_err(err, err_len, "target %u (%s): unknown flags 0x%x", i,
                     uuid, t->flags);
            return -1;
        }
        if (reserved != 0) {
            vmar_err(err, err_len, "target %u (%s): reserved field is 0x%x",
                     i, uuid, reserved);
            return -1;
        }
        if (t->flags & VMAR_TARGET_FLAG_SELF) {
            n_self++;
            if (n_self > 1) {
                vmar_err(err, err_len, "target %u (%s): more than one target "
                         "marked as the source image", i, uuid);
                return -1;
            }
            if (memcmp(t->image_id, h->image_id, 16) != 0) {
                vmar_err(err, err_len, "target %u (%s): marked as the source "
                         "image but its image_id differs from the header's",
                         i, uuid);
                return -1;
            }
            if (t->size != h->virtual_size) {
                vmar_err(err, err_len, "target %u (%s): marked as the source "
                         "image but its size %llu differs from virtual_size "
                         "%llu", i, uuid, (unsigned long long)t->size,
                         (unsigned long long)h->virtual_size);
                return -1;
            }
        }
    }

    sorted = malloc(sizeof(*sorted) * h->n_targets);
    if (!sorted) {
        vmar_err(err, err_len, "out of memory");
        return -1;
    }
    for (i = 0; i < h->n_targets; i++) {
        sorted[i] = &m->targets[i];
    }
    qsort(sorted, h->n_targets, sizeof(*sorted), vmar_cmp_target_id);
    for (i = 1; i < h->n_targets; i++) {
        if (memcmp(sorted[i - 1]->image_id, sorted[i]->image_id, 16) == 0) {
            vmar_uuid_format(sorted[i]->image_id, uuid);
            free(sorted);
            vmar_err(err, err_len, "duplicate target image_id %s", uuid);
            return -1;
        }
    }
    free(sorted);
    return 0;
}

static int vmar_parse_extents(VmarMap *m, const uint8_t *buf,
                              char *err, size_t err_len)
{
    const VmarHeader *h = &m->hdr;
    uint64_t prev_end = 0;
    uint64_t src_tail = h->virtual_size & (h->block_size - 1);
    uint32_t i;

    for (i = 0; i < h->n_extents; i++) {
        const uint8_t *p = buf + h->extents_off + (uint64_t)i *
                           VMAR_EXTENT_SIZE;
        VmarExtent *e = &m->extents[i];
        const VmarTarget *t;
        uint64_t src_end, tgt_end, tgt_tail;

        e->src_block = vmar_le32(p);
        e->length = vmar_le32(p + 4);
        e->target_block = vmar_le32(p + 8);
        e->target = vmar_le32(p + 12);

        if (e->length == 0) {
            vmar_err(err, err_len, "extent %u: length is 0", i);
            return -1;
        }
        if (e->src_block < prev_end) {
            vmar_err(err, err_len, "extent %u: src_block %u overlaps or is "
                     "not sorted after the previous extent (ending at "
                     "block %llu)", i, e->src_block,
                     (unsigned long long)prev_end);
            return -1;
        }
        src_end = (uint64_t)e->src_block + e->length;
        if (src_end > m->n_blocks) {
            vmar_err(err, err_len, "extent %u: source blocks [%u, %llu) past "
                     "n_blocks %llu", i, e->src_block,
                     (unsigned long long)src_end,
                     (unsigned long long)m->n_blocks);
            return -1;
        }
        if (e->target >= h->n_targets) {
            vmar_err(err, err_len, "extent %u: target index %u >= n_targets "
                     "%u", i, e->target, h->n_targets);
            return -1;
        }
        t = &m->targets[e->target];
        tgt_end = (uint64_t)e->target_block + e->length;
        if (tgt_end > t->n_blocks) {
            vmar_err(err, err_len, "extent %u: target blocks [%u, %llu) past "
                     "the end of target %u (%llu blocks)", i,
                     e->target_block, (unsigned long long)tgt_end, e->target,
                     (unsigned long long)t->n_blocks);
            return -1;
        }
        tgt_tail = t->size & (h->block_size - 1);
        if (tgt_tail != 0 && tgt_end == t->n_blocks) {
            /* Covers the target's partial last block */
            if (src_end != m->n_blocks || src_tail != tgt_tail) {
                vmar_err(err, err_len, "extent %u: covers the partial last "
                         "block of target %u (%llu bytes) but not the "
                         "source's partial last block of the same length at "
                         "the same position", i, e->target,
                         (unsigned long long)tgt_tail);
                return -1;
            }
        }
        prev_end = src_end;
    }
    return 0;
}

static int vmar_check_index(VmarMap *m, const uint8_t *buf,
                            char *err, size_t err_len)
{
    const VmarHeader *h = &m->hdr;
    uint64_t first = 0, last = 0;
    uint32_t k;

    for (k = 0; k < h->n_sections; k++) {
        const uint8_t *p = buf + h->index_off + (uint64_t)k *
                           VMAR_SECTION_SIZE;
        uint64_t start = (uint64_t)k << h->section_shift;
        uint64_t end = (uint64_t)(k + 1) << h->section_shift;
        VmarSection *s = &m->sections[k];

        /* first extent that ends after the section start */
        while (first < h->n_extents &&
               (uint64_t)m->extents[first].src_block +
               m->extents[first].length <= start) {
            first++;
        }
        /* extents [first, last) start before the section end */
        if (last < first) {
            last = first;
        }
        while (last < h->n_extents && m->extents[last].src_block < end) {
            last++;
        }

        s->first = vmar_le32(p);
        s->count = vmar_le32(p + 4);
        if (s->first != first || s->count != last - first) {
            vmar_err(err, err_len, "section index entry %u is (first %u, "
                     "count %u), expected (%llu, %llu)", k, s->first,
                     s->count, (unsigned long long)first,
                     (unsigned long long)(last - first));
            return -1;
        }
    }
    return 0;
}

static int vmar_check_filter(VmarMap *m, const uint8_t *buf,
                             char *err, size_t err_len)
{
    const VmarHeader *h = &m->hdr;
    const uint8_t *stored = buf + h->filter_off;
    uint64_t i;
    uint32_t e;

    memset(m->filter, 0, h->filter_bytes);
    for (e = 0; e < h->n_extents; e++) {
        const VmarExtent *x = &m->extents[e];
        uint64_t g0 = x->src_block >> h->filter_shift;
        uint64_t g1 = ((uint64_t)x->src_block + x->length - 1) >>
                      h->filter_shift;
        uint64_t g;

        for (g = g0; g <= g1; g++) {
            m->filter[g >> 3] |= (uint8_t)(1u << (g & 7));
        }
    }
    for (i = 0; i < h->filter_bytes; i++) {
        if (m->filter[i] != stored[i]) {
            vmar_err(err, err_len, "occupancy filter byte %llu is 0x%02x, "
                     "expected 0x%02x", (unsigned long long)i, stored[i],
                     m->filter[i]);
            return -1;
        }
    }
    for (i = h->filter_off + h->filter_bytes; i < h->file_size; i++) {
        if (buf[i] != 0) {
            vmar_err(err, err_len, "non-zero padding byte at offset %llu",
                     (unsigned long long)i);
            return -1;
        }
    }
    return 0;
}

void vmar_map_free(VmarMap *m)
{
    if (!m) {
        return;
    }
    free(m->targets);
    free(m->extents);
    free(m->sections);
    free(m->filter);
    free(m);
}

int vmar_map_parse(const uint8_t *buf, size_t len, VmarMap **pmap,
                   char *err, size_t err_len)
{
    VmarMap *m;
    uint32_t crc;

    *pmap = NULL;
    m = calloc(1, sizeof(*m));
    if (!m) {
        vmar_err(err, err_len, "out of memory");
        return -1;
    }
    if (vmar_header_parse(buf, len, &m->hdr, err, err_len) < 0) {
        goto fail;
    }
    if ((uint64_t)len != m->hdr.file_size) {
        vmar_err(err, err_len, "file is %llu bytes, header says file_size "
                 "%llu", (unsigned long long)len,
                 (unsigned long long)m->hdr.file_size);
        goto fail;
    }
    crc = vmar_crc32(buf + VMAR_HEADER_SIZE, len - VMAR_HEADER_SIZE);
    if (crc != m->hdr.body_crc) {
        vmar_err(err, err_len, "body CRC mismatch (stored 0x%08x, computed "
                 "0x%08x)", m->hdr.body_crc, crc);
        goto fail;
    }

    for (m->block_shift = 0; ((uint32_t)1 << m->block_shift) <
         m->hdr.block_size; m->block_shift++) {
        /* power of two, checked by vmar_header_parse() */
    }
    m->n_blocks = vmar_div_round_up(m->hdr.virtual_size, m->block_shift);

    /* Sizes are bounded by len, which holds all these tables */
    m->targets = calloc(m->hdr.n_targets, sizeof(*m->targets));
    m->extents = calloc(m->hdr.n_extents ? m->hdr.n_extents : 1,
                        sizeof(*m->extents));
    m->sections = calloc(m->hdr.n_sections, sizeof(*m->sections));
    m->filter = calloc(m->hdr.filter_bytes, 1);
    if (!m->targets || !m->extents || !m->sections || !m->filter) {
        vmar_err(err, err_len, "out of memory");
        goto fail;
    }

    if (vmar_parse_targets(m, buf, err, err_len) < 0 ||
        vmar_parse_extents(m, buf, err, err_len) < 0 ||
        vmar_check_index(m, buf, err, err_len) < 0 ||
        vmar_check_filter(m, buf, err, err_len) < 0) {
        goto fail;
    }

    *pmap = m;
    return 0;

fail:
    vmar_map_free(m);
    return -1;
}

static bool vmar_filter_bit(const VmarMap *m, uint64_t granule)
{
    return m->filter[granule >> 3] & (1u << (granule & 7));
}

/*
 * A run of @idx from @block, clipped to @limit.  The cursor moves to the
 * run's end: the extent after @idx if the run reaches the extent's end.
 */
static void vmar_run_from_extent(const VmarMap *m, VmarCursor *c,
                                 uint32_t idx, uint64_t block,
                                 uint64_t limit, VmarRun *run)
{
    const VmarExtent *e = &m->extents[idx];
    uint64_t end = (uint64_t)e->src_block + e->length;

    run->mapped = true;
    run->extent = idx;
    run->target_block = (uint64_t)e->target_block + (block - e->src_block);
    run->n_blocks = (end < limit ? end : limit) - block;
    c->last_extent = idx;
    c->next_block = block + run->n_blocks;
    c->next_extent = c->next_block < end ? idx : idx + 1;
}

/*
 * A zero run from @block up to @next, clipped to @limit.  @next_extent is
 * the first extent that ends after the run (its start is >= the run's end),
 * or UINT32_MAX if unknown; the cursor moves to the run's end.
 */
static void vmar_run_zero(VmarCursor *c, uint64_t block, uint64_t next,
                          uint64_t limit, uint32_t next_extent, VmarRun *run)
{
    run->mapped = false;
    run->extent = 0;
    run->target_block = 0;
    run->n_blocks = (next < limit ? next : limit) - block;
    if (next_extent == UINT32_MAX) {
        c->next_block = UINT64_MAX;
    } else {
        c->next_block = block + run->n_blocks;
        c->next_extent = next_extent;
    }
}

/* First granule at or after @g that has its bit set, or the one at @limit */
static uint64_t vmar_filter_next(const VmarMap *m, uint64_t g, uint64_t limit)
{
    uint32_t shift = m->hdr.filter_shift;

    while ((g << shift) < limit && !vmar_filter_bit(m, g)) {
        /* Skip whole zero bytes of the bitmap at once */
        if ((g & 7) == 0 && m->filter[g >> 3] == 0) {
            g += 8;
        } else {
            g++;
        }
    }
    return g;
}

void vmar_cursor_init(const VmarMap *m, VmarCursor *c)
{
    c->last_extent = m->hdr.n_extents;
    c->next_extent = 0;     /* extent 0 is the first to end after block 0 */
    c->next_block = 0;
    c->lookups = 0;
    c->probes = 0;
}

void vmar_map_lookup(const VmarMap *m, VmarCursor *c, uint64_t block,
                     uint64_t limit, VmarRun *run)
{
    const VmarHeader *h = &m->hdr;
    const VmarSection *s;
    uint64_t g, lo, hi, next;
    bool cursor;

    if (limit > m->n_blocks) {
        limit = m->n_blocks;
    }
    c->lookups++;

    /* Last-extent cache: reads inside the previous extent cost nothing */
    if (c->last_extent < h->n_extents) {
        const VmarExtent *e = &m->extents[c->last_extent];
        if (block >= e->src_block &&
            block < (uint64_t)e->src_block + e->length) {
            vmar_run_from_extent(m, c, c->last_extent, block, limit, run);
            return;
        }
    }
    cursor = block == c->next_block;

    /*
     * Occupancy filter: a clear bit means the whole granule is zero.  If
     * the lookup continues from the cursor, the next extent starts after
     * the zero run, so the cursor stays valid.
     */
    g = block >> h->filter_shift;
    if (!vmar_filter_bit(m, g)) {
        g = vmar_filter_next(m, g + 1, limit);
        vmar_run_zero(c, block, g << h->filter_shift, limit,
                      cursor ? c->next_extent : UINT32_MAX, run);
        return;
    }

    s = &m->sections[block >> h->section_shift];
    if (s->count == 0) {
        /* s->first starts after the section, all before it end before */
        next = s->first < h->n_extents ? m->extents[s->first].src_block
                                       : m->n_blocks;
        vmar_run_zero(c, block, next, limit, s->first, run);
        return;
    }

    /*
     * Sequential walk: the extent at the cursor is the first to end after
     * @block, so one comparison tells whether @block is in it or in the
     * zero gap before it (count >= 1 here, so this is within the bound).
     */
    if (cursor) {
        if (c->next_extent >= h->n_extents) {
            vmar_run_zero(c, block, m->n_blocks, limit, h->n_extents, run);
            return;
        }
        c->probes++;
        next = m->extents[c->next_extent].src_block;
        if (block >= next) {
            vmar_run_from_extent(m, c, c->next_extent, block, limit, run);
        } else {
            vmar_run_zero(c, block, next, limit, c->next_extent, run);
        }
        return;
    }

    /* Binary search inside the section */
    lo = s->first;
    hi = (uint64_t)s->first + s->count;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        c->probes++;
        if (m->extents[mid].src_block <= block) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    /* lo is the first extent starting after block; lo - 1 may cover it */
    if (lo > s->first &&
        block < (uint64_t)m->extents[lo - 1].src_block +
                m->extents[lo - 1].length) {
        vmar_run_from_extent(m, c, (uint32_t)(lo - 1), block, limit, run);
        return;
    }
    next = lo < h->n_extents ? m->extents[lo].src_block : m->n_blocks;
    vmar_run_zero(c, block, next, limit, (uint32_t)lo, run);
}
