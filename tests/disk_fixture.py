"""A block device of the test's own: a loop-mounted ext4 file system.

The disk's sysfs knobs (``queue/read_ahead_kb`` above all) are state of the
whole machine: every process whose files live on that disk shares them.
CI runs several chains at once on one disk (the functional tests, the
cloud's user path, the fresh-root demo), and a test that sets the knob, or
asserts that a tool put it back, would see the others' settings. A test
whose files are on a loop device of its own has knobs nobody else reads
or writes.

Needs root (``losetup``, ``mount``) and the kernel's loop driver.
"""

import os
import subprocess

import fixtures
import testtools

# A new loop device reads ahead 128 KiB, what the demo sets for its
# measurement: the test's disk starts at another value, so that a tool
# that did not put the knob back is seen.
READ_AHEAD_KB = 4096


def _run(*argv):
    return subprocess.run(argv, check=True, capture_output=True,
                          text=True).stdout.strip()


class OwnBlockDevice(fixtures.Fixture):
    """An empty directory on an ext4 file system of its own loop device.

    ``path`` is the mounted directory and ``device`` the loop device
    (``/dev/loopN``). Its sparse backing file lives beside it in a
    temporary directory, so the file system takes only what is written.
    On cleanup it is unmounted and the loop device released.
    """

    def __init__(self, size='16G', read_ahead_kb=READ_AHEAD_KB):
        super().__init__()
        self.size = size
        self.read_ahead_kb = read_ahead_kb

    def _setUp(self):
        if not os.path.exists('/dev/loop-control'):
            raise testtools.TestCase.skipException(
                'needs the loop driver (/dev/loop-control)')
        top = self.useFixture(fixtures.TempDir()).path
        # others may pass through to the mounted directory, as they may to
        # a test directory a test opens to them (libvirt's QEMU user)
        os.chmod(top, 0o711)
        backing = os.path.join(top, 'disk.img')
        with open(backing, 'wb') as f:
            f.truncate(_bytes(self.size))
        _run('mke2fs', '-q', '-F', '-t', 'ext4', backing)
        # direct I/O to the backing file: the machine's page cache holds
        # the test's files once, on the loop device, not twice
        self.device = _run('losetup', '--find', '--show', '--direct-io=on',
                           backing)
        self.addCleanup(_run, 'losetup', '--detach', self.device)
        name = os.path.basename(self.device)
        self.knob = '/sys/block/%s/queue/read_ahead_kb' % name
        with open(self.knob, 'w') as f:
            f.write(str(self.read_ahead_kb))
        self.path = os.path.join(top, 'mnt')
        os.mkdir(self.path)
        _run('mount', self.device, self.path)
        self.addCleanup(_unmount, self.path)


def _unmount(path):
    """Unmount ``path``; lazily if a file on it is still open.

    The test's process may hold a file of it yet (a connection pool, a
    log): the file system then goes once they are closed, and the loop
    device with it (losetup --detach of a busy device clears it then).
    """
    if subprocess.run(['umount', path], capture_output=True).returncode:
        _run('umount', '--lazy', path)


def on_own_disk(test_method):
    """Decorate a test whose directory must be on a disk of its own.

    :meth:`tests.base.LibraryTestCase.make_tmp` then makes it an
    :class:`OwnBlockDevice`; a class says so for all its tests with
    ``own_disk = True``.
    """
    test_method.own_disk = True
    return test_method


def wants_own_disk(test):
    method = getattr(test, test._testMethodName, None)
    return bool(getattr(test, 'own_disk', False)
                or getattr(method, 'own_disk', False))


def _bytes(size):
    units = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
    if size[-1] in units:
        return int(size[:-1]) * units[size[-1]]
    return int(size)
