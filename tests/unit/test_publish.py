"""Publishing maps: the map image is created while the library commits.

Glance is replaced by an in-memory fake here; tests/functional/test_glance.py
runs the same code against a real glance-api.
"""

import datetime
import hashlib
import os
import threading

from glanceclient import exc as glance_exc

from tests import base
from vmar_openstack.db import failures as db_failures
from vmar_openstack.db import models as db_models
from vmar_openstack.db import publications as db_publications
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack.glance_hooks import agent
from vmar_openstack.glance_hooks import publish
from vmar_openstack import ingest
from vmar_openstack.mapformat import layout as layout_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import names

ID = '0e000000-0000-4000-8000-00000000000e'


class FakeImages:
    """The part of glanceclient's images API that publishing uses."""

    def __init__(self):
        self.store = {}
        self.calls = []
        self.lock = threading.Lock()

    def create(self, **kw):
        with self.lock:
            self.calls.append(('create', kw['id']))
            if kw['id'] in self.store:
                raise glance_exc.HTTPConflict()
            self.store[kw['id']] = dict(kw, status='queued')
            return dict(self.store[kw['id']])

    def upload(self, mid, f, image_size=None):
        with self.lock:
            self.calls.append(('upload', mid))
            rec = self.store[mid]
            if rec['status'] != 'queued':
                raise glance_exc.HTTPConflict()
            rec['data'] = f.read()
            rec['status'] = 'active'

    def get(self, mid):
        with self.lock:
            self.calls.append(('get', mid))
            if mid not in self.store:
                raise glance_exc.HTTPNotFound()
            return dict(self.store[mid])

    def delete(self, mid):
        with self.lock:
            self.calls.append(('delete', mid))
            if mid not in self.store:
                raise glance_exc.HTTPNotFound()
            del self.store[mid]

    def list(self, filters=None):
        with self.lock:
            return [dict(r) for r in self.store.values()
                    if all(r.get(k) == v for k, v in (filters or {}).items())]


class FakeGlance:
    def __init__(self):
        self.images = FakeImages()


class PublishTestCase(base.LibraryTestCase):
    """An agent's handler publishing one small image to a fake Glance."""

    def setUp(self):
        super().setUp()
        self.glance = FakeGlance()
        self.handler = agent.Handler(self.conf, self.glance, self.lib)
        self.path = self.image('a', [1, 2, None, 3])
        self.meta = {'disk_format': 'raw', 'owner': 'p',
                     'visibility': 'public'}

    def _map_sha(self, version):
        with open(ingest.map_path(self.conf, ID, version), 'rb') as f:
            return hashlib.sha256(f.read()).hexdigest()


