#!/usr/bin/env python3
"""Declare the vmar block driver in QEMU's QAPI schema (qapi/block-core.json).

Without this, blockdev-add, qemu-storage-daemon --blockdev and every other
QAPI-validated path reject driver "vmar" (qemu-img/qemu-io "json:" filenames
work without it). The driver's read counters are declared as its
format-specific image information (ImageInfoSpecificVmar), which
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
# Since: 7.2
##
{ 'struct': 'BlockdevOptionsVmar',
  'base': 'BlockdevOptionsGenericFormat',
  'data': { '*base-dir': 'str',
            '*base-node-prefix': 'str',
            '*base-cache-direct': 'bool',
            '*targets': [ 'BlockdevRef' ],
            '*gather-gap': 'size' } }

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
# Since: 7.2
##
{ 'struct': 'ImageInfoSpecificVmar',
  'data': { 'requests': 'uint64', 'bytes-read': 'uint64',
            'bytes-zero': 'uint64', 'target-reads': 'uint64',
            'errors': 'uint64', 'extents': 'uint64' } }

##
# @ImageInfoSpecificVmarWrapper:
#
# Since: 7.2
##
{ 'struct': 'ImageInfoSpecificVmarWrapper',
  'data': { 'data': 'ImageInfoSpecificVmar' } }

"""

INFO_ENUM_OLD = "  'data': [ 'qcow2', 'vmdk', 'luks', 'rbd' ] }"
INFO_ENUM_NEW = "  'data': [ 'qcow2', 'vmdk', 'luks', 'rbd', 'vmar' ] }"
INFO_UNION_OLD = "      'rbd': 'ImageInfoSpecificRbdWrapper'\n  } }"
INFO_UNION_NEW = ("      'rbd': 'ImageInfoSpecificRbdWrapper',\n"
                  "      'vmar': 'ImageInfoSpecificVmarWrapper'\n  } }")
INFO_STRUCT_ANCHOR = "##\n# @ImageInfoSpecific:\n"

ENUM_OLD = "'vmdk', 'vpc', 'vvfat' ] }"
ENUM_NEW = "'vmar', 'vmdk', 'vpc', 'vvfat' ] }"
UNION_ANCHOR = "      'vvfat':      'BlockdevOptionsVVFAT'"
UNION_NEW = "      'vmar':       'BlockdevOptionsVmar',\n"
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
