"""Glance integration on the real thing.

RabbitMQ, glance-api (glance 33 under uWSGI, SQLite, file store, no
Keystone, messagingv2 notifications, the ``vmar_mapgen`` import plugin
enabled) and ``vmar-agent`` are started by the test; images are created
with the real ``openstack`` CLI.
"""

from concurrent import futures
import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import fixtures
from glanceclient import exc as glance_exc
from oslo_config import cfg
import oslo_messaging
from prometheus_client import parser as prom_parser
import testtools

from tests import base
from tests.functional.test_guest import GUEST_XML
from tools.vmarenv import glance_env
from tools.vmarenv import pki
from tools.vmarenv import process
from tools.vmarenv import proxy_env
from tools.vmarenv import qemu_env
from tools.vmarenv import rabbitmq_env
from tools.vmarenv import services
from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import api as db_api
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import migration
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack.exception import SourceError
from vmar_openstack.host.exports import graph
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.exports import qmp
from vmar_openstack.host.peers import source as peer_source
from vmar_openstack import ingest
from vmar_openstack.ingest import check as check_mod
from vmar_openstack import mapformat
from vmar_openstack.mapformat import bootset
from vmar_openstack.mapformat import delta as delta_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.mapsource import glance as gsource
from vmar_openstack.mapsource import readers
from vmar_openstack import names
from vmar_openstack.nova_imagebackend import delta as nova_delta


def _sha(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def _fetched(fetch, image_id, dest):
    """Whether ``fetch(image_id, dest)`` found it."""
    try:
        fetch(image_id, dest)
    except SourceError:
        return False
    return True


def _contents(path, blocks):
    """Distinct non-zero 4 KiB blocks among ``blocks`` of an image file.

    What fetching them fills: each canonical block once.
    """
    seen = set()
    with open(path, 'rb') as f:
        for b in blocks:
            f.seek(b * 4096)
            data = f.read(4096)
            if data.strip(b'\0'):
                seen.add(hashlib.sha256(data).digest())
    return len(seen)


def _data_bytes(path):
    """Bytes of ``path`` that are data, not holes (SEEK_DATA/SEEK_HOLE).

    Not ``st_blocks``: that counts the file's own extent-tree blocks too,
    which a sparse file of more than four extents has.
    """
    out, pos = 0, 0
    with open(path, 'rb') as f:
        fd = f.fileno()
        while True:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:         # ENXIO: no data past pos
                return out
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            out += pos - start


def _held(host):
    """Bytes the mirrors of a host hold."""
    d = os.path.join(host, 'mirrors')
    return sum(_data_bytes(os.path.join(d, n))
               for n in os.listdir(d) if '.' not in n)


def scrape(port):
    """The samples of a Prometheus endpoint: (name, labels) -> value."""
    with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port,
                                timeout=30) as r:
        text = r.read().decode()
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in prom_parser.text_string_to_metric_families(text)
            for x in fam.samples}


