"""Fingerprinting: correct digests, holes skipped, hostile images rejected."""

import errno
import hashlib
import mmap
import os
import subprocess
import time

import fixtures
import numpy as np

import sqlalchemy as sa
import testtools

from tests import base
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import hashing
from vmar_openstack import ingest

ID = '0f000000-0000-4000-8000-00000000000f'


def _oracle(path, bs, algorithm='sha256'):
    with open(path, 'rb') as f:
        data = f.read()
    out = []
    for i in range(0, len(data), bs):
        blk = data[i:i + bs].ljust(bs, b'\0')
        out.append(bytes(len(hashlib.new(algorithm).digest()))
                   if not any(blk) else hashlib.new(algorithm, blk).digest())
    return out


def _qemu_img(*args):
    subprocess.run(('qemu-img',) + args, check=True, capture_output=True)


class TestHashing(base.LibraryTestCase):

    def test_digests_match_hashlib_with_zero_blocks_and_tail(self):
        path = self.image('a', [1, None, 2, 3, None, None, 4], tail=b'x' * 7)
        for native in (True, False):
            for workers in (1, 2):
                fps = fingerprint.hash_file(path, os.path.getsize(path),
                                            workers=workers, native=native)
                self.assertEqual(_oracle(path, 4096),
                                 [bytes(r) for r in fps.digests])
                self.assertEqual(3, int(fps.zero_mask.sum()))
                self.assertTrue(fps.tail_partial)

    def test_other_block_sizes_and_algorithms(self):
        path = self.image('a', [1, None] + list(range(2, 9)) + [None])
        for algorithm in fingerprint.DIGEST_SIZES:
            for native in (True, False):
                fps = fingerprint.hash_file(path, os.path.getsize(path),
                                            block_size=8192,
                                            algorithm=algorithm,
                                            native=native)
                self.assertEqual(_oracle(path, 8192, algorithm),
                                 [bytes(r) for r in fps.digests],
                                 '%s native=%s' % (algorithm, native))

    def test_native_hasher_is_built(self):
        # tools/install-deps.sh installs what it needs; a missing build
        # would silently cost a third of the hashing rate
        self.assertIsNotNone(hashing._blockhash)

    def test_native_hasher_spans_chunks_and_buffers(self):
        # more blocks than one read buffer and one job, data at odd places
        blocks = [i if i % 7 else None for i in range(1, 700)]
        path = self.image('big', blocks, tail=b'y' * 100)
        self.patch(hashing, 'CHUNK', 64 << 10)
        self.patch(hashing, 'READ_BUF', 12 << 10)
        fps = fingerprint.hash_file(path, os.path.getsize(path), workers=2,
                                    native=True)
        self.assertEqual(_oracle(path, 4096), [bytes(r) for r in fps.digests])

    def test_on_chunk_sees_every_row_once_as_it_is_done(self):
        blocks = [i if i % 5 else None for i in range(1, 300)]
        path = self.image('chunks', blocks, tail=b'z' * 10)
        self.patch(hashing, 'CHUNK', 64 << 10)
        for native in (True, False):
            seen = []

            def on_chunk(rows, seen=seen):
                seen.append(np.array(rows))   # a copy: rows is a view
            fps = fingerprint.hash_file(path, os.path.getsize(path),
                                        workers=2, native=native,
                                        on_chunk=on_chunk)
            self.assertGreater(len(seen), 1)
            got = sorted(bytes(r) for c in seen for r in c)
            self.assertEqual(sorted(bytes(r) for r in fps.digests), got)

    def test_file_changed_while_hashed_is_rejected(self):
        path = self.image('moving', list(range(1, 64)))
        self.patch(hashing, 'CHUNK', 64 << 10)
        for native in (True, False):
            for change in ('truncate', 'write'):
                base.write_image(path, list(range(1, 64)))
                size = os.path.getsize(path)

                def progress(_n, change=change, done=[]):
                    if done:
                        return
                    done.append(1)
                    # past the file system's timestamp tick (a few ms)
                    time.sleep(0.02)
                    with open(path, 'r+b') as f:
                        if change == 'truncate':
                            f.truncate(size // 2)
                        else:
                            f.seek(size - 4096)
                            f.write(base.block(999))
                e = self.assertRaises(
                    exception.ImageRejected, fingerprint.hash_file, path,
                    size, workers=1, progress=progress, native=native)
                self.assertIn('changed while it was being read', str(e))

    def test_native_hasher_survives_a_file_truncated_while_mapped(self):
        # reading a vanished page of a memory map raises SIGBUS; the
        # extension turns it into an error instead of killing the process
        from vmar_openstack.fingerprint import _blockhash
        path = self.image('short', list(range(1, 257)))
        with open(path, 'r+b') as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            self.addCleanup(m.close)
            out = bytearray(32 * 256)
            self.assertEqual(256, _blockhash.hash_blocks('sha256', 4096, m,
                                                         out))
            f.truncate(4096)
            e = self.assertRaises(OSError, _blockhash.hash_blocks, 'sha256',
                                  4096, m, out)
            self.assertEqual(errno.EFAULT, e.errno)

    def test_native_hasher_rejects_bad_arguments(self):
        from vmar_openstack.fingerprint import _blockhash
        out = bytearray(32)
        self.assertRaises(ValueError, _blockhash.hash_blocks, 'nosuch',
                          4096, bytes(4096), out)
        self.assertRaises(ValueError, _blockhash.hash_blocks, 'sha256',
                          4096, bytes(4097), out)
        self.assertRaises(ValueError, _blockhash.hash_blocks, 'sha256',
                          4096, bytes(8192), out)
        self.assertRaises(TypeError, _blockhash.hash_blocks, 'sha256',
                          4096, bytes(4096), bytes(32))

    def test_holes_are_not_read(self):
        path = os.path.join(self.tmp, 'sparse.raw')
        with open(path, 'wb') as f:
            f.truncate(1 << 30)
            f.seek(100 << 20)
            f.write(base.block(1) * 4)
        read = []
        real = os.preadv

        def counting(fd, bufs, off):
            n = real(fd, bufs, off)
            read.append(n)
            return n
        self.patch(os, 'preadv', counting)
        spans = []
        real_range = hashing._native_range

        def recording(path, start, end, *args):
            spans.append(end - start)
            return real_range(path, start, end, *args)
        self.patch(hashing, '_native_range', recording)
        for native in (False, True):
            fps = fingerprint.hash_file(path, 1 << 30, workers=1,
                                        native=native)
            # 16 KiB of data; file systems report data in pages or
            # extents, never anything near the 1 GiB of the file
            self.assertLess(sum(read) + sum(spans), 4 << 20)
            self.assertEqual(4, int((~fps.zero_mask).sum()))
            self.assertEqual(bytes(fps.digests[25600]),
                             hashlib.sha256(base.block(1)).digest())
        self.assertTrue(read)       # the hashlib path read through preadv
        self.assertTrue(spans)      # the native path mapped the data only

    def test_qcow2_is_hashed_as_its_virtual_content(self):
        raw = self.image('a', [1, None, 2, 3])
        qcow = os.path.join(self.tmp, 'a.qcow2')
        _qemu_img('convert', '-f', 'raw', '-O', 'qcow2', raw, qcow)
        fps = fingerprint.fingerprint_image(qcow, 'qcow2')
        self.assertEqual(_oracle(raw, 4096), [bytes(r) for r in fps.digests])


class TestHostileImages(base.LibraryTestCase):
    """Each bad image is refused with a reason, and nothing is written."""

    def _assert_rejected(self, path, fmt, words, **kw):
        e = self.assertRaises(exception.ImageRejected, self.lib.add, ID,
                              path, disk_format=fmt, **kw)
        for w in words:
            self.assertIn(w, str(e))
        with db_session.reader(self.conf) as s:
            for table in (models.Image, models.Fingerprint,
                          models.RecentFingerprint, models.Cluster,
                          models.ImageDigests, models.MapVersion):
                self.assertEqual(0, s.execute(sa.select(sa.func.count())
                                              .select_from(table)).scalar())
        self.assertFalse(os.path.exists(ingest.base_path(self.conf, ID)))
        self.assertEqual({}, self.lib.lists.objects())
        maps = self.conf.vmar.map_dir
        self.assertEqual([], os.listdir(maps) if os.path.isdir(maps) else [])
        work = self.conf.vmar.work_dir
        self.assertEqual([], os.listdir(work) if os.path.isdir(work) else [])

    def test_qcow2_with_backing_file(self):
        backing = self.image('b', [1, 2])
        path = os.path.join(self.tmp, 'x.qcow2')
        _qemu_img('create', '-f', 'qcow2', '-b', backing, '-F', 'raw', path)
        self._assert_rejected(path, 'qcow2', ['backing'])

    def test_qcow2_with_data_file(self):
        path = os.path.join(self.tmp, 'x.qcow2')
        _qemu_img('create', '-f', 'qcow2', '-o',
                  'data_file=%s' % os.path.join(self.tmp, 'x.data'), path,
                  '1M')
        self._assert_rejected(path, 'qcow2', ['data'])

    def test_vmdk_with_flat_extent(self):
        path = os.path.join(self.tmp, 'x.vmdk')
        _qemu_img('create', '-f', 'vmdk', '-o', 'subformat=monolithicFlat',
                  path, '1M')
        self._assert_rejected(path, 'vmdk', ['safety check'])

    def test_truncated_qcow2(self):
        raw = self.image('a', list(range(1, 300)))
        path = os.path.join(self.tmp, 'x.qcow2')
        _qemu_img('convert', '-f', 'raw', '-O', 'qcow2', raw, path)
        os.truncate(path, os.path.getsize(path) // 2)
        self._assert_rejected(path, 'qcow2', ['truncated'])

    def test_truncated_raw_against_expected_size(self):
        path = self.image('a', [1, 2, 3])
        self._assert_rejected(path, 'raw', ['expected'],
                              expected_size=4 * 4096)

    def test_qcow2_claimed_as_raw(self):
        raw = self.image('a', [1, 2])
        path = os.path.join(self.tmp, 'x.qcow2')
        _qemu_img('convert', '-f', 'raw', '-O', 'qcow2', raw, path)
        self._assert_rejected(path, 'raw', ['claims to be raw', 'qcow2'])

    def test_raw_claimed_as_qcow2(self):
        path = self.image('a', [1, 2])
        self._assert_rejected(path, 'qcow2', ['claims to be qcow2'])

    def test_unknown_format(self):
        path = self.image('a', [1])
        self._assert_rejected(path, 'floppy', ['unsupported'])

    def test_empty_file(self):
        path = os.path.join(self.tmp, 'empty')
        open(path, 'wb').close()
        self._assert_rejected(path, 'raw', ['empty'])

    def test_too_large(self):
        path = os.path.join(self.tmp, 'big.raw')
        with open(path, 'wb') as f:
            f.truncate(3 << 30)
        self.conf.set_override('max_virtual_size_gb', 2, group='vmar')
        self._assert_rejected(path, 'raw', ['above the limit'])

    def test_missing_file(self):
        self._assert_rejected(os.path.join(self.tmp, 'nope'), 'raw',
                              ['cannot read'])


class TestRemoteHeaders(testtools.TestCase):
    """The first bytes of an image read range by range, before QEMU."""

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def head(self, *create_args):
        path = os.path.join(self.tmp, 'x.qcow2')
        _qemu_img('create', '-f', 'qcow2', *create_args, path, '3M')
        with open(path, 'rb') as f:
            return f.read(fingerprint.HEADER_BYTES)

    def rejected(self, data, fmt='qcow2'):
        return str(self.assertRaises(exception.ImageRejected,
                                     fingerprint.inspect_header, data, fmt,
                                     'image X'))

    def test_plain_qcow2_gives_its_virtual_size(self):
        self.assertEqual(3 << 20, fingerprint.inspect_header(
            self.head(), 'qcow2', 'image X'))

    def test_raw_has_no_header(self):
        self.assertIsNone(fingerprint.inspect_header(b'QFI\xfb', 'raw', 'X'))

    def test_backing_file_is_refused(self):
        backing = os.path.join(self.tmp, 'b')
        open(backing, 'wb').close()
        self.assertIn('backing', self.rejected(
            self.head('-b', backing, '-F', 'raw')))

    def test_data_file_is_refused(self):
        self.assertIn('data_file', self.rejected(self.head(
            '-o', 'data_file=%s' % os.path.join(self.tmp, 'x.data'))))

    def test_encryption_is_refused(self):
        data = bytearray(self.head())
        data[32:36] = (1).to_bytes(4, 'big')       # AES
        self.assertIn('encrypted', self.rejected(bytes(data)))

    def test_raw_bytes_claimed_as_qcow2(self):
        self.assertIn('not', self.rejected(bytes(512)))

    def test_short_header(self):
        self.assertIn('not', self.rejected(self.head()[:100]))

    def test_other_formats_are_not_read_by_range(self):
        self.assertIn('vmdk', self.rejected(bytes(512), 'vmdk'))
