"""What every map source is: an abstract class with capability flags.

Nova's ``imagebackend.Image`` is the model: the export service asks a
source what it can do through its flags, never by looking for methods.
"""

import abc

from vmar_openstack import exception


class MapSource(abc.ABC):
    """Where a compute host gets maps and base images from.

    Every failure is a :class:`~vmar_openstack.exception.SourceError`
    with a message an operator can act on.
    """

    #: reads any range of a base (:meth:`base_reader`) and has its digest
    #: list (:meth:`fetch_digests`): the host can keep lazy mirrors
    can_mirror = False
    #: publishes images' boot working sets (:meth:`fetch_bootset`)
    has_bootsets = False
    #: publishes images' block layouts (:meth:`fetch_layout`)
    has_layouts = False
    #: its base readers are exports of a range server the export daemon
    #: runs beside qemu-storage-daemon (:meth:`range_server_command`)
    needs_range_server = False
    #: publishes the SHA-256 of each digest list (:meth:`digests_sha256`):
    #: a peer's copy of a list can be checked, and read instead
    has_digest_sums = False

    @abc.abstractmethod
    def current_version(self, image_id):
        """The image's current map version."""

    @abc.abstractmethod
    def fetch_map(self, image_id, version, dest):
        """That map version, verified, at ``dest``."""

    @abc.abstractmethod
    def fetch_base(self, image_id, dest):
        """The image's raw content, verified, at ``dest``."""

    def fetch_digests(self, image_id, dest):
        """The base's digest list at ``dest`` (``can_mirror``)."""
        raise self._cannot('fetch digest lists')

    def digests_sha256(self, image_id):
        """The published SHA-256 of the base's digest list (``has_...``).

        Hex; what a copy of the list from elsewhere must hash to
        (``has_digest_sums``).
        """
        raise self._cannot('publish the sums of digest lists')

    def base_reader(self, image_id, size):
        """Where the base's ``size`` raw bytes can be read range by range.

        A description of :mod:`.readers` (``can_mirror``).
        """
        raise self._cannot('read bases range by range')

    def fetch_bootset(self, image_id, dest):
        """The image's boot working set at ``dest`` (``has_bootsets``)."""
        raise self._cannot('publish boot working sets')

    def fetch_layout(self, image_id, dest):
        """The image's block layout at ``dest`` (``has_layouts``)."""
        raise self._cannot('publish block layouts')

    def range_server_command(self):
        """``(argv, socket, env)`` of the range server.

        (``needs_range_server``.)
        """
        raise self._cannot('run a range server')

    def _cannot(self, what):
        return exception.SourceError('the %s map source cannot %s'
                                     % (type(self).__name__, what))
