"""The real QEMU, libvirt and images the export tests run on.

Each helper builds or starts what it needs once per test run and is cached:
the patched QEMU tools (``qemu/build.sh``, cached by content hash outside the
clone), the Debian image library (``tools/build-image-library.sh``), the
test guest (``tools/build-test-guest.sh``) and ``virtlogd``/``libvirtd``
(started by hand: there is no systemd).
"""

import contextlib
import functools
import grp
import hashlib
import os
import re
import signal
import socket
import subprocess
import time

from tools.vmarenv import services
from vmar_openstack.host.cache import pagecache

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SYSTEM_QEMU_IMG = '/usr/bin/qemu-img'
SYSTEM_QEMU_IO = '/usr/bin/qemu-io'
SYSTEM_QEMU_NBD = '/usr/bin/qemu-nbd'


def _last_line(cmd, env=None):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                         text=True, cwd=TOP, env=env).stdout
    return out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=None)
def qemu_prefix():
    prefix = os.environ.get('VMAR_QEMU_PREFIX')
    if prefix:
        return prefix
    return _last_line([os.path.join(TOP, 'qemu', 'build.sh')])


def qemu_bin(name):
    return os.path.join(qemu_prefix(), 'bin', name)


@functools.lru_cache(maxsize=None)
def image_library():
    """name -> path of every image of the Debian image library.

    build-image-library.sh prints one ``<name> <path>`` line per image on
    stdout (its progress goes to stderr); all of them are taken, however
    many images the library has.
    """
    lib = os.environ.get('VMAR_IMAGE_LIBRARY',
                         '/var/cache/vmar-openstack/images')
    out = subprocess.run(
        [os.path.join(TOP, 'tools', 'build-image-library.sh'), lib],
        check=True, stdout=subprocess.PIPE, text=True).stdout
    images = {}
    for line in out.splitlines():
        m = re.fullmatch(r'(\S+) (/.+)', line.strip())
        if m:
            images[m.group(1)] = m.group(2)
    if not images:
        raise RuntimeError('build-image-library.sh printed no image')
    return images


@functools.lru_cache(maxsize=None)
def test_guest():
    return _last_line([os.path.join(TOP, 'tools', 'build-test-guest.sh')])


def _serving(socket_path):
    """Whether a daemon answers on the unix socket ``socket_path``.

    Asked of the socket, not of the process list: in a chroot or a mount
    namespace the daemons another root runs are visible to pgrep but
    unreachable.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(socket_path)
        return True
    except OSError:
        return False
    finally:
        s.close()


@functools.lru_cache(maxsize=None)
def libvirt():
    """Start virtlogd and libvirtd if they are not running."""
    _kvm_device_as_debian_sets_it()
    # two chains that both find them down start them once: the first
    # waits under the lock until they answer
    with services.machine_lock('libvirtd'):
        if not _serving('/run/libvirt/virtlogd-sock'):
            subprocess.run(['virtlogd', '-d'], check=True)
            services.record_started('virtlogd')
            _wait_for(lambda: _serving('/run/libvirt/virtlogd-sock'),
                      'virtlogd')
        if not _serving('/run/libvirt/libvirt-sock'):
            subprocess.run(['libvirtd', '-d'], check=True)
            services.record_started('libvirtd')
        _wait_for(lambda: subprocess.run(
            ['virsh', '-c', 'qemu:///system', 'version'],
            capture_output=True).returncode == 0, 'libvirtd')
    return 'qemu:///system'


def _wait_for(check, what, timeout=30):
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            raise RuntimeError('%s did not answer within %d s'
                               % (what, timeout))
        time.sleep(0.2)


def kill_libvirtd():
    """SIGKILL the system libvirtd (a power cut), and only that one.

    Found through its pid file, not its name: a cloud of tools/cloud.sh
    runs a libvirtd of its own, which is not the harness's to kill.
    """
    try:
        with open('/run/libvirtd.pid') as f:
            pid = int(f.read().split()[0])
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        return
    while os.path.exists('/proc/%d' % pid):
        time.sleep(0.1)
    libvirt.cache_clear()


def _kvm_device_as_debian_sets_it():
    """/dev/kvm as Debian's udev rule sets it: root:kvm 0660.

    Without udev it is root-only 0600 here. libvirt 9.0 then caches QEMU's
    capabilities from a probe that may open /dev/kvm (it gets
    CAP_DAC_OVERRIDE) but judges the cache by whether libvirt-qemu may open
    it, so every lookup finds the cache stale and re-probes: 40 s per
    domain start. Guests still run under TCG (<domain type='qemu'>).
    """
    try:
        st = os.stat('/dev/kvm')
        gid = grp.getgrnam('kvm').gr_gid
    except (OSError, KeyError):
        return
    if st.st_gid != gid or st.st_mode & 0o777 != 0o660:
        os.chown('/dev/kvm', 0, gid)
        os.chmod('/dev/kvm', 0o660)


def virsh(*args, check=True):
    return subprocess.run(['virsh', '-c', libvirt()] + list(args),
                          capture_output=True, text=True, check=check)


def sha256_file(path):
    """The sha256 of a file's bytes, hex."""
    with open(path, 'rb') as f:
        return hashlib.file_digest(f, 'sha256').hexdigest()


def fincore_bytes(path):
    """Bytes of ``path`` in the page cache."""
    return pagecache.resident_bytes([path])[path]


evict = pagecache.evict


LOOP_MAJOR = 7


def set_readahead(path, kb, test):
    """Set the read-ahead of the disk holding ``path`` for one test.

    Only on a loop device (the test's own, ``tests.disk_fixture``): the
    machine's disk is shared with every chain CI runs beside the test, and
    a file opened on it meanwhile would take the test's setting. The knob
    stays held (an flock) until the test's cleanup puts the old value
    back.
    """
    if os.major(os.stat(path).st_dev) != LOOP_MAJOR:
        raise AssertionError(
            '%s is not on a disk of the test\'s own: its read-ahead is '
            'every process\'s (tests.disk_fixture.on_own_disk)' % path)
    held = contextlib.ExitStack()
    held.enter_context(pagecache.readahead(pagecache.readahead_knob(path),
                                           kb))
    test.addCleanup(held.close)


def console_tail(console, n=2000):
    try:
        with open(console, errors='replace') as f:
            return f.read()[-n:]
    except OSError:
        return ''


def console_lines(console, key):
    """The values of ``KEY value`` lines the test guest printed."""
    try:
        with open(console, errors='replace') as f:
            return re.findall(r'%s (\S+)' % key, f.read())
    except FileNotFoundError:
        return []


def run_domain(test, name, xml_path, console, wait=True, timeout=240):
    """Start a transient libvirt domain; wait until it powers off."""
    virsh('create', xml_path)
    test.addCleanup(virsh, 'destroy', name, check=False)
    if wait:
        deadline = time.time() + timeout
        while virsh('domstate', name, check=False).returncode == 0:
            test.assertLess(time.time(), deadline, console_tail(console))
            time.sleep(0.5)


def wait_for_line(test, console, key, count=1, timeout=240):
    deadline = time.time() + timeout
    while len(console_lines(console, key)) < count:
        test.assertLess(time.time(), deadline, console_tail(console))
        time.sleep(0.5)
    return console_lines(console, key)
