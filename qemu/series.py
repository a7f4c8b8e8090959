#!/usr/bin/env python3
"""Make and check the vmar patch series for one QEMU tree.

The vmar change to QEMU is kept as a ``git format-patch`` series per
QEMU version under ``qemu/patches/<version>/``: that is what build.sh
applies, what a packager drops into ``debian/patches``, and what a QEMU
maintainer would review.  The new files of the series (the drivers, the
map parser, the compat header, the trace events and the iotests) have one
source in ``qemu/``; this script writes them, with the few edits of
QEMU's own files (meson.build, the QAPI schema, trace-events, the NBD
server), into a series.  Every edit finds its place by a pattern that must
match exactly once, so a tree that does not look as expected stops it.

Usage:
  series.py make VERSION PRISTINE_TREE   write qemu/patches/VERSION/
                                         (build.sh --qemu VERSION --series)
  series.py check TREE                   the new files of a patched tree
                                         are those of qemu/ (exit 1 if not)
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
PATCHES = HERE / 'patches'

# qemu/ source -> path in the QEMU tree, per patch
VMAR_FILES = {
    'vmar-compat.h': 'block/vmar-compat.h',
    'vmar-map.h': 'block/vmar-map.h',
    'vmar-map.c': 'block/vmar-map.c',
    'block-vmar.c': 'block/vmar.c',
}
MIRROR_FILES = {
    'block-vmar-mirror.c': 'block/vmar-mirror.c',
}
# qemu/iotests/X -> tests/qemu-iotests/X (the helper module and tests/)
IOTEST_DIR = HERE / 'iotests'
IOTEST_DEST = 'tests/qemu-iotests'

AUTHOR = 'vmar-openstack developers'
EMAIL = 'vmar-openstack@lists.invalid'
DATE = '2026-01-01T00:00:00+00:00'


class SeriesError(Exception):
    pass


def _edit(tree, relpath, old, new, what):
    """Replace the one match of the regex ``old`` in ``relpath``."""
    path = pathlib.Path(tree) / relpath
    text = path.read_text()
    found = re.findall(old, text, flags=re.M)
    if len(found) != 1:
        raise SeriesError('%s: the %s is not there exactly once (%d)'
                          % (relpath, what, len(found)))
    path.write_text(re.sub(old, new, text, count=1, flags=re.M))


def _append(tree, relpath, text):
    path = pathlib.Path(tree) / relpath
    old = path.read_text()
    path.write_text(old.rstrip('\n') + '\n\n' + text)


def _trace_events(prefix):
    """The events of qemu/trace-events whose section names @prefix."""
    out, keep = [], False
    for line in (HERE / 'trace-events').read_text().splitlines():
        if line.startswith('# '):
            keep = line == '# %s' % prefix
        if keep:
            out.append(line)
    return '\n'.join(out).strip() + '\n'


def _copy(tree, files):
    for src, dst in files.items():
        shutil.copyfile(HERE / src, pathlib.Path(tree) / dst)


# The QAPI schema of patch 1 (the structs are inserted before
# BlockdevOptions' documentation, the info structs before
# ImageInfoSpecific's)
QAPI_VMAR = """##
# @BlockdevOptionsVmar:
#
# Driver specific block device options for VMAR block maps: a
# read-only virtual disk whose extents are read from other images
# ("targets") and whose unmapped blocks read as zeros.  Target i is
# the file named by its UUID in @base-dir, or the node named
# @base-node-prefix followed by its UUID in unpadded base64url, or
# entry i of @targets, which takes precedence.
#
# @base-dir: directory of the target files
#
# @base-node-prefix: target i is the node named this prefix + its id
#
# @base-cache-direct: open @base-dir targets with cache.direct=on
#
# @targets: the targets, in the order of the map's target table
#
# @gather-gap: read runs of a target this close with one read
#
# @record-window: seconds after the first read to record reads in
#
# Since: 11.0
##
{ 'struct': 'BlockdevOptionsVmar',
  'base': 'BlockdevOptionsGenericFormat',
  'data': { '*base-dir': 'str',
            '*base-node-prefix': 'str',
            '*base-cache-direct': 'bool',
            '*targets': [ 'BlockdevRef' ],
            '*gather-gap': 'size',
            '*record-window': 'uint32' } }

