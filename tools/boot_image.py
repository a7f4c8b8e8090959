#!/usr/bin/env python3
"""Boot a library image under QEMU (TCG) and wait for its VMAR-BOOTED line.

Every image of ``tools/build-image-library.sh`` boots by itself (MBR,
SYSLINUX, the Debian cloud kernel, systemd) and, once multi-user.target is
reached, prints ``VMAR-BOOTED <image name> <seconds since kernel start>``
on its serial console. This module starts the stock Debian
``qemu-system-x86_64`` on an image (``snapshot=on``: the image is never
written), waits for that line with a bounded wait and stops QEMU.

    tools/boot_image.py [--timeout S] [--console-dir DIR] IMAGE...

prints one ``<name> <seconds since kernel start> <wall seconds>`` line per
image and exits 1 if an image does not print its marker in time.
``parse_marker()`` reads the marker from any console text (a serial log,
``openstack console log show``).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

QEMU = '/usr/bin/qemu-system-x86_64'
MARKER_RE = re.compile(r'VMAR-BOOTED (\S+) ([0-9]+(?:\.[0-9]+)?)')
DEFAULT_TIMEOUT = 240


class BootTimeout(Exception):
    """The image printed no VMAR-BOOTED line within the timeout."""


def parse_marker(text):
    """(image name, seconds since kernel start) of the first marker."""
    # None if ``text`` holds no marker
    m = MARKER_RE.search(text)
    if m is None:
        return None
    return m.group(1), float(m.group(2))


def read_console(path):
    try:
        with open(path, errors='replace') as f:
            return f.read()
    except FileNotFoundError:
        return ''


def qemu_command(image, console, memory=1024, machine='q35', qemu=QEMU,
                 fmt='raw', cache=None, oem=()):
    """The QEMU command line; ``oem``: SMBIOS OEM strings (type 11)."""
    drive = 'file=%s,format=%s,if=virtio,snapshot=on' % (image, fmt)
    if cache:
        drive += ',cache=%s' % cache
    cmd = [qemu, '-machine', machine, '-accel', 'tcg', '-m', str(memory),
           '-nographic', '-monitor', 'none', '-no-reboot',
           '-serial', 'file:%s' % console, '-drive', drive]
    for value in oem:
        cmd += ['-smbios', 'type=11,value=%s' % value.replace(',', ',,')]
    return cmd


def boot(image, console=None, timeout=DEFAULT_TIMEOUT, memory=1024,
         machine='q35', qemu=QEMU, fmt='raw', cache=None, oem=(),
         until=()):
    """Boot ``image`` until its marker; return a dict.

    ``fmt``: the image's format; ``cache``: the drive's cache mode
    (QEMU's default if None); ``oem``: SMBIOS OEM strings for the guest;
    ``until``: regular expressions of console lines to wait for after
    the marker, in order (a line of the test probe's, say).

    Keys: ``name`` and ``uptime`` (from the marker), ``wall`` (seconds from
    starting QEMU to seeing the marker), ``console`` (the serial log),
    ``until``: [(match, wall seconds when seen)] for ``until``.
    Raises BootTimeout, with the end of the console, after ``timeout``
    seconds, or if QEMU exits before the marker or those lines.
    """
    if console is None:
        fd, console = tempfile.mkstemp(prefix='vmar-boot-', suffix='.log')
        os.close(fd)
    else:
        # not an earlier boot's lines, read before QEMU opens the file
        open(console, 'w').close()
    start = time.monotonic()
    proc = subprocess.Popen(
        qemu_command(image, console, memory, machine, qemu, fmt, cache,
                     oem),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    out, waits = None, [re.compile(r) for r in until]
    try:
        while True:
            text = read_console(console)
            now = time.monotonic() - start
            if out is None:
                marker = parse_marker(text)
                if marker is not None:
                    out = {'name': marker[0], 'uptime': marker[1],
                           'wall': now, 'console': console, 'until': []}
            while out is not None and len(out['until']) < len(waits):
                m = waits[len(out['until'])].search(text)
                if m is None:
                    break
                out['until'].append((m, now))
            if out is not None and len(out['until']) == len(waits):
                return out
            what = ('the VMAR-BOOTED line' if out is None else
                    'a line matching %r' % waits[len(out['until'])].pattern)
            if proc.poll() is not None:
                raise BootTimeout('%s: QEMU exited (%s) before %s: %s\n%s'
                                  % (image, proc.returncode, what,
                                     proc.stderr.read().decode(),
                                     read_console(console)[-3000:]))
            if now > timeout:
                raise BootTimeout('%s: %s not seen within %d s:\n%s'
                                  % (image, what, timeout,
                                     read_console(console)[-3000:]))
            # finer once booted: the lines after the marker time spans
            time.sleep(0.2 if out is None else 0.02)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stderr.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('images', nargs='+', metavar='IMAGE')
    parser.add_argument('--timeout', type=int, default=DEFAULT_TIMEOUT)
    parser.add_argument('--memory', type=int, default=1024)
    parser.add_argument('--machine', default='q35')
    parser.add_argument('--console-dir',
                        help='keep each serial log here as <image>.log')
    args = parser.parse_args(argv)
    failed = 0
    for image in args.images:
        console = None
        if args.console_dir:
            os.makedirs(args.console_dir, exist_ok=True)
            console = os.path.join(args.console_dir,
                                   os.path.basename(image) + '.log')
            if os.path.exists(console):
                os.unlink(console)
        try:
            r = boot(image, console, args.timeout, args.memory,
                     args.machine)
        except BootTimeout as e:
            print(e, file=sys.stderr)
            failed = 1
            continue
        print('%s %.2f %.2f' % (r['name'], r['uptime'], r['wall']),
              flush=True)
        if not args.console_dir:
            os.unlink(r['console'])
    return failed


if __name__ == '__main__':
    sys.exit(main())
