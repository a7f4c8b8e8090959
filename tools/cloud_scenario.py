"""The user's path through a tools/cloud.sh cloud, with the openstack CLI.

What a tenant and an operator do with vmar-openstack, in order (issue 14,
part 3): upload images (``--file`` and ``--import``) and see their maps
published; create flavors (a bogus ``vmar:`` spec is refused); boot vmar
and plain servers with ``--nic none`` to the ``VMAR-BOOTED`` marker of
the image library (doc/source/reference/images.rst); run the lifecycle
operations on a vmar server; restart nova-compute under Nova's image cache
manager; kill the export daemon; delete an image other maps point into; delete
everything and check that nothing vmar owns is left.

Each step prints what it did and raises :class:`ScenarioError` when what
it checks does not hold. ``tests/functional/test_cloud.py`` runs every
step; ``tools/cloud-demo.sh`` runs them against ``tools/cloud.sh up`` and
prints the timing figure (``server create`` to ``VMAR-BOOTED``, a vmar
server against a plain one from the same image).

Usage: python -m tools.cloud_scenario [--state-dir DIR] [--keep]
"""

import argparse
import configparser
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

from tools.cloud import config
from tools.cloud import stack
from tools import memhog
from tools.vmarenv import qemu_env

MARKER = re.compile(r'VMAR-BOOTED (\S+) ([0-9]+\.[0-9]+)')
BOOT_TIMEOUT = 600       # TCG, two cores, other guests booting
IDLE = 60                # seconds the host idles before metadata_warm
FLAVOR_VMAR = 'vmar.small'
FLAVOR_PLAIN = 'plain.small'
FLAVOR_PRIVATE = 'vmar.private'
FLAVOR_AUTO = 'vmar.auto'
# what vm-p's host-side figure must reach: half the base data the probe
# alone drops (16 MiB), which nothing in the guest refills
RETURNED_MIN = 8 << 20
# tools/vmar-test-probe's report on a guest-private server
PROBE = re.compile(r'VMAR-PROBE ((?:\w+=\d+ ?)+)')
VMAR_PREFIX = ('vmar-map-',)


def _args(pid):
    """A process's command line, cut short, for a failure's message."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read(200).replace(b'\0', b' ').decode(errors='replace')
    except (OSError, TypeError) as e:
        return 'unknown (%s)' % e


class ScenarioError(AssertionError):
    pass


def check(condition, message, *args):
    if not condition:
        raise ScenarioError(message % args if args else message)


class CLI(object):
    """The ``openstack`` command with an openrc's environment.

    What a user does goes through the command. What the scenario only
    watches (a server's status, its console log, polled every few
    seconds) goes through one openstacksdk connection of the same
    credentials (:attr:`sdk`): a command is a new Python process and a new
    Keystone token each time, about 1.5 s of CPU, and the polls of the
    cloud's user path were a seventh of the test run's work.
    """

    def __init__(self, openrc, bin_dir=None):
        self.bin = os.path.join(bin_dir or os.path.dirname(sys.executable),
                                'openstack')
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith('OS_')}
        with open(openrc) as f:
            for line in f:
                line = line.strip()
                if line.startswith('export '):
                    key, value = line[len('export '):].split('=', 1)
                    self.env[key] = value.strip('\'"')

    def connect(self, **kw):
        """An openstacksdk connection with the openrc's credentials.

        ``kw``: more of ``openstack.connect``'s options (an API version).
        """
        import openstack
        e = self.env
        return openstack.connect(
            load_envvars=False, auth_url=e['OS_AUTH_URL'],
            username=e['OS_USERNAME'], password=e['OS_PASSWORD'],
            project_name=e['OS_PROJECT_NAME'],
            user_domain_name=e.get('OS_USER_DOMAIN_NAME', 'Default'),
            project_domain_name=e.get('OS_PROJECT_DOMAIN_NAME', 'Default'),
            region_name=e.get('OS_REGION_NAME'),
            interface=e.get('OS_INTERFACE', 'public'), **kw)

    @functools.cached_property
    def sdk(self):
        """The connection the scenario watches servers through."""
        return self.connect()

    def state(self, name):
        """A server's (status, task state, fault), as ``server show``."""
        sdk = self.sdk
        s = sdk.compute.get_server(
            sdk.compute.find_server(name, ignore_missing=False))
        return s.status, s.task_state, s.fault

    def hidden_images(self):
        """The hidden images, as ``image list --hidden``, with properties."""
        return list(self.sdk.image.images(is_hidden=True))

    def console(self, name):
        """The console log (``console log show``); None if it has none.

        None while Nova answers that the server has no console or is not
        ready (off, shelved, building); other errors raise.
        """
        import openstack
        sdk = self.sdk
        try:
            return sdk.compute.get_server_console_output(
                sdk.compute.find_server(name, ignore_missing=False)
            )['output'] or ''
        except openstack.exceptions.HttpException as e:
            if ('does not have a console' in str(e)
                    or 'is not ready' in str(e)):
                return None
            raise ScenarioError('console log of %s: %s' % (name, e))

    def run(self, *args, check_rc=True, timeout=900):
        result = subprocess.run([self.bin] + list(args), env=self.env,
                                capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=timeout)
        if check_rc and result.returncode:
            raise ScenarioError('openstack %s failed (%d):\n%s%s' % (
                ' '.join(args), result.returncode, result.stdout,
                result.stderr))
        return result

    def json(self, *args):
        return json.loads(self.run(*(args + ('-f', 'json'))).stdout)

    def value(self, *args):
        return self.run(*(args + ('-f', 'value'))).stdout.strip()