"""

QAPI_VMAR_INFO = """##
# @ImageInfoSpecificVmar:
#
# The read counters of a vmar node.
#
# @requests: read requests
#
# @bytes-read: bytes read from targets
#
# @bytes-zero: bytes read as zeros (unmapped)
#
# @target-reads: reads sent to targets
#
# @errors: failed requests
#
# @extents: extents of the map
#
# @lookups: map lookups
#
# @probes: map index probes
#
# @recording: whether the record window is still open
#
# @touched: the blocks read in the record window (base64 bitmap)
#
# Since: 11.0
##
{ 'struct': 'ImageInfoSpecificVmar',
  'data': { 'requests': 'uint64', 'bytes-read': 'uint64',
            'bytes-zero': 'uint64', 'target-reads': 'uint64',
            'errors': 'uint64', 'extents': 'uint64',
            'lookups': 'uint64', 'probes': 'uint64',
            '*recording': 'bool', '*touched': 'str' } }

##
# @ImageInfoSpecificVmarWrapper:
#
# @data: image information specific to vmar
#
# Since: 11.0
##
{ 'struct': 'ImageInfoSpecificVmarWrapper',
  'data': { 'data': 'ImageInfoSpecificVmar' } }

"""

QAPI_MIRROR = """##
# @BlockdevOptionsVmarMirror:
#
# Driver specific block device options for vmar-mirror: a local copy
# of one base image (@file), filled on demand from @fetch, every
# block checked against its SHA-256 digest before it is written or
# read.
#
# @fetch: the node the base's bytes are fetched from
#
# @digests: the base's digest list file
#
# @present: the mirror's present-block bitmap file
#
# @readahead: missing bytes fetched after a missing run
#
# @verify-in-threads: check fetched blocks in the thread pool
#
# Since: 11.0
##
{ 'struct': 'BlockdevOptionsVmarMirror',
  'base': 'BlockdevOptionsGenericFormat',
  'data': { 'fetch': 'BlockdevRef',
            'digests': 'str',
            'present': 'str',
            '*readahead': 'size',
            '*verify-in-threads': 'bool' } }

"""

QAPI_MIRROR_INFO = """##
# @ImageInfoSpecificVmarMirror:
#
# The counters of a vmar-mirror node.
#
# @blocks: blocks of the base
#
# @present-blocks: blocks the mirror holds (zero blocks included)
#
# @requests: read requests
#
# @fetches: fetches from the fetch child
#
# @bytes-fetched: bytes fetched
#
# @waits: reads that waited for another read's fetch
#
# @fetch-errors: fetches that failed
#
# @digest-mismatches: fetched blocks that did not match their digest
#
# @write-errors: failed writes into the mirror file
#
# @flush-errors: failed updates of the present file
#
# Since: 11.0
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
# @data: image information specific to vmar-mirror
#
# Since: 11.0
##
{ 'struct': 'ImageInfoSpecificVmarMirrorWrapper',
  'data': { 'data': 'ImageInfoSpecificVmarMirror' } }

"""

BLOCK_CORE = 'qapi/block-core.json'


def _qapi_driver(tree, name, options, info, options_text, info_text):
    """Declare driver @name in the schema, with its structs."""
    _edit(tree, BLOCK_CORE, r"'vmdk', 'vpc', 'vvfat' \] \}",
          "'%s', 'vmdk', 'vpc', 'vvfat' ] }" % name,
          'end of the BlockdevDriver enum')
    _edit(tree, BLOCK_CORE, r"^(      'vvfat':      'BlockdevOptionsVVFAT')",
          "      %-12s'%s',\n\\1" % ("'%s':" % name, options),
          'vvfat branch of BlockdevOptions')
    _edit(tree, BLOCK_CORE, r"^(##\n# @BlockdevOptions:\n)",
          options_text.replace('\\', '\\\\') + r'\1',
          'BlockdevOptions documentation')
    _edit(tree, BLOCK_CORE,
          r"(\{ 'enum': 'ImageInfoSpecificKind',\n  'data': \[[^\]]*?) \] \}",
          "\\1, '%s' ] }" % name, 'ImageInfoSpecificKind enum')
    _edit(tree, BLOCK_CORE,
          r"(\{ 'union': 'ImageInfoSpecific',\n(?:.*\n)*?.*'"
          r"ImageInfoSpecific\w+Wrapper')\n  \} \}",
          "\\1,\n      '%s': '%sWrapper'\n  } }" % (name, info),
          'ImageInfoSpecific union')
    _edit(tree, BLOCK_CORE, r"^(##\n# @ImageInfoSpecific:\n)",
          info_text.replace('\\', '\\\\') + r'\1',
          'ImageInfoSpecific documentation')


MAINTAINERS_VMAR = """VMAR
M: %s <%s>
L: qemu-block@nongnu.org
S: Maintained
F: block/vmar*
F: tests/qemu-iotests/tests/vmar-*
F: tests/qemu-iotests/vmar_map.py

