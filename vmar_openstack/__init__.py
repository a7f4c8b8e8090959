"""VMAR for OpenStack: deduplicated reads of similar VM base images.

The package is split along the data flow of an image:

* :mod:`vmar_openstack.fingerprint` hashes an image's virtual disk in blocks;
* :mod:`vmar_openstack.db` keeps the cluster tables (images, fingerprints,
  clusters) in SQL;
* :mod:`vmar_openstack.mapgen` turns the cluster tables into per-image block
  maps;
* :mod:`vmar_openstack.mapformat` writes and reads the binary map format;
* :mod:`vmar_openstack.ingest` ties the above into add/update/delete;
* :mod:`vmar_openstack.conf` holds every configuration option;
* :mod:`vmar_openstack.cmd` holds the console scripts.
"""
