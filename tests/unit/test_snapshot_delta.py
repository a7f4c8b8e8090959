"""Snapshot deltas: the format, the compute host's builder, the assembly
in glance-api and the library entry made from the parent's.

The chain is checked whole on real files: a qcow2 overlay on a raw
parent written with qemu-io, its delta (mapformat.delta,
nova_imagebackend.delta), the image built from the parent's bytes and the
delta (glance_hooks.assemble) must equal ``qemu-img convert`` of the
overlay, and the library entry made from the parent's digests and the
delta's must be the entry a full ingest of that image makes.
"""

import hashlib
import os
import subprocess

import numpy as np

from tests import base
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack.glance_hooks import assemble
from vmar_openstack.mapformat import bootset as bootset_format
from vmar_openstack.mapformat import delta as delta_format
from vmar_openstack.mapformat import layout as layout_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.nova_imagebackend import delta as nova_delta

BS = base.BS
PARENT = '11111111-2222-4333-8444-555555555555'
CHILD = '66666666-7777-4888-9999-aaaaaaaaaaaa'
OTHER = '66666666-7777-4888-9999-bbbbbbbbbbbb'


def _sha(data):
    return hashlib.sha256(data).digest()


def _qemu_io(path, *cmds):
    args = ['qemu-io', '-f', 'qcow2']
    for c in cmds:
        args += ['-c', c]
    subprocess.run(args + [path], check=True, capture_output=True)


class TestFormat(base.LibraryTestCase):

    def _delta(self, data=(3, 9), zero=(5,), vsize=16 * BS, blocks=None):
        hdr = delta_format.Header(BS, vsize, PARENT, 12 * BS, 4)
        blocks = blocks or [base.block(b) for b in data]
        idx = delta_format.encode_index(
            hdr, data, np.frombuffer(b''.join(map(_sha, blocks)),
                                     np.uint8).reshape(-1, 32), zero)
        path = os.path.join(self.tmp, 'd')
        with open(path, 'wb') as f:
            f.write(idx + b''.join(blocks))
        return path

    def test_round_trip(self):
        d = delta_format.read_index(self._delta())
        self.assertEqual(delta_format.Header(BS, 16 * BS, PARENT, 12 * BS, 4),
                         d.header)
        self.assertEqual([3, 9], d.data_blocks.tolist())
        self.assertEqual([5], d.zero_blocks.tolist())
        with open(d.path, 'rb') as f:
            self.assertEqual(base.block(9), d.block(f, 1))

    def test_a_changed_index_byte_is_refused(self):
        path = self._delta()
        with open(path, 'r+b') as f:
            f.seek(delta_format.HEADER_SIZE + 3)
            f.write(b'\x07')
        e = self.assertRaises(exception.DeltaFormatError,
                              delta_format.read_index, path)
        self.assertIn('does not match its checksum', str(e))

    def test_a_changed_data_byte_fails_its_block(self):
        path = self._delta()
        with open(path, 'r+b') as f:
            f.seek(-10, os.SEEK_END)
            f.write(b'\xff')
        d = delta_format.read_index(path)
        with open(path, 'rb') as f:
            d.block(f, 0)
            e = self.assertRaises(exception.DeltaFormatError, d.block, f, 1)
        self.assertIn('block 9 (data block 1) does not match', str(e))

    def test_length_must_be_exact(self):
        for change in (b'x', None):
            path = self._delta()
            if change:
                with open(path, 'ab') as f:
                    f.write(change)
            else:
                os.truncate(path, os.path.getsize(path) - 1)
            self.assertRaises(exception.DeltaFormatError,
                              delta_format.read_index, path)

    def test_bad_indexes_are_refused(self):
        for data, zero in (((9, 3), ()), ((3, 16), ()), ((3,), (3,)),
                           ((), (5, 5))):
            self.assertRaises(exception.DeltaFormatError, self._delta,
                              data=data, zero=zero)
        self.assertRaises(exception.DeltaFormatError,
                          delta_format.read_index,
                          self._delta(vsize=32 * BS), max_virtual_size=BS * 16)

    def test_not_a_delta(self):
        path = base.write_image(os.path.join(self.tmp, 'raw'), [1, 2])
        self.assertFalse(delta_format.is_delta(path))
        self.assertRaises(exception.DeltaFormatError,
                          delta_format.read_index, path)


