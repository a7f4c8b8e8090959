"""vmar-agent's failures: backoff, parking, recovery, failing for good.

The handler and Glance are test doubles of the project's own Handler and
of python-glanceclient; the failure records are real (the library's
SQLite database). The functional test with RabbitMQ and glance-api is
tests/functional/test_glance.py TestGlance.test_outage_then_recovery.
"""

import uuid

from glanceclient import exc as glance_exc

from tests import base
from vmar_openstack.db import failures as db_failures
from vmar_openstack import exception
from vmar_openstack.glance_hooks import agent


class Outage(Exception):
    pass


class FakeHandler:
    """Handler.dispatch, failing while ``down`` or for ``bad`` images."""

    def __init__(self):
        self.down = False
        self.bad = set()
        self.calls = []
        self.glance = self

    @property
    def images(self):
        return self

    def get(self, image_id):           # glance.images.get
        if self.down:
            raise Outage('glance unreachable')
        if image_id.startswith('0'):
            raise glance_exc.HTTPNotFound()
        return {'id': image_id, 'status': 'active'}

    def dispatch(self, event_type, payload):
        self.calls.append((event_type, payload['id']))
        if payload['id'] in self.bad:
            raise exception.ImageUnusable(image_id=payload['id'],
                                          reason='it is hostile')
        if self.down:
            raise Outage('glance unreachable')


class TestFailures(base.LibraryTestCase):

    def setUp(self):
        super().setUp()
        self.conf.set_override('max_attempts', 3, group='vmar_agent')
        self.conf.set_override('retry_delay', 0.5, group='vmar_agent')
        self.handler = FakeHandler()
        self.endpoint = agent.Endpoint(self.conf, self.handler)
        self.failures = self.endpoint.failures

    @staticmethod
    def image_id():
        # FakeHandler: Glance knows images whose id does not start with 0
        return 'f' + str(uuid.uuid4())[1:]

    def test_outage_backs_off_then_parks(self):
        self.handler.down = True
        i = self.image_id()
        delays = [self.endpoint.handle('image.activate', {'id': i})
                  for _ in range(3)]
        self.assertEqual([0.5, 1.0, None], delays)
        f = self.failures.get(i)
        self.assertEqual(('parked', 'outage', 3),
                         (f.state, f.cause, f.attempts))
        self.assertIn('Outage: glance unreachable', f.last_error)
        self.assertFalse(self.endpoint.succeeded.is_set())

    def test_parked_images_are_retried_once_the_outage_is_over(self):
        self.handler.down = True
        ids = [self.image_id() for _ in range(3)]
        for i in ids:
            self.endpoint.handle('image.activate', {'id': i}, once=True)
        self.assertEqual(set(ids), {f.image_id for f in
                                    self.failures.list(state='parked')})
        # still down: the pass stops at the first failure
        self.assertEqual(0, agent.retry_parked(self.handler, self.endpoint))
        self.assertEqual(2, self.failures.get(ids[0]).attempts)
        self.assertEqual(1, self.failures.get(ids[1]).attempts)
        # an event succeeds: the agent knows the outage is over
        self.handler.down = False
        self.endpoint.handle('image.activate', {'id': self.image_id()})
        self.assertTrue(self.endpoint.succeeded.is_set())
        self.assertEqual(3, agent.retry_parked(self.handler, self.endpoint))
        self.assertEqual([], self.failures.list())
        # oldest attempt first: the one retried in the first pass is last
        retried = [c[1] for c in self.handler.calls[-3:]]
        self.assertEqual(ids[0], retried[-1])
        self.assertEqual(set(ids), set(retried))

    def test_a_bad_image_fails_for_good(self):
        i = self.image_id()
        self.handler.bad.add(i)
        self.assertIsNone(self.endpoint.handle('image.activate', {'id': i}))
        f = self.failures.get(i)
        self.assertEqual(('failed', db_failures.IMAGE, 1),
                         (f.state, f.cause, f.attempts))
        # later events and resync passes skip it; parked retries too
        n = len(self.handler.calls)
        self.endpoint.handle('image.update', {'id': i})
        self.endpoint.handle('image.activate', {'id': i}, once=True)
        self.assertEqual(0, agent.retry_parked(self.handler, self.endpoint))
        self.assertEqual(n, len(self.handler.calls))
        # an operator's retry runs it again; still bad
        again = agent.retry(self.handler, self.endpoint, f)
        self.assertEqual(('failed', 2), (again.state, again.attempts))
        # fixed: the retry clears it
        self.handler.bad.clear()
        self.assertIsNone(agent.retry(self.handler, self.endpoint, again))
        self.assertIsNone(self.failures.get(i))
        # its deletion always goes through
        self.handler.bad.add(i)
        self.endpoint.handle('image.activate', {'id': i})
        self.endpoint.handle('image.delete', {'id': i})
        self.assertEqual(('image.delete', i), self.handler.calls[-1])

    def test_retry_of_an_image_gone_from_glance_deletes_it(self):
        i = '0' + str(uuid.uuid4())[1:]
        self.handler.down = True
        self.endpoint.handle('image.activate', {'id': i}, once=True)
        self.handler.down = False
        self.assertIsNone(agent.retry(self.handler, self.endpoint,
                                      self.failures.get(i)))
        self.assertEqual(('image.delete', i), self.handler.calls[-1])

    def test_retry_while_glance_is_away_records_the_attempt(self):
        i = self.image_id()
        self.handler.down = True
        self.endpoint.handle('image.update', {'id': i}, once=True)
        f = agent.retry(self.handler, self.endpoint, self.failures.get(i))
        self.assertEqual(('parked', 2, 'image.update'),
                         (f.state, f.attempts, f.event))
        self.assertEqual(1, len(self.handler.calls))

    def test_a_stale_retry_does_not_bring_a_cleared_failure_back(self):
        # the agent's pass of the parked listed the image; before it got
        # to it, an operator's retry succeeded (or the failure was
        # forgotten): the pass's attempt, failing in the outage, records
        # nothing, neither when Glance is away nor when the event fails
        self.handler.down = True
        for outage_in in ('glance', 'dispatch'):
            i = self.image_id()
            self.endpoint.handle('image.activate', {'id': i}, once=True)
            listed = self.failures.get(i)
            self.assertEqual('parked', listed.state)
            self.assertTrue(self.failures.clear(i))
            self.handler.down = outage_in == 'glance'
            if outage_in == 'dispatch':
                self.handler.bad.add(i)
            self.assertIsNone(agent.retry(self.handler, self.endpoint,
                                          listed))
            self.assertIsNone(self.failures.get(i))
        # a failure still recorded is counted as before
        i = self.image_id()
        self.handler.down = True
        self.endpoint.handle('image.activate', {'id': i}, once=True)
        self.assertEqual(2, agent.retry(self.handler, self.endpoint,
                                        self.failures.get(i)).attempts)

    def test_forget(self):
        i = self.image_id()
        self.handler.down = True
        self.endpoint.handle('image.activate', {'id': i})
        self.assertTrue(self.failures.clear(i))
        self.assertFalse(self.failures.clear(i))
        self.assertIsNone(self.failures.get(i))
