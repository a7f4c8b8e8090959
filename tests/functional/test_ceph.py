"""Glance on Ceph: lazy hosts read canonical bases straight from RBD.

Real pieces throughout: a single-node Ceph cluster from Debian's packages
(tools/vmarenv/ceph_env.py: one monitor, one BlueStore OSD, cephx),
glance-api with glance_store's RBD store on it, vmar-agent, and a lazy
host (``vmar-export serve``, its daemon and its nbdkit range server) that
reads with a read-only Ceph user of its own. Glance is reached through a
proxy: stopped, it shows that blocks come from Ceph and not through
Glance. The cluster fails for real: its OSD is killed, and an object
Glance's snapshot reads is rewritten with ``rados put``.
"""

import json
import os
import signal
import subprocess
import time

from tests.functional import test_glance
from tools.vmarenv import ceph_env
from tools.vmarenv import qemu_env
from vmar_openstack.exception import SourceError
from vmar_openstack.mapformat import mirror
from vmar_openstack.mapsource import rbd

BS = 4096


class CephStore:
    """glance-api stores images in Ceph; lazy hosts read them from RBD."""

    # seconds a read waits for a dead OSD before it fails
    op_timeout = 5

    @classmethod
    def _start(cls):
        cls.ceph = ceph_env.Ceph(os.path.join(cls.work, 'ceph'))
        cls.ceph.start()
        super()._start()

    @classmethod
    def tearDownClass(cls):
        ceph = getattr(cls, 'ceph', None)
        if ceph is not None:
            ceph.stop()
        super().tearDownClass()

    @classmethod
    def store_config(cls):
        return cls.ceph.glance_config()

    @classmethod
    def store_python_path(cls):
        return [cls.ceph.python_path()]

    def host_config(self):
        return {'vmar_rbd': {'ceph_conf': self.ceph.conf, 'user': 'vmar',
                             'connect_timeout': '5',
                             'op_timeout': str(self.op_timeout)}}

    def setUp(self):
        super().setUp()
        if self.ceph.osd_proc is None or self.ceph.osd_proc.poll() is not None:
            self.ceph.start_osd()      # a test before this one killed it

    def serve_log(self):
        return super().serve_log() + self.ceph.tail()

    def reader(self, host, image_id):
        with open(os.path.join(host, 'mirrors', image_id + '.reader')) as f:
            return json.load(f)

    def corrupt(self, image_id, offset):
        """Flip a bit of the image's data in its RADOS object.

        ``rados put`` rewrites the object holding ``offset`` with no snap
        context, behind RBD's back: the OSD keeps no clone, so Glance's
        snapshot reads the changed bytes (bit rot, a bad disk, a bad
        actor with the admin key). Returns a function that puts the good
        byte back the same way.
        """
        info = json.loads(self.ceph.run('rbd', 'info', '--format', 'json',
                                        'images/' + image_id).stdout)
        obj_size = 1 << info['order']
        name = '%s.%016x' % (info['block_name_prefix'], offset // obj_size)
        path = os.path.join(self.tmp, 'object')

        def flip():
            self.ceph.run('rados', '--pool', ceph_env.POOL, 'get', name, path)
            with open(path, 'r+b') as f:
                f.seek(offset % obj_size)
                byte = f.read(1)[0]
                f.seek(offset % obj_size)
                f.write(bytes([byte ^ 0x10]))
            self.ceph.run('rados', '--pool', ceph_env.POOL, 'put', name, path)
        flip()
        return flip


class TestGlanceOnCeph(CephStore, test_glance.GlanceTestCase):

    def test_lazy_host_reads_blocks_straight_from_rbd(self):
        # b's first 2 MiB are a's
        a = self.image('cr-a.raw', list(range(1, 513)) + [None] * 256)
        b = self.image('cr-b.raw', list(range(1, 513))
                       + list(range(1001, 1513)) + [None] * 128)
        ia, ib, vb = self.publish_pair(a, b)
        # Glance keeps them in Ceph and says where; its data API cannot
        # serve them range by range (glance_store's RBD store has no
        # random access): without RBD reads a lazy host could not work
        meta = self.client.images.get(ib)
        self.assertEqual(rbd.Location(self.ceph.fsid, ceph_env.POOL, ib,
                                      'snap'), rbd.image_location(meta))
        e = self.assertRaises(SourceError, self.source.ranges.read, ib, BS,
                              BS)
        self.assertIn('Glance answered 400', str(e))
        host, cmd, proxy = self.lazy_host()
        uri = self.lazy_add(cmd, ib, vb)
        for i in (ia, ib):
            self.assertEqual(rbd.fetch_export(rbd.Location(
                None, ceph_env.POOL, i, 'snap'), os.path.getsize(
                    a if i == ia else b)), self.reader(host, i)['export'])
        mirrors = os.path.join(host, 'mirrors')

        def held():
            return sum(os.stat(os.path.join(mirrors, i)).st_blocks * 512
                       for i in (ia, ib))
        # Glance away: every block still comes, from Ceph, byte for byte,
        # each data block once
        proxy.stop()
        self.assertEqual(0, held())
        r = self.qemu_io(uri, 'read 0 64k')
        self.assertNotIn('failed', r.stdout + r.stderr, self.serve_log())
        self.assertEqual(65536, held())
        self.assert_same(uri, b)
        self.assertEqual(1024 * BS, held())
        # a restarted daemon opens the mirrors without asking anyone, and
        # serves what they recorded (present bits follow the data's sync)

        def recorded():
            bits = {i: mirror.read_present(os.path.join(
                mirrors, i + '.present'))[1] for i in (ia, ib)}
            return bits[ia][:512].all() and bits[ib][512:1024].all()
        self.wait_until(recorded, 'present bits on disk')
        self.ceph.kill_osd()
        with open(os.path.join(host, 'qsd.pid')) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        deadline = time.time() + 60
        while True:
            r = self.qemu_io(uri, 'read 0 4M')
            if r.returncode == 0 and 'failed' not in r.stdout + r.stderr:
                break
            self.assertLess(time.time(), deadline,
                            r.stdout + r.stderr + self.serve_log())
            time.sleep(0.5)
        self.ceph.start_osd()
        r = subprocess.run(cmd + ['remove', ib], capture_output=True,
                           text=True)
        self.assertEqual(0, r.returncode, r.stderr)

    def test_a_lazy_host_reads_what_its_peer_holds(self):
        """Peer discovery end to end, Ceph cut (issue 34)."""
        self.check_peer_reads(lambda _proxy: self.ceph.kill_osd())

    def test_a_dead_osd_fails_reads_until_it_is_back(self):
        a = self.image('co-a.raw', list(range(1, 257)))
        b = self.image('co-b.raw', list(range(1, 257))
                       + list(range(601, 857)))
        ia, ib, vb = self.publish_pair(a, b)
        host, cmd, _proxy = self.lazy_host()
        uri = self.lazy_add(cmd, ib, vb)
        mirror = os.path.join(host, 'mirrors', ib)
        self.ceph.kill_osd()
        # the read fails ([vmar_rbd] op_timeout), it does not hang
        r = self.qemu_io(uri, 'read 1M 64k')
        self.assertIn('Input/output error', r.stdout + r.stderr)
        self.assertIn('RBD operation timeout', self.serve_log())
        self.assertEqual(0, os.stat(mirror).st_blocks)
        self.ceph.start_osd()
        r = self.qemu_io(uri, 'read 1M 64k')
        self.assertNotIn('failed', r.stdout + r.stderr, self.serve_log())
        self.assert_same(uri, b)

    def test_corrupt_object_in_the_osd_is_never_served(self):
        a = self.image('cc-a.raw', list(range(1, 257)))
        b = self.image('cc-b.raw', list(range(1, 257))
                       + list(range(701, 957)))
        ia, ib, vb = self.publish_pair(a, b)
        host, cmd, _proxy = self.lazy_host()
        uri = self.lazy_add(cmd, ib, vb)
        repair = self.corrupt(ib, (1 << 20) + 5 * BS + 100)
        r = self.qemu_io(uri, 'read 1M 64k')
        self.assertIn('Input/output error', r.stdout + r.stderr)
        self.assertIn('digest', self.serve_log())
        # the blocks beside it are good, and served
        r = self.qemu_io(uri, 'read 1M 20k')
        self.assertNotIn('failed', r.stdout + r.stderr, self.serve_log())
        repair()
        self.assert_same(uri, b)

    def test_qcow2_images_in_rbd(self):
        a = self.image('cq-a.raw', list(range(1, 257)) + [None] * 64)
        b_raw = self.image('cq-b.raw', list(range(1, 257))
                           + list(range(801, 1057)))
        b = os.path.join(self.tmp, 'cq-b.qcow2')
        subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'convert', '-f', 'raw',
                        '-O', 'qcow2', b_raw, b], check=True)
        ia, ib, vb = self.publish_pair(a, b, fmt='qcow2')
        host, cmd, _proxy = self.lazy_host()
        # QEMU's qcow2 driver over the RBD export, the header read from
        # Ceph too (Glance cannot serve a range of it)
        uri = self.lazy_add(cmd, ib, vb)
        reader = self.reader(host, ib)
        self.assertEqual(('qcow2', 'range-export'),
                         (reader['kind'], reader['file']['kind']))
        self.assertTrue(rbd.is_fetch_export(reader['file']['export']))
        self.assert_same(uri, b_raw)


class TestLazyGuestsOnCeph(CephStore, test_glance.LazyGuestsTestCase):
    """A guest of a lazy host pauses while Ceph fails and resumes by itself."""

    def test_osd_down_in_the_middle_of_a_boot(self):
        self.prefill(8 << 20)
        self.ceph.kill_osd()
        name, console = self.boot(wait=False)
        self.wait_paused(name)
        deadline = time.time() + 60
        while name not in self.resumed:
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        self.wait_paused(name)
        self.ceph.start_osd()
        self.wait_off(name, console)
        self.assert_guest_saw_the_image(console)

    def test_corrupt_object_in_the_middle_of_a_boot(self):
        self.prefill(8 << 20)
        repair = self.corrupt(self.ib, (20 << 20) + 7)
        name, console = self.boot(wait=False)
        self.wait_paused(name)
        repair()
        self.wait_off(name, console)
        self.assert_guest_saw_the_image(console)
        self.assertIn('digest', self.serve_log())