class TestChain(base.LibraryTestCase):
    """Overlay -> delta -> whole image -> library entry."""

    # the parent: 40 blocks, zero ones among them, 2 blocks short of a
    # 64 KiB cluster at the end
    SEEDS = [None if i % 7 == 3 else 100 + i for i in range(40)]

    def setUp(self):
        super().setUp()
        self.parent = base.write_image(os.path.join(self.images, 'parent'),
                                       self.SEEDS)
        self.lib.add(PARENT, self.parent, visibility='public')
        self.overlay = os.path.join(self.tmp, 'disk.qcow2')
        # a larger disk than its image, as a flavor's root disk can be
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-b',
                        self.parent, '-F', 'raw', self.overlay,
                        str(64 * BS)], check=True, capture_output=True)

    def _parent_rows(self):
        path = os.path.join(self.tmp, 'parent.digests')
        with open(path, 'wb') as f:
            f.write(self.lib.digest_list(PARENT))
        return mirror_format.read_digests(path)[1]

    def _write_delta(self):
        hdr = delta_format.Header(BS, 64 * BS, PARENT,
                                  os.path.getsize(self.parent), 1)
        return nova_delta.write(self.overlay, os.path.join(self.tmp, 'd'),
                                hdr, self._parent_rows())

    def _whole(self):
        out = os.path.join(self.tmp, 'expected.raw')
        subprocess.run(['qemu-img', 'convert', '-f', 'qcow2', '-O', 'raw',
                        self.overlay, out], check=True, capture_output=True)
        with open(out, 'rb') as f:
            return f.read()

    def _rows(self):
        return self.lib.fingerprints(PARENT).digests

    def _chunks(self, size=20000):
        with open(self.parent, 'rb') as f:
            while True:
                c = f.read(size)
                if not c:
                    return
                yield c

    def _change(self):
        # a new block, one written back unchanged, a zeroed data block, a
        # block past the parent's end, and part of a cluster rewritten
        _qemu_io(self.overlay, 'write -P 0x5a %d %d' % (2 * BS, BS),
                 'write -z %d %d' % (18 * BS, BS),
                 'write -P 0x11 %d %d' % (50 * BS, 2 * BS))
        with open(self.parent, 'rb') as f:
            f.seek(9 * BS)
            same = f.read(BS)
        raw = os.path.join(self.tmp, 'same')
        with open(raw, 'wb') as f:
            f.write(same)
        subprocess.run(['qemu-img', 'dd', '-f', 'raw', '-O', 'qcow2',
                        'if=' + raw, 'of=' + self.overlay, 'bs=%d' % BS,
                        'count=1', 'seek=9'], capture_output=True)

    def test_the_delta_holds_what_changed(self):
        self._change()
        made = self._write_delta()
        d = delta_format.read_index(made.path)
        self.assertEqual([2, 50, 51], d.data_blocks.tolist())
        self.assertEqual([18], d.zero_blocks.tolist())
        # the top layer holds whole 64 KiB clusters: 16 blocks each
        self.assertEqual(16 * 3, made.top_blocks)
        self.assertEqual(16 * 3 - 4, made.unchanged_blocks)

    def test_assembled_image_is_the_disk(self):
        self._change()
        made = self._write_delta()
        d = delta_format.read_index(made.path)
        out = assemble.assemble(d, self._rows(), self._chunks(),
                                os.path.join(self.tmp, 'whole'))
        with open(out.path, 'rb') as f:
            got = f.read()
        want = self._whole()
        self.assertEqual(len(want), len(got))
        self.assertEqual(want, got)
        # sparse: zero blocks were not written
        self.assertLess(out.data_bytes, len(want))

    def test_entry_from_the_delta_is_a_full_ingest(self):
        self._change()
        d = delta_format.read_index(self._write_delta().path)
        out = assemble.assemble(d, self._rows(), self._chunks(),
                                os.path.join(self.tmp, 'whole'))
        self.lib.add_delta(CHILD, d)
        self.lib.add(OTHER, out.path)
        with db_session.reader(self.conf) as s:
            st = db_store.ClusterStore(s)
            child, other = st.get_image(CHILD), st.get_image(OTHER)
            self.assertEqual(other.content_sha256, child.content_sha256)
            self.assertEqual(st.load_digests(other).tobytes(),
                             st.load_digests(child).tobytes())
        # and its map reads the blocks the parent holds from the parent
        self.assertIn(PARENT, self.lib.bases_of(CHILD, 1))

    def test_unchanged_disk_gives_an_empty_delta(self):
        made = self._write_delta()
        self.assertEqual((0, 0, 0), (made.top_blocks, made.data_blocks,
                                     made.zero_blocks))

    def test_parent_bytes_not_as_hashed(self):
        self._change()
        d = delta_format.read_index(self._write_delta().path)
        dest = os.path.join(self.tmp, 'whole')
        # a data block of the parent changed in its store, or a zero one
        # that is not zero any more
        for at in (4, 3):
            with open(self.parent, 'r+b') as f:
                f.seek(at * BS + 100)
                f.write(b'rot')
            e = self.assertRaises(exception.SnapshotError, assemble.assemble,
                                  d, self._rows(), self._chunks(), dest)
            self.assertIn('stored block %d is not what the library hashed'
                          % at, str(e))
            self.assertFalse(os.path.exists(dest))
            self.assertEqual([], [n for n in os.listdir(self.tmp)
                                  if n.startswith('whole')])
        # a stream cut short
        e = self.assertRaises(exception.SnapshotError, assemble.assemble, d,
                              self._rows(), iter([b'x' * BS]), dest)
        self.assertIn('its store gave 4096 bytes', str(e))

    def test_the_file_being_written_is_named_after_the_image(self):
        # what a killed glance-api leaves: Glance's staging cleaner takes
        # a name that starts with the image id for that image's
        self._change()
        d = delta_format.read_index(self._write_delta().path)
        dest = os.path.join(self.tmp, 'whole')
        seen = []

        def chunks():
            for c in self._chunks():
                seen.append([n for n in os.listdir(self.tmp)
                             if n.startswith(('whole', '.'))])
                yield c
        assemble.assemble(d, self._rows(), chunks(), dest)
        self.assertEqual(1, len(seen[-1]), seen)
        self.assertTrue(seen[-1][0].startswith('whole.tmp-'), seen)
        self.assertEqual(['whole'], [n for n in os.listdir(self.tmp)
                                     if n.startswith(('whole', '.'))])

    def test_a_corrupted_block_fails_the_assembly(self):
        self._change()
        path = self._write_delta().path
        with open(path, 'r+b') as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(b'\x00' if last != b'\x00' else b'\x01')
        d = delta_format.read_index(path)
        dest = os.path.join(self.tmp, 'whole')
        self.assertRaises(exception.DeltaFormatError, assemble.assemble, d,
                          self._rows(), self._chunks(), dest)
        self.assertFalse(os.path.exists(dest))
        self.assertEqual([], [n for n in os.listdir(self.tmp)
                              if n.startswith('whole')])

    def test_entry_needs_the_parent(self):
        self._change()
        d = delta_format.read_index(self._write_delta().path)
        self.lib.delete(PARENT)
        self.assertRaises(exception.ImageNotFound, self.lib.add_delta, CHILD,
                          d)
        self.assertFalse(self.lib.has_image(CHILD))


