"""``vmar-guest-userdata``: cloud-init user-data that installs vmar-guest.

For servers of a guest-private flavor (``vmar:guest_cache=private``) whose
image does not carry the guest component::

    vmar-guest-userdata > vmar-guest.yaml
    openstack server create --flavor <guest-private flavor> \\
        --user-data vmar-guest.yaml ...

Writes the ``#cloud-config`` document to standard output (or ``-o``).
"""

import argparse
import sys

from vmar_openstack import exception
from vmar_openstack.guest import userdata


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='vmar-guest-userdata', description=__doc__.split('\n')[0])
    parser.add_argument('--binary', help='a vmar-guest binary built for '
                        'the guest; default: build it here with --cc')
    parser.add_argument('--cc', default='cc', help='C compiler (%(default)s)')
    parser.add_argument('-o', '--output', help='write here, not to stdout')
    args = parser.parse_args(argv)
    try:
        if args.binary:
            with open(args.binary, 'rb') as f:
                binary = f.read()
        else:
            binary = userdata.build(args.cc)
        text = userdata.make(binary)
    except (OSError, exception.VmarException) as e:
        print('vmar-guest-userdata: %s' % e, file=sys.stderr)
        return 1
    if args.output:
        with open(args.output, 'w') as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
