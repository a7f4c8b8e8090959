"""The VMAR block map file: writer, validating parser and lookups.

This package owns the binary format specified in
``doc/source/reference/map-format.rst`` (the only specification): the writer
and parser (:mod:`.codec`) and reading through a parsed map (:mod:`.lookup`).
It knows nothing of databases or images: it turns extents into bytes and
bytes back into validated extents. The C reader in ``qemu/`` implements
the same rules and is checked against the same vectors in
``tests/vectors/``.
"""

# still caught here by callers outside this package
from vmar_openstack.fileutils import write_atomic  # noqa: F401
from vmar_openstack.mapformat.codec import BlockMap  # noqa: F401
from vmar_openstack.mapformat.codec import build_filter  # noqa: F401
from vmar_openstack.mapformat.codec import build_index  # noqa: F401
from vmar_openstack.mapformat.codec import decode  # noqa: F401
from vmar_openstack.mapformat.codec import encode  # noqa: F401
from vmar_openstack.mapformat.codec import EXTENT_DTYPE  # noqa: F401
from vmar_openstack.mapformat.codec import INDEX_DTYPE  # noqa: F401
from vmar_openstack.mapformat.codec import read  # noqa: F401
from vmar_openstack.mapformat.codec import Target  # noqa: F401
from vmar_openstack.mapformat.codec import target_blocks  # noqa: F401
from vmar_openstack.mapformat.lookup import iter_ranges  # noqa: F401
from vmar_openstack.mapformat.lookup import Lookup  # noqa: F401
from vmar_openstack.mapformat.lookup import reconstruct  # noqa: F401
