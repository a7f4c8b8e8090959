"""Add, update and delete images in the library (paper Fig. 7).

This package is the only place that combines the other packages: the
library's operations (:mod:`.library`), the work an add does before it
takes the library lock (:mod:`.ahead`), where the library's files live
(:mod:`.paths`) and the invariant checker (:mod:`.check`).
"""

# still caught here by callers outside this package
from vmar_openstack.ingest.library import Library  # noqa: F401
from vmar_openstack.ingest.library import Outcome  # noqa: F401
from vmar_openstack.ingest.paths import base_path  # noqa: F401
from vmar_openstack.ingest.paths import map_path  # noqa: F401
