"""A host's files: which mirrors it keeps, boot working sets fetched."""

import collections
import os
import threading
from unittest import mock
import uuid

import fixtures
import numpy as np
import testtools

from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.host.exports import hostdir
from vmar_openstack import mapformat
from vmar_openstack.mapformat import bootset
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.mapsource import base
from vmar_openstack.mapsource import readers

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


class TestDigestListsFromPeers(testtools.TestCase):
    """A mirror's digest list comes from peers first, if it can be checked.

    ``peers`` is a stand-in for :class:`~vmar_openstack.host.peers.
    digests.PeerDigests` (the real one against a real peer server:
    tests/functional/test_peers.py).
    """

    def setUp(self):
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.image_id = str(uuid.uuid4())
        self.target = mapformat.Target(self.image_id, 3 * 4096)
        self.body = mirror_format.digests_bytes(
            self.image_id, fingerprint.Fingerprints(
                'sha256', 4096, 3 * 4096,
                np.zeros((3, 32), dtype=np.uint8)))
        self.calls = []
        body, calls = self.body, self.calls

        class Source(base.MapSource):
            can_mirror = True
            has_digest_sums = True
            current_version = fetch_map = fetch_base = None

            def digests_sha256(self, image_id):
                calls.append('sha')
                return 'the sum'

            def fetch_digests(self, image_id, dest):
                calls.append('store')
                with open(dest, 'wb') as f:
                    f.write(body)

            def base_reader(self, image_id, size):
                return readers.File('/nowhere/' + image_id)
        self.source = Source()

        class Peers:
            def __init__(self, got):
                self.got = got

            def fetch(self, image_id, dest, sha256):
                calls.append(('peers', sha256))
                if self.got:
                    with open(dest, 'wb') as f:
                        f.write(body)
                return self.got
        self.peers = Peers

    def fetch(self, files):
        dest = files.mirror(self.image_id).digests
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        return files._fetch_digests(self.target, dest), dest

    def test_from_a_peer(self):
        files = hostdir.HostDir(self.root, self.source, peers=self.peers(True))
        hdr, dest = self.fetch(files)
        self.assertEqual(self.image_id, hdr.image_id)
        self.assertEqual(['sha', ('peers', 'the sum')], self.calls)
        with open(dest, 'rb') as f:
            self.assertEqual(self.body, f.read())

    def test_from_the_store_when_no_peer_has_it(self):
        files = hostdir.HostDir(self.root, self.source,
                                peers=self.peers(False))
        self.assertEqual(self.image_id, self.fetch(files)[0].image_id)
        self.assertEqual(['sha', ('peers', 'the sum'), 'store'], self.calls)

    def test_not_from_peers_without_a_published_sum(self):
        self.source.has_digest_sums = False
        files = hostdir.HostDir(self.root, self.source, peers=self.peers(True))
        self.assertEqual(self.image_id, self.fetch(files)[0].image_id)
        self.assertEqual(['store'], self.calls)
        # nor when the store says it has none to give
        self.source.has_digest_sums = True
        self.source.digests_sha256 = mock.Mock(
            side_effect=exception.SourceError('gone'))
        os.unlink(files.mirror(self.image_id).digests)
        self.calls.clear()
        self.fetch(files)
        self.assertEqual(['store'], self.calls)

    def test_holders_are_asked_before_the_digest_list(self):
        """ensure() calls on_map once the map is read, before mirrors."""
        me = str(uuid.uuid4())
        ext = np.array([(0, 3, 0, 0)], dtype=mapformat.EXTENT_DTYPE)
        data = mapformat.encode(me, 3 * 4096, 4096, 1, [
            self.target, mapformat.Target(me, 3 * 4096, True)], ext)

        def fetch_map(image_id, version, dest):
            self.calls.append('map')
            with open(dest, 'wb') as f:
                f.write(data)
        self.source.fetch_map = fetch_map
        files = hostdir.HostDir(self.root, self.source,
                                peers=self.peers(False))
        os.makedirs(os.path.dirname(files.map_file(me, 1)))
        seen = []
        with mock.patch.object(files, '_ensure_mirror',
                               side_effect=lambda *a: self.calls.append(
                                   'mirror') or True):
            files.ensure(me, 1, lazy=True, on_map=lambda m: (
                seen.append([t.image_id for t in m.targets]),
                self.calls.append('on_map')))
        self.assertEqual([[self.image_id, me]], seen)
        self.assertEqual(['map', 'on_map', 'mirror', 'mirror'], self.calls)
