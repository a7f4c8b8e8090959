"""The real QEMU, libvirt and images the export tests run on.

Each helper builds or starts what it needs once per test run and is cached:
the patched QEMU tools (``qemu/build.sh``, cached by content hash outside the
clone), the Debian image library (``tools/build-image-library.sh``), the
test guest (``tools/build-test-guest.sh``) and ``virtlogd``/``libvirtd``
(started by hand: there is no systemd).
"""

import functools
import grp
import os
import re
import subprocess
import time

from tools.vmarenv import services

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SYSTEM_QEMU_IMG = '/usr/bin/qemu-img'


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


def _running(name):
    return subprocess.run(['pgrep', '-x', name],
                          capture_output=True).returncode == 0


@functools.lru_cache(maxsize=None)
def libvirt():
    """Start virtlogd and libvirtd if they are not running."""
    _kvm_device_as_debian_sets_it()
    if not _running('virtlogd'):
        subprocess.run(['virtlogd', '-d'], check=True)
        services.record_started('virtlogd')
    if not _running('libvirtd'):
        subprocess.run(['libvirtd', '-d'], check=True)
        services.record_started('libvirtd')
    deadline = time.time() + 30
    while time.time() < deadline:
        if subprocess.run(['virsh', '-c', 'qemu:///system', 'version'],
                          capture_output=True).returncode == 0:
            return 'qemu:///system'
        time.sleep(0.2)
    raise RuntimeError('libvirtd did not answer within 30 s')


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


def fincore_bytes(path):
    """Bytes of ``path`` in the page cache."""
    out = subprocess.run(['fincore', '--bytes', '--noheadings', '--output',
                          'RES', path], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0])


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _queue_of(path):
    dev = os.stat(path).st_dev
    sysdir = '/sys/dev/block/%d:%d' % (os.major(dev), os.minor(dev))
    queue = os.path.join(sysdir, 'queue')
    if not os.path.exists(queue):      # a partition: its disk's queue
        queue = os.path.join(sysdir, '..', 'queue')
    return os.path.join(queue, 'read_ahead_kb')


def set_readahead(path, kb, test):
    """Set the read-ahead of the disk holding ``path`` for one test."""
    knob = _queue_of(path)
    with open(knob) as f:
        old = f.read().strip()

    def restore():
        with open(knob, 'w') as f:
            f.write(old)
    with open(knob, 'w') as f:
        f.write(str(kb))
    test.addCleanup(restore)


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
