#!/usr/bin/env python3
"""Declare the vmar drivers in QEMU's QAPI schema (qapi/block-core.json).

Without this, blockdev-add, qemu-storage-daemon --blockdev and every other
QAPI-validated path reject the drivers "vmar" and "vmar-mirror"
(qemu-img/qemu-io "json:" filenames work without it). Each driver's
counters are declared as its format-specific image information
(ImageInfoSpecificVmar, ImageInfoSpecificVmarMirror), which
query-named-block-nodes returns. The edit is idempotent and fails loudly
if the schema does not look as expected (srcedit.py).

Usage: qapi-vmar.py QEMU_SOURCE_DIR
"""

import srcedit

STRUCT = """##
# @BlockdevOptionsVmar:
#
# Driver specific block device options for the read-only vmar format
# (VMAR block map, added by vmar-openstack).
#
# @base-dir: directory holding the target images, each named by its
#            lowercase hyphenated UUID; each is opened as a read-only
#            "file" node with cache.direct=off
#
# @base-node-prefix: if set, target i is the existing node named
#                    <prefix><id>, <id> being the target's UUID as 22
#                    characters of unpadded base64url (RFC 4648); the
#                    prefix is at most 9 characters
#
# @base-cache-direct: open the targets in @base-dir with cache.direct=on
#                     (default: false)
#
# @targets: the targets in the order of the map's target table; an entry
#           given here takes precedence over @base-dir and
#           @base-node-prefix
#
# @gather-gap: runs of one request that lie at most this many bytes apart
#              in one target are read with one target read, the bytes in
#              between being read and dropped (default: 0, only touching
#              runs are merged; a gap reads blocks that the map serves
#              from elsewhere, so they enter the host cache twice)
#
# @record-window: record the blocks read during this many seconds after
#                 the node's first read (an image's boot working set;
#                 default: 0, nothing recorded)
#
# Since: 7.2
##
{ 'struct': 'BlockdevOptionsVmar',
  'base': 'BlockdevOptionsGenericFormat',
  'data': { '*base-dir': 'str',
            '*base-node-prefix': 'str',
            '*base-cache-direct': 'bool',
            '*targets': [ 'BlockdevRef' ],
            '*gather-gap': 'size',
            '*record-window': 'uint32' } }

##
# @BlockdevOptionsVmarMirror:
#
# Driver specific block device options for vmar-mirror, a local copy of a
# VMAR base image filled on demand and verified block by block (added by
# vmar-openstack).  The node must be read-write: it writes fetched blocks
# into @file; it refuses writes from its parents.
#
# @fetch: the node blocks missing from @file are read from (the base's
#         raw bytes)
#
# @digests: path of the base's digest list (one SHA-256 per block)
#
# @present: path of the mirror's present-block bitmap file
#
# @readahead: missing bytes fetched after a missing run that ends a read
#             (default: 64 KiB, at most 16 MiB)
#
# Since: 7.2
##
{ 'struct': 'BlockdevOptionsVmarMirror',
  'base': 'BlockdevOptionsGenericFormat',
  'data': { 'fetch': 'BlockdevRef',
            'digests': 'str',
            'present': 'str',
            '*readahead': 'size' } }

"""

