"""cloud-init user-data that installs vmar-guest into a server.

For images that do not carry the component (image property
``vmar_guest``): ``vmar-guest-userdata > ud.yaml`` then
``openstack server create --user-data ud.yaml ...``. The binary is built
here from the shipped source, with the local C compiler, so it needs a
guest with a C library as recent as the build host's (build it on the
guest's release, or pass ``--binary``).
"""

import base64
import gzip
import os
import subprocess
import tempfile

import yaml

from vmar_openstack import exception

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, 'vmar-guest.c')
UNIT = os.path.join(HERE, 'vmar-guest.service')
BINARY_PATH = '/usr/local/sbin/vmar-guest'
UNIT_PATH = '/etc/systemd/system/vmar-guest.service'
# Nova refuses user_data whose base64 form is longer than this
NOVA_USER_DATA_MAX = 65535
CFLAGS = ('-O2', '-s', '-Wall', '-Werror')


def build(cc='cc'):
    """Compile vmar-guest; returns the binary's bytes."""
    with tempfile.TemporaryDirectory(prefix='vmar-guest.') as tmp:
        out = os.path.join(tmp, 'vmar-guest')
        try:
            subprocess.run([cc, *CFLAGS, '-o', out, SOURCE], check=True,
                           capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise exception.GuestUserDataError(reason='%s failed: %s' % (
                cc, getattr(e, 'stderr', None) or e))
        with open(out, 'rb') as f:
            return f.read()


def make(binary):
    """The ``#cloud-config`` document (str) that installs ``binary``."""
    with open(UNIT) as f:
        unit = f.read()
    doc = {
        'write_files': [
            {'path': BINARY_PATH, 'permissions': '0755',
             'encoding': 'gz+b64',
             'content': base64.b64encode(
                 gzip.compress(binary, mtime=0)).decode()},
            {'path': UNIT_PATH, 'permissions': '0644', 'content': unit},
        ],
        'runcmd': [
            ['systemctl', 'daemon-reload'],
            ['systemctl', 'enable', '--now', 'vmar-guest.service'],
        ],
    }
    text = '#cloud-config\n' + yaml.safe_dump(doc, sort_keys=False,
                                              width=1 << 20)
    encoded = len(base64.b64encode(text.encode()))
    if encoded > NOVA_USER_DATA_MAX:
        raise exception.GuestUserDataError(
            reason='%d bytes once base64-encoded; Nova takes at most %d'
            % (encoded, NOVA_USER_DATA_MAX))
    return text
