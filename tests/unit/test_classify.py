"""Block layouts: the format, and classifying every block of an image.

The classifier tests build small images with the real tools (``mke2fs
-d``, ``mkfs.xfs -p``, ``sfdisk``, ``mkfs.fat``) and check what the layout
says against what is on the disk: the blocks it gives a file hold that
file's bytes, the counts match what the file system itself reports, and
every block of a file system it reads gets a kind.
"""

import collections
import os
import re
import struct
import subprocess
import zlib

import fixtures
import testtools

from vmar_openstack import exception
from vmar_openstack.fingerprint import classify
from vmar_openstack.fingerprint import fstools
from vmar_openstack.mapformat import layout

from tests import fsimages

A = '00000000-0000-4000-8000-00000000000a'
B = '00000000-0000-4000-8000-00000000000b'
BS = 4096
MiB = 1 << 20


class TestFormat(testtools.TestCase):

    def lay(self, runs, size=16 * BS, files=('/a', '/b'), volumes=None):
        volumes = volumes or (layout.Volume(0, size, 'ext4', True),)
        return layout.Layout(A, size, BS, tuple(volumes), tuple(files),
                             tuple(runs))

    def test_round_trip_and_summaries(self):
        lay = self.lay([(0, 1, 'superblock', -1), (1, 3, 'data', 0),
                        (4, 2, 'data', 1), (6, 2, 'directory', -1),
                        (8, 8, 'free', -1)])
        self.assertEqual(lay, layout.decode(layout.encode(lay), A))
        counts = lay.counts()
        self.assertEqual(5, counts['data'])
        self.assertEqual(0, counts['journal'])
        self.assertEqual(set(layout.KINDS), set(counts))
        self.assertEqual([(0, 1), (6, 2)],
                         lay.extents(['superblock', 'directory']))
        self.assertEqual([(1, 5)], lay.extents(['data']))
        self.assertEqual({'/a': 3, '/b': 2}, lay.file_blocks())
        codes = lay.kind_codes()
        self.assertEqual(layout.CODE['data'], codes[5])
        self.assertEqual(layout.CODE['free'], codes[15])

    def test_from_arrays_merges_runs(self):
        codes = [layout.CODE[k] for k in
                 ('superblock', 'data', 'data', 'data', 'free', 'free')]
        lay = layout.from_arrays(A, 6 * BS, BS, (), ('/a', '/b'), codes,
                                 [-1, 0, 0, 1, 0, 0])
        self.assertEqual(((0, 1, 'superblock', -1), (1, 2, 'data', 0),
                          (3, 1, 'data', 1), (4, 2, 'free', -1)), lay.runs)

    def test_bad_layouts_are_refused(self):
        good = [(0, 8, 'data', 0), (8, 8, 'free', -1)]
        for runs in ([(0, 8, 'data', 0), (9, 7, 'free', -1)],    # gap
                     [(0, 8, 'data', 0), (7, 9, 'free', -1)],    # overlap
                     [(0, 8, 'data', 0)],                         # short
                     [(0, 8, 'data', 0), (8, 9, 'free', -1)],    # past
                     [(0, 0, 'data', 0), (0, 16, 'free', -1)],   # empty
                     [(0, 8, 'free', 0), (8, 8, 'free', -1)],    # file
                     [(0, 8, 'data', 2), (8, 8, 'free', -1)]):   # no file
            self.assertRaises(exception.LayoutFormatError, layout.encode,
                              self.lay(runs))
        self.assertRaises(
            exception.LayoutFormatError, layout.encode,
            self.lay(good, volumes=[layout.Volume(BS, 16 * BS, '', False)]))
        data = layout.encode(self.lay(good))
        e = self.assertRaises(exception.LayoutFormatError, layout.decode,
                              data, B)
        self.assertIn('describes image', str(e))
        for bad in (b'', b'{}', b'[1]',
                    data.replace(b'"vmar-layout"', b'"x"'),
                    data.replace(b'"free"', b'"spare"'),
                    data.replace(b'"/a"', b'7'),
                    b' ' * (layout.MAX_FILE_SIZE + 1)):
            self.assertRaises(exception.LayoutFormatError, layout.decode,
                              bad, A)


def _lvm_label(path, offset):
    """An LVM physical volume's label, as pvcreate writes it."""
    sec = bytearray(512)
    sec[0:8] = b'LABELONE'
    struct.pack_into('<QxxxxI8s', sec, 8, 1, 32, b'LVM2 001')
    sec[32:64] = b'0' * 32
    struct.pack_into('<Q', sec, 64, 8 * MiB)
    # LVM's CRC: CRC-32 from 0xf597a6cf, no final inversion
    crc = zlib.crc32(bytes(sec[20:]), 0xf597a6cf ^ 0xffffffff) ^ 0xffffffff
    struct.pack_into('<I', sec, 16, crc)
    with open(path, 'r+b') as f:
        f.seek(offset + 512)
        f.write(sec)