INFO_STRUCT = """##
# @ImageInfoSpecificVmar:
#
# Read counters of a vmar node since it was opened (added by
# vmar-openstack).
#
# @requests: read requests
#
# @bytes-read: bytes of those requests read from targets
#
# @bytes-zero: bytes of those requests served as zeros (no extent)
#
# @target-reads: reads sent to targets (gathered runs count once)
#
# @errors: read requests that failed
#
# @extents: extents in the map
#
# @recording: with record-window: whether the window is still open (it
#             opens at the first read)
#
# @touched: with record-window: the blocks read in the window, one bit
#           per block (bit b % 8 of byte b / 8), base64
#
# Since: 7.2
##
{ 'struct': 'ImageInfoSpecificVmar',
  'data': { 'requests': 'uint64', 'bytes-read': 'uint64',
            'bytes-zero': 'uint64', 'target-reads': 'uint64',
            'errors': 'uint64', 'extents': 'uint64',
            '*recording': 'bool', '*touched': 'str' } }

##
# @ImageInfoSpecificVmarWrapper:
#
# Since: 7.2
##
{ 'struct': 'ImageInfoSpecificVmarWrapper',
  'data': { 'data': 'ImageInfoSpecificVmar' } }

##
# @ImageInfoSpecificVmarMirror:
#
# State and counters of a vmar-mirror node since it was opened (added by
# vmar-openstack).
#
# @blocks: blocks of the base
#
# @present-blocks: blocks the mirror holds or need no fetch (zero blocks)
#
# @requests: read requests
#
# @fetches: reads sent to the fetch child
#
# @bytes-fetched: bytes those reads returned
#
# @waits: times a read waited for another read's fetch of its blocks
#
# @fetch-errors: fetches that failed
#
# @digest-mismatches: fetched blocks whose digest was wrong (not used)
#
# @write-errors: verified blocks that could not be written to the mirror
#
# @flush-errors: times present bits could not be recorded
#
# Since: 7.2
##
{ 'struct': 'ImageInfoSpecificVmarMirror',
  'data': { 'blocks': 'uint64', 'present-blocks': 'uint64',
            'requests': 'uint64', 'fetches': 'uint64',
            'bytes-fetched': 'uint64', 'waits': 'uint64',
            'fetch-errors': 'uint64', 'digest-mismatches': 'uint64',
            'write-errors': 'uint64', 'flush-errors': 'uint64' } }

##
# @ImageInfoSpecificVmarMirrorWrapper:
#
# Since: 7.2
##
{ 'struct': 'ImageInfoSpecificVmarMirrorWrapper',
  'data': { 'data': 'ImageInfoSpecificVmarMirror' } }

"""

INFO_ENUM_OLD = "  'data': [ 'qcow2', 'vmdk', 'luks', 'rbd' ] }"
INFO_ENUM_NEW = ("  'data': [ 'qcow2', 'vmdk', 'luks', 'rbd', 'vmar', "
                 "'vmar-mirror' ] }")
INFO_UNION_OLD = "      'rbd': 'ImageInfoSpecificRbdWrapper'\n  } }"
INFO_UNION_NEW = ("      'rbd': 'ImageInfoSpecificRbdWrapper',\n"
                  "      'vmar': 'ImageInfoSpecificVmarWrapper',\n"
                  "      'vmar-mirror': 'ImageInfoSpecificVmarMirrorWrapper'\n"
                  "  } }")
INFO_STRUCT_ANCHOR = "##\n# @ImageInfoSpecific:\n"

ENUM_OLD = "'vmdk', 'vpc', 'vvfat' ] }"
ENUM_NEW = "'vmar', 'vmar-mirror', 'vmdk', 'vpc', 'vvfat' ] }"
UNION_ANCHOR = "      'vvfat':      'BlockdevOptionsVVFAT'"
UNION_NEW = ("      'vmar':       'BlockdevOptionsVmar',\n"
             "      'vmar-mirror': 'BlockdevOptionsVmarMirror',\n")
STRUCT_ANCHOR = "##\n# @BlockdevOptions:\n"


EDITS = [
    (ENUM_OLD, ENUM_NEW, "BlockdevDriver enum"),
    (UNION_ANCHOR, UNION_NEW + UNION_ANCHOR, "BlockdevOptions union"),
    (STRUCT_ANCHOR, STRUCT + STRUCT_ANCHOR, "BlockdevOptions documentation"),
    (INFO_ENUM_OLD, INFO_ENUM_NEW, "ImageInfoSpecificKind enum"),
    (INFO_UNION_OLD, INFO_UNION_NEW, "ImageInfoSpecific union"),
    (INFO_STRUCT_ANCHOR, INFO_STRUCT + INFO_STRUCT_ANCHOR,
     "ImageInfoSpecific documentation"),
]


if __name__ == "__main__":
    srcedit.main(__doc__, "qapi-vmar.py", "qapi/block-core.json",
                 "BlockdevOptionsVmar", EDITS)
