"""python -m tools.cloud up|down|status (run by tools/cloud.sh)."""

import argparse
import sys
import time

from tools.cloud import config
from tools.cloud import stack
from tools.vmarenv import process


def main(argv=None):
    parser = argparse.ArgumentParser(prog='tools/cloud.sh')
    parser.add_argument('command', choices=('up', 'down', 'status'))
    parser.add_argument('--state-dir', help='default: $VMAR_CLOUD_STATE '
                        'or %s' % config.DEFAULT_STATE_DIR)
    parser.add_argument('--qemu-prefix', help='the patched QEMU '
                        '(qemu/build.sh prints it)')
    parser.add_argument('--computes', type=int, metavar='N',
                        help='up: a new cloud gets N compute hosts, each '
                        'in namespaces of its own when N > 1 (default 1)')
    parser.add_argument('--purge', action='store_true',
                        help='down: also remove the state directory')
    args = parser.parse_args(argv)
    cloud = config.Cloud(args.state_dir, args.qemu_prefix)

    def echo(text):
        print(text, file=sys.stderr if args.command == 'up' else sys.stdout,
              flush=True)

    t0 = time.time()
    try:
        if args.command == 'up':
            openrc = stack.up(cloud, echo, args.computes)
            echo('cloud up in %.1f s' % (time.time() - t0))
            print(openrc)
        elif args.command == 'down':
            stack.down(cloud, echo)
            if args.purge:
                cloud.clean()
            echo('cloud down in %.1f s' % (time.time() - t0))
        else:
            return 0 if stack.status(cloud, echo) else 3
    except process.ServiceError as e:
        print('tools/cloud.sh %s: %s' % (args.command, e), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
