#!/usr/bin/env python3
"""Declare the vmar block driver in QEMU's QAPI schema (qapi/block-core.json).

Without this, blockdev-add, qemu-storage-daemon --blockdev and every other
QAPI-validated path reject driver "vmar" (qemu-img/qemu-io "json:" filenames
work without it).  The edit is idempotent and fails loudly if the schema
does not look as expected.

Usage: qapi-vmar.py QEMU_SOURCE_DIR
"""

import pathlib
import sys

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
#                    <prefix><uuid> instead of a file in @base-dir
#
# @base-cache-direct: open the targets in @base-dir with cache.direct=on
#                     (default: false)
#
# Since: 7.2
##
{ 'struct': 'BlockdevOptionsVmar',
  'base': 'BlockdevOptionsGenericFormat',
  'data': { '*base-dir': 'str',
            '*base-node-prefix': 'str',
            '*base-cache-direct': 'bool' } }

"""

ENUM_OLD = "'vmdk', 'vpc', 'vvfat' ] }"
ENUM_NEW = "'vmar', 'vmdk', 'vpc', 'vvfat' ] }"
UNION_ANCHOR = "      'vvfat':      'BlockdevOptionsVVFAT'"
UNION_NEW = "      'vmar':       'BlockdevOptionsVmar',\n"
STRUCT_ANCHOR = "##\n# @BlockdevOptions:\n"


def replace_once(text, old, new, what):
    if text.count(old) != 1:
        sys.exit("qapi-vmar.py: cannot find the %s in block-core.json" % what)
    return text.replace(old, new)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = pathlib.Path(sys.argv[1]) / "qapi" / "block-core.json"
    text = path.read_text()
    if "BlockdevOptionsVmar" in text:
        return
    text = replace_once(text, ENUM_OLD, ENUM_NEW, "BlockdevDriver enum")
    text = replace_once(text, UNION_ANCHOR, UNION_NEW + UNION_ANCHOR,
                        "BlockdevOptions union")
    text = replace_once(text, STRUCT_ANCHOR, STRUCT + STRUCT_ANCHOR,
                        "BlockdevOptions documentation")
    path.write_text(text)


if __name__ == "__main__":
    main()
