"""Every exception vmar-openstack raises on purpose.

One base class, :class:`VmarException`, carries a message template filled
from keyword arguments, in the style of os-brick's ``exception.py``::

    raise LibraryInconsistent(what='image 3 holds part of cluster 7')

or a ready message as the first argument. The ``cmd`` mains catch
:class:`VmarException` and print its message on one line. Classes that
callers used to catch by a built-in type keep it as a second base.
"""


class VmarException(Exception):
    """Base class: ``message % kwargs``, or the message given."""

    message = 'An unknown error occurred.'

    def __init__(self, message=None, **kwargs):
        self.kwargs = kwargs
        if message is None:
            try:
                message = self.message % kwargs
            except (KeyError, TypeError, ValueError):
                # a template that does not fit its arguments is a bug of
                # ours; say what we have rather than hide the error
                message = '%s %r' % (self.message, kwargs)
        self.msg = message
        super().__init__(message)

    def __str__(self):
        return self.msg


class LibraryInconsistent(VmarException, RuntimeError):
    message = ('the library is inconsistent: %(what)s; run vmar-manage '
               'check')


class DatabaseNotReady(VmarException, RuntimeError):
    message = 'the %(what)s is missing; run "vmar-manage db sync"'


class IrreversibleMigration(VmarException, RuntimeError):
    message = ('schema revision %(revision)s cannot be undone; the '
               'earliest revision reachable from %(current)s is %(floor)s')


class DowngradeRefused(VmarException, RuntimeError):
    message = ('schema revision %(revision)s is not undone: %(reason)s; '
               'nothing was changed')


class NativeHasherMissing(VmarException, RuntimeError):
    message = ('the native block hasher is not built; reinstall the '
               'package with gcc, python3-dev and libssl-dev present')


class LockTimeout(VmarException, RuntimeError):
    message = 'could not take the library lock within %(timeout)s s'


class ImageRejected(VmarException, ValueError):
    message = 'image rejected: %(reason)s'


class ImageNotFound(VmarException, LookupError):
    message = 'image %(image_id)s is not in the library'


class ImageExists(VmarException, ValueError):
    message = 'image %(image_id)s is already in the library'


class MapFormatError(VmarException, ValueError):
    """A map file breaks a rule of the specification.

    ``reason`` is the rule: one of header, magic, version, crc, bounds,
    targets, extents, index, filter.
    """
    message = 'invalid VMAR map (%(reason)s): %(detail)s'

    @property
    def reason(self):
        return self.kwargs.get('reason')


class MirrorFormatError(VmarException, ValueError):
    """A digest list or present file breaks its specification."""
    message = 'invalid mirror file %(path)s: %(detail)s'


class BootsetFormatError(VmarException, ValueError):
    """A boot working set breaks its specification."""
    message = 'invalid boot working set of %(image_id)s: %(detail)s'


class LayoutFormatError(VmarException, ValueError):
    """A block layout breaks its specification."""
    message = 'invalid block layout of %(image_id)s: %(detail)s'


class DeltaFormatError(VmarException, ValueError):
    """A snapshot delta breaks its specification or its digests."""
    message = 'invalid snapshot delta %(what)s: %(detail)s'


class SnapshotError(VmarException, RuntimeError):
    """A snapshot's delta cannot be made, sent or assembled."""
    message = 'snapshot %(image_id)s: %(reason)s'


class SourceError(VmarException, RuntimeError):
    """A map or base image cannot be found, fetched or verified."""
    message = 'cannot get %(what)s: %(reason)s'


class ExportError(VmarException, RuntimeError):
    """An export cannot be created, restored or removed."""
    message = 'export failed: %(reason)s'


class ExportDaemonDown(ExportError):
    """Nothing answers on the export daemon's QMP socket."""
    message = ('the export daemon is not running (%(reason)s); start '
               '"vmar-export serve"')


class DaemonLacksDriver(ExportError):
    """The configured qemu-storage-daemon was built without vmar."""
    message = ('%(daemon)s has no %(drivers)s driver: build it with '
               'qemu/build.sh and point [vmar_host] qemu_storage_daemon '
               'at it')


class HostApiError(ExportError):
    """The host API's conversation failed.

    A malformed message, a cut connection, a reply that did not come in
    time.
    """
    message = 'the export daemon\'s API failed: %(reason)s'


class HostApiDenied(HostApiError):
    """The export daemon refused the caller (not root, not in its group)."""
    message = ('the export daemon refused the caller: %(reason)s')


class UnsupportedVersion(HostApiError):
    """The client speaks a host API version the daemon does not."""
    message = ('the export daemon does not speak host API version '
               '%(version)s (it speaks %(supported)s)')


class PublishError(VmarException, RuntimeError):
    """A map could not be published (Glance refused or is unreachable)."""
    message = 'cannot publish the map of %(image_id)s: %(reason)s'


class StuckError(PublishError):
    """A map image stays in 'saving' (its uploader died)."""
    message = 'map image %(image_id)s is stuck in saving'


class ImageUnusable(VmarException):
    """The agent can never ingest an image: retrying cannot help."""
    message = 'image %(image_id)s rejected by mapgen: %(reason)s'


class CommandError(VmarException):
    """A console command was given something it cannot act on."""


class GuestUserDataError(VmarException):
    message = 'cannot make vmar-guest user-data: %(reason)s'