"""


def patch_vmar(tree):
    _edit(tree, 'MAINTAINERS', r'^(VMDK\nM:)',
          (MAINTAINERS_VMAR % (AUTHOR, EMAIL)) + r'\1', 'VMDK entry')
    _copy(tree, VMAR_FILES)
    _append(tree, 'block/meson.build',
            "block_ss.add(files('vmar.c', 'vmar-map.c'), zlib)\n")
    _append(tree, 'block/trace-events', _trace_events('vmar.c'))
    _qapi_driver(tree, 'vmar', 'BlockdevOptionsVmar', 'ImageInfoSpecificVmar',
                 QAPI_VMAR, QAPI_VMAR_INFO)


def patch_mirror(tree):
    _copy(tree, MIRROR_FILES)
    _append(tree, 'block/meson.build',
            "block_ss.add(files('vmar-mirror.c'), dependency('libcrypto'))\n")
    _append(tree, 'block/trace-events', _trace_events('vmar-mirror.c'))
    _qapi_driver(tree, 'vmar-mirror', 'BlockdevOptionsVmarMirror',
                 'ImageInfoSpecificVmarMirror', QAPI_MIRROR, QAPI_MIRROR_INFO)


NBD_LIST_OLD = r"""    NBDExport \*exp;
    assert\(client->opt == NBD_OPT_LIST\);

    /\* For each export, send a NBD_REP_SERVER reply. \*/
    QTAILQ_FOREACH\(exp, &exports, next\) \{
        if \(nbd_negotiate_send_rep_list\(client, exp, errp\)\) \{
            return -EINVAL;
        \}
    \}
    /\* Finish with a NBD_REP_ACK. \*/
"""
NBD_LIST_NEW = """    assert(client->opt == NBD_OPT_LIST);

    /*
     * No export is listed: each export's name carries the key of the one
     * client allowed to open it.
     */
"""


def patch_nbd(tree):
    _edit(tree, 'nbd/server.c', NBD_LIST_OLD, NBD_LIST_NEW,
          'NBD_OPT_LIST handler')
    _edit(tree, 'nbd/server.c',
          r"^static coroutine_fn int\nnbd_negotiate_send_rep_list\(",
          "static coroutine_fn int G_GNUC_UNUSED\n"
          "nbd_negotiate_send_rep_list(", 'NBD_REP_SERVER helper')


def _iotests():
    """The iotest files, as paths relative to qemu/iotests."""
    return sorted(f.relative_to(IOTEST_DIR) for f in IOTEST_DIR.rglob('*')
                  if f.is_file() and '__pycache__' not in f.parts)


def patch_iotests(tree):
    dest = pathlib.Path(tree) / IOTEST_DEST
    for f in _iotests():
        shutil.copyfile(IOTEST_DIR / f, dest / f)
        if f.parent.name == 'tests' and f.suffix != '.out':
            os.chmod(dest / f, 0o755)


SERIES = [
    (patch_vmar, 'block/vmar: Add a read-only driver for VMAR block maps', """\
A VMAR block map describes a virtual disk as extents of blocks read
from other images (its targets); blocks no extent covers read as
zeros.  Many images of one cloud share most of their blocks, and a map
per image lets all of them read one copy of each shared block, so the
host page cache holds it once.

The map is the node's "file" child and is validated whole at open.
Targets are opened as children from a directory of base files, taken
from existing nodes by name, or given as a list.  Reads look extents up
through the map's index, fill unmapped runs with zeros and gather
nearby runs of one target into one read, sent through an AioTaskPool.
Block status reports zero runs and, for a run within one extent, its
offset in the target.  The node is read-only.

