"""A host's files: which mirrors it keeps, boot working sets fetched."""

import collections
import os
import threading
import uuid

import fixtures
import testtools

from vmar_openstack.export import hostdir
from vmar_openstack.mapformat import bootset
from vmar_openstack.mapsource import base

Exp = collections.namedtuple('Exp', 'image_id map_version targets')


class TestMirrorEviction(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.ids = [str(uuid.uuid4()) for _ in range(3)]
        for age, image_id in enumerate(self.ids):
            m = hostdir.HostDir(self.root, None).mirror(image_id)
            os.makedirs(os.path.dirname(m.data), exist_ok=True)
            for path in m:
                with open(path, 'wb') as f:
                    f.write(b'x' * (1 << 20 if path == m.data else 4096))
            # an alternate map: goes with its mirror
            with open('%s.alt.%s.1' % (m.data, uuid.uuid4()), 'wb') as f:
                f.write(b'x')
            # the first is the least recently used
            os.utime(m.present, (1000 + age, 1000 + age))

    def mirrors(self, budget, referenced):
        files = hostdir.HostDir(self.root, None, budget)
        files.prune([Exp(i, 1, [(i, 1 << 20)]) for i in referenced])
        return [i for i in self.ids if files.is_mirror(i)]

    def test_no_budget_deletes_every_unreferenced_mirror(self):
        self.assertEqual([self.ids[1]], self.mirrors(0, [self.ids[1]]))
        left = os.listdir(os.path.join(self.root, 'mirrors'))
        self.assertEqual(len(hostdir.Mirror._fields) + 1, len(left))
        self.assertEqual({self.ids[1]}, {n.split('.')[0] for n in left})

    def test_within_budget_everything_stays(self):
        self.assertEqual(self.ids, self.mirrors(100 << 20, []))

    def test_least_recently_used_goes_first(self):
        # room for two mirrors of 1 MiB and 8 KiB each, not three
        self.assertEqual(self.ids[1:], self.mirrors(5 << 19, []))

    def test_referenced_mirrors_stay_above_the_budget(self):
        self.assertEqual([self.ids[0]], self.mirrors(1, [self.ids[0]]))


class TestBootsetFetch(testtools.TestCase):
    """ensure_bootset under a shared hold: exports prepared at once."""

    def test_concurrent_fetches_of_one_set_both_succeed(self):
        root = self.useFixture(fixtures.TempDir()).path
        image_id = str(uuid.uuid4())
        data = bootset.encode(bootset.Bootset(image_id, 8 * 4096, 4096,
                                              'recorded', ((0, 2),)))
        both = threading.Barrier(2, timeout=10)

        class Source(base.MapSource):
            has_bootsets = True

            current_version = fetch_map = fetch_base = None

            def fetch_bootset(self, image_id, dest):
                both.wait()     # both fetches are under way at once
                with open(dest, 'wb') as f:
                    f.write(data)

        files = hostdir.HostDir(root, Source())
        out = []
        threads = [threading.Thread(
            target=lambda: out.append(files.ensure_bootset(image_id)))
            for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        path = files.bootset_file(image_id)
        self.assertEqual([path, path], out)
        with open(path, 'rb') as f:
            self.assertEqual(data, f.read())
        self.assertEqual([os.path.basename(path)],
                         os.listdir(os.path.dirname(path)))
