"""Emptying the page cache of some files, and only of them.

The kernel's own page cache and util-linux ``fincore``: the directory is on
the disk of ``/var/tmp`` (``POSIX_FADV_DONTNEED`` does nothing on tmpfs).
"""

import os

import fixtures
import testtools

from tests import base
from vmar_openstack.host.cache import pagecache


class TestEvict(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir(rootdir='/var/tmp')).path

    def cached_file(self, *parts):
        path = os.path.join(self.dir, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        base.write_image(path, range(64))
        with open(path, 'rb') as f:
            while f.read(1 << 20):
                pass
        return path

    def resident(self, *paths):
        return pagecache.resident_bytes(paths)

    def test_evict_tree_empties_its_files_and_leaves_others(self):
        inside = [self.cached_file('tree', 'a'),
                  self.cached_file('tree', 'sub', 'b')]
        outside = self.cached_file('other', 'c')
        os.symlink(outside, os.path.join(self.dir, 'tree', 'link'))
        os.mkfifo(os.path.join(self.dir, 'tree', 'fifo'))
        self.assertTrue(all(self.resident(*inside, outside).values()))

        pagecache.evict_tree(os.path.join(self.dir, 'tree'))

        self.assertEqual([0, 0], list(self.resident(*inside).values()))
        # a symlink out of the tree is not followed, a fifo not opened
        self.assertEqual(64 * base.BS, self.resident(outside)[outside])

    def test_evict_all_takes_only_the_files_named(self):
        a, b = self.cached_file('a'), self.cached_file('b')
        pagecache.evict_all([a])
        self.assertEqual({a: 0, b: 64 * base.BS}, self.resident(a, b))

    def test_evict_tree_of_a_missing_directory_does_nothing(self):
        pagecache.evict_tree(os.path.join(self.dir, 'none'))
