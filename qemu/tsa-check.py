#!/usr/bin/env python3
"""Check the graph-lock annotations of the vmar drivers with clang.

QEMU declares its graph lock as a clang thread-safety capability
(include/qemu/clang-tsa.h): built with clang, -Wthread-safety reports a
call or a field read that needs the lock where it is not held.  The vmar
tools are built with gcc, which ignores the annotations, so this compiles
the vmar files once more with clang, with their compile commands from
the build directory, and fails on any thread-safety warning.

Usage: tsa-check.py BUILD_DIR
"""

import json
import pathlib
import shlex
import shutil
import subprocess
import sys

FILES = ('block/vmar.c', 'block/vmar-mirror.c')
# gcc options clang does not take
GCC_ONLY = ('-ftrivial-auto-var-init', '-fzero-call-used-regs',
            '-Wimplicit-fallthrough', '-Wold-style-declaration',
            '-Wno-psabi', '-mcx16')


def clang_command(entry):
    args = [a for a in shlex.split(entry['command']) if a != 'ccache']
    args[0] = 'clang'
    args = [a for a in args if not a.startswith(GCC_ONLY)]
    out = args.index('-o')
    args[out + 1] = '/dev/null'
    return args + ['-Wthread-safety', '-Werror=thread-safety',
                   '-Wno-unknown-warning-option']


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    if not shutil.which('clang'):
        sys.exit('tsa-check.py: clang is not installed')
    build = pathlib.Path(argv[1])
    entries = json.loads((build / 'compile_commands.json').read_text())
    failed = checked = 0
    for e in entries:
        src = (pathlib.Path(e['directory']) / e['file']).resolve()
        if not any(str(src).endswith('/' + f) for f in FILES):
            continue
        checked += 1
        r = subprocess.run(clang_command(e), cwd=e['directory'],
                           capture_output=True, text=True)
        if r.returncode:
            failed += 1
            sys.stderr.write(r.stderr)
    if checked != len(FILES):
        sys.exit('tsa-check.py: %d of the vmar files are in %s'
                 % (checked, build / 'compile_commands.json'))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
