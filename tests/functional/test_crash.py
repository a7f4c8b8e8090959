"""A killed ingest, and a full disk, leave a consistent library."""

import os
import signal
import subprocess
import sys
import time

import sqlalchemy as sa

from tests import base
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack.ingest import check

ID = '0c000000-0000-4000-8000-0000000000c1'
OTHER = '0d000000-0000-4000-8000-0000000000d1'


def _count(conf, table):
    with db_session.reader(conf) as s:
        return s.execute(sa.select(sa.func.count()).select_from(
            table)).scalar()


class TestKill(base.LibraryTestCase):

    def setUp(self):
        super().setUp()
        self.conf_file = self.write_conf_file()
        # an existing image the new one shares blocks with, so the
        # transaction moves fingerprints and regenerates nothing else
        base_img = self.image('base.raw', list(range(1, 3000)))
        self.lib.add(OTHER, base_img, visibility='public')
        self.big = self.image('big.raw', list(range(1500, 9000)))

    def _add(self):
        return subprocess.Popen(
            [sys.executable, '-m', 'vmar_openstack.cmd.manage',
             '--config-file', self.conf_file, 'image', 'add', '--id', ID,
             '--visibility', 'public', self.big],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)

    def test_kill_9_at_every_stage(self):
        t = time.monotonic()
        p = self._add()
        p.wait()
        full = time.monotonic() - t
        self.assertEqual(0, p.returncode)
        self.lib.delete(ID)
        outcomes = set()
        for i in range(12):
            p = self._add()
            time.sleep(full * (i + 0.5) / 12)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            problems, _warnings = check.check(self.conf)
            self.assertEqual([], problems, 'after a kill at step %d' % i)
            present = _count(self.conf, models.Image) == 2
            outcomes.add(present)
            if present:
                self.lib.delete(ID)
            # whatever was killed, the ingest can be run again
            self.assertEqual(1, _count(self.conf, models.Image))
        # at least the early kills interrupted the ingest for real
        self.assertIn(False, outcomes)
        p = self._add()
        p.wait()
        self.assertEqual(0, p.returncode)
        self.assertEqual([], check.check(self.conf)[0])


class TestFullDisk(base.LibraryTestCase):
    """ENOSPC while converting, or while writing a map, loses nothing."""

    def _tmpfs(self, size):
        path = self.scratch()
        try:
            subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=%s' % size,
                            'tmpfs', path], check=True, capture_output=True)
        except subprocess.CalledProcessError as e:
            self.fail('cannot mount a small tmpfs to fill: %s'
                      % e.stderr.decode())
        self.addCleanup(subprocess.run, ['umount', '-l', path])
        return path

    def test_no_space_for_the_raw_view(self):
        raw = self.image('a.raw', list(range(1, 1000)))
        qcow = os.path.join(self.tmp, 'a.qcow2')
        subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2',
                        raw, qcow], check=True)
        self.conf.set_override('work_dir', self._tmpfs('1m'), group='vmar')
        e = self.assertRaises(exception.ImageRejected, self.lib.add, ID,
                              qcow, disk_format='qcow2')
        self.assertIn('No space', str(e))
        self.assertEqual(0, _count(self.conf, models.Image))
        self.assertEqual([], os.listdir(self.conf.vmar.work_dir))

    def test_no_space_for_a_map(self):
        first = self.image('a.raw', list(range(1, 50)))
        self.lib.add(OTHER, first, visibility='public')
        maps = self._tmpfs('64k')
        for name in os.listdir(self.conf.vmar.map_dir):
            with open(os.path.join(maps, name), 'wb') as f:
                with open(os.path.join(self.conf.vmar.map_dir, name),
                          'rb') as g:
                    f.write(g.read())
        self.conf.set_override('map_dir', maps, group='vmar')
        # fill the map file system
        fd = os.open(os.path.join(maps, 'filler'), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b'x' * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        many = self.image('b.raw', list(range(1, 4000, 2)))
        self.assertRaises(OSError, self.lib.add, ID, many,
                          visibility='public')
        os.unlink(os.path.join(maps, 'filler'))
        self.assertEqual(1, _count(self.conf, models.Image))
        self.assertEqual(sorted(['%s.1.vmap' % OTHER]),
                         sorted(os.listdir(maps)))
        self.assertEqual([], check.check(self.conf)[0])
        self.assertFalse(os.path.exists(os.path.join(self.conf.vmar.base_dir,
                                                     ID)))
        # with room again, the same ingest succeeds
        self.lib.add(ID, many, visibility='public')
        self.assertEqual([], check.check(self.conf)[0])
