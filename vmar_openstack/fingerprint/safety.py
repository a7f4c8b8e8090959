"""Whether an image file is safe to read, and its raw view.

The format is pinned by the caller and checked with the ``oslo_utils``
format inspector; non-raw formats are read through qemu-img, never probed.
"""

import contextlib
import json
import os
import subprocess
import tempfile
import typing

from oslo_utils.imageutils import format_inspector

from vmar_openstack.exception import ImageRejected

# Formats that are raw bytes on disk: hashed as they are.
RAW_LIKE = {'raw': ('raw', 'gpt'), 'iso': ('iso',)}
# Formats qemu-img converts to raw before hashing.
QEMU_FORMATS = ('qcow2', 'vmdk', 'vhd', 'vhdx', 'vdi', 'qed')
_QEMU_NAMES = {'vhd': 'vpc'}


def qemu_img_info(qemu_img, path, fmt, force_share=False):
    """``qemu-img info`` of ``path`` opened as ``fmt`` (never probed).

    ``force_share``: also for an image a running QEMU holds locked.
    """
    cmd = [qemu_img, 'info', '--output=json', '-f', _QEMU_NAMES.get(fmt, fmt),
           path] + (['-U'] if force_share else [])
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, LC_ALL='C'))
    if proc.returncode:
        raise ImageRejected('qemu-img cannot read %s as %s: %s'
                            % (path, fmt, proc.stderr.strip()))
    return json.loads(proc.stdout)


def inspect(path, claimed_format, qemu_img='qemu-img', expected_size=None,
            max_virtual_size=None):
    """Check that ``path`` is a safe image of ``claimed_format``.

    Returns the virtual size. Raises :class:`ImageRejected` with the reason
    otherwise: a format that differs from the claim, a backing file or data
    file, vmdk extents, a truncated or corrupt file.
    """
    if claimed_format not in RAW_LIKE and claimed_format not in QEMU_FORMATS:
        raise ImageRejected('unsupported disk format %r' % claimed_format)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ImageRejected('cannot read %s: %s' % (path, e.strerror))
    if expected_size is not None and st.st_size != expected_size:
        raise ImageRejected('%s is %d bytes, expected %d: truncated or '
                            'changed' % (path, st.st_size, expected_size))
    if st.st_size == 0:
        raise ImageRejected('%s is empty' % path)
    try:
        inspector = format_inspector.detect_file_format(path)
    except format_inspector.ImageFormatError as e:
        raise ImageRejected('cannot determine the format of %s: %s'
                            % (path, e))
    detected = str(inspector) if inspector else 'raw'
    allowed = RAW_LIKE.get(claimed_format, (claimed_format,))
    if detected not in allowed:
        raise ImageRejected('%s claims to be %s but its content is %s'
                            % (path, claimed_format, detected))
    try:
        inspector.safety_check()
    except (format_inspector.SafetyCheckFailed,
            format_inspector.ImageFormatError) as e:
        raise ImageRejected('%s failed the %s safety check: %s'
                            % (path, detected, e))
    if claimed_format in RAW_LIKE:
        vsize = st.st_size
    else:
        info = qemu_img_info(qemu_img, path, claimed_format)
        for key in ('backing-filename', 'full-backing-filename'):
            if info.get(key):
                raise ImageRejected('%s has a backing file' % path)
        data_file = info.get('format-specific', {}).get('data', {}).get(
            'data-file')
        if data_file:
            raise ImageRejected('%s has an external data file' % path)
        vsize = int(info['virtual-size'])
        if claimed_format == 'qcow2':
            _qcow2_check(qemu_img, path)
    if max_virtual_size is not None and vsize > max_virtual_size:
        raise ImageRejected('%s has virtual size %d, above the limit %d'
                            % (path, vsize, max_virtual_size))
    return vsize


# Formats a lazy mirror can read remotely: raw bytes, or qcow2 through
# QEMU's own driver (inspect_header checks the header first).
LAZY_FORMATS = ('raw', 'qcow2')
# bytes of an image's start that inspect_header needs (a qcow2 header is
# 104 bytes; the inspector captures 512)
HEADER_BYTES = 512
_QCOW2_CRYPT_METHOD = slice(32, 36)