class Scenario(object):
    """What every scenario on a cloud of tools/cloud.sh waits for.

    A scenario is its ``STEPS``, methods run in order by :meth:`run`, each
    named on the output by the first line of its docstring.
    """

    STEPS = ()
    TIMEOUT = BOOT_TIMEOUT

    def __init__(self, state_dir, openrc, echo=print):
        self.cloud = config.Cloud(state_dir)
        self.cloud.load()
        self.os = CLI(openrc)
        self.echo = echo
        self.figures = {}

    def wait(self, what, probe, timeout=None, interval=2, left=None):
        """Poll ``probe`` until it is true; ``left()`` says what is not."""
        deadline = time.monotonic() + (timeout or self.TIMEOUT)
        while True:
            result = probe()
            if result:
                return result
            if time.monotonic() > deadline:
                raise ScenarioError('timed out after %d s waiting for %s%s'
                                    % (timeout or self.TIMEOUT, what,
                                       '; left: %s' % left() if left
                                       else ''))
            time.sleep(interval)

    def server(self, name):
        return self.os.json('server', 'show', name)

    def wait_status(self, name, status, timeout=None):
        """Wait for ``status`` with no task; ``server show`` then."""
        def probe():
            now, task, fault = self.os.state(name)
            if now == 'ERROR':
                raise ScenarioError('server %s went to ERROR: %s'
                                    % (name, fault))
            return now == status and not task
        self.wait('server %s %s' % (name, status), probe, timeout)
        return self.server(name)

    def console(self, name):
        """The console log; '' while the server has none (off, shelved)."""
        return self.os.console(name) or ''

    def run(self, steps=None):
        """Run ``steps`` (default: all), timing each; the figures."""
        for step in steps or self.STEPS:
            t0 = time.monotonic()
            self.echo('== %s' % getattr(self, step).__doc__.split('\n')[0])
            getattr(self, step)()
            self.figures['step_' + step] = time.monotonic() - t0
        return self.figures

    @classmethod
    def main(cls, argv, prog, args=tuple):
        """The command line of a scenario: ``cls(state, openrc, *args())``.

        ``args`` is called once the command line is parsed (it may build
        what the scenario needs).
        """
        parser = argparse.ArgumentParser(prog=prog)
        parser.add_argument('--state-dir')
        parser.add_argument('--openrc')
        parser.add_argument('--steps', nargs='*', default=cls.STEPS)
        opts = parser.parse_args(argv)
        cloud = config.Cloud(opts.state_dir)
        scenario = cls(cloud.state_dir, opts.openrc or cloud.path('openrc'),
                       *args(), echo=lambda text: print(text, flush=True))
        try:
            figures = scenario.run(opts.steps)
        except ScenarioError as e:
            print('FAILED: %s' % e, file=sys.stderr)
            return 1
        print(json.dumps(figures, indent=1, sort_keys=True))
        return 0


