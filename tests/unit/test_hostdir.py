"""Which mirrors a host keeps when no export reads them."""

import collections
import os
import uuid

import fixtures
import testtools

from vmar_openstack.export import hostdir

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
