"""Map generation: from cluster tables to an image's extents.

For every shareable block of an image, the canonical target is the image
with the smallest sequence id among the images this image may redirect to
(``[vmar] dedup_scope``) that holds the same content, then the smallest block
number in it. Zero blocks are left out. Runs of blocks that map contiguously
into one target become one extent.

Candidate targets come from the clusters that contain the image; the full
digests of the candidate are compared before a block is redirected, so a
fingerprint key collision can never redirect a read to other content.

The package owns that rule: who may read whom (:mod:`.scope`), an image's
blocks by key and by digest (:mod:`.blocks`), the cache of the latter
(:mod:`.cache`) and the map built from them (:mod:`.resolver`). It reads
the cluster tables through :class:`vmar_openstack.db.store.ClusterStore`.
"""

from vmar_openstack.mapgen.blocks import BlockIndex  # noqa: F401
from vmar_openstack.mapgen.blocks import FirstOccurrence  # noqa: F401
from vmar_openstack.mapgen.cache import clear_cache  # noqa: F401
from vmar_openstack.mapgen.resolver import MapResult  # noqa: F401
from vmar_openstack.mapgen.resolver import NO_CLUSTER  # noqa: F401
from vmar_openstack.mapgen.resolver import Resolver  # noqa: F401
from vmar_openstack.mapgen.scope import may_redirect  # noqa: F401