class UserPath(Scenario):
    """The steps, sharing one cloud (``state_dir``) and its CLI."""

    # guest_auto's watermark, under what the host has free: wide enough
    # that the other work of the host (CI runs other tests beside this
    # one) does not cross it before the test takes the memory itself
    WATERMARK_MARGIN = 3 << 30

    def __init__(self, state_dir, openrc, images, echo=print):
        super().__init__(state_dir, openrc, echo)
        self.images = images            # library name -> raw file
        self.ids = {}                   # Glance name -> id
        self.host_dir = self.cloud.path('vmar', 'host')

    # -- helpers ----------------------------------------------------------

    def wait_booted(self, name, image, since=''):
        """Wait for a VMAR-BOOTED that ``since`` (a console log) lacks.

        Some operations append to the console log (soft reboot), others
        start a new one (hard reboot, rebuild, unshelve): a marker counts
        when it is past ``since`` in the same log, or anywhere in a log
        that no longer starts with ``since``. Returns its seconds.
        """
        seen = ['']

        def probe():
            log = seen[0] = self.console(name)
            if since and log.startswith(since):
                log = log[len(since):]
            m = MARKER.search(log)
            return m and (m.group(1), float(m.group(2)))
        try:
            found = self.wait('VMAR-BOOTED on %s' % name, probe)
        except ScenarioError as e:
            # what the guest got to, and where its domain is
            tail = '\n'.join(seen[0].splitlines()[-25:])
            raise ScenarioError('%s; the console log ends:\n%s\n%s' % (
                e, tail or '(empty)', self._domain_state(name)))
        check(found[0] == image, '%s booted %s, not %s', name, found[0],
              image)
        return found[1]

    def _domain_state(self, name):
        """virsh's view of a server's domain, for a failure's message."""
        try:
            dom = self.domain(name)
            return 'its domain %s: %s' % (
                dom, self.virsh('domstate', '--reason', dom).strip())
        except Exception as e:
            return 'its domain: unknown (%s)' % e

    def map_images(self, of=None):
        """Hidden map images in Glance, {id: properties}.

        One listing, which carries each image's properties: a listing and
        then a ``show`` per image raced the agents' deletes.
        """
        found = {}
        for img in self.os.hidden_images():
            p = img.properties or {}
            if (img.name or '').startswith(VMAR_PREFIX) and (
                    of is None or p.get('vmar_map_of') == of):
                found[img.id] = p
        return found

    def wait_map(self, name):
        image_id = self.ids[name]

        def probe():
            maps = self.map_images(of=image_id)
            return maps and sorted(int(p['vmar_map_version'])
                                   for p in maps.values())
        versions = self.wait('the map of %s' % name, probe)
        self.echo('  %s (%s): map v%s published' % (
            name, image_id, versions[-1]))
        return versions[-1]

    def compute_log(self, since=None):
        """nova-compute's log: its size now, or its text after ``since``."""
        log = os.path.join(self.cloud.log_dir, 'nova-compute.log')
        if since is None:
            return os.path.getsize(log)
        with open(log, errors='replace') as f:
            f.seek(since)
            return f.read()

    def virsh(self, *args):
        return subprocess.run(
            ['virsh', '-c', self.cloud.libvirt_uri] + list(args),
            capture_output=True, text=True, check=True).stdout

    def domain(self, name):
        return self.server(name)['OS-EXT-SRV-ATTR:instance_name']

    def export_pin(self, name):
        """The export name a vmar server's overlay reads."""
        disk = os.path.join(self.cloud.path('nova', 'instances'),
                            self.server(name)['id'], 'disk')
        info = json.loads(subprocess.run(
            ['qemu-img', 'info', '-U', '--output=json', disk],
            capture_output=True, text=True, check=True).stdout)
        return info.get('backing-filename', '')

    def export_matches(self, server, image):
        """The export ``server`` reads is, byte for byte, ``image``."""
        uri = self.export_pin(server)
        r = subprocess.run(['qemu-img', 'compare', '-f', 'raw', '-F', 'raw',
                            uri, self.images[image]], capture_output=True,
                           text=True)
        check(r.returncode == 0, 'the export of %s (%s) differs from %s: %s',
              server, uri, image, r.stdout + r.stderr)

    # -- the steps --------------------------------------------------------

    def upload(self):
        """Three images, two with --file and one with --import."""
        for name, how in (('minbase', '--file'), ('python3', '--file'),
                          ('nginx', '--import')):
            # every image of the library carries vmar-guest
            args = ['image', 'create', '--disk-format', 'raw',
                    '--container-format', 'bare', '--property',
                    'vmar_guest=1', '--file', self.images[name], name]
            if how == '--import':
                args.insert(2, '--import')
            self.ids[name] = self.os.json(*args)['id']
            self.echo('  %s %s -> %s' % (how, name, self.ids[name]))
        for name in ('minbase', 'python3', 'nginx'):
            self.wait_status_image(name)
            self.wait_map(name)

    def wait_status_image(self, name):
        self.wait('image %s active' % name, lambda: self.os.value(
            'image', 'show', '-c', 'status', name) == 'active')

    def flavors(self):
        """A vmar flavor and a plain one; a bogus vmar: spec is refused."""
        specs = self.os.value(
            'flavor', 'create', '--vcpus', '1', '--ram', '512', '--disk',
            '2', '--property', 'vmar:enabled=true', FLAVOR_VMAR, '-c',
            'properties')
        check('vmar:enabled' in specs, 'flavor properties: %s', specs)
        self.os.run('flavor', 'create', '--vcpus', '1', '--ram', '512',
                    '--disk', '2', FLAVOR_PLAIN)
        self.os.run('flavor', 'create', '--vcpus', '1', '--ram', '512',
                    '--disk', '2', '--property', 'vmar:enabled=true',
                    '--property', 'vmar:guest_cache=private', FLAVOR_PRIVATE)
        self.os.run('flavor', 'create', '--vcpus', '1', '--ram', '512',
                    '--disk', '2', '--property', 'vmar:enabled=true',
                    '--property', 'vmar:guest_cache=auto', FLAVOR_AUTO)
        r = self.os.run('--os-compute-api-version', '2.86', 'flavor', 'set',
                        '--property', 'vmar:bogus=1', FLAVOR_VMAR,
                        check_rc=False)
        check(r.returncode != 0 and '400' in r.stderr,
              'vmar:bogus=1 was not refused with HTTP 400: %s', r.stderr)
        specs = self.os.value('flavor', 'show', FLAVOR_VMAR, '-c',
                              'properties')
        check('bogus' not in specs, 'the bogus spec was stored: %s', specs)
        self.echo('  %s, %s; vmar:bogus=1 refused: %s' % (
            FLAVOR_VMAR, FLAVOR_PLAIN, r.stderr.strip().splitlines()[-1]))

    def create(self, name, flavor, image):
        t0 = time.monotonic()
        self.os.run('server', 'create', '--flavor', flavor, '--image',
                    image, '--nic', 'none', name)
        return t0

    def boot(self):
        """Two vmar servers from two images, one plain, to VMAR-BOOTED."""
        from vmar_openstack import names as vnames
        plan = (('vm-a', FLAVOR_VMAR, 'minbase'),
                ('vm-b', FLAVOR_VMAR, 'python3'),
                ('plain', FLAVOR_PLAIN, 'minbase'))
        started = {n: self.create(n, f, i) for n, f, i in plan}
        for name, _f, image in plan:
            self.wait_status(name, 'ACTIVE')
            self.wait_booted(name, image)
            took = time.monotonic() - started[name]
            self.figures['create_to_booted_' + name] = took
            self.echo('  %s (%s): ACTIVE, VMAR-BOOTED %.1f s after server '
                      'create' % (name, image, took))
        self.echo('  vmar/plain create-to-VMAR-BOOTED ratio (minbase): '
                  '%.2f' % (self.figures['create_to_booted_vm-a']
                            / self.figures['create_to_booted_plain']))
        for name in ('vm-a', 'vm-b'):
            pin = self.export_pin(name)
            check(pin.startswith('nbd+unix:///') and
                  self.cloud.export_socket in pin,
                  '%s does not read a vmar export: %r', name, pin)
            parsed = vnames.parse_nbd_uri(pin)
            export = parsed and vnames.parse_export(parsed[0])
            check(export is not None and export.key is not None,
                  '%s reads an export without its own key: %r', name, pin)
        plain = self.export_pin('plain')
        check(os.path.join('instances', '_base') in plain,
              'the plain server is not on the stock backend: %r', plain)

    def page_cache(self):
        """vm-b's shared blocks are read from minbase's pages, not its own.

        The host holds each base (a lazy mirror, or a whole copy) and
        wrote what it fetched through the page cache; so empty it of the
        bases, boot both vmar servers again (hard reboot) and count what
        their boots brought back.
        """
        from vmar_openstack.host.cache import pagecache
        from vmar_openstack import mapformat
        own, bases = {}, {}
        for name in ('minbase', 'python3'):
            maps = sorted(e for e in os.listdir(os.path.join(
                self.host_dir, 'maps')) if e.startswith(self.ids[name]))
            bmap = mapformat.read(os.path.join(self.host_dir, 'maps',
                                               maps[-1]))
            selfs = [i for i, t in enumerate(bmap.targets) if t.is_self]
            ext = bmap.extents
            own[name] = int(ext['length'][
                [t in selfs for t in ext['target']]].sum()) * \
                bmap.block_size
            bases[name] = self._base_file(self.ids[name])
        servers = (('vm-a', 'minbase'), ('vm-b', 'python3'))
        seen = {n: self.console(n) for n, _i in servers}
        for path in bases.values():
            pagecache.evict(path)
        for name, _image in servers:
            self.os.run('server', 'reboot', '--hard', name)
        for name, image in servers:
            self.wait_status(name, 'ACTIVE')
            self.wait_booted(name, image, since=seen[name])
        cached = pagecache.resident_bytes(bases.values())
        for name in own:
            self.echo('  %s base: %.1f MiB cached after the boots, %.1f MiB '
                      'its map serves from it' % (
                          name, cached[bases[name]] / 2**20,
                          own[name] / 2**20))
        self.figures['page_cache'] = {n: (cached[bases[n]], own[n])
                                      for n in own}
        self.booted_at = time.monotonic()
        # Both boots read nearly the same blocks (kernel, initramfs,
        # systemd, libc): without VMAR each base would hold about as much
        # as the other. Through VMAR, vm-b's reads of shared blocks land
        # in minbase's base, and its own base holds only what python3
        # alone has (read-ahead included: both bases are read the same
        # way).
        check(cached[bases['python3']] <= own['python3'],
              'python3 base: more cached than its map serves from it')
        check(cached[bases['python3']] * 4 < cached[bases['minbase']],
              'python3 base holds %d bytes, minbase %d: shared blocks are '
              'cached twice', cached[bases['python3']],
              cached[bases['minbase']])

    def metadata_warm(self):
        """The host keeps the metadata of its servers' images in memory.

        vm-a and vm-b have idled for a minute at least since their last
        boots (page_cache), through guest_auto's memory pressure (reclaim
        pages out what was not touched for 60 s, where it runs): the
        export daemon holds the file-system metadata their boots brought
        into their bases' mirrors locked in the page cache
        (doc/source/admin/export.rst, "Metadata kept warm"), and evicting the
        bases leaves it there.
        """
        from vmar_openstack.host.cache import pagecache
        time.sleep(max(0.0, self.booted_at + IDLE - time.monotonic()))
        warm = self.export_status()['warm']
        check(warm and warm['locked_bytes'] > 0 and warm['error'] == '',
              'no metadata kept warm: %s', warm)
        check(not warm['without_layout'], 'the host has no block layout '
              'of %s', warm['without_layout'])
        for name in ('minbase', 'python3'):
            image = self.ids[name]
            check(warm['bases'].get(image, 0) > 0, '%s: none of its '
                  'metadata locked: %s', name, warm)
            base = self._base_file(image)
            pagecache.evict(base)
            left = pagecache.resident_bytes([base])[base]
            check(left >= warm['bases'][image], '%s: %d bytes of its base '
                  'cached after eviction, %d locked', name, left,
                  warm['bases'][image])
            self.echo('  %s: %.1f MiB of metadata locked; %.1f MiB of its '
                      'base still cached after eviction' % (
                          name, warm['bases'][image] / 2**20,
                          left / 2**20))
        self.figures['metadata_warm'] = warm

    def boot_one(self, name, flavor, image):
        """Boot a server to its marker; its domain XML."""
        self.create(name, flavor, image)
        self.wait_status(name, 'ACTIVE')
        self.wait_booted(name, image)
        return self.virsh('dumpxml', self.domain(name))

    def guest_private(self):
        """A guest-private server keeps its private data, not base data.

        vm-p boots minbase with vmar:guest_cache=private. The image's test
        probe reads 16 MiB of base files and 8 MiB written after boot,
        waits for vmar-guest's grace period and reports what the guest's
        page cache holds of each.
        """
        xml = self.boot_one('vm-p', FLAVOR_PRIVATE, 'minbase')
        check("<entry>vmar:guest_cache=private</entry>" in xml,
              'vm-p has no vmar:guest_cache OEM string: %s', xml)
        check(re.search(r"<memballoon model='virtio'[^>]*"
                        r"freePageReporting='on'", xml),
              'vm-p has no reporting virtio balloon: %s', xml)
        check('<vmar:guest-component>image</vmar:guest-component>' in xml,
              'vm-p metadata does not say the image carries vmar-guest')

        def probe():
            m = PROBE.search(self.console('vm-p'))
            return m and {k: int(v) for k, v in
                          (kv.split('=') for kv in m.group(1).split())}
        r = self.wait('VMAR-PROBE on vm-p', probe)
        self.echo('  vm-p: base %(base)d bytes read, %(base_cached_before)d '
                  'cached after the read, %(base_cached_after)d after %('
                  'waited)d s; private %(private)d bytes, %(private_cached)d '
                  'cached' % r)
        self.figures['guest_private'] = r
        check(r['base_cached_before'] >= r['base'] // 2,
              'the probe\'s read did not cache base data: %s', r)
        check(r['base_cached_after'] <= r['base'] // 20,
              'vm-p still caches base data: %s; %s', r,
              self._guest_said('vm-p'))
        check(r['private_cached'] >= r['private'] * 9 // 10,
              'vm-p dropped its private data: %s', r)
        check('vmar-guest: the host did not ask' in self.console('vm-a'),
              'vmar-guest on vm-a (not guest-private) did not stand down')
        features = self._balloon(self.domain('vm-p'))
        check('VIRTIO_BALLOON_F_REPORTING' in features,
              'vm-p\'s balloon driver did not take free page reporting: '
              '%s', features)
        self.echo('  vm-p: the guest\'s balloon driver is ready with %s'
                  % ', '.join(sorted(features)))

        # the host's side: what vmar-guest freed came back to the host
        seen = {}

        def returned():
            g = seen['view'] = self.guest_view('vm-p')
            return (g and g['mode'] == 'private' and
                    (g['returned_bytes'] or 0) >= RETURNED_MIN and g)
        try:
            g = self.wait('vm-p\'s QEMU to give back %d MiB' % (
                RETURNED_MIN >> 20), returned, timeout=180)
        except ScenarioError as e:
            view = seen.get('view') or {}
            raise ScenarioError('%s; the daemon\'s last view of vm-p: %s; '
                                'its qemu_pid runs %r; %s' % (
                                    e, view, _args(view.get('qemu_pid')),
                                    self._guest_said('vm-p')))
        self.echo('  vm-p: the host got %d MiB back (guest RAM it holds '
                  '%d MiB now); vmar-guest dropped %d MiB, reporting order '
                  '%s' % (g['returned_bytes'] >> 20, g['resident_bytes'] >> 20,
                          g['dropped_bytes'] >> 20, g['reporting_order']))
        self.figures['guest_private_returned'] = g
        self.os.run('server', 'delete', '--wait', 'vm-p')

    def _guest_said(self, name):
        """What vmar-guest and the channel said, for a failure's message.

        The guest's vmar-guest lines on its console, and the export
        daemon's log lines of the server's channel.
        """
        # its own lines and the probe's VMAR-GUEST (its status file)
        said = [ln for ln in self.console(name).splitlines()
                if 'vmar-guest' in ln.lower()]
        inst = self.server(name)['id']
        log = self.cloud.path('log', 'vmar-export.log')
        try:
            with open(log, errors='replace') as f:
                daemon = [ln for ln in f if inst in ln]
        except OSError as e:
            daemon = ['(%s)' % e]
        return ('vmar-guest on the console: %s; the daemon of its channel: '
                '%s' % (said[-10:], [ln.strip() for ln in daemon[-10:]]))

    def guest_thresholds(self, **values):
        """Set the daemon's [vmar_guest_cache] options, and SIGHUP it.

        As an operator would: edit vmar-export.conf and signal the daemon,
        which takes new values of mutable options without a restart. A
        value of None takes the option out again (its default).
        """
        path = self.cloud.etc('vmar', 'vmar-export.conf')
        with open(path) as f:
            lines = [x for x in f
                     if x.split(' = ', 1)[0] not in values]
        at = lines.index('[vmar_guest_cache]\n') + 1
        for name, value in sorted(values.items()):
            if value is not None:
                lines.insert(at, '%s = %s\n' % (name, value))
        with open(path, 'w') as f:
            f.writelines(lines)
        # vmar-export serve itself: its qemu-storage-daemon would quit
        for pid in {s.name: s for s in stack.services(self.cloud)}[
                'vmar-export'].pids():
            with open('/proc/%d/cmdline' % pid, 'rb') as f:
                argv = f.read().split(b'\0')
            if any(a.endswith(b'vmar-export') for a in argv) and \
                    b'serve' in argv:
                os.kill(pid, signal.SIGHUP)
                return
        raise ScenarioError('no vmar-export serve to signal')

    def export_status(self):
        """``vmar-export status --json`` of the compute host."""
        return json.loads(subprocess.run(
            [self.cloud.bin('vmar-export'), '--config-file',
             self.cloud.etc('vmar', 'vmar-export.conf'), 'status', '--json'],
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
            timeout=120, check=True).stdout)

    def guest_view(self, name):
        """The daemon's view of a server's guest (its guest channel)."""
        uuid_ = self.server(name)['id']
        gc = self.export_status().get('guest_cache') or {}
        for g in gc.get('guests', ()):
            if g['instance'] == uuid_:
                return g
        return None

    def guest_auto(self):
        """An auto server turns guest-private under memory pressure, and back.

        vm-auto boots minbase with vmar:guest_cache=auto: vmar-guest waits
        on its channel in the guest's own caching. The operator sets the
        export daemon's watermark ([vmar_guest_cache] min_available_mb)
        WATERMARK_MARGIN under what the host has free and sends the daemon
        SIGHUP
        (the option is mutable); the test then takes the host's memory
        for real (tools/memhog.py) until MemAvailable is under it, and
        the daemon must turn the guest private; once the memory is back
        and calm_seconds passed, back to its own caching.

        For the step the watermark alone decides: the operator also sets
        pressure_high and pressure_low to 100. /proc/pressure/memory is
        the whole machine's, which CI shares with its other chains, and
        their global reclaim has raised it over the default 10 % before
        this step took any memory (the daemon then rightly turned vm-auto
        private). tests/functional/test_guest_channel.py covers the PSI
        thresholds.
        """
        self.guest_thresholds(pressure_high=100, pressure_low=100)
        try:
            self._guest_auto()
        finally:
            self.guest_thresholds(pressure_high=None, pressure_low=None,
                                  min_available_mb=None)

    def _host_sample(self):
        st = self.export_status()['guest_cache']
        return 'the host: memory pressure %s %%, MemAvailable %s MiB' % (
            st['some_avg10'], None if st['available_bytes'] is None
            else st['available_bytes'] >> 20)

    def _guest_auto(self):
        xml = self.boot_one('vm-auto', FLAVOR_AUTO, 'minbase')
        check('<entry>vmar:guest_cache=auto</entry>' in xml,
              'vm-auto has no vmar:guest_cache=auto OEM string: %s', xml)
        check("name='org.opendev.vmar.guest.0'" in xml,
              'vm-auto has no guest channel: %s', xml)

        def in_mode(mode, switches):
            def probe():
                g = self.guest_view('vm-auto')
                return (g and g['mode'] == mode and
                        g['switches'] >= switches and g)
            return probe
        try:
            g = self.wait('vm-auto\'s guest to report its own caching',
                          in_mode('default', 0), timeout=120)
        except ScenarioError as e:
            raise ScenarioError('%s; the daemon\'s view: %s; %s' % (
                e, self.guest_view('vm-auto'), self._guest_said('vm-auto')))
        check(g['wanted'] == 'default' and g['switches'] == 0,
              'vm-auto was switched before any pressure: %s; %s', g,
              self._host_sample())
        watermark = memhog.mem_available() - self.WATERMARK_MARGIN
        self.guest_thresholds(min_available_mb=watermark >> 20)
        try:
            time.sleep(10)              # two of the daemon's steps
            g = self.guest_view('vm-auto')
            check(g['wanted'] == 'default', 'vm-auto was asked for %s '
                  'before any pressure: %s; %s', g['wanted'], g,
                  self._host_sample())
            hog = memhog.mem_available() - watermark + (512 << 20)
            t0 = time.monotonic()
            with memhog.MemoryHog(hog):
                g = self.wait('vm-auto to turn guest-private under '
                              'pressure', in_mode('private', 1), timeout=180)
                took = time.monotonic() - t0
                st = self.export_status()['guest_cache']
            check(g['reason'] == 'host', 'vm-auto went private for %s, '
                  'not for the host\'s memory: %s', g['reason'], g)
            self.echo('  vm-auto: guest-private %.0f s after %d MiB were '
                      'taken (MemAvailable %d MiB, under the watermark of %d '
                      'MiB)' % (took, hog >> 20, st['available_bytes'] >> 20,
                                watermark >> 20))
            t0 = time.monotonic()
            g = self.wait('vm-auto to leave guest-private once calm',
                          in_mode('default', 2), timeout=300)
        finally:
            self.guest_thresholds(min_available_mb=None)
        self.echo('  vm-auto: back to its own caching %.0f s after the '
                  'pressure ended; %d switches, vmar-guest dropped %d MiB '
                  'meanwhile' % (time.monotonic() - t0, g['switches'],
                                 g['dropped_bytes'] >> 20))
        check(g['reporting_order'] != 0,
              'vm-auto left guest-private with the reporting order still '
              'lowered: %s', g)
        self.figures['guest_auto'] = g
        self.os.run('server', 'delete', '--wait', 'vm-auto')

    def _balloon(self, domain):
        """The features a domain's guest driver took of its virtio balloon.

        Empty if no driver is ready (QMP x-query-virtio-status).
        """
        def qmp(command, **arguments):
            return json.loads(self.virsh(
                'qemu-monitor-command', domain, json.dumps(
                    dict(execute=command, arguments=arguments)
                    if arguments else dict(execute=command))))['return']
        paths = [d['path'] for d in qmp('x-query-virtio')
                 if d['name'] == 'virtio-balloon']
        check(paths, 'no virtio balloon in QEMU of %s', domain)
        status = qmp('x-query-virtio-status', path=paths[0])
        if not any(s.startswith('VIRTIO_CONFIG_S_DRIVER_OK')
                   for s in status['status']['statuses']):
            return set()
        return {f.split(':')[0]
                for f in status['guest-features']['dev-features']}

    def _op(self, name, image, *args, status='ACTIVE', boots=True):
        """``server ARGS... NAME``, waited for (and for its boot)."""
        t0 = time.monotonic()
        before = self.console(name)
        self.os.run('server', *args, name)
        self.wait_status(name, status)
        if boots:
            self.wait_booted(name, image, since=before)
        self.echo('  %-24s %-17s %.1f s' % (
            ' '.join(args), status, time.monotonic() - t0))

    def lifecycle(self, name='vm-a', image='minbase'):
        """Power operations, a live snapshot and shelve on a vmar server."""
        def op(*args, **kwargs):
            self._op(name, image, *args, **kwargs)
        # stop and soft reboot: the guest shuts down on the ACPI power
        # button, and nova-compute does not fall back to powering it off
        size = self.compute_log()
        op('stop', status='SHUTOFF', boots=False)
        check('Instance shutdown successfully after' in
              self.compute_log(size),
              'the guest did not shut down by itself on stop')
        op('start')
        size = self.compute_log()
        op('reboot', '--soft')
        tail = self.compute_log(size)
        check('Instance soft rebooted successfully' in tail
              and 'Failed to soft reboot' not in tail,
              'the soft reboot was not soft (nova-compute fell back to a '
              'hard reboot)')
        op('pause', status='PAUSED', boots=False)
        op('unpause', boots=False)
        op('suspend', status='SUSPENDED', boots=False)
        op('resume', boots=False)
        # a live snapshot, sent as its delta, and a server from it, which
        # gets its own map
        self.snapshot(name, 'snap-a', image)
        self.wait_map('snap-a')
        self.create('vm-snap', FLAVOR_VMAR, 'snap-a')
        self.wait_status('vm-snap', 'ACTIVE')
        self.wait_booted('vm-snap', image)
        check(self.ids['snap-a'] in self.export_pin('vm-snap'),
              'vm-snap does not read its own map')
        self.echo('  snapshot snap-a has its own map; vm-snap booted it')
        # shelve offloads (shelved_offload_time = 0) through a snapshot,
        # sent as its delta too
        size = self.compute_log()
        op('shelve', status='SHELVED_OFFLOADED', boots=False)
        self.check_delta(self.compute_log(size), '%s-shelved' % name)
        op('unshelve')

    def lifecycle_images(self, name='vm-a'):
        """Operations that change a vmar server's image or save it whole.

        Hard reboot, rebuild, a plain server of a snapshot, a cold
        snapshot (not in CI's run: tools/run-tests.sh --full).
        """
        image = 'nginx'

        def op(*args, **kwargs):
            self._op(name, image, *args, **kwargs)
        self._op(name, 'minbase', 'reboot', '--hard')
        op('rebuild', '--image', 'nginx')
        check(self.ids['nginx'] in self.export_pin(name),
              'rebuilt %s does not read nginx: %s', name,
              self.export_pin(name))
        # a snapshot is a standalone image: a plain server boots it
        self.snapshot(name, 'snap-c', 'nginx')
        self.create('vm-plainsnap', FLAVOR_PLAIN, 'snap-c')
        self.wait_status('vm-plainsnap', 'ACTIVE')
        self.wait_booted('vm-plainsnap', 'nginx')
        self.os.run('server', 'delete', '--wait', 'vm-plainsnap')
        self.echo('  a plain server booted snap-c')
        # a cold one: the image saved whole is the disk the guest left
        op('stop', status='SHUTOFF', boots=False)
        self.snapshot(name, 'snap-b', 'nginx')
        saved = self.cloud.path('snap-b.img')
        self.os.run('image', 'save', '--file', saved, 'snap-b')
        fmt = self.os.value('image', 'show', '-c', 'disk_format', 'snap-b')
        disk = os.path.join(self.cloud.path('nova', 'instances'),
                            self.server(name)['id'], 'disk')
        r = subprocess.run(['qemu-img', 'compare', '-U', '-f', 'qcow2',
                            '-F', fmt, disk, saved], capture_output=True,
                           text=True)
        os.unlink(saved)
        check(r.returncode == 0, 'snap-b saved whole is not the disk of '
              '%s: %s', name, r.stdout + r.stderr)
        self.echo('  snap-b saved whole equals the stopped disk')
        for snap in ('snap-b', 'snap-c'):
            self.os.run('image', 'delete', snap)
        op('start')

    def snapshot(self, server, name, parent):
        """``server image create``; checks it went as a delta."""
        size = self.compute_log()
        t0 = time.monotonic()
        snap = self.os.json('server', 'image', 'create', '--name', name,
                            '--wait', server)
        self.ids[name] = snap['id']
        props = self.os.json('image', 'show', name)['properties']
        check(props.get('vmar_parent') == self.ids[parent],
              '%s was not built from a delta on %s: %s', name, parent,
              props)
        self.check_delta(self.compute_log(size), name)
        self.echo('  %s: a delta of %s blocks (%s zeroed) on %s, active in '
                  '%.1f s' % (name, props['vmar_delta_blocks'],
                              props['vmar_delta_zero_blocks'], parent,
                              time.monotonic() - t0))

    def check_delta(self, log, name):
        check('Performing standard snapshot' not in log,
              'the snapshot %s took Nova\'s own route:\n%s', name,
              log[-3000:])
        check(re.search(r'snapshot \S+: delta of \d+ blocks', log),
              'nova-compute logged no delta for %s', name)

    def restart_compute(self):
        """Restart nova-compute under the image cache manager.

        A reference on an export left by an instance that is not on the
        host (as a compute service killed between a delete and its
        release leaves one) is dropped when the service starts; the
        running servers keep theirs.
        """
        before = self._vmar_files()
        svc = {s.name: s for s in stack.services(self.cloud)}
        compute = svc['nova-compute']
        held = self._holders()
        servers = {s['ID'] for s in self.os.json('server', 'list')}
        check(held, 'no export is held on the host')
        # a reference on an export the host has already, as it is
        image_id, version, host_cache = min(min(e) for e in held.values())
        left = str(uuid.uuid4())
        out = subprocess.run(
            [self.cloud.bin('vmar-export'), '--config-file',
             self.cloud.etc('vmar', 'vmar-export.conf'), 'add', image_id,
             '--map-version', str(version), '--host-cache', host_cache,
             '--holder', left], capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=120)
        check(out.returncode == 0, 'vmar-export add failed: %s%s',
              out.stdout, out.stderr)
        check(left in self._holders(), 'vmar-export add --holder %s did not '
              'record the holder', left)
        size = self.compute_log()
        compute.stop()
        stack.up(self.cloud, echo=lambda *a: None)
        interval = configparser.ConfigParser(interpolation=None)
        interval.read(self.cloud.etc('nova', 'nova.conf'))
        interval = interval.getint('image_cache', 'manager_interval')
        check(interval <= 60, 'nova.conf has [image_cache] manager_interval '
              '= %d: set VMAR_CLOUD_IMAGE_CACHE_INTERVAL (10) for the '
              'cloud and for this process', interval)
        # two passes of the image cache manager after the restart

        def passes():
            # the manager logs its active base files on every pass (the
            # plain server's is one)
            return self.compute_log(size).count('Active base files') >= 2
        self.wait('two image cache manager passes', passes, timeout=300)
        after = self._vmar_files()
        check(before <= after, 'files gone after the cache manager: %s',
              sorted(before - after))
        for name in self.running():
            self.wait_status(name, 'ACTIVE')
        now = self._holders()
        check(left not in now, 'the reference of %s, an instance that is '
              'not on the host, survived the restart: %s', left, now)
        kept = {h for h in held if h in servers}
        check(kept <= set(now), 'servers lost their references: %s',
              sorted(kept - set(now)))
        self.echo('  nova-compute restarted; the cache manager ran twice; '
                  '%d vmar files, none gone; a left-over reference on %s '
                  'dropped, %d servers kept theirs'
                  % (len(before), image_id, len(kept)))

    def _holders(self):
        """holder -> (image, map version, host cache) of what it holds."""
        from vmar_openstack.host.exports import state as export_state
        out = {}
        with export_state.State(self.host_dir) as state:
            for exp in state.exports.values():
                for h in exp.holders:
                    out.setdefault(h, set()).add(
                        (exp.image_id, exp.map_version, exp.host_cache))
        return out

    def _base_file(self, image_id):
        """A base on the host: its whole copy, else its mirror."""
        whole = os.path.join(self.host_dir, 'bases', image_id)
        if os.path.exists(whole):
            return whole
        return os.path.join(self.host_dir, 'mirrors', image_id)

    def _vmar_files(self, subs=('maps', 'bases', 'mirrors', 'bootsets',
                                'layouts')):
        found = set()
        for sub in subs:
            d = os.path.join(self.host_dir, sub)
            if not os.path.isdir(d):
                continue
            found.update(os.path.join(d, f) for f in os.listdir(d))
        return found

    def running(self):
        return [s['Name'] for s in self.os.json('server', 'list')
                if s['Status'] == 'ACTIVE']

    def qsd_pids(self):
        return [int(p) for p in subprocess.run(
            ['pgrep', '-f', 'qemu-storage-daemon.*%s' % self.host_dir],
            capture_output=True, text=True).stdout.split()]

    def qsd_pid(self):
        pids = self.qsd_pids()
        check(len(pids) == 1, 'qemu-storage-daemon pids: %s', pids)
        return pids[0]

    def kill_export_daemon(self):
        """kill -9 the export daemon; guests pause and resume alone.

        vm-b is hard-rebooted first, so its guest reads its disk (SeaBIOS,
        the kernel, systemd) when the daemon dies. vmar-export is held
        (SIGSTOP) for the moment it takes to see vm-b paused on the I/O
        error; without that, its restart can beat the guest's next read.
        Then it is let go: it restarts the daemon and restores the exports,
        and vmar-nova-compute resumes the guests, with no command from
        anyone.
        """
        servers = [n for n in self.running() if n != 'plain']
        domains = {n: self.domain(n) for n in servers}
        supervisor = {s.name: s for s in stack.services(self.cloud)}[
            'vmar-export'].pids()[0]
        size = self.compute_log()
        before = self.console('vm-b')
        self.os.run('server', 'reboot', '--hard', 'vm-b')
        self.wait_status('vm-b', 'ACTIVE')
        old = self.qsd_pid()
        os.kill(supervisor, signal.SIGSTOP)
        try:
            os.kill(old, signal.SIGKILL)
            t0 = time.monotonic()
            self.wait('vm-b to pause on an I/O error', lambda: 'I/O error'
                      in self.virsh('domstate', '--reason',
                                    domains['vm-b']), timeout=300)
        finally:
            os.kill(supervisor, signal.SIGCONT)
        # none for the moment the supervisor waits before it restarts one
        self.wait('a new export daemon',
                  lambda: self.qsd_pids() not in ([], [old]),
                  timeout=60, interval=0.5)
        self.qsd_pid()

        def all_running():
            return all(self.virsh('domstate', dom).startswith('running')
                       for dom in domains.values())
        self.wait('the guests to run again', all_running, timeout=120,
                  interval=0.5)
        took = time.monotonic() - t0
        resumed = self.compute_log(size).count(
            'paused on an I/O error of its vmar')
        check(resumed >= 1, 'vmar-nova-compute logged no resume')
        self.wait_booted('vm-b', 'python3', since=before)
        for name in servers:
            check(self.server(name)['status'] == 'ACTIVE',
                  '%s is not ACTIVE', name)
        self.export_matches('vm-b', 'python3')
        self.echo('  export daemon killed during vm-b\'s boot; %d guest(s) '
                  'resumed by vmar-nova-compute, all running %.1f s after '
                  'the kill; vm-b booted; exports verify' % (resumed, took))

    def delete_canonical(self):
        """Delete minbase (python3's map points into it) while vm-b runs."""
        from vmar_openstack import names as vnames
        self.os.run('image', 'delete', 'minbase')
        self.export_matches('vm-b', 'python3')
        self.create('vm-c', FLAVOR_VMAR, 'python3')
        self.wait_status('vm-c', 'ACTIVE')
        self.wait_booted('vm-c', 'python3')
        self.echo('  minbase deleted; python3 still verifies; vm-c booted '
                  'python3')
        # vm-b still runs on python3's map from before the deletion: the
        # host reports it, and the map version garbage collector keeps it
        old = vnames.parse_export(vnames.parse_nbd_uri(
            self.export_pin('vm-b'))[0])

        def manage(*args):
            return subprocess.run(
                [self.cloud.bin('vmar-manage'), '--config-file',
                 self.cloud.etc('vmar', 'vmar.conf')] + list(args),
                capture_output=True, text=True, check=True).stdout
        shown = manage('map', 'show', old.image_id)
        # oslo.log writes to stdout when use_stderr is off and no log file
        current = json.loads(shown[shown.index('{'):])['map_version']
        check(old.version < current, 'python3 is still at map v%d',
              current)
        kept = 'kept map v%d of %s: held by ' % (old.version, old.image_id)
        self.wait('the host to report vm-b\'s old map version',
                  lambda: kept in manage('map', 'gc', '--dry-run',
                                         '--min-age', '0'), timeout=120)
        self.echo('  vm-b reads python3 map v%d, the current one is v%d: '
                  'v%d is kept, held by the host' % (old.version, current,
                                                     old.version))

    def delete_all(self):
        """Delete every server and image; nothing vmar owns is left."""
        for s in self.os.json('server', 'list'):
            self.os.run('server', 'delete', '--wait', s['ID'])
        for img in self.os.json('image', 'list'):
            self.os.run('image', 'delete', img['ID'])

        library = [self.cloud.path('vmar', d) for d in ('maps', 'bases')]

        def left():
            # mirrors stay, unreferenced, up to [vmar_host] mirror_cache_gb
            return {
                'map images': sorted(
                    '%s (of %s)' % (i, p.get('vmar_map_of'))
                    for i, p in self.map_images().items()),
                'library files': sorted(
                    os.path.join(d, f) for d in library if os.path.isdir(d)
                    for f in os.listdir(d)),
                'host files': sorted(self._vmar_files(
                    ('maps', 'bases', 'bootsets', 'layouts')))}

        self.wait('maps and bases to go',
                  lambda: not any(left().values()), timeout=300, left=left)
        state = os.path.join(self.host_dir, 'exports.json')
        if os.path.exists(state):
            with open(state) as f:
                check(not json.load(f).get('exports'),
                      'exports left: %s', state)
        self.echo('  every server and image deleted; no map image in '
                  'Glance, no map or base file on the host or in the '
                  'agent\'s library')

    STEPS = ('upload', 'flavors', 'boot', 'page_cache', 'guest_private',
             'guest_auto', 'metadata_warm', 'lifecycle',
             'lifecycle_images', 'restart_compute',
             'kill_export_daemon', 'delete_canonical', 'delete_all')
    # the steps CI's run leaves out (tools/run-tests.sh --full runs them)
    FULL_ONLY = ('lifecycle_images',)

    def run(self, steps=None):
        # (a run that starts at a later step finds the images by name)
        self.ids.update({i['Name']: i['ID']
                         for i in self.os.json('image', 'list')})
        return super().run(steps)


def main(argv=None):
    return UserPath.main(argv, 'python -m tools.cloud_scenario',
                         lambda: (qemu_env.image_library(),))


if __name__ == '__main__':
    sys.exit(main())
