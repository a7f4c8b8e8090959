"""vmar-manage end to end, as an operator runs it, on real files."""

import json
import os
import subprocess
import sys

from tests import base
from tests import fsimages
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

    def test_image_show_says_what_each_block_is(self):
        self.manage('db', 'sync')
        root = os.path.join(self.tmp, 'root')
        os.makedirs(os.path.join(root, 'usr', 'bin'))
        with open(os.path.join(root, 'usr', 'bin', 'tool'), 'wb') as f:
            f.write(b'\x7f' * (3 << 20))
        with open(os.path.join(root, 'motd'), 'wb') as f:
            f.write(b'hello\n')
        disk = os.path.join(self.tmp, 'disk.raw')
        fsimages.partition(disk, 40 << 20, 'start=2048, type=83\n')
        fsimages.mkfs_ext(disk, root, offset=1 << 20, size=39 << 20)
        self.manage('image', 'add', '--id', A, disk)
        self.manage('image', 'add', '--id', B,
                    self.image('b.raw', [1, 2, 3, None]))
        info = json.loads(self.manage('image', 'show', A, '--json').stdout)
        lay = info['layout']
        self.assertEqual([(1 << 20, 39 << 20, 'ext4', True)],
                         [(v['offset'], v['length'], v['type'],
                           v['classified']) for v in lay['volumes']])
        kinds = lay['kinds']
        # the tool's 768 blocks and motd's one, none of them zero
        self.assertEqual(769, kinds['data']['blocks'])
        self.assertEqual(769, kinds['data']['stored_blocks'])
        for k in ('partition-table', 'superblock', 'group-header',
                  'allocation', 'inode-table', 'journal', 'directory',
                  'free', 'unknown'):
            self.assertIn(k, kinds)
        self.assertTrue(kinds['journal']['metadata'])
        self.assertFalse(kinds['free']['metadata'])
        self.assertEqual(2, lay['files'])
        self.assertEqual({'path': '/usr/bin/tool', 'blocks': 768},
                         lay['largest_files'][0])
        text = self.manage('image', 'show', A).stdout
        self.assertIn('all metadata', text)
        self.assertIn('/usr/bin/tool', text)
        # no file system: every block unknown, said so, not an error
        info = json.loads(self.manage('image', 'show', B, '--json').stdout)
        self.assertEqual(['unknown'], list(info['layout']['kinds']))
        self.assertFalse(info['layout']['volumes'][0]['classified'])
        err = self.manage('image', 'show', B.replace('b', 'c'),
                          ok=False).stderr
        self.assertIn('is not in the library', err)

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
        reports.record('h2', [], {A: None, B: None},
                       peer_address='10.0.0.2:10810', load_per_cpu=0.25,
                       complete=[B])
        # serves B, holds nothing yet: it will hold all B reads
        reports.record('h3', [(B, 1)], {})
        hosts = json.loads(self.manage('hosts', 'list', '--json').stdout)
        self.assertEqual([[[A, None]], [[A, None], [B, None]], []],
                         [h['holds'] for h in hosts])
        self.assertEqual([None, '10.0.0.2:10810', None],
                         [h['peer'] for h in hosts])
        self.assertEqual([[], [B], []], [h['complete'] for h in hosts])
        table = self.manage('hosts', 'list').stdout.splitlines()
        self.assertEqual([B, '10.0.0.2:10810', '0.25'],
                         table[2].split()[-3:])
        rows = [ln.split() for ln in self.manage(
            'hosts', 'shares', B).stdout.splitlines()]
        self.assertIn(['h2', '1.000'], rows)
        self.assertIn(['h3', '1.000'], rows)
        self.assertIn(['h1', '0.667'], rows)
        self.assertLess(rows.index(['h2', '1.000']),
                        rows.index(['h1', '0.667']))

    def test_a_delete_leaves_maps_pending(self):
        self.conf_file = self.write_conf_file(
            vmar_extra='rewrite_at_once = 0\n',
            connection='sqlite:///%s/cli.sqlite' % self.tmp)
        self.manage('db', 'sync')
        self.manage('image', 'add', '--id', A, '--visibility', 'public',
                    self.image('a.raw', range(1, 9)))
        self.manage('image', 'add', '--id', B, '--owner', 'p1',
                    self.image('b.raw', list(range(1, 9)) + [70]))
        out = self.manage('image', 'delete', A).stdout
        self.assertIn('1 more maps left for vmar-agent to rewrite', out)
        pending = self.manage('map', 'pending').stdout.splitlines()
        self.assertEqual(1, len(pending))
        self.assertTrue(pending[0].startswith(B), pending)
        self.assertIn('after a change of %s' % A, pending[0])
        # a warning, not a problem: the library is consistent
        out = self.manage('check').stdout
        self.assertIn('waits for vmar-agent to rewrite it', out)
        self.assertIn('library consistent', out)

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


class TestCompact(base.LibraryTestCase):
    """``vmar-manage db compact`` before a downgrade past revision 0025."""

    def manage(self, *args):
        return subprocess.run(
            [sys.executable, '-m', 'vmar_openstack.cmd.manage',
             '--config-file', self.write_conf_file()] + list(args),
            capture_output=True, text=True)

    def test_the_downgrade_waits_for_a_compaction(self):
        # an add whose writer stopped before its compaction: a run is left
        self.lib._compact_after_change = lambda: None
        self.lib.add(A, self.image('a.raw', range(1, 40)))
        proc = self.manage('db', 'downgrade', '0024')
        self.assertEqual(1, proc.returncode, proc.stdout)
        self.assertIn('vmar-manage db compact', proc.stderr)
        proc = self.manage('db', 'version')
        self.assertEqual('0025', proc.stdout.strip())
        proc = self.manage('db', 'compact')
        self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
        self.assertIn('fingerprint index compacted', proc.stdout)
        for args in (('db', 'downgrade', '0024'), ('db', 'sync'),
                     ('check',)):
            proc = self.manage(*args)
            self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
        self.assertIn('library consistent', proc.stdout)
