"""vmar-manage end to end, as an operator runs it, on real files."""

import json
import os
import subprocess
import sys

from tests import base
from vmar_openstack.db import hosts as db_hosts

A = '0a000000-0000-4000-8000-0000000000a1'
B = '0b000000-0000-4000-8000-0000000000b2'


class TestManage(base.LibraryTestCase):

    def setUp(self):
        super().setUp()
        self.conf_file = self.write_conf_file(
            connection='sqlite:///%s/cli.sqlite' % self.tmp)

    def manage(self, *args, ok=True):
        proc = subprocess.run(
            [sys.executable, '-m', 'vmar_openstack.cmd.manage',
             '--config-file', self.conf_file] + list(args),
            capture_output=True, text=True)
        if ok:
            self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
        else:
            self.assertEqual(1, proc.returncode, proc.stdout)
        return proc

    def test_operator_path(self):
        self.manage('db', 'sync')
        a = self.image('a.raw', list(range(1, 64)) + [None] * 16)
        qcow = os.path.join(self.tmp, 'b.qcow2')
        b_raw = self.image('b.raw', [None] * 4 + list(range(10, 50))
                           + [500, 501])
        subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2',
                        b_raw, qcow], check=True)
        out = self.manage('image', 'add', '--id', A, '--visibility',
                          'public', a).stdout
        self.assertIn('added %s: seq 1, map v1' % A, out)
        out = self.manage('image', 'add', '--id', B, '--format', 'qcow2',
                          '--owner', 'p1', qcow).stdout
        self.assertIn('seq 2', out)
        listing = self.manage('image', 'list').stdout
        self.assertIn(A, listing)
        self.assertIn('qcow2', listing)
        show = json.loads(self.manage('map', 'show', '--extents', B).stdout)
        self.assertEqual({A, B}, {t['image_id'] for t in show['targets']})
        self.assertEqual(42, show['mapped_blocks'])
        self.assertEqual([4, 40, 9, A], [
            show['extent_list'][0][k] for k in ('src', 'length',
                                                'target_block', 'target')])
        out = self.manage('map', 'verify', B, '--source', qcow, '--format',
                          'qcow2').stdout
        self.assertIn('byte for byte', out)
        st = json.loads(self.manage('stats', '--json').stdout)
        img_b = st['images'][1]
        self.assertEqual(40, img_b['redirected_blocks'])
        self.assertEqual(2, img_b['unique_blocks'])
        self.assertEqual(4, img_b['zero_blocks'])
        self.assertIn('library consistent', self.manage('check').stdout)
        # a corrupted map is caught by verify and check, not trusted
        path = os.path.join(self.tmp, 'maps', '%s.1.vmap' % B)
        os.chmod(path, 0o644)
        with open(path, 'r+b') as f:
            f.seek(200)
            f.write(b'\xff\xff')
        err = self.manage('map', 'verify', B, ok=False).stderr
        self.assertIn('checksum', err)
        self.assertIn('checksum mismatch', self.manage('check',
                                                       ok=False).stdout)
        # delete the canonical image: B's map is regenerated without it
        out = self.manage('image', 'delete', A).stdout
        self.assertIn('regenerated map of %s: v2' % B, out)
        show = json.loads(self.manage('map', 'show', B).stdout)
        self.assertEqual([B], [t['image_id'] for t in show['targets']])
        self.manage('map', 'verify', B)
        self.assertIn('library consistent', self.manage('check').stdout)

    def test_hosts_list_and_shares(self):
        self.manage('db', 'sync')
        self.manage('image', 'add', '--id', A, '--visibility', 'public',
                    self.image('a.raw', [1, 2, 3, 4]))
        self.manage('image', 'add', '--id', B, '--visibility', 'public',
                    self.image('b.raw', [1, 2, 5, None]))
        self.conf.set_override('connection', 'sqlite:///%s/cli.sqlite'
                               % self.tmp, group='vmar_database')
        reports = db_hosts.HostReports(self.conf)
        reports.record('h1', [(A, 1)], {A: None})
        reports.record('h2', [], {A: None, B: None})
        # serves B, holds nothing yet: it will hold all B reads
        reports.record('h3', [(B, 1)], {})
        hosts = json.loads(self.manage('hosts', 'list', '--json').stdout)
        self.assertEqual([[[A, None]], [[A, None], [B, None]], []],
                         [h['holds'] for h in hosts])
        rows = [ln.split() for ln in self.manage(
            'hosts', 'shares', B).stdout.splitlines()]
        self.assertIn(['h2', '1.000'], rows)
        self.assertIn(['h3', '1.000'], rows)
        self.assertIn(['h1', '0.667'], rows)
        self.assertLess(rows.index(['h2', '1.000']),
                        rows.index(['h1', '0.667']))

    def test_errors_are_one_clear_line(self):
        self.manage('db', 'sync')
        err = self.manage('image', 'delete', A, ok=False).stderr
        self.assertEqual('vmar-manage: error: image %s is not in the library'
                         % A, err.strip())
        err = self.manage('image', 'add', '--id', 'not-a-uuid',
                          self.image('x', [1]), ok=False).stderr
        self.assertIn('is not an image id', err)
        a = self.image('a.raw', [1, 2])
        self.manage('image', 'add', '--id', A, a)
        err = self.manage('image', 'add', '--id', A, a, ok=False).stderr
        self.assertIn('already in the library', err)