class TestClassify(testtools.TestCase):

    def setUp(self):
        super().setUp()
        fsimages.need('mke2fs', 'dumpe2fs', 'debugfs', 'sfdisk', 'blkid',
                      'mkfs.xfs', 'xfs_db', 'mkfs.fat')
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.logs = self.useFixture(fixtures.FakeLogger(level='INFO'))
        root = self.root = os.path.join(self.tmp, 'root')
        self.content = {}
        # files of a few sizes, a directory too large for one block, a
        # symlink too long for its inode, one left out of the tree
        self.write('etc/passwd', 100)
        self.write('usr/bin/big', 3 * MiB + 5)
        self.write('usr/share/doc/one', 2 * BS)
        for i in range(400):
            self.write('usr/share/many/file-with-a-long-name-%04d' % i, 1)
        os.symlink('/'.join(['very-long-directory-name'] * 8),
                   os.path.join(root, 'usr/share/far'))

    def write(self, rel, size):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # never a block of zeros: mke2fs -d leaves those holes
        data = b'\x01' + os.urandom(size - 1)
        with open(path, 'wb') as f:
            f.write(data)
        self.content['/' + rel] = data

    def classify(self, img):
        lay = classify.classify(img, os.path.getsize(img), BS, A)
        # what the library writes, it must be able to read back
        self.assertEqual(lay, layout.decode(layout.encode(lay), A))
        return lay

    def check_files(self, img, lay, offset_ok=lambda b: True):
        """The blocks each file gets hold the file's bytes, in order."""
        blocks = {}
        for first, n, kind, file in lay.runs:
            if kind == 'data':
                self.assertGreaterEqual(file, 0)
                blocks.setdefault(lay.files[file], []).extend(
                    range(first, first + n))
        self.assertEqual(set(self.content), set(blocks))
        with open(img, 'rb') as f:
            for path, data in self.content.items():
                got = b''
                for b in blocks[path]:
                    f.seek(b * BS)
                    got += f.read(BS)
                self.assertEqual(data, got[:len(data)], path)
                self.assertEqual(-(-len(data) // BS), len(blocks[path]),
                                 path)

    def volume_counts(self, lay, vol):
        codes = lay.kind_codes()[vol.offset // BS:
                                 (vol.offset + vol.length) // BS]
        return collections.Counter(layout.KINDS[c] for c in codes.tolist())

    def dumpe2fs(self, img, offset, field):
        dev = '%s?offset=%d' % (img, offset) if offset else img
        out = subprocess.run(['dumpe2fs', '-h', dev], capture_output=True,
                             text=True, check=True).stdout
        return int(re.search(r'^%s:\s+(\d+)' % field, out, re.M).group(1))

    def check_ext(self, img, lay, offset):
        vol = [v for v in lay.volumes if v.offset == offset][0]
        self.assertTrue(vol.classified)
        counts = self.volume_counts(lay, vol)
        self.assertNotIn('unknown', counts)
        # what the file system says of itself
        self.assertEqual(self.dumpe2fs(img, offset, 'Free blocks'),
                         counts['free'])
        self.assertEqual(self.dumpe2fs(img, offset, 'Total journal blocks'),
                         counts['journal'])
        self.assertEqual(self.dumpe2fs(img, offset, 'Inode blocks per '
                                       'group') * len(range(
                                           0, vol.length // BS,
                                           self.dumpe2fs(img, offset,
                                                         'Blocks per group'))),
                         counts['inode-table'])
        codes = lay.kind_codes()
        self.assertEqual(layout.CODE['superblock'], codes[offset // BS])
        # the directory of 400 names spans blocks; the long symlink has one
        self.assertGreater(counts['directory'], 4)
        self.assertEqual(1, counts['symlink'])

    def test_ext4_on_the_whole_disk(self):
        img = os.path.join(self.tmp, 'disk.raw')
        fsimages.mkfs_ext(img, self.root)
        lay = self.classify(img)
        self.assertEqual((layout.Volume(0, 64 * MiB, 'ext4', True),),
                         lay.volumes)
        self.check_ext(img, lay, 0)
        self.check_files(img, lay)
        self.assertEqual(0, lay.counts()['partition-table'])

    def test_ext3_block_mapped_files_have_indirect_blocks(self):
        img = os.path.join(self.tmp, 'disk.raw')
        fsimages.mkfs_ext(img, self.root, kind='ext3')
        lay = self.classify(img)
        self.check_ext(img, lay, 0)
        self.check_files(img, lay)
        # usr/bin/big is past 12 blocks: an indirect block (and a double
        # indirect one past 1036)
        self.assertGreaterEqual(lay.counts()['file-map'], 2)

    def test_extended_attribute_blocks(self):
        # attributes too large for the inode go to a block of their own,
        # which no extent names: icheck finds whose it is
        img = os.path.join(self.tmp, 'disk.raw')
        fsimages.mkfs_ext(img, self.root)
        value = os.path.join(self.tmp, 'value')
        with open(value, 'wb') as f:
            f.write(b'v' * 3000)
        subprocess.run(['debugfs', '-w', '-R',
                        'ea_set -f %s /usr/bin/big user.big' % value, img],
                       check=True, capture_output=True)
        ea = subprocess.run(['debugfs', '-R', 'stat /usr/bin/big', img],
                            capture_output=True, text=True, check=True)
        block = int(re.search(r'File ACL: (\d+)', ea.stdout).group(1))
        self.assertGreater(block, 0)
        lay = self.classify(img)
        self.check_ext(img, lay, 0)
        self.assertEqual(layout.CODE['xattr'], lay.kind_codes()[block])
        self.assertEqual(1, lay.counts()['xattr'])

    def test_gpt_disk_with_ext4_and_xfs(self):
        img = os.path.join(self.tmp, 'disk.raw')
        ext_off, xfs_off = 1 * MiB, 65 * MiB
        fsimages.partition(img, 386 * MiB,
                           'label: gpt\nstart=2048, size=131072\n'
                           'start=133120, size=655360\n')
        fsimages.mkfs_ext(img, self.root, ext_off)
        fsimages.mkfs_xfs(img, self.root, xfs_off)
        lay = self.classify(img)
        self.assertEqual([('ext4', True), ('xfs', True)],
                         [(v.type, v.classified) for v in lay.volumes])
        codes = lay.kind_codes()
        # the GPT at the start, its backup at the end
        self.assertEqual(layout.CODE['partition-table'], codes[0])
        self.assertEqual(layout.CODE['partition-table'], codes[-1])
        self.check_ext(img, lay, ext_off)
        xfs = lay.volumes[1]
        kinds = set(self.volume_counts(lay, xfs))
        self.assertNotIn('unknown', kinds)
        # (an AG's headers share its first block with its superblock)
        self.assertLessEqual({'superblock', 'allocation', 'inode-table',
                              'journal', 'directory', 'data', 'free'},
                             kinds)
        # each file is in both file systems: the content check reads
        # them volume by volume
        for vol in lay.volumes:
            sub = layout.Layout(
                A, lay.virtual_size, BS, lay.volumes, lay.files,
                tuple(r if vol.offset // BS <= r[0] <
                      (vol.offset + vol.length) // BS
                      else (r[0], r[1], 'free', -1) for r in lay.runs))
            self.check_files(img, sub)

    def test_other_layouts_stay_unknown(self):
        img = os.path.join(self.tmp, 'disk.raw')
        fsimages.partition(img, 40 * MiB,
                           'start=2048, size=32768, type=c\n'
                           'start=34816, type=8e\n')
        fat = os.path.join(self.tmp, 'boot.fat')
        subprocess.run(['mkfs.fat', '-C', fat, '16384'], check=True,
                       capture_output=True)
        fsimages.place(img, 1 * MiB, fat)
        _lvm_label(img, 17 * MiB)
        lay = self.classify(img)
        self.assertEqual([('vfat', False), ('LVM2_member', False)],
                         [(v.type, v.classified) for v in lay.volumes])
        counts = lay.counts()
        self.assertEqual(1, counts['partition-table'])
        self.assertEqual(lay.n_blocks - 1, counts['unknown'])
        self.assertIn('(LVM2_member) is left unknown', self.logs.output)
        self.assertIn('(vfat) is left unknown', self.logs.output)

    def test_noise_is_unknown_not_an_error(self):
        img = os.path.join(self.tmp, 'noise.raw')
        with open(img, 'wb') as f:
            f.write(os.urandom(MiB))
        lay = self.classify(img)
        self.assertEqual({'unknown': lay.n_blocks},
                         {k: v for k, v in lay.counts().items() if v})

    def test_a_stalled_xfs_db_is_killed_and_its_volume_left_unknown(self):
        # 'sleep' stands in for an xfs_db a hostile image hung
        self.useFixture(fixtures.MockPatchObject(fstools, 'TIMEOUT', 0.2))
        marks = classify._Marks(1 << 20, BS)
        sb = {'blocksize': BS, 'agblocks': 256}
        self.assertFalse(classify._xfs_blockuse(
            ['sleep', '30'], sb, 0, 1 << 20, marks, classify._Files()))
        self.assertIn('xfs_db past its time', self.logs.output)
        self.assertFalse(marks.codes.any())

    def test_a_damaged_ext_file_system_is_left_unknown(self):
        img = os.path.join(self.tmp, 'disk.raw')
        fsimages.mkfs_ext(img, self.root)
        # the group descriptors overwritten: dumpe2fs refuses it
        with open(img, 'r+b') as f:
            f.seek(BS)
            f.write(os.urandom(BS))
        lay = self.classify(img)
        self.assertEqual([('ext4', False)],
                         [(v.type, v.classified) for v in lay.volumes])
        self.assertEqual(lay.n_blocks, lay.counts()['unknown'])
