"""Runs of a file locked in the page cache: locked for real, page by page.

The kernel says which pages are locked (``/proc/kpageflags``, through
:mod:`tests.pageflags`): every page of a pinned run must be, whether the
file was cached before (``read(2)`` caches it in large folios, which a
run cuts) or not at all.
"""

import mmap
import os

import fixtures
import testtools

from tests import pageflags
from vmar_openstack.host.cache import pagecache
from vmar_openstack.host.cache import pinned

PAGE = pinned.PAGE
SIZE = 16 << 20
# runs of 1, 2 and 3 pages scattered over the file, none folio-aligned
RUNS = [(PAGE * (37 + 509 * i), PAGE * (1 + i % 3)) for i in range(8)]


class TestPinned(testtools.TestCase):

    def setUp(self):
        super().setUp()
        if not pageflags.available():
            self.skipTest('needs root to read /proc/kpageflags')
        self.path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                 'base')
        with open(self.path, 'wb') as f:
            f.write(os.urandom(SIZE))
            os.fsync(f.fileno())
        self.fd = os.open(self.path, os.O_RDONLY)
        self.addCleanup(os.close, self.fd)

    def pin_all(self):
        runs = [pinned.Pinned(self.fd, off, n) for off, n in RUNS]
        for r in runs:
            self.addCleanup(r.close)
        return runs

    def assertAllLocked(self):
        want = sum(n for _o, n in RUNS) // PAGE
        self.assertEqual((want, want),
                         pageflags.locked_pages(os.getpid(), self.path))

    def test_a_file_cached_in_large_folios(self):
        with open(self.path, 'rb') as f:
            while f.read(1 << 20):
                pass
        self.pin_all()
        self.assertAllLocked()
        # what stays after eviction is the runs and the rest of no folio
        # they cut: their pages are 4 KiB ones now
        pagecache.evict(self.path)
        self.assertEqual(sum(n for _o, n in RUNS),
                         pagecache.resident_bytes([self.path])[self.path])

    def test_a_file_not_cached(self):
        pagecache.evict(self.path)
        self.pin_all()
        self.assertAllLocked()
        # no read-around: the runs alone were read
        self.assertEqual(sum(n for _o, n in RUNS),
                         pagecache.resident_bytes([self.path])[self.path])

    def test_close_unlocks_and_unmaps(self):
        runs = self.pin_all()
        for r in runs:
            r.close()
            r.close()
        self.assertEqual((0, 0),
                         pageflags.locked_pages(os.getpid(), self.path))
        pagecache.evict(self.path)
        self.assertEqual(0, pagecache.resident_bytes([self.path])[self.path])

    def test_a_run_past_the_end_of_the_file_is_an_error(self):
        # (a base shorter than its map says: mlock(2) would fail ENOMEM)
        e = self.assertRaises(OSError, pinned.Pinned, self.fd, SIZE - PAGE,
                              2 * PAGE)
        self.assertIn('ends past the file', str(e))
        self.assertEqual((0, 0),
                         pageflags.locked_pages(os.getpid(), self.path))
        # a file's last page, partly past its end, is its own
        with open(self.path, 'ab') as f:
            f.write(b'x')
        r = pinned.Pinned(self.fd, SIZE, PAGE)
        self.addCleanup(r.close)
        self.assertEqual((1, 1),
                         pageflags.locked_pages(os.getpid(), self.path))

    def test_a_bad_descriptor_is_an_error_and_maps_nothing(self):
        self.assertRaises(OSError, pinned.Pinned, 12345, 0, PAGE)
        w = os.open(self.path, os.O_WRONLY)
        self.addCleanup(os.close, w)
        # a write-only descriptor cannot be mapped for reading
        self.assertRaises(OSError, pinned.Pinned, w, 0, PAGE)
        self.assertEqual((0, 0),
                         pageflags.locked_pages(os.getpid(), self.path))
        self.assertEqual(mmap.PAGESIZE, PAGE)