def inspect_header(data, claimed_format, name):
    """Check the start of a remote image before QEMU opens it; its size.

    For an image read range by range, never whole: ``data`` is its first
    :data:`HEADER_BYTES` (or all of it). Raw data has no header: None.
    qcow2 must be what it claims, with no backing file, no external data
    file, no unknown features and no encryption; returns its virtual
    size. Raises :class:`ImageRejected` otherwise.
    """
    if claimed_format == 'raw':
        return None
    if claimed_format != 'qcow2':
        raise ImageRejected('%s: %s images are not read range by range'
                            % (name, claimed_format))
    inspector = format_inspector.QcowInspector()
    try:
        inspector.eat_chunk(data[:HEADER_BYTES])
        if not inspector.format_match:
            raise ImageRejected('%s claims to be qcow2 but its header is '
                                'not' % name)
        inspector.safety_check()
    except (format_inspector.SafetyCheckFailed,
            format_inspector.ImageFormatError) as e:
        raise ImageRejected('%s failed the qcow2 safety check: %s'
                            % (name, e))
    if data[_QCOW2_CRYPT_METHOD] != bytes(4):
        raise ImageRejected('%s is an encrypted qcow2' % name)
    return inspector.virtual_size


def _qcow2_check(qemu_img, path):
    proc = subprocess.run(
        [qemu_img, 'check', '-f', 'qcow2', '--output=json', path],
        capture_output=True, text=True, env=dict(os.environ, LC_ALL='C'))
    # 0: clean, 3: leaked clusters only (harmless). Anything else is damage.
    if proc.returncode not in (0, 3):
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        detail = lines[0] if lines else 'qemu-img check failed'
        if len(lines) > 1:
            detail += ' (and %d more lines)' % (len(lines) - 1)
        raise ImageRejected('%s is a corrupt or truncated qcow2: %s'
                            % (path, detail))


@contextlib.contextmanager
def raw_view(path, fmt, qemu_img='qemu-img', work_dir=None):
    """Yield a path to the raw virtual disk content of an inspected image.

    Raw-like images are used in place; others are converted, sparse, into a
    temporary file that is removed afterwards, whatever happens.
    """
    if fmt in RAW_LIKE:
        yield path
        return
    if work_dir:
        os.makedirs(work_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='vmar-raw-', dir=work_dir)
    os.close(fd)
    try:
        proc = subprocess.run(
            [qemu_img, 'convert', '-f', _QEMU_NAMES.get(fmt, fmt), '-O',
             'raw', '-S', '4k', path, tmp],
            capture_output=True, text=True,
            env=dict(os.environ, LC_ALL='C'))
        if proc.returncode:
            raise ImageRejected('qemu-img could not convert %s from %s: %s'
                                % (path, fmt, proc.stderr.strip()))
        yield tmp
    finally:
        os.unlink(tmp)


class RawView(typing.NamedTuple):
    """The raw content of an inspected image, and its virtual size."""

    path: str
    virtual_size: int


@contextlib.contextmanager
def checked_raw_view(path, fmt, qemu_img='qemu-img', work_dir=None,
                     expected_size=None, max_virtual_size=None):
    """Inspect an image, then yield its :class:`RawView`.

    :func:`inspect` first (``expected_size`` and ``max_virtual_size`` as
    there), then :func:`raw_view`, whose size must be the virtual size
    the inspection found.
    """
    vsize = inspect(path, fmt, qemu_img=qemu_img, expected_size=expected_size,
                    max_virtual_size=max_virtual_size)
    with raw_view(path, fmt, qemu_img=qemu_img, work_dir=work_dir) as raw:
        size = os.stat(raw).st_size
        if size != vsize:
            raise ImageRejected('raw view of %s is %d bytes, expected %d'
                                % (path, size, vsize))
        yield RawView(raw, vsize)
