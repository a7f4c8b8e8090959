"""Block fingerprints of an image's virtual disk content.

This package owns deciding whether an image file is safe to read
(:mod:`.safety`: format pinned, ``oslo_utils`` format inspector, qemu-img
for non-raw formats), hashing its virtual disk in fixed-size blocks on every
core (:mod:`.hashing`), the digest arrays that result (:mod:`.digests`: one
digest per block, all-zero rows for zero blocks) and the fingerprint keys
derived from them (:mod:`.keys`), and what its file systems say of its
blocks, read with well-kept tools (:mod:`.fstools`): which blocks a boot
of the image reads (:mod:`.introspect`). It touches no database.
"""

# still caught here by callers outside this package
from vmar_openstack.fingerprint.digests import DIGEST_SIZES  # noqa: F401
from vmar_openstack.fingerprint.digests import Fingerprints  # noqa: F401
from vmar_openstack.fingerprint.digests import rows_equal  # noqa: F401
from vmar_openstack.fingerprint.digests import take_rows  # noqa: F401
from vmar_openstack.fingerprint.digests import words  # noqa: F401
from vmar_openstack.fingerprint.hashing import fingerprint_image  # noqa
from vmar_openstack.fingerprint.hashing import hash_file  # noqa: F401
from vmar_openstack.fingerprint.safety import checked_raw_view  # noqa
from vmar_openstack.fingerprint.safety import HEADER_BYTES  # noqa: F401
from vmar_openstack.fingerprint.safety import inspect  # noqa: F401
from vmar_openstack.fingerprint.safety import inspect_header  # noqa
from vmar_openstack.fingerprint.safety import LAZY_FORMATS  # noqa: F401
from vmar_openstack.fingerprint.safety import qemu_img_info  # noqa: F401
from vmar_openstack.fingerprint.safety import raw_view  # noqa: F401
from vmar_openstack.fingerprint.safety import RawView  # noqa: F401