Its counters are its format-specific image information
(query-named-block-nodes); diagnostics are trace events.  The map
format is documented in vmar-openstack's doc/source/map-format.rst."""),
    (patch_mirror, 'block/vmar-mirror: Add verified on-demand mirrors', """\
A vmar-mirror node is a local sparse copy of one base image, filled on
demand: a read of blocks the mirror does not hold yet fetches them from
the "fetch" child, checks each block against its SHA-256 from a digest
list, writes the good ones into the "file" child and serves the read
from there.  Unverified bytes never reach the mirror or a reader: a
failed fetch or a mismatch fails the read with EIO.

Concurrent misses of one run wait for the fetch in flight (reqlist).
The present-block bitmap is written after the data it stands for was
flushed, so after a crash a block is present and good or fetched
again.  Hashing and the bitmap writes run in the thread pool, off the
AioContext.  Counters are the node's image information; diagnostics
are trace events."""),
    (patch_nbd, 'nbd/server: List no export', """\
vmar-openstack gives each client its own export whose name carries a
random key, so that a client can open only the exports it was told
about.  NBD_OPT_LIST would hand every name to any client of the
socket: answer it with an empty list.  Opening an export by name is
unchanged, and an unknown name still gets NBD_REP_ERR_UNKNOWN."""),
    (patch_iotests, 'iotests: Add tests of the vmar and vmar-mirror drivers',
     """\
Reads through maps with shared, zero and unaligned extents; a mirror
filled on demand, reopened and filled again; a corrupted fetched block
that fails the read and writes nothing; a fetch child that fails and
recovers; concurrent readers of one missing run; and a map whose base
does not match its digest list."""),
]


def _git(tree, *args, env=None):
    subprocess.run(['git', '-c', 'safe.directory=*', '-C', str(tree)]
                   + list(args), check=True,
                   env=env, stdout=subprocess.DEVNULL)


def make(version, tree):
    """Write qemu/patches/@version from the pristine tree @tree."""
    tree = pathlib.Path(tree)
    env = dict(os.environ, GIT_AUTHOR_NAME=AUTHOR, GIT_AUTHOR_EMAIL=EMAIL,
               GIT_COMMITTER_NAME=AUTHOR, GIT_COMMITTER_EMAIL=EMAIL,
               GIT_AUTHOR_DATE=DATE, GIT_COMMITTER_DATE=DATE)
    if (tree / '.git').exists():
        raise SeriesError('%s is a git tree: give a pristine source tree'
                          % tree)
    _git(tree, 'init', '-q', env=env)
    _git(tree, 'add', '-A', '-f', '.', env=env)
    _git(tree, 'commit', '-q', '-m', 'QEMU %s' % version, env=env)
    _git(tree, 'tag', 'vmar-base', env=env)
    for func, subject, body in SERIES:
        func(tree)
        _git(tree, 'add', '-A', '.', env=env)
        if subprocess.run(['git', '-c', 'safe.directory=*', '-C', str(tree),
                           'diff', '--cached', '--quiet']).returncode == 0:
            raise SeriesError('%r changes nothing' % subject)
        msg = '%s\n\n%s\n\nSigned-off-by: %s <%s>\n' % (
            subject, body, AUTHOR, EMAIL)
        _git(tree, 'commit', '-q', '-m', msg, env=env)
    out = PATCHES / version
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    _git(tree, 'format-patch', '-q', '--zero-commit', '--no-signature',
         '--no-numbered', '-o', str(out), 'vmar-base..HEAD', env=env)
    return sorted(out.iterdir())


def check(tree):
    """The problems of a patched tree against qemu/ (empty: none)."""
    tree = pathlib.Path(tree)
    wrong = []
    files = dict(VMAR_FILES, **MIRROR_FILES)
    files.update({'iotests/%s' % f: '%s/%s' % (IOTEST_DEST, f)
                  for f in _iotests()})
    for src, dst in sorted(files.items()):
        if not (tree / dst).exists() or \
                (tree / dst).read_bytes() != (HERE / src).read_bytes():
            wrong.append('%s differs from qemu/%s' % (dst, src))
    events = (tree / 'block/trace-events').read_text()
    for prefix in ('vmar.c', 'vmar-mirror.c'):
        if _trace_events(prefix) not in events:
            wrong.append('block/trace-events lacks the events of %s'
                         % prefix)
    return wrong


def main(argv):
    try:
        if len(argv) == 4 and argv[1] == 'make':
            for p in make(argv[2], argv[3]):
                print(p)
            return 0
        if len(argv) == 3 and argv[1] == 'check':
            wrong = check(argv[2])
            for w in wrong:
                print('series.py: %s' % w, file=sys.stderr)
            return 1 if wrong else 0
    except SeriesError as e:
        print('series.py: %s' % e, file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv))
