"""Edit one file of QEMU's source tree, the same way every time.

Used by qapi-vmar.py and nbd-private.py. The first run saves the file's
original as ``<file>.vmar-orig``; every run starts from that copy, so a
changed edit replaces the old one, applies each ``(old, new, what)``
replacement (``old`` must occur exactly once, or the script fails
loudly), and rewrites the file only if the result differs, so nothing is
rebuilt needlessly.
"""

import pathlib
import sys


def apply(prog, src_dir, relpath, marker, edits):
    """Edit ``src_dir/relpath``; ``marker`` shows an edited file."""
    path = pathlib.Path(src_dir) / relpath
    orig = path.with_name(path.name + ".vmar-orig")
    if not orig.exists():
        text = path.read_text()
        if marker in text:
            sys.exit("%s: %s is already edited and %s is missing"
                     % (prog, path, orig))
        orig.write_text(text)
    text = orig.read_text()
    for old, new, what in edits:
        if text.count(old) != 1:
            sys.exit("%s: cannot find the %s in %s" % (prog, what, relpath))
        text = text.replace(old, new)
    if text != path.read_text():
        path.write_text(text)


def main(doc, prog, relpath, marker, edits):
    """The command line of an edit script: ``prog QEMU_SOURCE_DIR``."""
    if len(sys.argv) != 2:
        sys.exit(doc)
    apply(prog, sys.argv[1], relpath, marker, edits)
