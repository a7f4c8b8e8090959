/*
 * VMAR block map: parser, validator and lookup (format v1)
 *
 * The format is specified in doc/source/map-format.rst of vmar-openstack.
 * This part has no QEMU dependency (standard C and zlib only), so the QEMU
 * block driver, the fuzzer and the standalone checker share one parser.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#ifndef VMAR_MAP_H
#define VMAR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VMAR_MAGIC              "VMARMAP\0"
#define VMAR_FORMAT_VERSION     1
#define VMAR_HEADER_SIZE        128
#define VMAR_TARGET_SIZE        32
#define VMAR_EXTENT_SIZE        16
#define VMAR_SECTION_SIZE       8
#define VMAR_MIN_BLOCK_SIZE     4096
#define VMAR_MAX_BLOCK_SIZE     (2 * 1024 * 1024)
#define VMAR_MAX_TARGETS        65536
#define VMAR_MAX_SHIFT          31
#define VMAR_TARGET_FLAG_SELF   1u

/* Size of the buffer that vmar_map_* functions fill with an error message */
#define VMAR_ERR_LEN            256

typedef struct VmarTarget {
    uint8_t image_id[16];
    uint64_t size;          /* bytes */
    uint64_t n_blocks;      /* ceil(size / block_size) */
    uint32_t flags;
} VmarTarget;

typedef struct VmarExtent {
    uint32_t src_block;
    uint32_t length;
    uint32_t target_block;
    uint32_t target;
} VmarExtent;

typedef struct VmarSection {
    uint32_t first;
    uint32_t count;
} VmarSection;

typedef struct VmarHeader {
    uint32_t format_version;
    uint32_t header_size;
    uint32_t block_size;
    uint32_t flags;
    uint64_t virtual_size;
    uint64_t map_version;
    uint8_t image_id[16];
    uint32_t n_targets;
    uint32_t n_extents;
    uint32_t section_shift;
    uint32_t n_sections;
    uint32_t filter_shift;
    uint32_t filter_bytes;
    uint64_t targets_off;
    uint64_t extents_off;
    uint64_t index_off;
    uint64_t filter_off;
    uint64_t file_size;
    uint32_t body_crc;
    uint32_t header_crc;
} VmarHeader;

typedef struct VmarMap {
    VmarHeader hdr;
    uint32_t block_shift;   /* log2(block_size) */
    uint64_t n_blocks;      /* ceil(virtual_size / block_size), < 2^32 */
    VmarTarget *targets;
    VmarExtent *extents;
    VmarSection *sections;
    uint8_t *filter;
} VmarMap;

/*
 * A reader's lookup state (see "Lookup cost" in the spec).  A VmarMap is
 * never written once parsed: each reader (in the QEMU driver, each
 * request) keeps a cursor of its own, so lookups from any number of
 * threads at once need no lock.  The cursor remembers where the reader's
 * previous run ended: when next_block is not UINT64_MAX, next_extent is
 * the first extent that ends after next_block (n_extents if none), so a
 * lookup that continues a sequential walk needs one probe at most.  It
 * also counts the reader's lookups and probes.
 */
typedef struct VmarCursor {
    uint32_t last_extent;   /* n_extents when none */
    uint32_t next_extent;
    uint64_t next_block;    /* UINT64_MAX when unknown */
    uint64_t lookups;
    uint64_t probes;
} VmarCursor;

/*
 * Parse and check the fixed 128-byte header.  @len is the number of bytes
 * available at @buf (at least VMAR_HEADER_SIZE are needed).  Checks every
 * header-only rule, including header_crc and the derived section offsets
 * and file_size.  Returns 0 on success, -1 with @err filled on failure.
 */
int vmar_header_parse(const uint8_t *buf, size_t len, VmarHeader *hdr,
                      char *err, size_t err_len);

/*
 * Parse and fully validate a whole map file held in @buf (@len bytes, the
 * whole file).  On success returns 0 and stores a newly allocated map in
 * @pmap (free with vmar_map_free()).  On failure returns -1 and fills @err
 * with a message naming the violated rule.
 */
int vmar_map_parse(const uint8_t *buf, size_t len, VmarMap **pmap,
                   char *err, size_t err_len);

void vmar_map_free(VmarMap *map);

/* Result of one lookup */
typedef struct VmarRun {
    bool mapped;            /* false: the run reads as zeros */
    uint32_t extent;        /* index of the extent, if mapped */
    uint64_t target_block;  /* target block of the first block, if mapped */
    uint64_t n_blocks;      /* run length in blocks, >= 1 */
} VmarRun;

/* A fresh cursor for @map: no previous extent, at block 0, no counts */
void vmar_cursor_init(const VmarMap *map, VmarCursor *cursor);

/*
 * Look up source block @block (< map->n_blocks) and return the run of
 * blocks starting there that is either read from one extent or zero,
 * clipped to end at @limit (exclusive, block number, > @block, clamped to
 * n_blocks).  Counts the lookup and its probes in @cursor as the spec's
 * "Lookup cost" defines, and moves the cursor to the run's end.  A lookup
 * in the cursor's previous extent costs nothing; one that starts where
 * the previous run ended compares the next extent only (one probe); any
 * other does the filter, section and binary search of the spec.  Reads
 * @map only.
 */
void vmar_map_lookup(const VmarMap *map, VmarCursor *cursor, uint64_t block,
                     uint64_t limit, VmarRun *run);

/* Format a 16-byte UUID as 36 lowercase characters plus NUL */
void vmar_uuid_format(const uint8_t id[16], char out[37]);

/*
 * Format a 16-byte UUID as 22 characters of unpadded base64url (RFC 4648,
 * section 5) plus NUL.  QEMU node names are at most 31 characters, too
 * short for a canonical UUID; this form leaves room for a 9-character
 * prefix.  Python: base64.urlsafe_b64encode(u.bytes).rstrip(b"=").
 */
#define VMAR_ID_B64_LEN 22
void vmar_id_b64url(const uint8_t id[16], char out[VMAR_ID_B64_LEN + 1]);

#endif /* VMAR_MAP_H */
