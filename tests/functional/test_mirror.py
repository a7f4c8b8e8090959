"""The vmar-mirror driver on the real thing.

The patched ``qemu-storage-daemon`` serves a mirror node over NBD; stock
``qemu-img`` and ``qemu-io`` (Debian's) read it. The source the mirror
fetches from is a local file here, or a copy of it with a flipped bit;
what the daemon knows is read back over QMP and from the present file.
"""

import hashlib
import json
import os
import signal
import subprocess
import time
import uuid

import fixtures
import numpy as np
import testtools

from tests import base
from tools.vmarenv import qemu_env
from vmar_openstack import fingerprint
from vmar_openstack.host.exports import qmp
from vmar_openstack.mapformat import mirror

BS = 4096
N_BLOCKS = 2048                 # 8 MiB
SIZE = N_BLOCKS * BS + 1000     # and a partial last block


def _make_base(path, seed=7):
    """Random blocks, every fourth run of 16 blocks zero; a partial tail."""
    rng = np.random.default_rng(seed)
    data = bytearray(rng.integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    for run in range(0, N_BLOCKS, 64):
        data[run * BS:(run + 16) * BS] = bytes(16 * BS)
    with open(path, 'wb') as f:
        f.write(data)
    return bytes(data)


def _data_blocks(data):
    n = -(-len(data) // BS)
    return [b for b in range(n) if any(data[b * BS:(b + 1) * BS])]


class MirrorTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.prefix = qemu_env.qemu_prefix()
        self.sock_dir = base.socket_dir(self, 'mirror-')
        self.image_id = str(uuid.uuid4())
        self.base = os.path.join(self.tmp, 'base.raw')
        self.data = _make_base(self.base)
        self.digests = os.path.join(self.tmp, 'base.digests')
        fps = fingerprint.hash_file(self.base, SIZE)
        with open(self.digests, 'wb') as f:
            f.write(mirror.digests_bytes(self.image_id, fps))
        self.hdr, self.rows = mirror.read_digests(self.digests)
        self.mirror = os.path.join(self.tmp, 'mirror')
        self.present = self.mirror + '.present'
        with open(self.mirror, 'wb') as f:
            f.truncate(SIZE)
        mirror.create_present(self.present, self.hdr)

    def node(self, source=None, readahead=None, **extra):
        opts = {'driver': 'vmar-mirror', 'node-name': 'm0',
                'digests': self.digests, 'present': self.present,
                'file': {'driver': 'file', 'filename': self.mirror},
                'fetch': {'driver': 'file', 'read-only': True,
                          'filename': source or self.base}}
        if readahead is not None:
            opts['readahead'] = readahead
        opts.update(extra)
        return opts

    def start(self, node):
        """A daemon serving ``node`` as NBD export ``m``; its QMP socket."""
        nbd = os.path.join(self.sock_dir, 'nbd.sock')
        mon = os.path.join(self.sock_dir, 'qmp.sock')
        for p in (nbd, mon):
            if os.path.exists(p):
                os.unlink(p)
        log = open(os.path.join(self.tmp, 'qsd.log'), 'ab')
        self.addCleanup(log.close)
        proc = subprocess.Popen(
            [qemu_env.qemu_bin('qemu-storage-daemon'),
             '--chardev', 'socket,id=c0,path=%s,server=on,wait=off' % mon,
             '--monitor', 'chardev=c0',
             '--blockdev', json.dumps(node),
             '--nbd-server', 'addr.type=unix,addr.path=%s' % nbd,
             '--export', 'type=nbd,id=e0,node-name=m0,name=m,writable=off'],
            stdout=log, stderr=log)
        self.addCleanup(self._kill, proc)
        deadline = time.monotonic() + 30
        while not os.path.exists(nbd):
            self.assertIsNone(proc.poll(), self.log())
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.02)
        self.proc, self.qmp_sock = proc, mon
        self.uri = 'nbd+unix:///m?socket=%s' % nbd
        return proc

    @staticmethod
    def _kill(proc):
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(0, self.proc.wait(timeout=30), self.log())

    def log(self):
        with open(os.path.join(self.tmp, 'qsd.log'), 'rb') as f:
            return f.read().decode(errors='replace')

    def counters(self):
        with qmp.Monitor(self.qmp_sock) as mon:
            for n in mon.execute('query-named-block-nodes', {'flat': True}):
                if n['node-name'] == 'm0':
                    return n['image']['format-specific']['data']
        self.fail('no node m0')

    def read(self, offset, length):
        """qemu-io (Debian's) reads a range over NBD; (rc, output)."""
        proc = subprocess.run(
            ['qemu-io', '-r', '-f', 'raw', '-c',
             'read %d %d' % (offset, length), self.uri],
            capture_output=True, text=True)
        ok = proc.returncode == 0 and 'error' not in proc.stdout.lower()
        return ok, proc.stdout + proc.stderr

    def compare(self):
        """Stock qemu-img compares the whole export with the base."""
        return subprocess.run(['qemu-img', 'compare', '-f', 'raw', '-F',
                               'raw', self.uri, self.base],
                              capture_output=True, text=True)

    def present_blocks(self):
        _hdr, bits = mirror.read_present(self.present)
        return set(np.flatnonzero(bits).tolist())

    def assert_present_blocks_are_good(self):
        """The invariant: every block marked present is in the file."""
        with open(self.mirror, 'rb') as f:
            held = f.read()
        for b in sorted(self.present_blocks()):
            blk = held[b * BS:(b + 1) * BS].ljust(BS, b'\0')
            want = self.rows[b]
            if not want.any():
                self.assertEqual(bytes(BS), blk, 'zero block %d' % b)
            else:
                self.assertEqual(want.tobytes(),
                                 hashlib.sha256(blk).digest(),
                                 'block %d marked present' % b)


class TestMirror(MirrorTestCase):

    def test_whole_read_fetches_each_data_block_once(self):
        self.start(self.node())
        self.assertEqual(0, self.compare().returncode)
        # a second reader finds everything in the mirror
        self.assertEqual(0, self.compare().returncode)
        c = self.counters()
        data = _data_blocks(self.data)
        tail = SIZE % BS
        self.assertEqual((len(data) - 1) * BS + tail, c['bytes-fetched'])
        self.assertEqual(N_BLOCKS + 1, c['present-blocks'])
        self.assertEqual(0, c['digest-mismatches'] + c['fetch-errors'])
        self.stop()
        self.assertEqual(set(data), self.present_blocks())
        self.assert_present_blocks_are_good()
        with open(self.mirror, 'rb') as f:
            self.assertEqual(self.data, f.read())

    def test_read_fetches_the_range_and_its_readahead(self):
        self.start(self.node(readahead=8 * BS))
        ok, out = self.read(20 * BS, 2 * BS)   # blocks 20, 21
        self.assertTrue(ok, out)
        c = self.counters()
        self.assertEqual(1, c['fetches'])
        # the two blocks and the 8 missing blocks after them
        self.assertEqual(10 * BS, c['bytes-fetched'])
        # inside the read-ahead: no fetch
        ok, out = self.read(25 * BS, BS)
        self.assertTrue(ok, out)
        self.assertEqual(1, self.counters()['fetches'])
        # zero blocks are never fetched
        ok, out = self.read(64 * BS, 16 * BS)
        self.assertTrue(ok, out)
        self.assertEqual(1, self.counters()['fetches'])
        self.stop()
        self.assertEqual(set(range(20, 30)), self.present_blocks())

    def test_zero_blocks_are_reported_as_zeros(self):
        self.start(self.node())
        out = subprocess.run(['qemu-img', 'map', '--output=json', '-f',
                              'raw', self.uri], capture_output=True,
                             text=True, check=True).stdout
        zero = set()
        for e in json.loads(out):
            if e['zero']:
                zero.update(range(e['start'] // BS,
                                  (e['start'] + e['length']) // BS))
        want = {b for b in range(N_BLOCKS)
                if not any(self.data[b * BS:(b + 1) * BS])}
        self.assertEqual(want, zero)
        # answered from the digest list: nothing was fetched
        self.assertEqual(0, self.counters()['fetches'])

    def test_restart_keeps_what_was_fetched(self):
        self.start(self.node(readahead=0))
        self.assertTrue(self.read(16 * BS, 32 * BS)[0])
        self.stop()
        self.start(self.node(readahead=0))
        self.assertTrue(self.read(16 * BS, 32 * BS)[0])
        self.assertEqual(0, self.counters()['fetches'])
        self.assertEqual(0, self.compare().returncode)

    def test_corrupt_block_is_never_served(self):
        bad = os.path.join(self.tmp, 'bad.raw')
        flipped = bytearray(self.data)
        flipped[100 * BS + 17] ^= 0x04
        with open(bad, 'wb') as f:
            f.write(flipped)
        self.start(self.node(source=bad, readahead=0))
        ok, out = self.read(99 * BS, 3 * BS)
        self.assertFalse(ok, out)
        self.assertIn('Input/output error', out)
        c = self.counters()
        self.assertEqual(1, c['digest-mismatches'])
        self.assertIn('block 100 (byte %d) fetched with digest' % (100 * BS),
                      self.log())
        # blocks around it read fine, one at a time
        self.assertTrue(self.read(99 * BS, BS)[0])
        self.assertTrue(self.read(101 * BS, BS)[0])
        # the store is repaired: the same read now works
        with open(bad, 'r+b') as f:
            f.seek(100 * BS + 17)
            f.write(bytes([self.data[100 * BS + 17]]))
        ok, out = self.read(99 * BS, 3 * BS)
        self.assertTrue(ok, out)
        self.stop()
        self.assertEqual({99, 100, 101}, self.present_blocks())
        self.assert_present_blocks_are_good()

    def test_killed_daemon_leaves_no_bad_present_block(self):
        self.start(self.node(readahead=64 * BS))
        self.assertEqual(0, self.compare().returncode)
        self.proc.kill()
        self.proc.wait()
        # whatever got recorded before the kill is good
        self.assert_present_blocks_are_good()
        self.start(self.node())
        self.assertEqual(0, self.compare().returncode)
        self.stop()
        self.assertEqual(set(_data_blocks(self.data)), self.present_blocks())
        self.assert_present_blocks_are_good()

    def test_concurrent_readers_fetch_once(self):
        self.start(self.node(readahead=16 * BS))
        procs = [subprocess.Popen(['qemu-img', 'compare', '-f', 'raw', '-F',
                                   'raw', self.uri, self.base],
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
                 for _i in range(4)]
        self.assertEqual([0] * 4, [p.wait(timeout=120) for p in procs])
        data = _data_blocks(self.data)
        self.assertEqual((len(data) - 1) * BS + SIZE % BS,
                         self.counters()['bytes-fetched'])

    def test_failed_fetch_fails_the_read_then_recovers(self):
        gone = os.path.join(self.tmp, 'source.raw')
        os.link(self.base, gone)
        self.start(self.node(source=gone, readahead=0))
        # the source file shrinks under the daemon: reads past it fail
        with open(gone, 'r+b') as f:
            f.truncate(4 * BS)
        ok, out = self.read(40 * BS, BS)
        self.assertFalse(ok, out)
        self.assertNotIn(40, self.present_blocks())
        with open(gone, 'r+b') as f:
            f.write(self.data)
        self.assertTrue(self.read(40 * BS, BS)[0])


class TestMirrorRefusals(MirrorTestCase):

    def add(self, node):
        """qemu-img info on a json: node; (rc, output)."""
        proc = subprocess.run(
            [qemu_env.qemu_bin('qemu-io'), '-c', 'read 0 512',
             'json:' + json.dumps(node)], capture_output=True, text=True)
        return proc.returncode, proc.stdout + proc.stderr

    def test_digest_list_of_the_wrong_length(self):
        with open(self.digests, 'ab') as f:
            f.write(b'x')
        rc, out = self.add(self.node())
        self.assertNotEqual(0, rc)
        self.assertIn('is not %d bytes long' % (mirror.DIGESTS_HEADER_SIZE
                                                + (N_BLOCKS + 1) * 32), out)

    def test_present_file_of_another_base(self):
        other = mirror.Header(str(uuid.uuid4()), SIZE, BS)
        mirror.create_present(self.present, other)
        rc, out = self.add(self.node())
        self.assertNotEqual(0, rc)
        self.assertIn('does not describe the base of its digest list', out)

    def test_not_a_digest_list(self):
        rc, out = self.add(self.node(digests=self.base))
        self.assertNotEqual(0, rc)
        self.assertIn('is not a VMARDGST file', out)

    def test_source_of_another_size(self):
        short = os.path.join(self.tmp, 'short.raw')
        with open(short, 'wb') as f:
            f.write(self.data[:SIZE - BS])
        rc, out = self.add(self.node(source=short))
        self.assertNotEqual(0, rc)
        self.assertIn('its source is', out)

    def test_read_only_node(self):
        node = self.node()
        node['read-only'] = True
        rc, out = self.add(node)
        self.assertNotEqual(0, rc)
        self.assertIn('open them read-write', out)
