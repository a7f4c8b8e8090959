"""Boot working sets: the format, and finding one in an image's file systems.

The introspection tests build small images with the real tools
(``mke2fs -d``, ``sfdisk``, ``mkfs.fat``) and check that the set holds the
blocks of the boot files, found through symlinks and ELF dependencies, and
not those of other files.
"""

import os
import re
import shutil
import subprocess

import fixtures
import testtools

from vmar_openstack import exception
from vmar_openstack.fingerprint import classify
from vmar_openstack.fingerprint import fstools
from vmar_openstack.fingerprint import introspect
from vmar_openstack.mapformat import bootset

from tests import fsimages

A = '00000000-0000-4000-8000-00000000000a'
BS = 4096


class TestFormat(testtools.TestCase):

    def bset(self, extents, size=64 * BS, image_id=A):
        return bootset.Bootset(image_id, size, BS, 'introspected',
                               tuple(extents))

    def test_round_trip(self):
        b = self.bset([(0, 2), (5, 1), (60, 4)])
        self.assertEqual(b, bootset.decode(bootset.encode(b), A))
        self.assertEqual(7, b.n_blocks)

    def test_bad_sets_are_refused(self):
        for extents in ([(0, 2), (2, 1)],        # touching
                        [(3, 2), (0, 1)],        # out of order
                        [(0, 2), (1, 2)],        # overlapping
                        [(0, 0)],                # empty
                        [(63, 2)]):              # past the end
            self.assertRaises(exception.BootsetFormatError, bootset.encode,
                              self.bset(extents))
        data = bootset.encode(self.bset([(0, 1)]))
        e = self.assertRaises(exception.BootsetFormatError, bootset.decode,
                              data, '00000000-0000-4000-8000-00000000000b')
        self.assertIn('describes image', str(e))
        for bad in (b'', b'{}', b'[1]', data.replace(b'"vmar-bootset"',
                                                     b'"x"'),
                    data.replace(b'introspected', b'guessed'),
                    b' ' * (bootset.MAX_FILE_SIZE + 1)):
            self.assertRaises(exception.BootsetFormatError, bootset.decode,
                              bad, A)

    def test_byte_ranges_merge_gaps_and_split_large_reads(self):
        # the image ends 100 bytes into its last block
        b = self.bset([(0, 2), (3, 1), (10, 6)], size=16 * BS - 100)
        self.assertEqual([(0, 2 * BS), (3 * BS, BS),
                          (10 * BS, 6 * BS - 100)], b.byte_ranges())
        self.assertEqual([(0, 4 * BS), (10 * BS, 6 * BS - 100)],
                         b.byte_ranges(gap=BS))
        self.assertEqual([(0, 2 * BS), (3 * BS, BS), (10 * BS, 4 * BS),
                          (14 * BS, 2 * BS - 100)],
                         b.byte_ranges(limit=4 * BS))

    def test_merge(self):
        self.assertEqual([(1, 3), (7, 1)], bootset.merge([3, 1, 2, 7, 2]))