class GlanceTestCase(testtools.TestCase):
    """One RabbitMQ, glance-api and vmar-agent for the whole class."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.work = tempfile.mkdtemp(prefix='vmar-glance-')
        try:
            cls._start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start(cls):
        cls.rabbit = rabbitmq_env.RabbitMQ(os.path.join(cls.work, 'rabbit'))
        cls.rabbit.start()
        cls.state = os.path.join(cls.work, 'vmar')
        os.makedirs(cls.state)
        db = cls.database_url()
        vmar_sections = {
            'vmar': dict({'state_dir': cls.state, 'hash_workers': '2'},
                         **cls.library_options()),
            'vmar_database': {'connection': db}}
        # Glance on MariaDB, as deployed: on SQLite, concurrent writes (the
        # import task's and a map upload) fail with "database is locked"
        # and leave images stuck in 'saving'
        cls.glance = glance_env.GlanceAPI(
            os.path.join(cls.work, 'glance'), cls.rabbit.transport_url,
            import_plugins=['vmar_mapgen'], import_config=vmar_sections,
            extra_config=glance_env.merge_sections(
                {'database': {'connection': cls.mariadb('glance')}},
                cls.store_config()),
            python_path=cls.store_python_path())
        cls.glance.start()
        cls.conf_file = os.path.join(cls.work, 'vmar.conf')
        glance_env.write_conf(cls.conf_file, dict(vmar_sections, **{
            'DEFAULT': {'transport_url': cls.rabbit.transport_url,
                        'debug': 'true'},
            'vmar_glance': {'auth_type': 'none',
                            'endpoint': cls.glance.endpoint,
                            'endpoint_override': cls.glance.endpoint},
            'vmar_agent': {'retry_delay': '0.2', 'max_attempts': '3',
                           'resync_interval': '5'}}))
        cls.conf = cfg.ConfigOpts()
        vmar_conf.register_opts(cls.conf)
        cls.conf(['--config-file', cls.conf_file], project='vmar')
        migration.upgrade('head', conf=cls.conf)
        cls.agent = None
        cls.start_agent()

    @classmethod
    def library_options(cls):
        """More [vmar] options of the library's users."""
        return {}

    @classmethod
    def store_config(cls):
        """glance-api.conf sections of the store (default: file)."""
        return {}

    @classmethod
    def store_python_path(cls):
        """Directories glance-api's store needs on its PYTHONPATH."""
        return ()

    def host_config(self):
        """Sections of a lazy host's configuration besides [vmar_host]."""
        return {}

    @classmethod
    def database_url(cls):
        return 'sqlite:///%s/vmar.sqlite' % cls.state

    @staticmethod
    def mariadb(suffix):
        """A new, empty MariaDB database of the test user."""
        return services.mariadb_database(suffix)

    @classmethod
    def start_agent(cls, *extra_conf):
        log = open(os.path.join(cls.work, 'agent.log'), 'ab')
        args = ['--config-file', cls.conf_file]
        for c in extra_conf:
            args += ['--config-file', c]
        cls.agent = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), 'vmar-agent')]
            + args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    @classmethod
    def stop_agent(cls, sig=signal.SIGTERM, agent=None):
        agent = agent or cls.agent
        if agent and agent.poll() is None:
            agent.send_signal(sig)
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()

    @classmethod
    def tearDownClass(cls):
        for extra in getattr(cls, 'extra_agents', ()):
            cls.stop_agent(agent=extra)
        for stop in (lambda: cls.stop_agent(),
                     lambda: cls.glance.stop(), lambda: cls.rabbit.stop()):
            try:
                stop()
            except Exception:
                pass
        shutil.rmtree(cls.work, ignore_errors=True)
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        # the tests of a class share one library: each test's seeds are its
        # own, so no test finds its blocks already canonical in another's
        # image (a test that ran before would change its maps)
        self.salt = uuid.uuid4().int % 10 ** 6 * 10 ** 6
        self.source = gsource.GlanceSource(self.conf)
        self.client = self.glance.glanceclient()

    def wait_until(self, predicate, what, timeout=60):
        deadline = time.time() + timeout
        while not predicate():
            self.assertLess(time.time(), deadline, '%s\n%s' % (
                what, self.agent_log()))
            time.sleep(0.3)

    def wait_listening(self, started_before):
        """Wait for the agent started after ``started_before`` listens.

        ``started_before``: the agent log's count of "vmar-agent
        listening" before the start. Glance drops a notification that no
        queue is bound for, so an agent that had not declared its queue
        yet (the class's first one, stopped at once by a test that runs
        alone) would never see the uploads made meanwhile.
        """
        self.wait_until(
            lambda: self.agent_log(full=True).count(
                'vmar-agent listening') > started_before,
            'vmar-agent to listen')

    def agent_log(self, full=False):
        with open(os.path.join(self.work, 'agent.log'), errors='replace') as f:
            text = f.read()
        return text if full else text[-20000:]

    def image(self, name, seeds):
        return base.write_image(
            os.path.join(self.tmp, name),
            [None if s is None else s + self.salt for s in seeds])

    def create(self, path, fmt='raw', visibility=None):
        """A new image of the file ``path``, once it is active.

        Through Glance's API, as ``openstack image create --file`` does it
        (create, then upload the data); :meth:`create_cli` runs the
        command itself, for the tests of what a user types (each command
        a new client process: about 1.5 s of CPU here).
        """
        kw = {'visibility': visibility} if visibility else {}
        img = self.client.images.create(
            name='vmar-test-%s' % uuid.uuid4().hex[:6], disk_format=fmt,
            container_format='bare', **kw)
        # the size in a header, as the command's Content-Length gives it:
        # the store learns it before the data (Ceph's sizes its image)
        with open(path, 'rb') as f:
            self.client.images.upload(img['id'], f,
                                      image_size=os.path.getsize(path))
        self.wait_status(img['id'], 'active')
        return img['id']

    def create_cli(self, path, *extra, fmt='raw'):
        """:meth:`create` with ``openstack image create --file``."""
        out = self.glance.openstack(
            'image', 'create', '--file', path, '--disk-format', fmt,
            '--container-format', 'bare', '-f', 'value', '-c', 'id',
            *extra, 'vmar-test-%s' % uuid.uuid4().hex[:6])
        image_id = out.stdout.strip().splitlines()[-1]
        uuid.UUID(image_id)
        self.wait_status(image_id, 'active')
        return image_id

    def delete(self, image_id):
        """Delete an image through Glance's API."""
        self.client.images.delete(image_id)

    def wait_status(self, image_id, status, timeout=120):
        deadline = time.time() + timeout
        while True:
            img = self.client.images.get(image_id)
            if img['status'] == status:
                return img
            self.assertNotEqual('killed', img['status'])
            self.assertLess(time.time(), deadline, img)
            time.sleep(0.2)

    def wait_handled(self, event_type, image_id, count=1, timeout=120,
                     outcome='done'):
        """Until the agent is through ``count`` ``event_type`` of an image.

        ``outcome``: a regular expression of how each ended (its debug
        log's "done", or how a failure was logged). The agent handles
        notifications on several threads: a later image's map says
        nothing of an earlier event; its log does.
        """
        pattern = re.compile(r'%s for %s (%s)' % (
            re.escape(event_type), re.escape(image_id), outcome))
        deadline = time.time() + timeout
        while len(pattern.findall(self.agent_log(full=True))) < count:
            self.assertLess(time.time(), deadline,
                            'the agent never went through %d %s of %s'
                            % (count, event_type, image_id))
            time.sleep(0.2)

    def wait_map(self, image_id, newer_than=0, timeout=120):
        deadline = time.time() + timeout
        while True:
            try:
                v = self.source.current_version(image_id)
                if v > newer_than:
                    return v
            except SourceError:
                pass
            if time.time() > deadline:
                # every agent's threads, for the record
                for a in [self.agent] + getattr(self, 'extra_agents', []):
                    if a.poll() is None:
                        a.send_signal(signal.SIGUSR1)
                time.sleep(1)
            self.assertLess(time.time(), deadline, self.agent_log())
            time.sleep(0.2)

    def wait_digests(self, image_id, timeout=120):
        did = names.digests_image_id(image_id)
        deadline = time.time() + timeout
        while True:
            try:
                if self.client.images.get(did)['status'] == 'active':
                    return did
            except glance_exc.HTTPNotFound:
                pass
            self.assertLess(time.time(), deadline, self.agent_log())
            time.sleep(0.2)

    def start_serve(self, cmd, log_path, host_dir):
        """``cmd + ['serve']``, stopped at cleanup with its daemon."""
        with open(log_path, 'ab') as log:
            proc = subprocess.Popen(cmd + ['serve'], stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL,
                                    start_new_session=True)

        def stop():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            # a daemon the supervisor could not stop (none if it quit)
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(host_dir, 'qsd.pid')) as f:
                    os.kill(int(f.read()), signal.SIGKILL)
        self.addCleanup(stop)
        return proc

    def lazy_host(self, report=False, name='host', sections=None,
                  **vmar_opts):
        """``vmar-export serve`` of a lazy host reading Glance via a proxy.

        Returns the host dir, the vmar-export command and the proxy (a
        Glance outage when stopped); ``self.lazy_serve()`` starts another
        ``serve`` of the same host (after a "reboot"). ``report``: the host
        reports to the agent through RabbitMQ every second. ``name``: of
        the host (its directory), for tests of several; ``sections``: more
        sections of its configuration.
        """
        first = name == 'host'
        proxy = proxy_env.TcpProxy(
            '127.0.0.1', self.glance.endpoint.rsplit(':', 1)[1],
            work_dir=os.path.join(self.tmp, 'proxy' if first
                                  else name + '-proxy'))
        os.makedirs(proxy.work_dir)
        self.addCleanup(proxy.stop)
        proxy.start()
        host = os.path.join(self.tmp, name)
        sock_dir = tempfile.mkdtemp(prefix='vmar-lazy-', dir='/run')
        os.chmod(sock_dir, 0o755)       # QEMU of libvirt connects
        self.addCleanup(shutil.rmtree, sock_dir, True)
        sock = os.path.join(sock_dir, 'nbd.sock')
        conf_file = os.path.join(self.tmp, name + '.conf')
        notify = ({'transport_url': self.rabbit.transport_url}
                  if report else {})
        glance_env.write_conf(conf_file, {
            'DEFAULT': {'debug': 'true', **notify},
            'vmar_host': {'host_dir': host, 'map_source': 'glance',
                          'report_interval': '1' if report else '0',
                          'base_fetch': 'lazy', 'mirror_readahead': '0',
                          'fetch_retries': '1', 'export_socket': sock,
                          'qemu_storage_daemon': qemu_env.qemu_bin(
                              'qemu-storage-daemon'), **vmar_opts},
            'vmar_glance': {'auth_type': 'none', 'endpoint': proxy.url,
                            'endpoint_override': proxy.url},
            **self.host_config(), **(sections or {})})
        cmd = [sys.executable, '-m', 'vmar_openstack.cmd.export',
               '--config-file', conf_file]
        self.lazy_conf_file = conf_file

        def serve():
            proc = self.start_serve(
                cmd, os.path.join(self.tmp, 'serve.log' if first
                                  else name + '-serve.log'), host)
            deadline = time.time() + 60
            while not os.path.exists(sock):
                self.assertIsNone(proc.poll(), self.serve_log())
                self.assertLess(time.time(), deadline, self.serve_log())
                time.sleep(0.1)
            return proc
        self.lazy_serve = serve
        self.lazy_proc = serve()
        return host, cmd, proxy

    def publish_pair(self, a, b, fmt='raw'):
        """Upload a, then b (a holds what they share); wait for both.

        Returns a's id, b's id and b's map version.
        """
        ia = self.create(a)
        self.wait_map(ia)
        ib = self.create(b, fmt=fmt)
        vb = self.wait_map(ib)
        for i in (ia, ib):
            self.wait_digests(i)
        return ia, ib, vb

    def lazy_add(self, cmd, image_id, version):
        """Add an export on the lazy host; its NBD URI."""
        r = subprocess.run(cmd + ['add', image_id], capture_output=True,
                           text=True)
        self.assertEqual(0, r.returncode, r.stderr + self.serve_log())
        uri = r.stdout.strip().split()[-1]
        self.assertTrue(
            uri.startswith('nbd+unix:///%s.%d.' % (image_id, version)), uri)
        return uri

    @staticmethod
    def qemu_io(uri, command):
        return subprocess.run(
            [qemu_env.SYSTEM_QEMU_IO, '-r', '-f', 'raw', '-c', command, uri],
            capture_output=True, text=True)

    def check_peer_reads(self, cut_store, fmt='raw'):
        """Peer discovery end to end (issue 34, doc/source/admin/peers.rst).

        Host a runs a peer server and reports what its mirror holds; host
        b asks vmar-agent who holds the image (RPC on the bus of the
        reports), is told a, and reads every block from a once
        ``cut_store(b's Glance proxy)`` has cut its way to the store.
        ``fmt``: the image's disk format in Glance (peers hold its raw
        content whatever the store keeps).
        """
        img = self.image('peer.raw', list(range(95001, 95257)) + [None] * 64
                         + list(range(96001, 96065)))
        if fmt == 'raw':
            iid = self.create(img)
        else:
            stored = os.path.join(self.tmp, 'peer.' + fmt)
            subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', fmt,
                            img, stored], check=True)
            iid = self.create(stored, fmt=fmt)
        version = self.wait_map(iid)
        self.wait_digests(iid)
        ca = os.path.join(self.tmp, 'ca')
        pki.make_ca(ca, 'vmar test host CA')
        tls = os.path.join(self.tmp, 'tls')
        pki.make_cert(ca, tls, 'server', '127.0.0.1', san='IP:127.0.0.1')
        pki.make_cert(ca, tls, 'client', 'compute')
        port = process.free_port()
        _a_dir, a_cmd, _a_proxy = self.lazy_host(
            report=True, name='peer-a', host='peer-a', sections={
                'vmar_peers': {'listen_address': '127.0.0.1',
                               'listen_port': str(port), 'tls_dir': tls}})
        self.assert_same(self.lazy_add(a_cmd, iid, version), img)
        # a's report: its mirror holds the image's 320 data blocks
        reports = db_hosts.HostReports(self.conf)
        self.wait_until(
            lambda: [(h.host, h.blocks) for h in reports.holders(iid)]
            == [('peer-a', 320)],
            'a never reported its mirror: %s' % reports.holders(iid))
        b_dir, b_cmd, b_proxy = self.lazy_host(
            report=True, name='peer-b', host='peer-b', sections={
                'vmar_peers': {'discover': 'true', 'tls_dir': tls}})
        uri = self.lazy_add(b_cmd, iid, version)
        # the export's add asked the agent before any read
        with open(os.path.join(b_dir, 'peers', iid + '.json')) as f:
            found = json.load(f)
        self.assertEqual([{'host': 'peer-a', 'peer': '127.0.0.1:%d' % port,
                           'blocks': 320}], found['holders'])
        # and its digest list came from a, checked against the sum the
        # agent published in Glance
        with open(os.path.join(self.tmp, 'peer-b-serve.log')) as f:
            self.assertIn('digest list of %s read from peer 127.0.0.1:%d'
                          % (iid, port), f.read())
        # the store out of b's reach: every block comes from a, each
        # checked against its digest (and counted: all 320 from a)
        layout = hostdir.Layout(b_dir)
        cut_store(b_proxy)
        self.assert_same(uri, img)
        # (the present bits reach the disk after the data)
        self.wait_until(lambda: layout.holdings()[iid] == 320,
                        'b\'s mirror holds %d blocks'
                        % layout.holdings()[iid])
        # what b's operator sees (the counts are written once a second)
        self.wait_until(lambda: peer_source.read_counts(
            layout.peer_counts_file())['peer_bytes'] == 320 * 4096,
            'b counted %s' % peer_source.read_counts(
                layout.peer_counts_file()))
        st = subprocess.run(b_cmd + ['status'], capture_output=True,
                            text=True, check=True).stdout
        self.assertIn('%s  held by peer-a' % iid, st)
        self.assertIn('bad blocks 0', st)
        # b holds it all now, but serves no peer: nobody is sent to it
        self.wait_until(
            lambda: dict(next((h.holds for h in reports.list()
                               if h.host == 'peer-b'), ())).get(iid) == 320,
            'b never reported its mirror')
        self.assertEqual(['peer-a'], [h.host for h in reports.holders(iid)])

    def assert_same(self, uri, raw):
        r = subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'compare', '-f', 'raw',
                            '-F', 'raw', uri, raw], capture_output=True,
                           text=True)
        self.assertEqual(0, r.returncode,
                         r.stdout + r.stderr + self.serve_log())

    def serve_log(self):
        """The logs of the lazy hosts (see lazy_host)."""
        logs = glob.glob(os.path.join(self.tmp, '*serve.log'))
        for host in sorted(glob.glob(os.path.join(self.tmp, '*.conf'))):
            for log in ('qsd.log', 'fetch.log', 'peer-fetch.log',
                        'peers.log'):
                logs.append(os.path.join(host[:-len('.conf')], log))
        return process.log_tail([p for p in logs if os.path.exists(p)])

    def rebuild(self, image_id, version, out):
        """The image, read through its published map and Glance bases."""
        d = os.path.join(self.tmp, 'host-%s-%d' % (image_id, version))
        os.makedirs(d)
        mpath = os.path.join(d, 'map')
        self.source.fetch_map(image_id, version, mpath)
        bmap = mapformat.read(mpath)
        for t in bmap.targets:
            self.source.fetch_base(t.image_id, os.path.join(d, t.image_id))
        with open(out, 'wb') as f:
            mapformat.reconstruct(bmap, lambda t: os.path.join(d, t), f)
        return bmap

    def assert_consistent(self):
        problems, _warnings = check_mod.check(self.conf)
        self.assertEqual([], problems)

    def library_image(self, image_id):
        """The library's record of an image (detached), or None."""
        with db_session.reader(self.conf) as s:
            img = db_api.get_image(s, image_id)
            if img is not None:
                s.expunge(img)
            return img

    def library_count(self):
        with db_session.reader(self.conf) as s:
            return len(db_api.list_images(s))


