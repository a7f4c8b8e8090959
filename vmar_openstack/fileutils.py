"""Files that appear whole or not at all.

Both helpers write to a temporary name in the destination directory, fsync,
and rename, so a reader (or a process killed half way) never sees part of a
file.
"""

import contextlib
import grp
import os
import socket
import struct
import subprocess
import tempfile


def write_atomic(path, data, mode=0o644):
    """Write ``data`` to ``path``: temp file, fsync, rename, fsync dir."""
    install(write_temp(path, data, mode), path)


def write_temp(path, data, mode=0o644):
    """Write ``data`` to a new fsynced temporary file next to ``path``.

    Returns its name; :func:`install` moves it to ``path``. The caller
    removes it if it never does.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.tmp-', dir=directory)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        unlink(tmp)
        raise
    return tmp


def new_temp(path, prefix='.tmp-'):
    """A new empty temporary file next to ``path``, for a writer to fill.

    Unique per call (threads of one process included); :func:`install`
    moves it to ``path``, the caller removes it if it never does.
    ``prefix`` starts its name.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    os.close(fd)
    return tmp


@contextlib.contextmanager
def atomic_file(path, prefix='.tmp-'):
    """A new file (``w+b``) that becomes ``path`` if the block ends well.

    Synced before it is renamed; on any failure it is removed and ``path``
    is untouched. ``prefix`` starts the temporary file's name (a process
    killed meanwhile leaves that file behind).
    """
    tmp = new_temp(path, prefix)
    try:
        with open(tmp, 'w+b') as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        install(tmp, path)
    except BaseException:
        unlink(tmp)
        raise


def install(tmp, path):
    """Rename a file from :func:`write_temp` to ``path``, durably."""
    try:
        os.rename(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def unlink(path):
    """Remove a file if it exists."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def copy_readonly(src, dest):
    """Copy ``src`` to ``dest``, sparse, mode 0444, atomically.

    A copy (reflinked where the file system can), never a hard link: the
    copy must not change when the source does.

    :raises OSError: when the copy fails (the message names the file).
    """
    directory = os.path.dirname(os.path.abspath(dest))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.tmp-', dir=directory)
    os.close(fd)
    try:
        proc = subprocess.run(['cp', '--sparse=always', '--reflink=auto',
                               src, tmp], capture_output=True, text=True)
        if proc.returncode:
            raise OSError('cannot copy %s to %s: %s'
                          % (src, dest, proc.stderr.strip()))
        os.chmod(tmp, 0o444)
        with open(tmp, 'rb') as f:
            os.fsync(f.fileno())
        os.rename(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_dir(directory)


def fsync_dir(directory):
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def publish_socket(tmp, path, group=None):
    """Give a bound unix socket to root and ``group``, 0660, at ``path``.

    The socket was bound at ``tmp`` beside ``path``: clients find it only
    once its owner and mode are right (the rename is atomic).
    """
    if group:
        os.chown(tmp, -1, grp.getgrnam(group).gr_gid)
    os.chmod(tmp, 0o660)
    os.rename(tmp, path)


_UCRED = struct.Struct('3i')    # pid, uid, gid


def socket_peer(sock):
    """``(pid, uid, gid)`` of a unix socket's peer (``SO_PEERCRED``)."""
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET,
                                         socket.SO_PEERCRED, _UCRED.size))
