"""The ``dir`` map source: a library directory (``maps/``, ``bases/``).

For a compute host that shares a file system with the library, and for
tests. The current map of an image is its highest version present.
"""

import os
import re

from vmar_openstack import fileutils
from vmar_openstack.mapsource import SourceError

_MAP_NAME = re.compile(r'^(?P<id>[0-9a-f-]{36})\.(?P<v>[0-9]+)\.vmap$')


class LocalDirSource:

    def __init__(self, root):
        self.root = root

    def current_version(self, image_id):
        versions = []
        try:
            names = os.listdir(os.path.join(self.root, 'maps'))
        except FileNotFoundError:
            names = []
        for name in names:
            m = _MAP_NAME.match(name)
            if m and m.group('id') == image_id:
                versions.append(int(m.group('v')))
        if not versions:
            raise SourceError('no map of image %s in %s'
                              % (image_id, self.root))
        return max(versions)

    def fetch_map(self, image_id, version, dest):
        name = '%s.%d.vmap' % (image_id, version)
        self._copy(os.path.join(self.root, 'maps', name), dest)

    def fetch_base(self, image_id, dest):
        self._copy(os.path.join(self.root, 'bases', image_id), dest)

    @staticmethod
    def _copy(src, dest):
        try:
            fileutils.copy_readonly(src, dest)
        except OSError as e:
            raise SourceError('cannot fetch %s: %s' % (src, e))