class TestGlance(GlanceTestCase):

    def test_create_file_leads_to_a_fetchable_map(self):
        raw = self.image('a.raw', list(range(1, 1025)) + [None] * 64)
        image_id = self.create_cli(raw)
        v = self.wait_map(image_id)
        out = os.path.join(self.tmp, 'out.raw')
        self.rebuild(image_id, v, out)
        self.assertEqual(_sha(raw), _sha(out))
        # the map image is hidden from ordinary listings
        listed = self.glance.openstack('image', 'list', '-f', 'value',
                                       '-c', 'ID').stdout.split()
        self.assertIn(image_id, listed)
        self.assertNotIn(names.map_image_id(image_id, v), listed)
        self.assert_consistent()

    def test_lazy_host_reads_ranges_of_glance_images(self):
        # b's first 2 MiB are a's: its map reads them from a's base
        a = self.image('lz-a.raw', list(range(7001, 7513)) + [None] * 256)
        b = self.image('lz-b.raw', list(range(7001, 7513))
                       + list(range(9001, 9513)) + [None] * 128)
        ia, ib, vb = self.publish_pair(a, b)
        host, cmd, proxy = self.lazy_host()
        uri = self.lazy_add(cmd, ib, vb)
        # nothing copied whole: two empty mirrors
        mirrors = os.path.join(host, 'mirrors')
        self.assertFalse(os.listdir(os.path.join(host, 'bases'))
                         if os.path.isdir(os.path.join(host, 'bases'))
                         else [])
        self.assertEqual({ia, ib}, {n for n in os.listdir(mirrors)
                                    if '.' not in n})

        def held():
            return sum(os.stat(os.path.join(mirrors, i)).st_blocks * 512
                       for i in (ia, ib))

        def qemu_io(command):
            return self.qemu_io(uri, command)
        self.assertEqual(0, held())
        # a read fetches its own blocks, no more (read-ahead 0)
        r = qemu_io('read 0 64k')
        self.assertNotIn('failed', r.stdout + r.stderr)
        self.assertEqual(65536, held())
        # Glance unreachable: a read of missing blocks fails, nothing is
        # recorded; back, the same read succeeds
        proxy.stop()
        r = qemu_io('read 3M 64k')
        self.assertIn('Input/output error', r.stdout + r.stderr)
        self.assertEqual(65536, held())
        proxy.start()
        r = qemu_io('read 3M 64k')
        self.assertNotIn('failed', r.stdout + r.stderr, self.serve_log())
        self.assertEqual(2 * 65536, held())
        # the whole image, byte for byte, each data block fetched once
        self.assert_same(uri, b)
        self.assertEqual(1024 * 4096, held())
        r = subprocess.run(cmd + ['remove', ib], capture_output=True,
                           text=True)
        self.assertEqual(0, r.returncode, r.stderr)

    def test_a_hung_store_holds_back_only_its_own_export(self):
        # a and b share nothing: b's export needs nothing from the store
        a = self.image('hs-a.raw', list(range(1, 257)))
        b = self.image('hs-b.raw', list(range(501, 757)))
        ia, ib = self.create(a), self.create(b)
        va, vb = self.wait_map(ia), self.wait_map(ib)
        for i in (ia, ib):
            self.wait_digests(i)
        host, cmd, proxy = self.lazy_host()
        self.lazy_add(cmd, ib, vb)
        # the store takes connections and never answers: a's export waits
        # on its map and digest list
        proxy.pause()
        self.addCleanup(proxy.resume)
        slow = subprocess.Popen(
            cmd + ['add', ia, '--map-version', str(va)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(slow.kill)
        # the event: the daemon holds a's files and asks the store for its
        # map (it has no lock files any more)
        want = 'fetching map v%d of %s' % (va, ia)
        log = os.path.join(self.tmp, 'serve.log')

        def preparing():
            with open(log, errors='replace') as f:
                return want in f.read()
        self.wait_until(preparing, 'a being prepared')
        # meanwhile another server of b starts, and one stops
        for verb in ('add', 'remove'):
            r = subprocess.run(cmd + [verb, ib, '--holder', 'vm2',
                                      '--map-version', str(vb)],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(0, r.returncode, r.stderr + self.serve_log())
        self.assertIsNone(slow.poll())
        proxy.resume()
        out, err = slow.communicate(timeout=120)
        self.assertEqual(0, slow.returncode, err + self.serve_log())
        self.assert_same(out.strip().split()[-1], a)

    def fs_image(self, name):
        """A small ext4 image: boot files, and data nobody boots."""
        root = os.path.join(self.tmp, name + '.root')
        for d in ('usr/lib/systemd', 'usr/lib/x86_64-linux-gnu', 'usr/sbin',
                  'usr/lib64', 'srv'):
            os.makedirs(os.path.join(root, d))
        shutil.copy(shutil.which('true'),
                    os.path.join(root, 'usr/lib/systemd/systemd'))
        os.symlink('/usr/lib/systemd/systemd',
                   os.path.join(root, 'usr/sbin/init'))
        os.symlink('usr/sbin', os.path.join(root, 'sbin'))
        os.symlink('usr/lib64', os.path.join(root, 'lib64'))
        shutil.copy('/lib/x86_64-linux-gnu/libc.so.6',
                    os.path.join(root, 'usr/lib/x86_64-linux-gnu'))
        shutil.copy('/lib64/ld-linux-x86-64.so.2',
                    os.path.join(root, 'usr/lib64'))
        with open(os.path.join(root, 'srv/data'), 'wb') as f:
            f.write(os.urandom(8 << 20))
        path = os.path.join(self.tmp, name)
        subprocess.run(['mke2fs', '-q', '-F', '-t', 'ext4', '-b', '4096',
                        '-d', root, path, '32M'], check=True,
                       capture_output=True)
        return path

    def test_lazy_host_prefetches_the_boot_working_set(self):
        img = self.fs_image('pf.raw')
        i = self.create(img)
        v = self.wait_map(i)
        self.wait_digests(i)
        bpath = os.path.join(self.tmp, 'pf.vboot')
        self.wait_until(lambda: _fetched(self.source.fetch_bootset, i,
                                         bpath), 'the boot working set')
        bset = bootset.read(bpath, i)
        self.assertEqual('introspected', bset.source)
        want = _contents(img, {f + k for f, n in bset.extents
                               for k in range(n)})
        # the boot files, not the 8 MiB nobody boots
        self.assertLess(0, want)
        self.assertLess(want, 1024)
        host, cmd, _proxy = self.lazy_host(prefetch_gap='0')
        uri = self.lazy_add(cmd, i, v)
        queue = os.path.join(host, 'prefetch')
        self.wait_until(lambda: not os.listdir(queue), 'the prefetch')
        # read by nobody yet, the mirrors hold exactly the set's data,
        # each distinct block once (some are canonical in another test's
        # image with the same files)
        self.assertEqual(want * 4096, _held(host), self.serve_log())
        with open(os.path.join(self.tmp, 'serve.log')) as f:
            self.assertIn('prefetched %s.%d' % (i, v), f.read())
        # the prefetch holder is gone; the image reads byte for byte
        r = subprocess.run(cmd + ['list'], capture_output=True, text=True)
        self.assertNotIn('prefetch', r.stdout)
        self.assert_same(uri, img)

    def test_first_boot_is_recorded_and_prefetched_by_the_next_host(self):
        img = self.fs_image('rec.raw')
        i = self.create(img)
        v = self.wait_map(i)
        self.wait_digests(i)
        host, cmd, _proxy = self.lazy_host(
            report=True, prefetch='false', bootset_record_window='3',
            mirror_cache_gb='0', prefetch_gap='0')
        uri = self.lazy_add(cmd, i, v)
        # "the boot": reads of some of the image, then of more after the
        # window closed
        with open(img, 'rb') as f:
            data = f.read()

        def blocks(ranges):
            return {b for off, n in ranges for b in range(off, off + n)
                    if data[b * 4096:(b + 1) * 4096] != bytes(4096)}
        boot = [(0, 16), (1024, 64), (4000, 3)]
        for off, n in boot:
            r = self.qemu_io(uri, 'read %d %d' % (off * 4096, n * 4096))
            self.assertNotIn('failed', r.stdout + r.stderr)
        want = blocks(boot)
        self.assertLess(10, len(want))
        rec = os.path.join(self.tmp, 'rec.vboot')

        def recorded():
            if not _fetched(self.source.fetch_bootset, i, rec):
                return False
            return bootset.read(rec, i).source == 'recorded'
        self.wait_until(recorded, 'the recorded boot working set')
        bset = bootset.read(rec, i)
        self.assertEqual(want, {f + k for f, n in bset.extents
                                for k in range(n)})
        # the window has closed: later reads are not the boot's
        r = self.qemu_io(uri, 'read %d %d' % (2048 * 4096, 256 * 4096))
        self.assertNotIn('failed', r.stdout + r.stderr)
        self.assertLess(want, blocks([(2048, 256)]) | want)
        with qmp.Monitor(os.path.join(host, 'qsd-qmp.sock')) as mon:
            bits = list(graph.recorded(mon).values())
        self.assertEqual(1, len(bits))
        self.assertEqual(want, {b for b in range(len(bits[0]) * 8)
                                if bits[0][b // 8] >> (b % 8) & 1})
        # a cold host (the mirror went with the export) prefetches it
        r = subprocess.run(cmd + ['remove', i], capture_output=True,
                           text=True)
        self.assertEqual(0, r.returncode, r.stderr)
        self.assertEqual([], os.listdir(os.path.join(host, 'mirrors')))
        conf = self.lazy_conf_file
        with open(conf) as f:
            text = f.read()
        with open(conf, 'w') as f:
            f.write(text.replace('prefetch = false', 'prefetch = true'))
        self.lazy_proc.terminate()
        self.lazy_proc.wait(30)
        self.lazy_serve()
        self.lazy_add(cmd, i, v)
        queue = os.path.join(host, 'prefetch')
        self.wait_until(lambda: not os.listdir(queue), 'the prefetch')
        self.assertEqual(_contents(img, want) * 4096, _held(host),
                         self.serve_log())

    def test_lazy_host_after_a_canonical_image_is_deleted(self):
        a = self.image('la-a.raw', list(range(1, 513)) + [None] * 256)
        b = self.image('la-b.raw', list(range(1, 513))
                       + list(range(1001, 1513)) + [None] * 128)
        ia = self.create(a)
        self.wait_map(ia)
        ib = self.create(b)
        v1 = self.wait_map(ib)
        for i in (ia, ib):
            self.wait_digests(i)
        # mirror_cache_gb 0: a mirror goes with its last export
        host, cmd, _proxy = self.lazy_host(mirror_cache_gb='0')
        mirrors = os.path.join(host, 'mirrors')
        uri = self.lazy_add(cmd, ib, v1)

        def held(image_id):
            return os.stat(os.path.join(mirrors, image_id)).st_blocks * 512
        r = self.qemu_io(uri, 'read 0 64k')
        self.assertNotIn('failed', r.stdout + r.stderr, self.serve_log())
        self.assertEqual((65536, 0), (held(ia), held(ib)))
        # a goes, with its data; the agent republishes b's map without it
        self.delete(ia)
        v2 = self.wait_map(ib, newer_than=v1)
        self.assertRaises(glance_exc.HTTPNotFound, self.client.images.get,
                          ia)
        # the export of v1 still reads a's blocks: from b's own data,
        # checked against a's digests
        self.assert_same(uri, b)
        self.assertEqual((512 * 4096, 512 * 4096), (held(ia), held(ib)))
        # a cold host booting b v1 now (before its hosts catch up with v2)
        r = subprocess.run(cmd + ['remove', ib], capture_output=True,
                           text=True)
        self.assertEqual(0, r.returncode, r.stderr)
        self.assertEqual([], os.listdir(mirrors))
        r = subprocess.run(cmd + ['add', ib, '--map-version', str(v1)],
                           capture_output=True, text=True)
        self.assertEqual(0, r.returncode, r.stderr + self.serve_log())
        uri = r.stdout.strip().split()[-1]
        self.assertFalse(os.path.exists(os.path.join(mirrors,
                                                     ia + '.reader')))
        self.assert_same(uri, b)
        self.assertEqual((512 * 4096, 512 * 4096), (held(ia), held(ib)))
        # and v2 reads b alone
        self.assertEqual([ib], [t.image_id for t in self.rebuild(
            ib, v2, os.path.join(self.tmp, 'b2.raw')).targets])

    def test_lazy_host_holds_own_blocks_before_a_delete(self):
        # b (an unshelved snapshot, say) shares its first half with a;
        # Nova deletes it from Glance right after the spawn
        a = self.image('lo-a.raw', list(range(8001, 8513)) + [None] * 256)
        b = self.image('lo-b.raw', list(range(8001, 8513))
                       + list(range(8601, 8729)) + [None] * 128)
        ia, ib, vb = self.publish_pair(a, b)
        host, cmd, _proxy = self.lazy_host()
        mirrors = os.path.join(host, 'mirrors')
        r = subprocess.run(cmd + ['add', ib, '--own-blocks'],
                           capture_output=True, text=True)
        self.assertEqual(0, r.returncode, r.stderr + self.serve_log())
        uri = r.stdout.strip().split()[-1]

        def held(image_id):
            return os.stat(os.path.join(mirrors, image_id)).st_blocks * 512
        # b's own 128 blocks are there, nothing of a, and no whole copy
        self.assertEqual((0, 128 * 4096), (held(ia), held(ib)))
        self.assertFalse(os.path.exists(os.path.join(host, 'bases', ib)))
        self.delete(ib)
        self.assert_same(uri, b)
        self.assertEqual((512 * 4096, 128 * 4096), (held(ia), held(ib)))

    def test_lazy_host_reads_qcow2_images_through_qemus_driver(self):
        a = self.image('lq-a.raw', list(range(7601, 8113)) + [None] * 256)
        b_raw = self.image('lq-b.raw', list(range(7601, 8113))
                           + list(range(9601, 10113)) + [None] * 128)
        b = os.path.join(self.tmp, 'lq-b.qcow2')
        subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'convert', '-f', 'raw',
                        '-O', 'qcow2', b_raw, b], check=True)
        ia, ib, vb = self.publish_pair(a, b, fmt='qcow2')
        host, cmd, proxy = self.lazy_host()
        uri = self.lazy_add(cmd, ib, vb)
        mirrors = os.path.join(host, 'mirrors')
        with open(os.path.join(mirrors, ib + '.reader')) as f:
            reader = json.load(f)
        # QEMU's qcow2 driver over the range server, never a backing file:
        # the host keeps where, and the daemon's node has no backing
        self.assertEqual(('qcow2', 'range-export', ib),
                         (reader['kind'], reader['file']['kind'],
                          reader['file']['export'].split('/')[0]))
        node = graph.reader_options(readers.from_record(reader))
        self.assertEqual(('qcow2', None, 'nbd'), (
            node['driver'], node['backing'], node['file']['driver']))
        with open(os.path.join(mirrors, ia + '.reader')) as f:
            self.assertEqual('range-export', json.load(f)['kind'])

        def held(image_id):
            return os.stat(os.path.join(mirrors, image_id)).st_blocks * 512
        # b's own blocks are in its qcow2; a read of them fills b's mirror
        r = self.qemu_io(uri, 'read 2M 64k')
        self.assertNotIn('failed', r.stdout + r.stderr, self.serve_log())
        self.assertEqual((0, 65536), (held(ia), held(ib)))
        self.assert_same(uri, b_raw)
        self.assertEqual((512 * 4096, 512 * 4096), (held(ia), held(ib)))
        # a daemon restarted while Glance is away: the export of a raw
        # image comes back from its mirror's reader at once; the qcow2
        # export needs its header from Glance (QEMU's driver reads it at
        # open) and comes back by itself once Glance does
        uri_a = self.lazy_add(cmd, ia, self.wait_map(ia))
        proxy.stop()
        with open(os.path.join(host, 'qsd.pid')) as f:
            os.kill(int(f.read()), signal.SIGKILL)

        def served(u, deadline):
            while True:
                r = self.qemu_io(u, 'read 1M 64k')
                if r.returncode == 0 and 'failed' not in r.stdout + r.stderr:
                    return
                self.assertLess(time.time(), deadline,
                                r.stdout + r.stderr + self.serve_log())
                time.sleep(0.5)
        served(uri_a, time.time() + 60)
        r = self.qemu_io(uri, 'read 1M 64k')
        self.assertIn("can't open device", r.stdout + r.stderr)
        proxy.start()
        served(uri, time.time() + 60)
        self.assert_same(uri, b_raw)

    def test_create_import_runs_the_plugin(self):
        raw = self.image('b.raw', list(range(5001, 6025)))
        image_id = self.create_cli(raw, '--import')
        img = self.client.images.get(image_id)
        self.assertEqual('1', img.get('vmar_map_version'), img)
        self.assertEqual('sha256', img.get('vmar_hash_algorithm'))
        self.assertIn('vmar_shared_fraction', img)
        v = self.wait_map(image_id)
        self.assertEqual(1, v)
        out = os.path.join(self.tmp, 'out.raw')
        self.rebuild(image_id, v, out)
        self.assertEqual(_sha(raw), _sha(out))
        # the agent saw it ingested: no second version, once it is done
        # with the image's activation
        self.wait_handled('image.activate', image_id)
        self.assertEqual(1, self.library_image(image_id).map_version)

    # -- snapshots sent as deltas (issue 33) -----------------------------

    def _delta_of(self, parent_id, parent_raw, *writes):
        """The delta of an overlay on ``parent_raw`` after ``writes``.

        Returns (delta path, the whole disk as raw).
        """
        overlay = os.path.join(self.tmp, 'disk-%s.qcow2' % uuid.uuid4().hex)
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b',
                        parent_raw, '-F', 'raw', overlay], check=True)
        cmd = ['qemu-io', '-f', 'qcow2']
        for w in writes:
            cmd += ['-c', w]
        subprocess.run(cmd + [overlay], check=True, capture_output=True)
        digests = os.path.join(self.tmp, 'parent.digests')
        # the agent publishes the map first, then the digest list
        self.wait_digests(parent_id)
        self.source.fetch_digests(parent_id, digests)
        hdr, rows = mirror_format.read_digests(digests)
        header = delta_format.Header(hdr.block_size, hdr.size, parent_id,
                                     hdr.size, 1)
        made = nova_delta.write(overlay, overlay + '.vdelta', header, rows)
        whole = overlay + '.raw'
        subprocess.run(['qemu-img', 'convert', '-f', 'qcow2', '-O', 'raw',
                        overlay, whole], check=True)
        return made.path, whole

    def _import_delta(self, path, fmt='raw'):
        """A new image with the delta staged and imported (glance-direct)."""
        client = self.glance.glanceclient()     # one per thread
        img = client.images.create(
            name='vmar-snap-%s' % uuid.uuid4().hex[:6], disk_format=fmt,
            container_format='bare')
        with open(path, 'rb') as f:
            client.images.stage(img['id'], f)
        client.images.image_import(img['id'], method='glance-direct')
        return img['id']

    def _import_ended(self, image_id, timeout=120):
        deadline = time.time() + timeout
        while True:
            img = self.client.images.get(image_id)
            if img['status'] not in ('uploading', 'importing'):
                return img
            self.assertLess(time.time(), deadline, img)
            time.sleep(0.3)

    def _staged(self, image_id):
        return [n for n in os.listdir(self.glance.staging_dir)
                if n.startswith(image_id)]

    def test_snapshot_delta_becomes_the_whole_image(self):
        parent_raw = self.image('p.raw', list(range(30001, 31025))
                                + [None] * 256)
        parent = self.create(parent_raw, visibility='public')
        self.wait_map(parent)
        delta, whole = self._delta_of(
            parent, parent_raw, 'write -P 0x5a 64k 12k', 'write -z 1M 64k',
            'write -P 0x33 4300k 8k')
        # qcow2, as Nova's snapshots are by default
        child = self._import_delta(delta, fmt='qcow2')
        img = self.wait_status(child, 'active')
        # the whole disk, stored as any image is, and its checksums
        got = os.path.join(self.tmp, 'got.qcow2')
        with open(got, 'wb') as f:
            for chunk in self.client.images.data(child):
                f.write(chunk)
        r = subprocess.run(['qemu-img', 'compare', '-f', 'raw', '-F',
                            'qcow2', whole, got], capture_output=True,
                           text=True)
        self.assertEqual(0, r.returncode, r.stdout + r.stderr)
        self.assertEqual(os.path.getsize(got), img['size'])
        self.assertEqual(os.path.getsize(whole), img['virtual_size'])
        self.assertEqual('%s:%s' % (img['os_hash_algo'],
                                    img['os_hash_value']),
                         img['vmar_stored_hash'])
        self.assertEqual(parent, img['vmar_parent'])
        self.assertEqual(['5', '16'], [img['vmar_delta_blocks'],
                                       img['vmar_delta_zero_blocks']])
        self.assertEqual([], self._staged(child))
        # its library entry came from the parent's: the agent only
        # published its map, which reads the parent's blocks from it
        v = self.wait_map(child)
        self.wait_handled('image.activate', child)
        self.assertNotIn('ingested %s' % child, self.agent_log(full=True))
        bmap = mapformat.read(self._fetched_map(child, v))
        self.assertIn(parent, [t.image_id for t in bmap.targets])
        self.assertIn(child, [t.image_id for t in bmap.targets])
        self.assert_consistent()
        # a raw snapshot: downloaded as it is, and rebuilt through its map
        child = self._import_delta(delta)
        self.wait_status(child, 'active')
        v = self.wait_map(child)
        out = os.path.join(self.tmp, 'rebuilt.raw')
        self.rebuild(child, v, out)
        self.assertEqual(_sha(whole), _sha(out))

    def _fetched_map(self, image_id, version):
        path = os.path.join(self.tmp, 'map-%s' % image_id)
        self.source.fetch_map(image_id, version, path)
        return path

    def test_snapshot_deltas_at_once(self):
        # three servers of one image snapshotted together (seed 004's
        # multisnapshotting): each sends and gets its own delta
        parent_raw = self.image('m.raw', list(range(50001, 51025)))
        parent = self.create(parent_raw, visibility='public')
        self.wait_map(parent)
        made = [self._delta_of(parent, parent_raw,
                               'write -P 0x%02x %dk 8k' % (0x40 + i,
                                                           64 * (i + 1)))
                for i in range(3)]
        with futures.ThreadPoolExecutor(3) as pool:
            children = list(pool.map(self._import_delta,
                                     [d for d, _w in made]))
        for child, (_d, whole) in zip(children, made):
            img = self.wait_status(child, 'active')
            self.assertEqual('2', img['vmar_delta_blocks'])
            got = os.path.join(self.tmp, child)
            with open(got, 'wb') as f:
                for chunk in self.client.images.data(child):
                    f.write(chunk)
            self.assertEqual(_sha(whole), _sha(got))
            self.wait_map(child)
        self.assert_consistent()

    def test_snapshot_delta_refused(self):
        parent_raw = self.image('q.raw', list(range(40001, 41025)))
        parent = self.create(parent_raw, visibility='public')
        self.wait_map(parent)
        delta, _whole = self._delta_of(parent, parent_raw,
                                       'write -P 0x77 128k 4k')
        # a corrupted data block: the import fails, nothing is left
        bad = delta + '.bad'
        shutil.copy(delta, bad)
        with open(bad, 'r+b') as f:
            f.seek(-100, os.SEEK_END)
            f.write(b'corrupt')
        child = self._import_delta(bad)
        img = self._import_ended(child)
        self.assertEqual('queued', img['status'])
        self.assertEqual([], self._staged(child))
        self.assertIsNone(self.library_image(child))
        with open(self.glance.api_log, errors='replace') as f:
            self.assertIn('does not match its digest', f.read())
        self.assertIn(child, self.glance.openstack(
            'image', 'list', '--status', 'queued', '-f', 'value', '-c',
            'ID').stdout)
        # the parent gone meanwhile: the same
        self.delete(parent)
        child = self._import_delta(delta)
        img = self._import_ended(child)
        self.assertEqual('queued', img['status'])
        self.assertEqual([], self._staged(child))
        self.assertIsNone(self.library_image(child))

    def test_snapshot_delta_after_the_parent_map_changed(self):
        # the delta was made on the parent's map v1; before its import the
        # image the parent shared blocks with is deleted, the parent's map
        # becomes v2 and v1 goes: the delta names content, not a map, so
        # the snapshot is still the whole disk
        seeds = list(range(60001, 61025))
        a = self.create(self.image('ca.raw', seeds))
        self.wait_map(a)
        parent_raw = self.image('cp.raw', seeds[:512] + list(
            range(62001, 62513)))
        parent = self.create(parent_raw, visibility='public')
        v1 = self.wait_map(parent)
        delta, whole = self._delta_of(parent, parent_raw,
                                      'write -P 0x21 8k 8k',
                                      'write -P 0x22 3000k 4k')
        self.delete(a)
        self.wait_map(parent, newer_than=v1)
        child = self._import_delta(delta)
        img = self.wait_status(child, 'active')
        self.assertEqual(('1', '3'), (img['vmar_parent_map_version'],
                                      img['vmar_delta_blocks']))
        got = os.path.join(self.tmp, 'got.raw')
        with open(got, 'wb') as f:
            for chunk in self.client.images.data(child):
                f.write(chunk)
        self.assertEqual(_sha(whole), _sha(got))
        v = self.wait_map(child)
        out = os.path.join(self.tmp, 'rebuilt.raw')
        bmap = self.rebuild(child, v, out)
        self.assertNotIn(a, [t.image_id for t in bmap.targets])
        self.assertEqual(_sha(whole), _sha(out))
        self.assert_consistent()

    def test_snapshot_delta_on_a_full_staging_disk(self):
        # the delta fits the staging file system, the whole image does not:
        # the import fails with the reason, and nothing half-built is left
        parent_raw = self.image('f.raw', list(range(70001, 71025)))
        parent = self.create(parent_raw, visibility='public')
        self.wait_map(parent)
        delta, _whole = self._delta_of(parent, parent_raw,
                                       'write -P 0x44 64k 4k')
        staging = self.glance.staging_dir
        self.assertEqual([], os.listdir(staging))
        subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m',
                        'vmar-full', staging], check=True)
        self.addCleanup(subprocess.run, ['umount', staging])
        child = self._import_delta(delta)
        img = self._import_ended(child)
        self.assertEqual('queued', img['status'])
        self.assertEqual([], os.listdir(staging))
        self.assertIsNone(self.library_image(child))
        with open(self.glance.api_log, errors='replace') as f:
            log = f.read()
        self.assertIn('snapshot %s: building the whole image beside the '
                      'staged delta in %s failed: [Errno 28] No space left '
                      'on device' % (child, staging), log)
        # room again: the same delta imports
        subprocess.run(['umount', staging], check=True)
        subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64m',
                        'vmar-room', staging], check=True)
        child = self._import_delta(delta)
        self.wait_status(child, 'active')

    def test_snapshot_delta_import_killed(self):
        # glance-api dies while it builds the whole image: what it wrote is
        # named after the image, so once the operator deletes the stuck
        # image Glance's own staging cleaner removes it at the next start
        parent_raw = self.image('k.raw', list(range(80001, 96385)))
        parent = self.create(parent_raw, visibility='public')
        self.wait_map(parent)
        delta, whole = self._delta_of(parent, parent_raw,
                                      'write -P 0x66 1M 4k')
        staging = self.glance.staging_dir
        child = self._import_delta(delta)
        deadline = time.time() + 60
        while not any(n.startswith(child + '.vmar')
                      for n in os.listdir(staging)):
            self.assertLess(time.time(), deadline, os.listdir(staging))
            time.sleep(0.005)
        self.glance.kill()
        left = os.listdir(staging)
        self.assertTrue(left)
        self.assertEqual([], [n for n in left if not n.startswith(child)])
        self.glance.start()
        self.assertEqual('importing', self.client.images.get(child)['status'])
        self.delete(child)
        self.glance.stop()
        self.glance.start()
        deadline = time.time() + 60
        while [n for n in os.listdir(staging) if n.startswith(child)]:
            self.assertLess(time.time(), deadline, os.listdir(staging))
            time.sleep(0.2)
        self.assertIsNone(self.library_image(child))
        # the same delta, imported again, is the whole disk
        child = self._import_delta(delta)
        self.wait_status(child, 'active')
        got = os.path.join(self.tmp, 'got.raw')
        with open(got, 'wb') as f:
            for chunk in self.client.images.data(child):
                f.write(chunk)
        self.assertEqual(_sha(whole), _sha(got))
        self.assertEqual([], self._staged(child))

    def test_delete_of_a_canonical_image(self):
        seeds = list(range(10001, 11025))
        a = self.create(self.image('c.raw', seeds))
        self.wait_map(a)
        b_raw = self.image('d.raw', seeds[:512] + list(range(20001, 20513)))
        b = self.create(b_raw)
        v1 = self.wait_map(b)
        self.assertIn(a, [t.image_id for t in self.rebuild(
            b, v1, os.path.join(self.tmp, 'b1.raw')).targets])
        self.delete(a)
        v2 = self.wait_map(b, newer_than=v1)
        out = os.path.join(self.tmp, 'b2.raw')
        bmap = self.rebuild(b, v2, out)
        self.assertEqual([b], [t.image_id for t in bmap.targets])
        self.assertEqual(_sha(b_raw), _sha(out))
        # the old version stays fetchable for hosts that still run it
        self.source.fetch_map(b, v1, os.path.join(self.tmp, 'old.vmap'))
        # A's own maps are gone
        deadline = time.time() + 60
        while True:
            try:
                self.source.current_version(a)
            except SourceError:
                break
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        self.assertIsNone(self.library_image(a))
        self.assert_consistent()

    def notifier(self):
        conf = cfg.ConfigOpts()
        conf([], project='vmar-test')
        oslo_messaging.set_transport_defaults('glance')
        transport = oslo_messaging.get_notification_transport(
            conf, url=self.rabbit.transport_url)
        self.addCleanup(transport.cleanup)
        return oslo_messaging.Notifier(transport, 'image.localhost',
                                       driver='messagingv2',
                                       topics=['notifications'])

    def test_duplicate_and_out_of_order_notifications(self):
        raw = self.image('e.raw', list(range(30001, 30513)))
        image_id = self.create(raw)
        v = self.wait_map(image_id)
        img = self.client.images.get(image_id)
        payload = {k: img.get(k) for k in (
            'id', 'status', 'owner', 'visibility', 'disk_format', 'size',
            'checksum', 'properties')}
        n = self.notifier()
        for _ in range(3):
            n.info({}, 'image.activate', payload)
            n.info({}, 'image.upload', payload)
        # a late update that changes nothing, a delete of an unknown image
        n.info({}, 'image.update', payload)
        ghost = dict(payload, id=str(uuid.uuid4()))
        n.info({}, 'image.delete', ghost)
        n.info({}, 'image.activate', ghost)
        # every one of them handled, Glance's own two included
        for event, count in (('image.activate', 4), ('image.upload', 4),
                             ('image.update', 1)):
            self.wait_handled(event, image_id, count)
        self.wait_handled('image.delete', ghost['id'])
        self.wait_handled('image.activate', ghost['id'],
                          outcome='done|failed')
        self.assertEqual(v, self.library_image(image_id).map_version)
        self.assertEqual(1, self.source.current_version(image_id))
        self.assertIsNone(self.library_image(ghost['id']))
        self.assertNotIn('Traceback', self.agent_log())
        self.assert_consistent()

    def test_agent_killed_mid_ingest(self):
        raw = self.image('g.raw', list(range(40001, 40001 + 24576)))
        self.stop_agent()
        self.start_agent()
        # wait until the agent is streaming it, then kill it; the upload
        # runs beside the wait, because the agent may be done before the
        # openstack CLI that uploads has exited
        work = self.conf.vmar.work_dir
        with futures.ThreadPoolExecutor(1) as pool:
            created = pool.submit(self.create, raw)
            deadline = time.time() + 60
            while not glob.glob(os.path.join(work, '.fetch-*')):
                self.assertLess(time.time(), deadline, self.agent_log())
                time.sleep(0.005)
            self.agent.send_signal(signal.SIGKILL)
            self.agent.wait()
            image_id = created.result()
        self.assertIsNone(self.library_image(image_id))
        self.start_agent()
        v = self.wait_map(image_id)
        out = os.path.join(self.tmp, 'out.raw')
        self.rebuild(image_id, v, out)
        self.assertEqual(_sha(raw), _sha(out))
        self.assert_consistent()
        # the dead agent's temporary file was cleaned up
        deadline = time.time() + 10
        while glob.glob(os.path.join(work, '.fetch-*')):
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)

    def test_resync_catches_up_on_lost_notifications(self):
        self.stop_agent()
        self.addCleanup(self.start_agent)
        self.addCleanup(self.stop_agent)
        raw = self.image('r.raw', list(range(70001, 70257)))
        image_id = self.create(raw)
        # an agent of another pool: a new queue, which never saw the
        # notifications of that upload
        other = os.path.join(self.tmp, 'other-pool.conf')
        glance_env.write_conf(other, {'vmar_agent': {
            'pool': 'vmar-resync-test', 'resync_interval': '1'}})
        self.start_agent(other)
        v = self.wait_map(image_id)
        out = os.path.join(self.tmp, 'out.raw')
        self.rebuild(image_id, v, out)
        self.assertEqual(_sha(raw), _sha(out))
        self.assertIn('resync: %s is not in the library' % image_id,
                      self.agent_log(full=True))

    def manage(self, *args, conf=None, check=True):
        """``vmar-manage`` with the class's configuration (and ``conf``)."""
        cmd = [os.path.join(os.path.dirname(sys.executable), 'vmar-manage'),
               '--config-file', self.conf_file]
        if conf:
            cmd += ['--config-file', conf]
        proc = subprocess.run(cmd + list(args), capture_output=True,
                              text=True)
        if check:
            self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
        return proc

    def failures(self, state=None):
        args = ['failures', 'list', '--json'] + (
            ['--state', state] if state else [])
        return {f['image_id']: f for f in json.loads(
            self.manage(*args).stdout)}

    def wait_failure(self, image_id, state, timeout=60):
        deadline = time.time() + timeout
        while self.failures(state).get(image_id) is None:
            self.assertLess(time.time(), deadline, self.agent_log())
            time.sleep(0.3)

    def test_outage_then_recovery(self):
        # the agent reaches Glance through a proxy: stopped, an outage
        proxy = proxy_env.TcpProxy(
            '127.0.0.1', self.glance.endpoint.rsplit(':', 1)[1],
            work_dir=os.path.join(self.tmp, 'proxy'))
        os.makedirs(proxy.work_dir)
        self.addCleanup(proxy.stop)
        through = os.path.join(self.tmp, 'through-proxy.conf')
        metrics_port = process.free_port()
        glance_env.write_conf(through, {
            'vmar_glance': {'endpoint': proxy.url,
                            'endpoint_override': proxy.url},
            'vmar_metrics': {'agent_port': str(metrics_port)}})
        self.stop_agent()
        self.addCleanup(self.start_agent)
        self.addCleanup(self.stop_agent)
        started = self.agent_log(full=True).count('vmar-agent listening')
        self.start_agent(through)
        self.wait_listening(started)

        # uploads while the agent cannot reach Glance: retried, then parked
        raws = {}
        for name, first in (('x', 81001), ('y', 82001), ('z', 83001)):
            raw = self.image(name + '.raw', list(range(first, first + 64)))
            raws[self.create(raw)] = raw
        x, y, z = raws
        for image_id in raws:
            self.wait_failure(image_id, 'parked')
        # [vmar_agent] max_attempts of the first event; image.upload and
        # image.activate of one upload may each add attempts
        f = self.failures()[x]
        self.assertGreaterEqual(f['attempts'], 3)

        m = scrape(metrics_port)
        self.assertEqual(3, m[('vmar_agent_failures',
                               (('state', 'parked'),))])
        self.assertGreaterEqual(m[('vmar_agent_events_total', (
            ('event', 'image.activate'), ('outcome', 'retry')))], 3)

        # an operator's retry while Glance is still away: a clear error
        proc = self.manage('failures', 'retry', x, conf=through,
                           check=False)
        self.assertEqual(1, proc.returncode)
        self.assertRegex(proc.stderr, r'image\.(activate|upload) of %s '
                         r'failed again \(parked, attempt \d+\): \w+' % x)
        self.assertGreater(self.failures()[x]['attempts'], f['attempts'])
        # ... and through a path that works: done at once
        out = self.manage('failures', 'retry', y).stdout
        self.assertIn('succeeded', out)
        self.assertNotIn(y, self.failures())
        self.wait_map(y)
        # a forgotten failure is handled like any image the agent missed
        self.manage('failures', 'forget', z)
        self.assertNotIn(z, self.failures())
        proc = self.manage('failures', 'forget', z, check=False)
        self.assertEqual(1, proc.returncode)
        self.assertIn('no failure is recorded for %s' % z, proc.stderr)

        # the outage ends: the agent retries x by itself, resync takes z
        proxy.start()
        for image_id, raw in raws.items():
            v = self.wait_map(image_id)
            out = os.path.join(self.tmp, image_id + '.out')
            self.rebuild(image_id, v, out)
            self.assertEqual(_sha(raw), _sha(out))
        self.assertEqual({}, {i: f for i, f in self.failures().items()
                              if i in raws})
        # by a resync or by a retry of the parked: whichever comes first
        with open(os.path.join(self.work, 'agent.log'),
                  errors='replace') as f:
            self.assertIn('ingested %s' % x, f.read())
        m = scrape(metrics_port)
        self.assertEqual(0, m[('vmar_agent_failures',
                               (('state', 'parked'),))])
        # x and z by this agent (y by vmar-manage)
        self.assertEqual(2, m[('vmar_agent_ingest_seconds_count', ())])
        self.assertEqual(os.path.getsize(raws[x]) * 2,
                         m[('vmar_agent_ingested_bytes_total', ())])
        self.assert_consistent()

    def export_host(self, name, **vmar):
        """A compute host: vmar-export serve reading this Glance.

        It reports its exports every second. Returns a function running
        vmar-export commands on that host. ``vmar``: more of its
        [vmar_host] options.
        """
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        sock_dir = base.socket_dir(self, 'gc-')
        conf = os.path.join(d, 'vmar.conf')
        glance_env.write_conf(conf, {
            'DEFAULT': {'transport_url': self.rabbit.transport_url},
            'vmar_host': {'host_dir': os.path.join(d, 'host'), 'host': name,
                          'report_interval': '1', 'map_source': 'glance',
                          'export_socket': os.path.join(sock_dir,
                                                        'nbd.sock'),
                          'qemu_storage_daemon':
                              qemu_env.qemu_bin('qemu-storage-daemon'),
                          **vmar},
            'vmar_glance': {'auth_type': 'none',
                            'endpoint': self.glance.endpoint,
                            'endpoint_override': self.glance.endpoint}})
        bin_dir = os.path.dirname(sys.executable)
        proc = self.start_serve(
            [os.path.join(bin_dir, 'vmar-export'), '--config-file', conf],
            os.path.join(d, 'serve.log'), os.path.join(d, 'host'))
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(sock_dir, 'nbd.sock')):
            self.assertIsNone(proc.poll(), 'vmar-export serve exited')
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)

        def cli(*args):
            r = subprocess.run([os.path.join(bin_dir, 'vmar-export'),
                                '--config-file', conf] + list(args),
                               capture_output=True, text=True)
            self.assertEqual(0, r.returncode, r.stderr[-3000:])
        return cli

    def map_image_exists(self, image_id, version):
        try:
            self.client.images.get(names.map_image_id(image_id, version))
            return True
        except glance_exc.HTTPNotFound:
            return False

    def test_map_versions_gc(self):
        gc_conf = os.path.join(self.tmp, 'gc.conf')
        glance_env.write_conf(gc_conf, {'vmar_agent': {
            'map_gc_interval': '1', 'map_gc_min_age': '0'}})
        self.stop_agent()
        self.addCleanup(self.start_agent)
        self.addCleanup(self.stop_agent)
        self.start_agent(gc_conf)
        # hosts of earlier tests (stopped, reports long handled) would hold
        # every version superseded after their last report
        for h in json.loads(self.manage('hosts', 'list', '--json').stdout):
            self.manage('hosts', 'forget', h['host'])
        held = self.create(self.image('held.raw', list(range(91001, 91065))))
        free = self.create(self.image('free.raw', list(range(92001, 92065))))
        v_held, v_free = self.wait_map(held), self.wait_map(free)
        export_cli = self.export_host('gc-host')
        # an instance on the host reads the current version of one
        export_cli('add', held, '--holder', 'instance-1')
        # a new version of both: their old ones are superseded
        for image_id, v in ((held, v_held), (free, v_free)):
            self.client.images.update(image_id, visibility='public')
            self.wait_map(image_id, newer_than=v)
        # the unheld one goes, from Glance and from the library
        # (the agent deletes the Glance map image first, then the
        # library's record and file: wait for both)
        self.wait_until(lambda: not self.map_image_exists(free, v_free)
                        and not os.path.exists(ingest.map_path(
                            self.conf, free, v_free)),
                        'map v%d of %s stays' % (v_free, free))
        # the held one stays, for the reason a dry run gives
        out = self.manage('map', 'gc', '--dry-run', '--min-age', '0').stdout
        self.assertIn('kept map v%d of %s: held by gc-host' % (v_held, held),
                      out)
        self.assertTrue(self.map_image_exists(held, v_held))
        hosts = json.loads(self.manage('hosts', 'list', '--json').stdout)
        self.assertEqual([[held, v_held]], [
            h['exports'] for h in hosts if h['host'] == 'gc-host'][0])
        # the instance is gone: its version follows
        export_cli('remove', held, '--holder', 'instance-1')
        self.wait_until(lambda: not self.map_image_exists(held, v_held)
                        and not os.path.exists(ingest.map_path(
                            self.conf, held, v_held)),
                        'map v%d of %s stays' % (v_held, held))
        # the current versions stay
        for image_id in (held, free):
            v = self.source.current_version(image_id)
            self.assertTrue(self.map_image_exists(image_id, v))
        self.assert_consistent()
        self.manage('hosts', 'forget', 'gc-host')

    def test_hosts_report_what_they_hold(self):
        """The channel of the scheduler's vmar weigher, end to end."""
        for h in json.loads(self.manage('hosts', 'list', '--json').stdout):
            self.manage('hosts', 'forget', h['host'])
        a = self.create(self.image('hold-a.raw', list(range(93001, 93065))))
        # a in the library first, so that it is canonical for what b
        # shares (the agent may take two activations in either order;
        # b first, a's map would read half of b, and a host holding a
        # whole would hold b whole too)
        self.wait_map(a)
        # b's first half is a's: its map reads 32 blocks of a, 32 of b
        b = self.create(self.image('hold-b.raw', list(range(93001, 93033))
                                   + list(range(94001, 94033))))
        self.wait_map(b)

        def shares(image_id):
            out = self.manage('hosts', 'shares', image_id).stdout
            return dict(ln.split() for ln in out.splitlines()[1:] if ln)
        export_cli = self.export_host('hold-host', base_fetch='full')
        export_cli('add', a, '--holder', 'instance-1')
        # the host holds a whole: all of a, half of b
        self.wait_until(lambda: shares(b) == {'hold-host': '0.500'},
                        'shares of %s: %s' % (b, shares(b)))
        self.assertEqual({'hold-host': '1.000'}, shares(a))
        hosts = json.loads(self.manage('hosts', 'list', '--json').stdout)
        self.assertEqual([[[a, None]]], [h['holds'] for h in hosts])
        # the instance goes, and with it the base
        export_cli('remove', a, '--holder', 'instance-1')
        self.wait_until(lambda: not shares(b), 'shares of %s: %s'
                        % (b, shares(b)))
        self.manage('hosts', 'forget', 'hold-host')

    def test_a_new_export_is_reported_at_once(self):
        """An added or removed export does not wait for report_interval.

        The scheduler's weigher places a burst's next servers by what the
        hosts reported: the host reports a change report_change_delay
        after it, through RabbitMQ and vmar-agent, as any report.
        """
        a = self.create(self.image('change-a.raw',
                                   list(range(95001, 95033))))
        self.wait_map(a)

        def reported():
            hosts = json.loads(self.manage('hosts', 'list', '--json').stdout)
            return {h['host']: h for h in hosts}.get('change-host')
        # an hour between periodic reports: only the first one, at start
        export_cli = self.export_host('change-host', base_fetch='full',
                                      report_interval='3600',
                                      report_change_delay='0.5')
        self.wait_until(reported, 'the first report of change-host')
        self.assertEqual([], reported()['holds'])
        export_cli('add', a, '--holder', 'instance-1')
        self.wait_until(lambda: reported()['holds'] == [[a, None]],
                        'the report of the new export: %s' % reported())
        export_cli('remove', a, '--holder', 'instance-1')
        self.wait_until(lambda: reported()['holds'] == [],
                        'the report of the export gone: %s' % reported())
        self.manage('hosts', 'forget', 'change-host')

    def test_a_lazy_host_reads_what_its_peer_holds(self):
        """Peer discovery end to end, Glance cut (issue 34)."""
        self.check_peer_reads(lambda proxy: proxy.stop())

    def test_a_qcow2_image_comes_from_peers_at_its_own_offsets(self):
        """Peers hold raw content; Glance keeps the image as qcow2.

        The peer fetcher is a child of the mirror's quorum, under the
        image's own offsets: every block comes from the peer and checks
        out (asked at qcow2 offsets, as a step inside the range server
        was, they failed their digests and the peer was marked bad).
        """
        self.check_peer_reads(lambda proxy: proxy.stop(), fmt='qcow2')

    def test_hostile_uploads(self):
        before = self.library_count()
        backing = os.path.join(self.tmp, 'backing.raw')
        base.write_image(backing, [1, 2, 3])
        evil = os.path.join(self.tmp, 'evil.qcow2')
        subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b',
                        backing, '-F', 'raw', evil], check=True)
        trunc = os.path.join(self.tmp, 'trunc.qcow2')
        subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2',
                        self.image('h.raw', list(range(50001, 50257))),
                        trunc], check=True)
        shutil.copy(trunc, trunc + '.orig')
        with open(trunc, 'r+b') as f:
            f.truncate(os.path.getsize(trunc) // 2)
        # a qcow2 whose L1 table lies past its end: Glance's header checks
        # pass, qemu-img check does not
        corrupt = os.path.join(self.tmp, 'corrupt.qcow2')
        shutil.copy(trunc + '.orig', corrupt)
        with open(corrupt, 'r+b') as f:
            f.seek(40)
            f.write((0x7fff00000000).to_bytes(8, 'big'))
        rejected_by_us = 0
        for path in (evil, trunc, corrupt):
            r = self.glance.openstack(
                'image', 'create', '--file', path, '--disk-format', 'qcow2',
                '--container-format', 'bare', '-f', 'value', '-c', 'id',
                'hostile', check=False)
            if r.returncode:
                # Glance's own inspection refused it: nothing reached us
                self.assertRegex(r.stdout + r.stderr, r'\b4(00|15)\b')
                continue
            image_id = r.stdout.strip().splitlines()[-1]
            img = self.client.images.get(image_id)
            if img['status'] != 'active':
                continue
            # Glance took it: mapgen refuses it, for good, and says why
            deadline = time.time() + 60
            while True:
                with db_session.reader(self.conf) as s:
                    row = s.get(models.AgentFailure, image_id)
                    if row is not None and row.permanent:
                        error = row.last_error
                        break
                self.assertLess(time.time(), deadline, '%s %s: %s' % (
                    path, self.client.images.get(image_id)['status'],
                    self.agent_log()))
                time.sleep(0.2)
            self.assertIn('image %s rejected by mapgen: it is ' % image_id,
                          error)
            rejected_by_us += 1
            self.assertIsNone(self.library_image(image_id))
            # Glance is unharmed: the image is still there, byte for byte
            got = b''.join(self.client.images.data(image_id))
            with open(path, 'rb') as f:
                self.assertEqual(f.read(), got)
        self.assertGreaterEqual(rejected_by_us, 1)
        self.assertEqual(before, self.library_count())
        self.assert_consistent()


class TestSeveralAgents(GlanceTestCase):
    """Three agents of one pool against MariaDB.

    A delete rewrites no other map itself: the agents' background pass
    rewrites and publishes them ([vmar] rewrite_at_once = 0).
    """

    @classmethod
    def database_url(cls):
        return cls.mariadb('agents')

    @classmethod
    def library_options(cls):
        return {'rewrite_at_once': '0'}

    @classmethod
    def _start(cls):
        super()._start()
        cls.extra_agents = []
        first = cls.agent
        for _ in range(2):
            cls.start_agent()
            cls.extra_agents.append(cls.agent)
        cls.agent = first

    def test_parallel_uploads_and_a_delete(self):
        common = list(range(60001, 60513))
        raws = [self.image('p%d.raw' % i, common + list(
            range(61000 + 1000 * i, 61256 + 1000 * i))) for i in range(5)]
        # one after the other; the agents take their notifications in
        # parallel
        ids = [self.create(raw) for raw in raws]
        raw_of = dict(zip(ids, raws))
        versions = {i: self.wait_map(i) for i in ids}
        # the canonical copy of the common blocks is the first ingested
        # image (the lowest seq: the agents may ingest out of upload
        # order): delete every image in turn but the last two ingested
        ids.sort(key=lambda i: self.library_image(i).seq)
        for image_id in ids[:3]:
            self.delete(image_id)
        for image_id in ids[3:]:
            deadline = time.time() + 120
            while True:
                v = self.source.current_version(image_id)
                m = os.path.join(self.tmp, '%s.%d.vmap' % (image_id, v))
                if not os.path.exists(m):
                    self.source.fetch_map(image_id, v, m)
                targets = {t.image_id for t in mapformat.read(m).targets}
                if not targets & set(ids[:3]):
                    break
                self.assertLess(time.time(), deadline, self.agent_log())
                time.sleep(0.5)
            out = os.path.join(self.tmp, image_id + '.raw')
            self.rebuild(image_id, v, out)
            self.assertEqual(_sha(raw_of[image_id]), _sha(out))
            self.assertGreaterEqual(v, versions[image_id])
        deadline = time.time() + 60
        while self.library_count() != 2:
            self.assertLess(time.time(), deadline, self.agent_log())
            time.sleep(0.2)
        self.assert_consistent()
        # the maps were rewritten by the agents' pass, none by a delete
        self.assertEqual([], ingest.Library(self.conf).pending_maps())
        log = self.agent_log(full=True)
        self.assertIn('left for vmar-agent to rewrite', log)
        self.assertRegex(log, r'rewrote \d+ pending maps')


class LazyGuestsTestCase(GlanceTestCase):
    """Guests on a lazy host whose store fails under them.

    Real pieces throughout: glance-api and its store, vmar-agent,
    ``vmar-export serve`` with its nbdkit range server, libvirt and the
    test guest (tools/build-test-guest.sh), which checksums its whole
    disk, and the Nova backend's resumer (run here in a thread, as
    vmar-nova-compute runs it). :class:`TestLazyGuests` runs them on the
    file store: the outage is a proxy in front of glance-api that stops,
    corruption is the store's own file, changed; test_ceph.py runs them
    on Ceph.
    """

    def setUp(self):
        super().setUp()
        qemu_env.libvirt()
        self.guest = qemu_env.test_guest()
        os.chmod(self.tmp, 0o755)
        # b's first 16 MiB are a's; 8 MiB its own; 24 MiB in all
        shared = list(range(1, 4097))
        a = self.image('a.raw', shared + [None] * 2048)
        self.b = self.image('b.raw', shared + list(range(5001, 7049)))
        self.expected = qemu_env.sha256_file(self.b)
        self.ia = self.create(a)
        self.wait_map(self.ia)
        self.ib = self.create(self.b)
        vb = self.wait_map(self.ib)
        for i in (self.ia, self.ib):
            self.wait_digests(i)
        self.host, cmd, self.proxy = self.lazy_host(
            export_socket_group='libvirt-qemu')
        self.uri = self.lazy_add(cmd, self.ib, vb)
        self.overlay = os.path.join(self.tmp, 'disk.qcow2')
        subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'create', '-q', '-f',
                        'qcow2', '-b', self.uri, '-F', 'raw',
                        self.overlay], check=True)
        self.resumed = []
        self._resumer()

    def _resumer(self):
        """The Nova backend's resumer, every second, in a thread."""
        import libvirt

        from vmar_openstack import hostapi
        from vmar_openstack.nova_imagebackend import resume
        conf = cfg.ConfigOpts()
        vmar_conf.register_opts(conf)
        conf(['--config-file', self.lazy_conf_file], project='vmar')
        resumer = resume.Resumer(hostapi.Client.from_host_conf(conf),
                                 libvirt)
        conn = libvirt.open('qemu:///system')
        stop = threading.Event()

        def loop():
            while not stop.wait(1):
                with contextlib.suppress(Exception):
                    self.resumed += resumer.run_once(conn)
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        self.addCleanup(t.join)
        self.addCleanup(stop.set)

    def boot(self, args='', wait=True, timeout=300):
        name = 'vmar-lazy-%s' % uuid.uuid4().hex[:8]
        console = os.path.join(self.tmp, name + '.log')
        xml = os.path.join(self.tmp, name + '.xml')
        with open(xml, 'w') as f:
            f.write(GUEST_XML.format(
                name=name, guest=self.guest, args=args,
                overlay=self.overlay, console=console))
        qemu_env.run_domain(self, name, xml, console, wait, timeout)
        return name, console

    def held(self):
        """Bytes the mirrors hold."""
        d = os.path.join(self.host, 'mirrors')
        return sum(os.stat(os.path.join(d, i)).st_blocks * 512
                   for i in (self.ia, self.ib))

    def prefill(self, length):
        """Fetch the image's first ``length`` bytes (part of a boot)."""
        r = self.qemu_io(self.uri, 'read 0 %d' % length)
        self.assertNotIn('failed', r.stdout + r.stderr, self.serve_log())

    def wait_paused(self, name, timeout=120):
        """Until libvirt paused ``name`` on an I/O error."""
        deadline = time.time() + timeout
        while 'I/O error' not in qemu_env.virsh(
                'domstate', '--reason', name, check=False).stdout:
            self.assertLess(time.time(), deadline, self.serve_log())
            time.sleep(0.2)

    def wait_off(self, name, console, timeout=300):
        deadline = time.time() + timeout
        while qemu_env.virsh('domstate', name, check=False).returncode == 0:
            self.assertLess(time.time(), deadline,
                            qemu_env.console_tail(console) + self.serve_log())
            time.sleep(0.5)

    def assert_guest_saw_the_image(self, console):
        sums = qemu_env.console_lines(console, 'VMAR-SHA256')
        self.assertEqual([self.expected], sums,
                         qemu_env.console_tail(console))


