"""The ``dir`` map source: a library directory (``maps/``, ``bases/``).

For a compute host that shares a file system with the library (NFS, say),
and for tests. The current map of an image is its highest version present.
Base mirrors (``[vmar_host] base_fetch = lazy``) read missing blocks straight
from ``bases/`` and check them against ``digests/``.
"""

import os

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.mapsource import base
from vmar_openstack.mapsource import readers
from vmar_openstack import names


class LocalDirSource(base.MapSource):

    can_mirror = True
    has_bootsets = True
    has_layouts = True

    def __init__(self, root):
        self.root = root

    def current_version(self, image_id):
        versions = []
        try:
            files = os.listdir(os.path.join(self.root, 'maps'))
        except FileNotFoundError:
            files = []
        for name in files:
            parsed = names.parse_map_file(name)
            if parsed and parsed[0] == image_id:
                versions.append(parsed[1])
        if not versions:
            raise exception.SourceError('no map of image %s in %s'
                                        % (image_id, self.root))
        return max(versions)

    def fetch_map(self, image_id, version, dest):
        self._copy(os.path.join(self.root, 'maps',
                                names.map_file(image_id, version)), dest)

    def fetch_base(self, image_id, dest):
        self._copy(self._base(image_id), dest)

    def fetch_digests(self, image_id, dest):
        self._copy(os.path.join(self.root, 'digests',
                                names.digest_file(image_id)), dest)

    def fetch_bootset(self, image_id, dest):
        self._copy(os.path.join(self.root, 'digests',
                                names.bootset_file(image_id)), dest)

    def fetch_layout(self, image_id, dest):
        self._copy(os.path.join(self.root, 'digests',
                                names.layout_file(image_id)), dest)

    def base_reader(self, image_id, size):
        """The library's base file: a mirror fetches missing blocks there.

        :raises SourceError: the library's base is not ``size`` bytes.
        """
        path = self._base(image_id)
        try:
            have = os.path.getsize(path)
        except OSError as e:
            raise exception.SourceError('cannot read %s: %s'
                                        % (path, e.strerror))
        if have != size:
            raise exception.SourceError('%s is %d bytes, the map says %d'
                                        % (path, have, size))
        return readers.File(path)

    def _base(self, image_id):
        return os.path.join(self.root, 'bases', image_id)

    @staticmethod
    def _copy(src, dest):
        try:
            fileutils.copy_readonly(src, dest)
        except OSError as e:
            raise exception.SourceError('cannot fetch %s: %s' % (src, e))
