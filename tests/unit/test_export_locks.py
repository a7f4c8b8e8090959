"""The export daemon's in-process locks (host/exports/locks.py)."""

import contextlib
import threading

import testtools

from vmar_openstack.host.exports import locks


class TestKeyed(testtools.TestCase):

    def test_one_holder_per_key_and_keys_apart(self):
        keyed = locks.Keyed()
        inside, peak, other = [], [], threading.Event()
        mutex = threading.Lock()

        def work(key):
            with keyed(key):
                with mutex:
                    inside.append(key)
                    peak.append(inside.count('a'))
                if key == 'b':
                    other.set()
                else:
                    # 'b' gets in while an 'a' is inside
                    self.assertTrue(other.wait(10))
                with mutex:
                    inside.remove(key)
        threads = [threading.Thread(target=work, args=(k,))
                   for k in 'aaaab']
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(1, max(peak))
        self.assertEqual({}, keyed._locks)


class TestHolds(testtools.TestCase):

    def test_a_held_key_cannot_be_claimed(self):
        holds = locks.Holds()
        with contextlib.ExitStack() as stack:
            holds.hold('a', stack)
            holds.hold('a', stack)
            with holds.claimed('a') as mine:
                self.assertFalse(mine)
            with holds.claimed('b') as mine:
                self.assertTrue(mine)
        with holds.claimed('a') as mine:
            self.assertTrue(mine)
            with holds.claimed('a') as again:
                self.assertFalse(again)

    def test_a_hold_waits_for_the_claim(self):
        holds = locks.Holds()
        order = []
        with holds.claimed('a') as mine:
            self.assertTrue(mine)
            stack = contextlib.ExitStack()
            t = threading.Thread(target=lambda: (holds.hold('a', stack),
                                                 order.append('held')))
            t.start()
            t.join(0.2)
            self.assertTrue(t.is_alive())
            order.append('claim over')
        t.join(10)
        stack.close()
        self.assertEqual(['claim over', 'held'], order)
        self.assertEqual({}, holds._held)