class TestLazyGuests(LazyGuestsTestCase):

    def test_store_down_in_the_middle_of_a_boot(self):
        self.prefill(8 << 20)
        self.proxy.stop()
        name, console = self.boot(wait=False)
        self.wait_paused(name)
        # the resumer tries again; the store is still down: paused again
        deadline = time.time() + 60
        while name not in self.resumed:
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        self.wait_paused(name)
        self.proxy.start()
        self.wait_off(name, console)
        self.assert_guest_saw_the_image(console)

    def test_store_returns_corrupted_bytes(self):
        self.prefill(8 << 20)
        # the store's copy of b, one bit flipped in b's own part
        stored = os.path.join(self.glance.store_dir, self.ib)
        with open(stored, 'r+b') as f:
            f.seek(20 << 20)
            good = f.read(1)
            f.seek(20 << 20)
            f.write(bytes([good[0] ^ 0x10]))
        name, console = self.boot(wait=False)
        self.wait_paused(name)
        with open(stored, 'r+b') as f:
            f.seek(20 << 20)
            f.write(good)
        self.wait_off(name, console)
        self.assert_guest_saw_the_image(console)
        self.assertIn('digest', self.serve_log())

    def test_daemon_killed_in_the_middle_of_a_fetch(self):
        self.prefill(8 << 20)
        self.proxy.stop()       # the fetch the guest waits for hangs on
        name, console = self.boot(wait=False)
        self.wait_paused(name)
        with open(os.path.join(self.host, 'qsd.pid')) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        self.proxy.start()
        self.wait_off(name, console)
        self.assert_guest_saw_the_image(console)

    def test_host_reboots_in_the_middle_of_a_fetch(self):
        self.prefill(8 << 20)
        held = self.held()
        self.proxy.stop()
        name, console = self.boot(wait=False)
        self.wait_paused(name)
        # everything on the host dies: guest, vmar-export, its daemon and
        # range server
        qemu_env.virsh('destroy', name, check=False)
        os.killpg(self.lazy_proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(self.host, 'qsd.pid')) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.uri.split('socket=')[1])
        self.proxy.start()
        self.lazy_proc = self.lazy_serve()
        # the mirrors kept what they held (the prefill was synced)
        self.assertGreaterEqual(self.held(), held)
        name, console = self.boot()
        self.assert_guest_saw_the_image(console)
