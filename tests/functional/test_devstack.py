"""The devstack plugin, phase by phase, against a shim of devstack.

A real devstack cannot run here (it clones and installs all of OpenStack),
so each phase runs in its own bash, as stack.sh/unstack.sh/clean.sh run it:
``tests/functional/devstack_shim.sh`` (devstack's functions, following their
documented behaviour, and its variables pointing into a temporary
directory), then ``devstack/settings``, then ``devstack/plugin.sh MODE
PHASE``. The checks are on real effects: configuration files parsed back,
the database schema, the vmar-export service really serving its NBD socket
with the patched qemu-storage-daemon, and nothing left after ``clean``.

nova-compute cannot run without a control plane, so the shim records the
n-cpu command line instead of running it (``SHIM_RECORD_ONLY=n-cpu``); the
test checks that command and that its program starts.
"""

import configparser
import grp
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import uuid

import fixtures
from oslo_config import cfg
from oslo_config import types
import testtools

from tools.vmarenv import qemu_env
from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import models
from vmar_openstack.host.peers import server as export_peers

TOP = qemu_env.TOP
SHIM = os.path.join(TOP, 'tests', 'functional', 'devstack_shim.sh')
BIN_DIR = os.path.dirname(sys.executable)
SOCKET_GROUP = 'libvirt-qemu'
LIBVIRT_GROUP = 'libvirt'
LIST = types.List(item_type=types.String(quotes=True), bounds=True)

# What devstack has written before the plugin's post-config.
NOVA_CONF = """[DEFAULT]
debug = True
transport_url = rabbit://stackrabbit:secret@127.0.0.1:5672/

[libvirt]
virt_type = qemu
"""
NOVA_CPU_CONF = """[DEFAULT]
debug = True
# an older copy, written by a previous start_nova_compute
"""
# lib/nova's write_uwsgi_config, for n-api
NOVA_UWSGI_CONF = """[uwsgi]
module = nova.wsgi.osapi_compute:application
processes = 2
"""
GLANCE_API_CONF = """[DEFAULT]
debug = True
enabled_import_methods = [copy-image]

[oslo_messaging_notifications]
driver = messagingv2
"""
GLANCE_IMAGE_IMPORT_CONF = """[image_import_opts]
image_import_plugins = []

[inject_metadata_properties]
ignore_user_roles = admin
"""


def map_source():
    """The plugin's map source, while [vmar_host] map_source lacks "glance"."""
    opt = [o for o in vmar_conf.host.ALL_OPTS if o.name == 'map_source'][0]
    return 'glance' if 'glance' in opt.type.choices else 'dir'


