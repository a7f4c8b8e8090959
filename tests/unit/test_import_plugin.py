"""The import plugin's delta task: what its revert leaves, and when.

Glance's ImportActionWrapper is replaced by a recorder (a unit test's
isolation; tests/functional/test_glance.py runs the plugin in a real
glance-api).
"""

import os

import fixtures
import testtools

from vmar_openstack.glance_hooks import plugin


class _Action:
    """Records each call, and whether the staged files existed then."""

    def __init__(self, paths, calls):
        self.paths, self.calls = paths, calls

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, kwargs, [p for p in self.paths
                                              if os.path.exists(p)]))
        return call


class TestRevert(testtools.TestCase):

    def setUp(self):
        super().setUp()
        d = self.useFixture(fixtures.TempDir()).path
        self.src = os.path.join(d, 'img-1')
        self.ours = [self.src + '.vmar', self.src + '.vmar.qcow2']
        for p in [self.src] + self.ours:
            with open(p, 'wb') as f:
                f.write(b'x')
        self.calls = []
        action = _Action([self.src] + self.ours, self.calls)

        class Wrapper:
            def __enter__(self):
                return action

            def __exit__(self, *exc):
                return False

        self.task = plugin._AssembleDelta('t1', 'api_image_import', 'img-1',
                                          Wrapper(), None, stores=['s1'])
        self.task.src_path = self.src

    def test_the_image_is_queued_after_its_staged_data_went(self):
        self.task.revert()
        name, kwargs, present = self.calls[0]
        self.assertEqual(('set_image_attribute', {'status': 'queued'}, []),
                         (name, kwargs, present))
        self.assertEqual(['remove_importing_stores', 'add_failed_stores'],
                         [c[0] for c in self.calls[1:]])
        self.assertFalse(any(os.path.exists(p)
                             for p in [self.src] + self.ours))

    def test_the_image_is_queued_even_when_a_file_cannot_go(self):
        os.unlink(self.src)
        os.mkdir(self.src)      # unlink(2) of a directory fails
        self.assertRaises(OSError, self.task.revert)
        self.assertEqual('set_image_attribute', self.calls[0][0])

    def test_not_a_delta_reverts_nothing(self):
        self.task.src_path = None
        self.task.revert()
        self.assertEqual([], self.calls)
        self.assertTrue(os.path.exists(self.src))