class TestPublish(PublishTestCase):

    def test_map_image_created_before_commit_then_uploaded(self):
        created_before_commit = []
        real = self.handler.publisher.precreate

        def precreate(image_id, version, sha):
            real(image_id, version, sha)
            # the transaction is still open: other sessions do not see it
            created_before_commit.append((version,
                                          self.handler._known(image_id)))
        self.handler.publisher.precreate = precreate
        self.handler._add(ID, self.meta, self.path, 'it')
        self.assertEqual([(1, None)], created_before_commit)
        self.assertEqual(1, self.handler.publisher.current(ID))
        mid = names.map_image_id(ID, 1)
        rec = self.glance.images.store[mid]
        self.assertEqual('active', rec['status'])
        self.assertEqual(self._map_sha(1), rec[names.PROP_SHA256])
        self.assertEqual(hashlib.sha256(rec['data']).hexdigest(),
                         rec[names.PROP_SHA256])
        # one create (ahead of the commit) and one upload, nothing else
        self.assertEqual([('create', mid), ('upload', mid)],
                         self.glance.images.calls)

    def test_version_that_does_not_commit_leaves_no_map_image(self):
        real = self.lib._regenerate

        def fail_after_maps(*a, **kw):
            real(*a, **kw)
            raise RuntimeError('disk full at commit')
        self.lib._regenerate = fail_after_maps
        self.assertRaises(RuntimeError, self.handler._add, ID, self.meta,
                          self.path, 'it')
        self.assertEqual({}, self.glance.images.store)
        self.assertIn(('delete', names.map_image_id(ID, 1)),
                      self.glance.images.calls)
        self.lib._regenerate = real
        self.assertIsNone(self.handler._known(ID))

    def test_leftover_record_with_other_content_gets_a_new_version(self):
        # a process killed between creating v1's record and committing v1
        mid1 = names.map_image_id(ID, 1)
        self.glance.images.store[mid1] = {
            'id': mid1, 'status': 'queued', names.PROP_OF: ID,
            names.PROP_VERSION: '1', names.PROP_SHA256: '0' * 64}
        self.lib.add(ID, self.path, owner='p', visibility='public')
        self.assertEqual(2, self.handler.publisher.current(ID))
        rec = self.glance.images.store[names.map_image_id(ID, 2)]
        self.assertEqual('active', rec['status'])
        self.assertEqual(self._map_sha(2), rec[names.PROP_SHA256])
        # nothing was uploaded into the leftover
        self.assertNotIn('data', self.glance.images.store[mid1])

    def test_failed_create_ahead_is_retried_at_publish(self):
        # a Glance error, or a connection error keystoneauth raises as is
        for n, error in enumerate((glance_exc.HTTPServiceUnavailable(),
                                   ConnectionError('glance unreachable'))):
            image_id = ID[:-1] + str(n)
            pub = publish.Publisher(self.conf, self.glance, self.lib)
            real = self.glance.images.create
            fails = [error]

            def flaky(**kw):
                if fails:
                    raise fails.pop()
                return real(**kw)
            self.glance.images.create = flaky
            with pub.creating_ahead() as on_map_written:
                self.lib.add(image_id, self.path, owner='p',
                             visibility='public',
                             on_map_written=on_map_written)
            self.assertEqual(1, pub.current(image_id))
            self.glance.images.create = real
            mid = names.map_image_id(image_id, 1)
            self.assertEqual('active', self.glance.images.store[mid]['status'])
            self.assertEqual(1, self.glance.images.calls.count(
                ('create', mid)))

    def test_a_map_published_beside_its_image_delete_is_withdrawn(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        self.assertEqual(1, self.handler.publisher.current(ID))
        # a version written without a record ahead, as a pass of the
        # pending maps writes them
        self.assertEqual(2, self.lib.remap(ID))
        real = self.glance.images.create

        def create(**kw):
            # the image's delete runs once the map was read, before its
            # record is created: the delete lists only v1
            self.glance.images.create = real
            self.handler.delete({'id': ID})
            return real(**kw)
        self.glance.images.create = create
        self.assertIsNone(self.handler.publisher.current(ID))
        self.assertIn(('create', names.map_image_id(ID, 2)),
                      self.glance.images.calls)
        self.assertEqual(set(), {names.map_image_id(ID, v) for v in (1, 2)}
                         & set(self.glance.images.store))
        self.assertIsNone(self.handler._known(ID))


class TestPublishDigests(TestPublish):

    def test_digest_list_published_once_and_checked(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        did = names.digests_image_id(ID)
        self.assertEqual(did, self.handler.publisher.digests(ID))
        rec = self.glance.images.store[did]
        self.assertEqual('active', rec['status'])
        self.assertEqual(ID, rec[names.PROP_OF])
        self.assertNotIn(names.PROP_VERSION, rec)  # never taken for a map
        self.assertTrue(rec['os_hidden'])
        self.assertEqual(hashlib.sha256(rec['data']).hexdigest(),
                         rec[names.PROP_DIGESTS_SHA256])
        path = os.path.join(self.tmp, 'published.vdig')
        with open(path, 'wb') as f:
            f.write(rec['data'])
        hdr, rows = mirror_format.read_digests(path)
        self.assertEqual((ID, 4 * 4096), (hdr.image_id, hdr.size))
        self.assertEqual([True, True, False, True], list(rows.any(axis=1)))
        # an image's data never changes: published once
        self.glance.images.calls.clear()
        self.assertEqual(did, self.handler.publisher.digests(ID))
        self.assertEqual([('get', did)], self.glance.images.calls)

    def test_activate_publishes_map_and_digest_list(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        did = names.digests_image_id(ID)
        self.assertNotIn(did, self.glance.images.store)
        self.handler.activate(dict(self.meta, id=ID, status='active'))
        self.assertEqual('active', self.glance.images.store[
            names.map_image_id(ID, 1)]['status'])
        self.assertEqual('active', self.glance.images.store[did]['status'])

    def test_activate_publishes_the_block_layout(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        self.handler.activate(dict(self.meta, id=ID, status='active'))
        rec = self.glance.images.store[names.layout_image_id(ID)]
        self.assertEqual('active', rec['status'])
        self.assertTrue(rec['os_hidden'])
        self.assertEqual(ID, rec[names.PROP_OF])
        self.assertEqual(hashlib.sha256(rec['data']).hexdigest(),
                         rec[names.PROP_LAYOUT_SHA256])
        lay = layout_format.decode(rec['data'], ID)
        self.assertEqual(lay.n_blocks, sum(n for _f, n, _k, _i in lay.runs))
        # it goes with the image
        self.handler.publisher.delete_all(ID)
        self.assertNotIn(names.layout_image_id(ID), self.glance.images.store)

    def test_an_upload_under_way_elsewhere_is_waited_out(self):
        # another agent (on another Galera node, where the library lock
        # does not exclude it) started the same upload a moment before
        self.handler._add(ID, self.meta, self.path, 'it')
        did = names.digests_image_id(ID)
        data = self.lib.digest_list(ID)
        images = self.glance.images
        images.store[did] = {
            'id': did, 'status': 'queued', names.PROP_OF: ID,
            names.PROP_DIGESTS_SHA256: hashlib.sha256(data).hexdigest()}
        upload, get = images.upload, images.get
        gets = []

        def other_first(mid, f, image_size=None):
            images.store[mid]['status'] = 'saving'
            return upload(mid, f, image_size)

        def get_then_done(mid):
            gets.append(mid)
            if len(gets) == 3:      # the other upload ends
                images.store[mid].update(status='active', data=data)
            return get(mid)

        self.patch(images, 'upload', other_first)
        self.patch(images, 'get', get_then_done)
        self.assertEqual(did, self.handler.publisher.digests(ID))
        self.assertEqual(data, images.store[did]['data'])
        self.assertEqual(3, len(gets))

    def test_a_record_left_queued_is_filled(self):
        # an agent killed between create and upload
        self.handler._add(ID, self.meta, self.path, 'it')
        did = names.digests_image_id(ID)
        data = self.lib.digest_list(ID)
        self.glance.images.store[did] = {
            'id': did, 'status': 'queued', names.PROP_OF: ID,
            names.PROP_DIGESTS_SHA256: hashlib.sha256(data).hexdigest()}
        self.handler.publisher.digests(ID)
        self.assertEqual(data, self.glance.images.store[did]['data'])


class TestPublishOutsideTheLock(PublishTestCase):
    """Publishers take turns per hidden image, not by the library lock."""

    def generation(self):
        with db_session.reader(self.conf) as s:
            return db_session.generation(s)

    def test_publishing_moves_no_generation(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        before = self.generation()
        self.assertEqual(1, self.handler.publisher.current(ID))
        self.handler.publisher.files(ID)
        failures = db_failures.Failures(self.conf)
        failures.record(ID, 'image.activate', 'glance away', 'outage')
        self.assertTrue(failures.clear(ID))
        # an ingest that looked its keys up in a snapshot before these
        # keeps its answers
        self.assertEqual(before, self.generation())
        pubs = self.handler.publisher.publications
        for oid in (names.map_image_id(ID, 1), names.digests_image_id(ID),
                    names.layout_image_id(ID)):
            row = pubs.get(oid)
            self.assertEqual((db_publications.DONE, ID),
                             (row.state, row.image_id), oid)
            self.assertEqual(self.glance.images.store[oid]['data'],
                             self._published_data(oid))

    def _published_data(self, oid):
        row = self.handler.publisher.publications.get(oid)
        data = self.glance.images.store[oid]['data']
        self.assertEqual(row.sha256, hashlib.sha256(data).hexdigest())
        return data

    def test_a_claim_of_another_publisher_is_waited_for_then_taken(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        mid = names.map_image_id(ID, 1)
        other = db_publications.Publications(self.conf, 'other-agent')
        self.assertEqual(db_publications.TAKEN,
                         other.claim(mid, ID, 'map', 'x' * 64, 300))
        ours = self.handler.publisher.publications
        self.assertEqual(db_publications.BUSY,
                         ours.claim(mid, ID, 'map', 'y' * 64, 300))
        # the other agent died with its claim: once the claim is older
        # than the timeout, ours takes it over and publishes
        self.conf.set_override('publish_claim_timeout', 1,
                               group='vmar_agent')
        self.assertEqual(1, self.handler.publisher.current(ID))
        row = ours.get(mid)
        self.assertEqual((db_publications.DONE, ours.holder),
                         (row.state, row.holder))
        self.assertEqual('active', self.glance.images.store[mid]['status'])
        # the late one's done changes nothing
        self.assertFalse(other.done(mid, 'x' * 64))
        self.assertEqual(db_publications.DONE, ours.get(mid).state)

    def test_a_failed_upload_releases_its_claim(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        mid = names.map_image_id(ID, 1)

        def unreachable(*a, **kw):
            raise glance_exc.HTTPServiceUnavailable()
        self.patch(self.glance.images, 'upload', unreachable)
        self.assertRaises(exception.PublishError,
                          self.handler.publisher.current, ID)
        # nobody need wait for it to time out
        self.assertIsNone(self.handler.publisher.publications.get(mid))

    def test_resync_finishes_what_a_killed_publisher_left(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        mid = names.map_image_id(ID, 1)
        # killed between its claim and the upload: the record is queued
        dead = db_publications.Publications(self.conf, 'dead-agent')
        dead.claim(mid, ID, 'map', self._map_sha(1), 300)
        self.assertEqual('queued', self.glance.images.store[mid]['status'])
        pubs = self.handler.publisher.publications
        self.assertEqual([], pubs.unfinished(older_than=300))
        self.assertEqual([mid], [p.object_id
                                 for p in pubs.unfinished(older_than=0)])
        self.conf.set_override('publish_claim_timeout', 1,
                               group='vmar_agent')
        self._backdate(mid, seconds=2)
        agent._finish_publications(self.conf, self.handler, {ID})
        self.assertEqual('active', self.glance.images.store[mid]['status'])
        self.assertEqual(db_publications.DONE, pubs.get(mid).state)
        self.assertEqual([], pubs.unfinished(older_than=0))

    def test_deleted_hidden_images_forget_their_rows(self):
        self.handler._add(ID, self.meta, self.path, 'it')
        self.handler.publisher.current(ID)
        mid = names.map_image_id(ID, 1)
        self.assertIsNotNone(self.handler.publisher.publications.get(mid))
        self.handler.publisher.delete_all(ID)
        self.assertIsNone(self.handler.publisher.publications.get(mid))

    def _backdate(self, object_id, seconds):
        with db_session.writer(self.conf) as s:
            row = s.get(db_models.Publication, object_id)
            row.claimed_at -= datetime.timedelta(seconds=seconds)