def alive(pid):
    """Whether ``pid`` is a process that is not a zombie."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            state = f.read().rsplit(')', 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != 'Z'


def read(path):
    with open(path) as f:
        return f.read()


def ini(path):
    # DEFAULT as a plain section: no defaults mixed into the others
    parser = configparser.ConfigParser(interpolation=None,
                                       default_section='\0')
    with open(path) as f:
        parser.read_file(f)
    return parser


def wait_for(predicate, timeout=30):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


class DevstackTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.root = os.path.join(self.tmp, 'root')
        os.makedirs('/run/vmar-test', exist_ok=True)
        os.chmod('/run/vmar-test', 0o755)
        self.sock_dir = '/run/vmar-test/devstack-%s' % uuid.uuid4().hex[:8]
        self.sock = os.path.join(self.sock_dir, 'nbd.sock')
        etc = os.path.join(self.root, 'etc')
        self.dest = os.path.join(self.root, 'opt', 'stack')
        self.status = os.path.join(self.dest, 'status')
        self.records = os.path.join(self.root, 'shim')
        self.vmar_conf_dir = os.path.join(etc, 'vmar')
        self.vmar_conf = os.path.join(self.vmar_conf_dir, 'vmar.conf')
        self.export_conf = os.path.join(self.vmar_conf_dir,
                                        'vmar-export.conf')
        self.state_dir = os.path.join(self.dest, 'data', 'vmar')
        self.host_dir = os.path.join(self.state_dir, 'host')
        self.db_file = os.path.join(self.root, 'databases', 'vmar.sqlite')
        self.nova_conf = os.path.join(etc, 'nova', 'nova.conf')
        self.nova_cpu_conf = os.path.join(etc, 'nova', 'nova-cpu.conf')
        self.nova_uwsgi_conf = os.path.join(etc, 'nova',
                                            'nova-api-uwsgi.ini')
        self.glance_api_conf = os.path.join(etc, 'glance', 'glance-api.conf')
        self.import_conf = os.path.join(etc, 'glance',
                                        'glance-image-import.conf')
        for path, text in ((self.nova_conf, NOVA_CONF),
                           (self.nova_cpu_conf, NOVA_CPU_CONF),
                           (self.nova_uwsgi_conf, NOVA_UWSGI_CONF),
                           (self.glance_api_conf, GLANCE_API_CONF),
                           (self.import_conf, GLANCE_IMAGE_IMPORT_CONF)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                f.write(text)
        self.env = {
            'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
            'HOME': os.environ.get('HOME', '/root'),
            'LANG': 'C.UTF-8',
            'SHIM_ROOT': self.root,
            'SHIM_RECORD_ONLY': 'n-cpu',
            'DEST': self.dest,
            'NOVA_CONF': self.nova_conf,
            'NOVA_CPU_CONF': self.nova_cpu_conf,
            'NOVA_UWSGI_CONF': self.nova_uwsgi_conf,
            'GLANCE_API_CONF': self.glance_api_conf,
            'GLANCE_IMAGE_IMPORT_CONF': self.import_conf,
            'LIBVIRT_GROUP': LIBVIRT_GROUP,
            'NOVA_BIN_DIR': BIN_DIR,
            'VMAR_DIR': TOP,
            'VMAR_BIN_DIR': BIN_DIR,
            'VMAR_CONF_DIR': self.vmar_conf_dir,
            'VMAR_EXPORT_SOCKET': self.sock,
            'VMAR_MAP_SOURCE': map_source(),
            'VMAR_QEMU_PREFIX': qemu_env.qemu_prefix(),
        }
        self.addCleanup(self._kill_leftovers)

    def _kill_leftovers(self):
        pid_files = [os.path.join(self.host_dir, 'qsd.pid')]
        if os.path.isdir(self.status):
            pid_files += [os.path.join(self.status, f)
                          for f in os.listdir(self.status)
                          if f.endswith('.pid')]
        for pid_file in pid_files:
            self._kill_pid_file(pid_file)
        subprocess.run(['rm', '-rf', self.sock_dir])

    @staticmethod
    def _kill_pid_file(path):
        try:
            os.kill(int(read(path)), signal.SIGKILL)
        except (OSError, ValueError):
            pass

    def bash(self, script, *args, env=None, check=True):
        """Run ``script`` after sourcing the shim, as root, in ``/``."""
        proc = subprocess.run(
            ['bash', '-c', 'set -o errexit\nsource "$SHIM"\n' + script,
             'bash'] + list(args),
            env=dict(env or self.env, SHIM=SHIM), cwd='/',
            capture_output=True, text=True)
        if check:
            self.assertEqual(0, proc.returncode,
                             '%s %s failed:\n%s\n%s' % (
                                 script, args, proc.stdout[-3000:],
                                 proc.stderr[-5000:]))
        return proc

    def phase(self, *args, **kwargs):
        """One run of the plugin: ``stack extra``, ``unstack``..."""
        return self.bash('shim_run_plugin "$@"', *args, **kwargs)

    def record(self, name):
        path = os.path.join(self.records, name)
        if not os.path.exists(path):
            return []
        return read(path).splitlines()

    def service_cmd(self, service):
        lines = read(os.path.join(self.status, service + '.cmd'))
        return dict(line.split('=', 1) for line in lines.splitlines())

    def service_pid(self, service):
        return int(read(os.path.join(self.status, service + '.pid')))

    def processes_mentioning(self, *needles):
        found = []
        for pid in os.listdir('/proc'):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open('/proc/%s/cmdline' % pid, 'rb') as f:
                    cmdline = f.read().replace(b'\0', b' ').decode()
            except OSError:
                continue
            if alive(int(pid)) and any(n in cmdline for n in needles):
                found.append('%s: %s' % (pid, cmdline))
        return found


class TestDevstackPlugin(DevstackTestCase):

    def test_settings_defaults(self):
        env = {k: v for k, v in self.env.items()
               if not k.startswith('VMAR_') or k == 'VMAR_DIR'}
        out = self.bash(
            'source "$VMAR_DIR/devstack/settings"\n'
            'for v in VMAR_CONF VMAR_BIN_DIR VMAR_STATE_DIR VMAR_HOST_DIR '
            'VMAR_EXPORT_SOCKET VMAR_EXPORT_SOCKET_GROUP VMAR_MAP_SOURCE '
            'VMAR_EXPORT_USER VMAR_FLAVOR ENABLED_SERVICES VMAR_PEERS '
            'VMAR_PEER_ADDRESS VMAR_PEER_TLS_DIR VMAR_PEER_CA_DIR; do\n'
            '    echo "$v=${!v}"\ndone', env=env).stdout
        values = dict(line.split('=', 1) for line in out.splitlines())
        self.assertEqual('/etc/vmar/vmar.conf', values['VMAR_CONF'])
        self.assertEqual(self.dest + '/data/venv/bin', values['VMAR_BIN_DIR'])
        self.assertEqual(self.state_dir, values['VMAR_STATE_DIR'])
        self.assertEqual(self.host_dir, values['VMAR_HOST_DIR'])
        self.assertEqual('/run/vmar/nbd.sock', values['VMAR_EXPORT_SOCKET'])
        self.assertEqual(SOCKET_GROUP, values['VMAR_EXPORT_SOCKET_GROUP'])
        self.assertEqual('glance', values['VMAR_MAP_SOURCE'])
        self.assertEqual('root', values['VMAR_EXPORT_USER'])
        self.assertEqual('vmar', values['VMAR_FLAVOR'])
        # peers off; when on, on the node's address (the shim's HOST_IP)
        self.assertEqual('False', values['VMAR_PEERS'])
        self.assertEqual('127.0.0.1', values['VMAR_PEER_ADDRESS'])
        self.assertEqual('/etc/vmar/pki', values['VMAR_PEER_TLS_DIR'])
        self.assertEqual(self.dest + '/data/vmar-peer-ca',
                         values['VMAR_PEER_CA_DIR'])
        services = values['ENABLED_SERVICES'].split(',')
        self.assertIn('vmar-export', services)
        self.assertIn('vmar-agent', services)

    def test_lifecycle(self):
        # stack pre-install: the packages of bindep.txt's default profile,
        # through devstack's install_bindep
        self.phase('stack', 'pre-install')
        self.assertEqual([os.path.join(TOP, 'bindep.txt')],
                         self.record('bindep'))

        # stack install: the package, and the QEMU prefix remembered
        self.phase('stack', 'install')
        self.assertEqual(['setup_develop %s' % TOP], self.record('develop'))
        prefix = qemu_env.qemu_prefix()
        self.assertEqual(prefix + '\n', read(os.path.join(
            self.vmar_conf_dir, 'qemu-prefix')))

        # stack post-config
        self.phase('stack', 'post-config')
        self.check_post_config(prefix)

        # devstack's start_nova: NOVA_CPU_CONF is a copy of NOVA_CONF, then
        # n-cpu runs the stock nova-compute
        self.bash('start_nova_compute')
        nova_cpu_conf = read(self.nova_cpu_conf)
        self.assertEqual(read(self.nova_conf), nova_cpu_conf)

        # stack extra, twice (re-running it must not duplicate anything)
        self.phase('stack', 'extra')
        export_pid = self.check_export_running()
        self.phase('stack', 'extra')
        self.assertEqual(export_pid, self.check_export_running())
        self.check_agent_recorded()
        self.check_nova_compute_replaced()
        self.check_flavor()
        self.assertEqual(nova_cpu_conf, read(self.nova_cpu_conf))

        # unstack: the services stop; n-cpu is left to devstack
        qsd_pid = int(read(os.path.join(self.host_dir, 'qsd.pid')))
        self.phase('unstack')
        self.assertTrue(wait_for(lambda: not alive(export_pid), 5),
                        'vmar-export still runs')
        self.assertTrue(wait_for(lambda: not alive(qsd_pid), 5),
                        'qemu-storage-daemon still runs')
        self.assertFalse(os.path.exists(self.sock))
        self.assertFalse(os.path.exists(
            os.path.join(self.status, 'vmar-export.pid')))
        n_cpu = [e for e in self.record('process.log') if ' n-cpu' in e]
        self.assertTrue(n_cpu[-1].startswith('start n-cpu '), n_cpu)

        # clean: nothing left
        self.phase('clean')
        self.check_clean()

    def check_post_config(self, prefix):
        qsd = os.path.join(prefix, 'bin', 'qemu-storage-daemon')
        rabbit = 'rabbit://stackrabbit:shim-rabbit-password@127.0.0.1:5672/'
        db_url = 'sqlite:///' + self.db_file
        glance_auth = {
            'auth_type': 'password',
            'auth_url': 'http://127.0.0.1/identity',
            'username': 'nova',
            'password': 'shim-service-password',
            'project_name': 'service',
            'user_domain_name': 'Default',
            'project_domain_name': 'Default',
            'region_name': 'RegionOne',
        }
        host = {
            'host_dir': self.host_dir,
            'export_socket': self.sock,
            'export_socket_group': SOCKET_GROUP,
            'map_source': map_source(),
            'map_source_dir': self.state_dir,
            'qemu_storage_daemon': qsd,
        }

        # the library's file: vmar-agent and vmar-manage
        conf = ini(self.vmar_conf)
        self.assertEqual(rabbit, conf['DEFAULT']['transport_url'])
        self.assertEqual(rabbit,
                         conf['oslo_messaging_notifications']['transport_url'])
        self.assertEqual({'state_dir': self.state_dir}, dict(conf['vmar']))
        self.assertEqual(db_url, conf['vmar_database']['connection'])
        self.assertEqual(glance_auth, dict(conf['vmar_glance']))
        self.assertNotIn('vmar_host', conf.sections())
        # the export daemon's own: the host, and its Glance access
        export_conf = ini(self.export_conf)
        self.assertEqual(rabbit, export_conf['DEFAULT']['transport_url'])
        self.assertEqual(host, dict(export_conf['vmar_host']))
        self.assertEqual(glance_auth, dict(export_conf['vmar_glance']))
        self.assertEqual({'DEFAULT', 'vmar_host', 'vmar_glance'},
                         set(export_conf.sections()))
        self.assertTrue(os.access(qsd, os.X_OK))

        # oslo.config reads them, with the project's own options
        cfg_conf = cfg.ConfigOpts()
        vmar_conf.register_opts(cfg_conf)
        cfg_conf(['--config-file', self.export_conf], project='vmar',
                 default_config_files=[])
        self.assertEqual(self.sock, cfg_conf.vmar_host.export_socket)
        self.assertEqual(map_source(), cfg_conf.vmar_host.map_source)
        cfg_conf = cfg.ConfigOpts()
        vmar_conf.register_opts(cfg_conf)
        cfg_conf(['--config-file', self.vmar_conf], project='vmar',
                 default_config_files=[])
        self.assertEqual(db_url, cfg_conf.vmar_database.connection)

        # the database: every table of the models, at a known revision
        with sqlite3.connect(self.db_file) as db:
            tables = {r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        self.assertTrue(set(models.Base.metadata.tables) <= tables, tables)
        out = subprocess.run(
            [os.path.join(BIN_DIR, 'vmar-manage'), '--config-file',
             self.vmar_conf, 'db', 'version'],
            capture_output=True, text=True, check=True).stdout
        revision = out.strip().splitlines()[-1]    # after oslo.log's lines
        self.assertRegex(revision, r'^\w+$')
        self.assertNotEqual('none', revision)

        # Glance
        api = ini(self.glance_api_conf)
        self.assertEqual('messagingv2',
                         api['oslo_messaging_notifications']['driver'])
        self.assertEqual(['copy-image', 'glance-direct', 'web-download'],
                         LIST(api['DEFAULT']['enabled_import_methods']))
        self.assertEqual('True', api['DEFAULT']['debug'])
        imp = ini(self.import_conf)
        self.assertEqual(['vmar_mapgen'], LIST(
            imp['image_import_opts']['image_import_plugins']))
        self.assertEqual(self.state_dir, imp['vmar']['state_dir'])
        self.assertEqual(db_url, imp['vmar_database']['connection'])
        self.assertEqual('admin', imp['inject_metadata_properties'][
            'ignore_user_roles'])

        # Nova: NOVA_CONF only, and no Glance credentials of vmar's in it
        nova = ini(self.nova_conf)
        self.assertEqual({'api_socket': os.path.join(self.sock_dir,
                                                     'api.sock')},
                         dict(nova['vmar_compute']))
        self.assertNotIn('vmar', nova.sections())
        self.assertNotIn('vmar_glance', nova.sections())
        # nova-scheduler (n-sch here): the weigher, beside Nova's own, and
        # the library it reads
        self.assertEqual(['nova.scheduler.weights.all_weighers',
                          'vmar_openstack.nova_scheduler.weigher.VmarWeigher'],
                         LIST(nova['filter_scheduler']['weight_classes']))
        self.assertEqual(db_url, nova['vmar_database']['connection'])
        # nova-api (n-api here): the application with vmar's checks
        self.assertEqual('vmar_openstack.nova_api.wsgi:application',
                         ini(self.nova_uwsgi_conf)['uwsgi']['module'])
        self.assertEqual('qemu', nova['libvirt']['virt_type'])
        self.assertEqual(NOVA_CPU_CONF, read(self.nova_cpu_conf))

    def check_export_running(self):
        self.assertTrue(wait_for(lambda: os.path.exists(self.sock)),
                        'no NBD socket; vmar-export.log:\n%s' % read(
                            os.path.join(self.dest, 'logs',
                                         'vmar-export.log'))[-3000:])
        st = os.stat(self.sock)
        self.assertTrue(stat.S_ISSOCK(st.st_mode))
        self.assertEqual(0o660, stat.S_IMODE(st.st_mode))
        self.assertEqual(grp.getgrnam(SOCKET_GROUP).gr_gid, st.st_gid)
        pid = self.service_pid('vmar-export')
        self.assertTrue(alive(pid))
        with open('/proc/%d/status' % pid) as f:
            uid = re.search(r'^Uid:\s+(\d+)', f.read(), re.M).group(1)
        self.assertEqual('0', uid)
        self.assertEqual(
            {'command': '%s/vmar-export --config-file %s serve'
                        % (BIN_DIR, self.export_conf),
             'group': '', 'user': 'root', 'env': ''},
            self.service_cmd('vmar-export'))
        self.assertTrue(alive(int(read(os.path.join(self.host_dir,
                                                    'qsd.pid')))))
        starts = [e for e in self.record('process.log')
                  if e.startswith('start vmar-export ')]
        self.assertEqual(1, len(starts), starts)
        return pid

    def check_agent_recorded(self):
        # Whether it really runs: TestDevstackAgent.
        self.assertEqual(
            {'command': '%s/vmar-agent --config-file %s'
                        % (BIN_DIR, self.vmar_conf),
             'group': '', 'user': 'root', 'env': ''},
            self.service_cmd('vmar-agent'))

    def check_nova_compute_replaced(self):
        stock = 'start n-cpu %s/nova-compute --config-file %s' % (
            BIN_DIR, self.nova_cpu_conf)
        vmar = 'start n-cpu %s/vmar-nova-compute --config-file %s' % (
            BIN_DIR, self.nova_cpu_conf)
        n_cpu = [e for e in self.record('process.log') if ' n-cpu' in e]
        self.assertEqual([stock, 'stop n-cpu', vmar, 'stop n-cpu', vmar],
                         n_cpu)
        self.assertEqual(LIBVIRT_GROUP, self.service_cmd('n-cpu')['group'])
        # the recorded program is there and starts
        proc = subprocess.run(
            [os.path.join(BIN_DIR, 'vmar-nova-compute'), '--help'],
            capture_output=True, text=True)
        self.assertEqual(0, proc.returncode, proc.stderr[-2000:])
        self.assertIn('--config-file', proc.stdout)

    def check_flavor(self):
        creates = [c for c in self.record('openstack.log')
                   if 'flavor create' in c]
        self.assertEqual(3, len(creates), creates)
        args = self.record('flavors/vmar')
        self.assertEqual('vmar', args[-1])
        self.assertIn('vmar:enabled=true',
                      args[args.index('--property') + 1:])
        args = self.record('flavors/vmar.private')
        self.assertEqual('vmar.private', args[-1])
        self.assertIn('vmar:guest_cache=private', args)
        self.assertIn('vmar:enabled=true', args)
        args = self.record('flavors/vmar.auto')
        self.assertEqual('vmar.auto', args[-1])
        self.assertIn('vmar:guest_cache=auto', args)
        self.assertIn('vmar:enabled=true', args)

    def check_clean(self):
        for path in (self.vmar_conf_dir, self.state_dir, self.sock_dir,
                     self.db_file):
            self.assertFalse(os.path.exists(path), path)
        self.assertEqual(NOVA_CONF, read(self.nova_conf))
        self.assertEqual('nova.wsgi.osapi_compute:application',
                         ini(self.nova_uwsgi_conf)['uwsgi']['module'])
        imp = ini(self.import_conf)
        self.assertEqual([], LIST(
            imp['image_import_opts']['image_import_plugins']))
        self.assertEqual(['image_import_opts', 'inject_metadata_properties'],
                         imp.sections())
        self.assertEqual([], [f for f in os.listdir(self.status)
                              if f.endswith('.pid') and f != 'n-cpu.pid'])
        self.assertEqual([], self.processes_mentioning(
            self.root, self.sock_dir))

    def test_compute_only_node(self):
        # the controller: the database server, Glance and the agent
        self.phase('stack', 'install')
        self.phase('stack', 'post-config')
        marker = str(uuid.uuid4())
        with sqlite3.connect(self.db_file) as db:
            db.execute("INSERT INTO vmar_agent_failures (image_id, event, "
                       "attempts, permanent, last_error, updated_at) VALUES "
                       "(?, 'image.activate', 1, 0, 'marker', "
                       "CURRENT_TIMESTAMP)", (marker,))

        # a compute-only node of the same cloud: no database server, no
        # Glance; devstack points its database URLs at the controller
        root = os.path.join(self.tmp, 'compute')
        env = {k: v.replace(self.root, root) for k, v in self.env.items()}
        env.update(ENABLED_SERVICES='n-cpu,placement-client',
                   SHIM_DB_DIR=os.path.dirname(self.db_file),
                   VMAR_EXPORT_SOCKET=os.path.join(self.sock_dir, 'cpu.sock'))
        for name in ('NOVA_CONF', 'NOVA_CPU_CONF'):
            os.makedirs(os.path.dirname(env[name]), exist_ok=True)
            with open(env[name], 'w') as f:
                f.write(NOVA_CONF)
        host_dir = os.path.join(root, 'opt', 'stack', 'data', 'vmar', 'host')
        self.addCleanup(self._kill_pid_file,
                        os.path.join(host_dir, 'qsd.pid'))
        self.addCleanup(self._kill_pid_file, os.path.join(
            root, 'opt', 'stack', 'status', 'vmar-export.pid'))

        def controller_db_intact():
            with sqlite3.connect(self.db_file) as db:
                rows = db.execute('SELECT last_error FROM vmar_agent_failures'
                                  ' WHERE image_id = ?', (marker,)).fetchall()
            self.assertEqual([('marker',)], rows)

        services = self.bash('source "$VMAR_DIR/devstack/settings"\n'
                             'echo "$ENABLED_SERVICES"', env=env).stdout
        self.assertEqual('n-cpu,placement-client,vmar-export',
                         services.strip())
        for phase in (('stack', 'install'), ('stack', 'post-config'),
                      ('stack', 'extra')):
            self.phase(*phase, env=env)
        controller_db_intact()
        conf = ini(os.path.join(env['VMAR_CONF_DIR'], 'vmar.conf'))
        self.assertNotIn('vmar_database', conf.sections())
        conf = ini(os.path.join(env['VMAR_CONF_DIR'], 'vmar-export.conf'))
        self.assertEqual(host_dir, conf['vmar_host']['host_dir'])
        self.assertNotIn('vmar_host', ini(env['NOVA_CONF']).sections())
        status = os.path.join(root, 'opt', 'stack', 'status')
        self.assertFalse(os.path.exists(os.path.join(status,
                                                     'vmar-agent.cmd')))
        self.assertTrue(wait_for(lambda: os.path.exists(
            env['VMAR_EXPORT_SOCKET'])), 'vmar-export serves no socket')

        self.phase('unstack', env=env)
        self.phase('clean', env=env)
        controller_db_intact()

    def check_peer_tls(self, conf_file, tls_dir, ca_dir, address):
        """[vmar_peers] of an export daemon's file and its credentials."""
        conf = ini(conf_file)
        self.assertEqual({'listen_address': address, 'discover': 'True',
                          'tls_dir': tls_dir}, dict(conf['vmar_peers']))

        def mode(path):
            return stat.S_IMODE(os.stat(path).st_mode)
        self.assertEqual(0o700, mode(tls_dir))
        self.assertEqual(sorted(export_peers.SERVER_FILES + (
            'client-cert.pem', 'client-key.pem')), sorted(os.listdir(
                tls_dir)))
        for name in ('server-key.pem', 'client-key.pem'):
            self.assertEqual(0o600, mode(os.path.join(tls_dir, name)))
        self.assertEqual(read(os.path.join(ca_dir, 'ca-cert.pem')),
                         read(os.path.join(tls_dir, 'ca-cert.pem')))

        def openssl(*args):
            return subprocess.run(['openssl'] + list(args), cwd=tls_dir,
                                  capture_output=True, text=True)
        for role, usage in (('server', 'TLS Web Server Authentication'),
                            ('client', 'TLS Web Client Authentication')):
            proc = openssl('verify', '-CAfile', 'ca-cert.pem',
                           '%s-cert.pem' % role)
            self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)
            text = openssl('x509', '-noout', '-text', '-in',
                           '%s-cert.pem' % role).stdout
            self.assertIn(usage, text)
            self.assertIn('CA:FALSE', text)
        san = openssl('x509', '-noout', '-ext', 'subjectAltName', '-in',
                      'server-cert.pem').stdout
        self.assertEqual(['IP Address:%s' % address],
                         [ln.strip() for ln in san.splitlines()[1:]])
        # the key is the certificate's
        self.assertEqual(
            openssl('pkey', '-pubout', '-in', 'server-key.pem').stdout,
            openssl('x509', '-noout', '-pubkey', '-in',
                    'server-cert.pem').stdout)

        # the daemon reads them: its peer server's command line
        cfg_conf = cfg.ConfigOpts()
        vmar_conf.register_opts(cfg_conf)
        cfg_conf(['--config-file', conf_file], project='vmar',
                 default_config_files=[])
        self.assertTrue(cfg_conf.vmar_peers.discover)
        cmd = export_peers.command(cfg_conf, os.path.join(self.tmp, 'pid'))
        self.assertIn('--tls-certificates=%s' % tls_dir, cmd)
        self.assertEqual(address, cmd[cmd.index('--ipaddr') + 1])

    def test_peers(self):
        # the controller: it makes the CA, and its own certificates
        env = dict(self.env, VMAR_PEERS='True', HOST_IP='192.0.2.10')
        self.phase('stack', 'install', env=env)
        self.phase('stack', 'post-config', env=env)
        tls = os.path.join(self.vmar_conf_dir, 'pki')
        ca = os.path.join(self.dest, 'data', 'vmar-peer-ca')
        self.check_peer_tls(self.export_conf, tls, ca, '192.0.2.10')
        self.assertEqual(0o700, stat.S_IMODE(os.stat(ca).st_mode))
        self.assertEqual(0o600, stat.S_IMODE(os.stat(
            os.path.join(ca, 'ca-key.pem')).st_mode))
        # again: the same CA, new certificates
        ca_cert = read(os.path.join(ca, 'ca-cert.pem'))
        self.phase('stack', 'post-config', env=env)
        self.assertEqual(ca_cert, read(os.path.join(ca, 'ca-cert.pem')))
        self.check_peer_tls(self.export_conf, tls, ca, '192.0.2.10')

        # a compute-only node with the controller's CA directory: its
        # certificates, signed by that CA, for its own address
        root = os.path.join(self.tmp, 'compute')
        cpu = {k: v.replace(self.root, root) for k, v in self.env.items()}
        cpu.update(ENABLED_SERVICES='n-cpu', VMAR_PEERS='True',
                   HOST_IP='192.0.2.11', VMAR_PEER_CA_DIR=ca)
        for name in ('NOVA_CONF', 'NOVA_CPU_CONF'):
            os.makedirs(os.path.dirname(cpu[name]), exist_ok=True)
            with open(cpu[name], 'w') as f:
                f.write(NOVA_CONF)
        self.phase('stack', 'install', env=cpu)
        self.phase('stack', 'post-config', env=cpu)
        self.check_peer_tls(
            os.path.join(cpu['VMAR_CONF_DIR'], 'vmar-export.conf'),
            os.path.join(cpu['VMAR_CONF_DIR'], 'pki'), ca, '192.0.2.11')
        self.assertEqual(ca_cert, read(os.path.join(ca, 'ca-cert.pem')))
        # its clean leaves the controller's CA
        self.phase('unstack', env=cpu)
        self.phase('clean', env=cpu)
        self.assertFalse(os.path.exists(cpu['VMAR_CONF_DIR']))
        self.assertEqual(ca_cert, read(os.path.join(ca, 'ca-cert.pem')))

        # a compute-only node without the CA: it says what it needs
        proc = self.phase('stack', 'post-config', check=False, env=dict(
            cpu, VMAR_PEER_CA_DIR=os.path.join(self.tmp, 'no-ca')))
        self.assertNotEqual(0, proc.returncode)
        self.assertIn('no peer CA in %s' % os.path.join(self.tmp, 'no-ca'),
                      proc.stderr)

        # the controller's clean removes the CA it made
        self.phase('unstack', env=env)
        self.phase('clean', env=env)
        self.assertFalse(os.path.exists(ca))
        self.assertFalse(os.path.exists(self.vmar_conf_dir))

    def test_install_runs_the_build_script(self):
        prefix = os.path.join(self.tmp, 'qemu-prefix')
        os.makedirs(os.path.join(prefix, 'bin'))
        qsd = os.path.join(prefix, 'bin', 'qemu-storage-daemon')
        build = os.path.join(self.tmp, 'build.sh')
        for path, text in (
                (qsd, '#!/bin/sh\n'),
                (build, '#!/bin/sh\necho "build.sh: up to date" >&2\n'
                        'echo "some output"\necho %s\n' % prefix)):
            with open(path, 'w') as f:
                f.write(text)
            os.chmod(path, 0o755)
        env = dict(self.env, VMAR_QEMU_PREFIX='', VMAR_QEMU_BUILD=build)
        self.phase('stack', 'install', env=env)
        self.assertEqual(prefix + '\n', read(os.path.join(
            self.vmar_conf_dir, 'qemu-prefix')))

        with open(build, 'a') as f:
            f.write('exit 3\n')
        proc = self.phase('stack', 'install', env=env, check=False)
        self.assertNotEqual(0, proc.returncode)
        self.assertIn('build.sh failed', proc.stderr)

    def test_glance_list_options(self):
        lib = 'source "$VMAR_DIR/devstack/settings"\n' \
              'source "$VMAR_DIR/devstack/lib/vmar"\n'
        cases = [
            ('[]', ['vmar_mapgen'], []),
            ("['image_conversion', 'inject_image_metadata']",
             ['image_conversion', 'inject_image_metadata', 'vmar_mapgen'],
             ['image_conversion', 'inject_image_metadata']),
            ('[image_conversion,vmar_mapgen]',
             ['image_conversion', 'vmar_mapgen'], ['image_conversion']),
            (None, ['vmar_mapgen'], []),
        ]
        # A one-letter file that ['vmar_mapgen'] matches as a glob: the
        # shim's iniget/iniset expand like devstack's, the plugin must not.
        with open(os.path.join(self.tmp, 'v'), 'w'):
            pass
        for value, added, removed in cases:
            with open(self.import_conf, 'w') as f:
                f.write('[image_import_opts]\n')
                if value is not None:
                    f.write('image_import_plugins = %s\n' % value)
            for action, want in (('add', added), ('add', added),
                                 ('remove', removed)):
                self.bash(lib + 'cd "$TMP"\n_vmar_list_option "$@"',
                          action, self.import_conf, 'image_import_opts',
                          'image_import_plugins', 'vmar_mapgen',
                          env=dict(self.env, TMP=self.tmp))
                self.assertEqual(want, LIST(ini(self.import_conf)[
                    'image_import_opts']['image_import_plugins']),
                    (value, action))

        # enabled_import_methods unset: Glance's default has both methods
        with open(self.glance_api_conf, 'w') as f:
            f.write('[DEFAULT]\ndebug = True\n')
        with open(os.path.join(self.tmp, 'vmar.conf'), 'w') as f:
            f.write('[vmar_database]\nconnection = sqlite:///x\n')
        self.bash(lib + 'configure_vmar_glance',
                  env=dict(self.env, VMAR_CONF=os.path.join(self.tmp,
                                                            'vmar.conf')))
        api = ini(self.glance_api_conf)
        self.assertNotIn('enabled_import_methods', api['DEFAULT'])
        self.assertEqual('messagingv2',
                         api['oslo_messaging_notifications']['driver'])
        self.assertEqual('sqlite:///x', ini(self.import_conf)[
            'vmar_database']['connection'])