class TestIntrospect(testtools.TestCase):

    def setUp(self):
        super().setUp()
        fsimages.need('mke2fs', 'debugfs', 'sfdisk', 'blkid', 'readelf',
                      'mkfs.fat')
        self.tmp = self.useFixture(fixtures.TempDir()).path
        root = self.root = os.path.join(self.tmp, 'root')
        # a root file system: systemd (an ELF needing libc and the
        # dynamic loader), reached through /sbin/init and two directory
        # symlinks; unit files; a kernel in /boot; and files nobody boots
        self.elf = shutil.which('true')
        self.libc = '/lib/x86_64-linux-gnu/libc.so.6'
        for d in ('usr/lib/systemd/system/multi-user.target.wants',
                  'usr/lib/x86_64-linux-gnu', 'usr/sbin', 'boot', 'srv',
                  'etc'):
            os.makedirs(os.path.join(root, d))
        os.symlink('usr/lib', os.path.join(root, 'lib'))
        os.symlink('usr/lib64', os.path.join(root, 'lib64'))
        os.makedirs(os.path.join(root, 'usr/lib64'))
        shutil.copy(self.elf, os.path.join(root, 'usr/lib/systemd/systemd'))
        os.symlink('/lib/systemd/systemd',
                   os.path.join(root, 'usr/sbin/init'))
        os.symlink('usr/sbin', os.path.join(root, 'sbin'))
        shutil.copy(self.libc, os.path.join(root,
                                            'usr/lib/x86_64-linux-gnu'))
        shutil.copy('/lib64/ld-linux-x86-64.so.2',
                    os.path.join(root, 'usr/lib64'))
        self.write('usr/lib/systemd/system/basic.target', 1)
        self.write('usr/lib/systemd/system/multi-user.target.wants/'
                   'a.service', 1)
        self.write('boot/vmlinuz-6.1.0', 64)
        self.write('etc/fstab', 1)
        self.write('srv/data', 256)
        self.write('usr/lib/x86_64-linux-gnu/libunused.so', 64)
        # enabled units (linked from a target's .wants/) and one that is
        # not: the programs of the enabled ones whose path conditions hold
        # are read at boot, not the others
        os.makedirs(os.path.join(root, 'etc/systemd/system/'
                                 'multi-user.target.wants'))
        for unit, prog, cond in (
                ('b.service', 'bdaemon', '/etc/fstab'),
                ('c.service', 'cdaemon', ''),
                ('d.service', 'ddaemon', '!/etc/fstab')):
            with open(os.path.join(root, 'usr/lib/systemd/system', unit),
                      'w') as f:
                f.write('[Unit]\n%s[Service]\nExecStartPre=/usr/bin/true\n'
                        'ExecStart=-/usr/sbin/%s --flag\n' % (
                            'ConditionPathExists=%s\n' % cond if cond
                            else '', prog))
            self.write('usr/sbin/' + prog, 32)
        for unit in ('b.service', 'd.service'):
            os.symlink('/usr/lib/systemd/system/' + unit,
                       os.path.join(root, 'etc/systemd/system/'
                                    'multi-user.target.wants', unit))

    def write(self, rel, blocks):
        with open(os.path.join(self.root, rel), 'wb') as f:
            f.write(os.urandom(blocks * BS))

    def mkfs(self, path, offset=0):
        fsimages.mkfs_ext(path, self.root, offset)

    def file_blocks(self, path, offset, rel):
        out = fstools.Debugfs(path, offset).run(['blocks /' + rel])[0]
        return {(offset + int(b) * BS) // BS for b in out.split()}

    def test_ext_root_on_the_whole_disk(self):
        img = os.path.join(self.tmp, 'disk.raw')
        self.mkfs(img)
        got = set(introspect.boot_blocks(img, os.path.getsize(img), BS))
        for rel in ('usr/lib/systemd/systemd',
                    'usr/lib/x86_64-linux-gnu/libc.so.6',
                    'usr/lib64/ld-linux-x86-64.so.2',
                    'usr/lib/systemd/system/basic.target',
                    'usr/lib/systemd/system/multi-user.target.wants/'
                    'a.service',
                    'boot/vmlinuz-6.1.0', 'etc/fstab'):
            blocks = self.file_blocks(img, 0, rel)
            self.assertTrue(blocks)
            self.assertLessEqual(blocks, got, rel)
        self.assertLessEqual(self.file_blocks(img, 0, 'usr/sbin/bdaemon'),
                             got)
        for rel in ('srv/data', 'usr/lib/x86_64-linux-gnu/libunused.so',
                    'usr/sbin/cdaemon', 'usr/sbin/ddaemon'):
            self.assertFalse(self.file_blocks(img, 0, rel) & got, rel)
        # and the metadata on the way: the superblock, the directories
        # to a boot file and the inode-table blocks of its inodes, not
        # those of a directory no boot file is in
        fs = fstools.Debugfs(img, 0)
        self.assertIn(0, got)
        for rel in ('usr', 'usr/lib', 'usr/lib/systemd'):
            self.assertLessEqual(self.file_blocks(img, 0, rel), got, rel)
        imap = fs.run(['imap /usr/lib/systemd/systemd'])[0]
        self.assertIn(int(re.search(r'located at block (\d+)',
                                    imap).group(1)), got)
        self.assertFalse(self.file_blocks(img, 0, 'srv') & got)

    def test_with_its_layout_the_set_holds_the_inode_tables(self):
        img = os.path.join(self.tmp, 'disk.raw')
        self.mkfs(img)
        size = os.path.getsize(img)
        lay = classify.classify(img, size, BS,
                                '00000000-0000-4000-8000-0000000000aa')
        without = set(introspect.boot_blocks(img, size, BS))
        got = set(introspect.with_skeleton(
            introspect.boot_blocks(img, size, BS), lay))
        self.assertLessEqual(without, got)
        for first, n in lay.extents(introspect.SKELETON):
            self.assertLessEqual(set(range(first, first + n)), got)
        # not the journal (but its superblock, read at mount), free
        # blocks or the data of other files
        journal = sorted(b for first, n in lay.extents(['journal'])
                         for b in range(first, first + n))
        self.assertIn(journal[0], got)
        self.assertFalse(set(journal[1:]) & got)
        for first, n in lay.extents(['free']):
            self.assertFalse(set(range(first, first + n)) & got)
        self.assertFalse(self.file_blocks(img, 0, 'srv/data') & got)

    def test_partitioned_disk_with_a_fat_boot_partition(self):
        img = os.path.join(self.tmp, 'disk.raw')
        boot_off, boot_size = 1 << 20, 16 << 20
        root_off = boot_off + boot_size
        fsimages.partition(img, root_off + (64 << 20),
                           'start=2048, size=32768, type=c\n'
                           'start=34816, type=83\n')
        fat = os.path.join(self.tmp, 'boot.fat')
        subprocess.run(['mkfs.fat', '-C', fat, str(boot_size >> 10)],
                       check=True, capture_output=True)
        fsimages.place(img, boot_off, fat)
        self.mkfs(img, root_off)
        got = set(introspect.boot_blocks(img, os.path.getsize(img), BS))
        # the boot partition whole, the root's boot files only
        boot = set(range(boot_off // BS, root_off // BS))
        self.assertLessEqual(boot, got)
        self.assertLessEqual(self.file_blocks(
            img, root_off, 'usr/lib/systemd/systemd'), got)
        self.assertFalse(self.file_blocks(img, root_off, 'srv/data') & got)

    def test_no_file_system_no_blocks(self):
        img = os.path.join(self.tmp, 'noise.raw')
        with open(img, 'wb') as f:
            f.write(os.urandom(1 << 20))
        self.assertEqual([], introspect.boot_blocks(img, 1 << 20, BS))


class TestBaseRanges(testtools.TestCase):

    def test_set_maps_onto_the_canonical_blocks_of_each_base(self):
        import numpy as np

        from vmar_openstack.host.cache import prefetch
        from vmar_openstack import mapformat
        m, b = '00000000-0000-4000-8000-00000000000b', A
        # image m: blocks 0-3 from base b's 10-13, 4-5 zero, 6-9 its own
        ext = np.array([(0, 4, 10, 0), (6, 4, 6, 1)],
                       dtype=mapformat.EXTENT_DTYPE)
        bmap = mapformat.decode(mapformat.encode(
            m, 10 * BS, BS, 1, [mapformat.Target(b, 20 * BS),
                                mapformat.Target(m, 10 * BS, True)], ext))
        bset = bootset.Bootset(m, 10 * BS, BS, 'recorded',
                               ((1, 2), (4, 1), (8, 2)))
        self.assertEqual({b: [(11 * BS, 2 * BS)], m: [(8 * BS, 2 * BS)]},
                         prefetch.base_ranges(bmap, bset))
        # the zero block 4 reads nothing, so 1-2 and 8-9 never merge
        bset = bootset.Bootset(m, 10 * BS, BS, 'recorded',
                               ((0, 1), (3, 2), (7, 1)))
        self.assertEqual({b: [(10 * BS, BS), (13 * BS, BS)],
                          m: [(7 * BS, BS)]},
                         prefetch.base_ranges(bmap, bset))
        self.assertEqual({b: [(10 * BS, 4 * BS)], m: [(7 * BS, BS)]},
                         prefetch.base_ranges(bmap, bset, gap=2 * BS))
