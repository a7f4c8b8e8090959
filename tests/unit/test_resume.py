"""Which paused guests vmar-nova-compute resumes, and when."""

import testtools

from vmar_openstack import exception
from vmar_openstack.nova_imagebackend import resume

SOCK = '/run/vmar/nbd.sock'
A = '11111111-2222-3333-4444-555555555555.3'

DISK = """<domain><devices>
<disk type='file' device='disk'>
  <driver name='qemu' type='qcow2' error_policy='stop'/>
  <source file='/i/disk'/>
  <backingStore type='network'>
    <format type='raw'/>
    <source protocol='nbd' name='%s'>
      <host transport='unix' socket='%s'/>
    </source>
  </backingStore>
  <target dev='vda' bus='virtio'/>
</disk></devices></domain>"""
PLAIN = """<domain><devices><disk type='file' device='disk'>
<source file='/i/disk'/><backingStore type='file'>
<source file='/i/_base/abc'/></backingStore></disk></devices></domain>"""


class FakeLibvirt(object):
    """The constants of the libvirt module (not installed for unit tests)."""

    VIR_DOMAIN_RUNNING = 1
    VIR_DOMAIN_PAUSED = 3
    VIR_DOMAIN_PAUSED_USER = 1
    VIR_DOMAIN_PAUSED_IOERROR = 5
    VIR_CONNECT_LIST_DOMAINS_PAUSED = 32

    class libvirtError(Exception):
        pass


class Domain(object):

    def __init__(self, name, xml, state, reason, fail=False):
        self._name, self.xml, self.st = name, xml, (state, reason)
        self.fail = fail
        self.resumed = 0

    def name(self):
        return self._name

    def state(self):
        return self.st

    def XMLDesc(self, flags):
        return self.xml

    def resume(self):
        if self.fail:
            raise FakeLibvirt.libvirtError('no')
        self.resumed += 1
        self.st = (FakeLibvirt.VIR_DOMAIN_RUNNING, 1)


class Conn(object):

    def __init__(self, domains):
        self.domains = domains

    def listAllDomains(self, flags):
        assert flags == FakeLibvirt.VIR_CONNECT_LIST_DOMAINS_PAUSED
        return [d for d in self.domains
                if d.st[0] == FakeLibvirt.VIR_DOMAIN_PAUSED]


class Exports(object):
    """The health call of the host API's client, over a set."""

    def __init__(self, live):
        self.live = live
        self.calls = 0

    def nbd_socket(self):
        if isinstance(self.live, Exception):
            raise self.live
        return SOCK

    def health(self, names=()):
        self.calls += 1
        if isinstance(self.live, Exception):
            raise self.live
        return {'daemon_up': self.live is not None,
                'served': sorted(set(names) & (self.live or set()))}


class TestVmarExports(testtools.TestCase):

    def test_names_the_exports_on_our_socket_only(self):
        self.assertEqual({A}, resume.vmar_exports(DISK % (A, SOCK), SOCK))
        self.assertEqual(set(), resume.vmar_exports(DISK % (A, '/x'), SOCK))
        self.assertEqual(set(), resume.vmar_exports(PLAIN, SOCK))
        self.assertEqual(set(), resume.vmar_exports(
            DISK % ('not-an-export', SOCK), SOCK))


class TestResumer(testtools.TestCase):

    def run_once(self, domains, live):
        exports = Exports(live)
        r = resume.Resumer(exports, FakeLibvirt)
        return r.run_once(Conn(domains)), exports

    def test_resumes_io_error_pause_once_export_is_served(self):
        d = Domain('i-1', DISK % (A, SOCK), 3, 5)
        resumed, _e = self.run_once([d], {A})
        self.assertEqual(['i-1'], resumed)
        self.assertEqual(1, d.resumed)

    def test_waits_while_the_export_is_not_served(self):
        d = Domain('i-1', DISK % (A, SOCK), 3, 5)
        self.assertEqual([], self.run_once([d], set())[0])
        self.assertEqual([], self.run_once([d], None)[0])    # daemon down
        self.assertEqual([], self.run_once(
            [d], exception.ExportDaemonDown(reason='no socket'))[0])
        self.assertEqual(0, d.resumed)

    def test_leaves_user_pauses_and_other_disks_alone(self):
        user = Domain('i-user', DISK % (A, SOCK), 3, 1)
        plain = Domain('i-plain', PLAIN, 3, 5)
        resumed, exports = self.run_once([user, plain], {A})
        self.assertEqual([], resumed)
        self.assertEqual((0, 0), (user.resumed, plain.resumed))
        # nothing to do: the export service is not even asked
        self.assertEqual(0, exports.calls)

    def test_a_failed_resume_does_not_stop_the_others(self):
        bad = Domain('i-bad', DISK % (A, SOCK), 3, 5, fail=True)
        good = Domain('i-good', DISK % (A, SOCK), 3, 5)
        self.assertEqual(['i-good'], self.run_once([bad, good], {A})[0])

    def test_interval_zero_disables(self):
        self.assertIsNone(resume.start(object(), Exports({A}), 0))