class TestDevstackAgent(DevstackTestCase):

    def test_vmar_agent_runs(self):
        agent = os.path.join(BIN_DIR, 'vmar-agent')
        if not os.access(agent, os.X_OK):
            self.skipTest('%s does not exist yet: the plugin starts it with '
                          'run_process vmar-agent (its command line is '
                          'checked by TestDevstackPlugin.test_lifecycle), '
                          'but whether it runs cannot be checked' % agent)
        self.env['ENABLED_SERVICES'] = 'rabbit,mysql,g-api'
        for phase in (('stack', 'install'), ('stack', 'post-config'),
                      ('stack', 'extra')):
            self.phase(*phase)
        pid = self.service_pid('vmar-agent')
        log = os.path.join(self.dest, 'logs', 'vmar-agent.log')
        # the event: the agent took its configuration, library and Glance
        # client and turns to its transport (the shim runs no RabbitMQ:
        # it never gets to listen here, and retries)
        self.assertTrue(
            wait_for(lambda: 'vmar-agent connecting' in read(log)
                     if os.path.exists(log) else False, 60),
            'vmar-agent did not get to its transport; its log:\n%s'
            % (read(log)[-3000:] if os.path.exists(log) else '(none)'))
        self.assertTrue(alive(pid), 'vmar-agent exited; its log:\n%s'
                        % read(log)[-3000:])
        self.phase('unstack')
        self.assertTrue(wait_for(lambda: not alive(pid), 10),
                        'vmar-agent still runs after unstack')
        self.phase('clean')
        self.assertEqual([], self.processes_mentioning(self.root,
                                                       self.sock_dir))
