"""VMAR for OpenStack: deduplicated reads of similar VM base images.

The package is split along the data flow of an image, from the library
(the image service's side) to the compute hosts:

* :mod:`vmar_openstack.fingerprint` hashes an image's virtual disk in blocks;
* :mod:`vmar_openstack.db` keeps the cluster tables (images, fingerprints,
  clusters) in SQL;
* :mod:`vmar_openstack.mapgen` turns the cluster tables into per-image block
  maps;
* :mod:`vmar_openstack.mapformat` writes and reads the binary map format;
* :mod:`vmar_openstack.ingest` ties the above into add/update/delete;
* :mod:`vmar_openstack.mapsource` gets maps and base images onto a compute
  host (from a library directory, or from Glance);
* :mod:`vmar_openstack.host` serves each image's VMAR view over NBD from
  the host's patched ``qemu-storage-daemon`` (``vmar-export``): its
  exports, its peers, its page cache, its guests' channels and what it
  reports;
* :mod:`vmar_openstack.nova_imagebackend` boots instances from qcow2
  overlays on those exports (``vmar-nova-compute``);
* :mod:`vmar_openstack.glance_hooks` ingests images as Glance receives them
  (the ``vmar_mapgen`` import plugin) and publishes their maps to Glance
  (``vmar-agent``);
* :mod:`vmar_openstack.conf` holds every configuration option;
* :mod:`vmar_openstack.cmd` holds the console scripts.

Leaf modules, which import nothing of the project:

* :mod:`vmar_openstack.names` builds and parses every name format that
  crosses components (map file, export, NBD URI);
* :mod:`vmar_openstack.exception` holds every exception class;
* :mod:`vmar_openstack.fileutils` writes files atomically.
"""
