"""Map sources: where a compute host gets maps and base images from.

A source answers three questions for the export service
(:class:`vmar_openstack.export.ExportService`):

* ``current_version(image_id)``: the image's current map version;
* ``fetch_map(image_id, version, dest)``: that map, verified, at ``dest``;
* ``fetch_base(image_id, dest)``: the image's raw content, verified, at
  ``dest``.

A source that can also fill base mirrors on demand (``[vmar_host] base_fetch =
lazy``) has two more:

* ``fetch_digests(image_id, dest)``: the base's digest list at ``dest``;
* ``base_reader(image_id, size)``: the QEMU node (a ``blockdev-add``
  dict without a name) that reads the base's ``size`` raw bytes. The
  host keeps it with the mirror, so a restarted daemon needs no source;
* ``fetch_bootset(image_id, dest)``: the image's boot working set (which
  the host prefetches) at ``dest``.

``[vmar_host] map_source`` chooses one: ``dir`` (:mod:`.local`, a library
directory on the host) or ``glance`` (:mod:`.glance`, maps published as
hidden Glance images by ``vmar-agent``). Every failure is a
:class:`vmar_openstack.exception.SourceError` with a message an operator
can act on.
"""


def get_source(conf):
    """The source ``[vmar_host] map_source`` names."""
    if conf.vmar_host.map_source == 'glance':
        from vmar_openstack.mapsource import glance
        return glance.GlanceSource(conf)
    from vmar_openstack.mapsource import local
    return local.LocalDirSource(conf.vmar_host.map_source_dir)
