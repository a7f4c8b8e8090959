"""Which export references vmar-nova-compute drops when it starts."""

import os

import fixtures
import testtools

from vmar_openstack import exception
from vmar_openstack.nova_imagebackend import reconcile

HERE = '11111111-2222-3333-4444-555555555555'
RESIZED = '22222222-2222-3333-4444-555555555555'
DOMAIN_ONLY = '33333333-2222-3333-4444-555555555555'
GONE = 'aaaaaaaa-2222-3333-4444-555555555555'
GONE_TOO = '55555555-2222-3333-4444-555555555555'


class Exports(object):
    """The holders calls of the host API's client, over a dict."""

    def __init__(self, held, failing=(), down=False):
        self.held = dict(held)
        self.failing = set(failing)
        self.down = down

    def holders(self):
        if self.down:
            raise exception.ExportDaemonDown(reason='no API socket')
        return {h: list(n) for h, n in self.held.items()}

    def release(self, holder):
        if holder in self.failing:
            raise exception.ExportDaemonDown(reason='socket refused')
        return self.held.pop(holder)


class TestStale(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.path = self.useFixture(fixtures.TempDir()).path
        os.mkdir(os.path.join(self.path, HERE))
        os.mkdir(os.path.join(self.path, RESIZED + '_resize'))

    def test_only_instances_with_no_dir_and_no_domain(self):
        holders = [HERE, RESIZED, DOMAIN_ONLY, GONE, GONE_TOO]
        self.assertEqual(sorted([GONE, GONE_TOO]),
                         reconcile.stale(holders, self.path, {DOMAIN_ONLY}))

    def test_operator_holders_are_kept(self):
        # the CLI's default, a tool's name, and a UUID not written the
        # way Nova writes an instance's
        holders = ['cli', 'bench-minbase', GONE.upper(),
                   '{%s}' % GONE, GONE.replace('-', '')]
        self.assertEqual([], reconcile.stale(holders, self.path, set()))

    def test_a_deleting_dir_does_not_keep_it(self):
        # Nova renames a directory to <uuid>_del before it removes it
        os.mkdir(os.path.join(self.path, GONE + '_del'))
        self.assertEqual([GONE], reconcile.stale([GONE], self.path, set()))


class TestReleaseStale(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.path = self.useFixture(fixtures.TempDir()).path
        os.mkdir(os.path.join(self.path, HERE))
        self.log = self.useFixture(fixtures.FakeLogger())

    def test_releases_what_left_and_keeps_the_rest(self):
        exports = Exports({HERE: ['a.1'], GONE: ['a.1'], 'cli': ['b.1']})
        self.assertEqual([GONE], reconcile.release_stale(
            exports, self.path, [DOMAIN_ONLY]))
        self.assertEqual({HERE: ['a.1'], 'cli': ['b.1']}, exports.holders())
        self.assertIn(GONE, self.log.output)

    def test_a_failed_release_is_kept_and_others_go_on(self):
        exports = Exports({GONE: ['a.1'], GONE_TOO: ['c.2']},
                          failing={GONE})
        self.assertEqual([GONE_TOO], reconcile.release_stale(
            exports, self.path, []))
        self.assertEqual({GONE: ['a.1']}, exports.holders())
        self.assertIn('vmar-export release %s' % GONE, self.log.output)

    def test_a_host_whose_daemon_is_down_is_left_alone(self):
        exports = Exports({GONE: ['a.1']}, down=True)
        self.assertEqual([], reconcile.release_stale(exports, self.path, []))
        exports.down = False
        self.assertEqual({GONE: ['a.1']}, exports.holders())
        self.assertIn('no export references reconciled', self.log.output)

    def test_unreadable_holders_do_not_stop_the_start(self):
        exports = Exports({})

        def broken():
            raise exception.ExportError(reason='exports.json: bad JSON')
        exports.holders = broken
        self.assertEqual([], reconcile.release_stale(exports, self.path, []))
        self.assertIn('could not read the export holders', self.log.output)