class TestDerivedFiles(base.LibraryTestCase):
    """A snapshot's layout and boot set are its parent's, renamed."""

    def test_layout_and_bootset_for_a_snapshot(self):
        parent = base.write_image(os.path.join(self.images, 'p'),
                                  list(range(1, 33)))
        self.lib.add(PARENT, parent)
        lay = layout_format.decode(self.lib.layout(PARENT), PARENT)
        for size in (lay.virtual_size, lay.virtual_size + 8 * BS):
            out = layout_format.decode(layout_format.for_image(
                self.lib.layout(PARENT), PARENT, CHILD, size), CHILD)
            self.assertEqual((CHILD, size), (out.image_id, out.virtual_size))
            self.assertEqual(lay.runs, out.runs[:len(lay.runs)])
            self.assertEqual(size // BS, sum(r[1] for r in out.runs))
        boot = bootset_format.Bootset(PARENT, 32 * BS, BS, 'introspected',
                                      ((1, 3), (10, 2)))
        for size in (32 * BS, 64 * BS):
            out = bootset_format.decode(bootset_format.for_image(
                bootset_format.encode(boot), PARENT, CHILD, size), CHILD)
            self.assertEqual((CHILD, size, boot.extents),
                             (out.image_id, out.virtual_size, out.extents))
        # another image's file is refused
        self.assertRaises(exception.LayoutFormatError,
                          layout_format.for_image, self.lib.layout(PARENT),
                          OTHER, CHILD, 32 * BS)
