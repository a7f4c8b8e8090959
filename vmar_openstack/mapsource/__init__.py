"""Map sources: where a compute host gets maps and base images from.

Every source is a :class:`.base.MapSource`: three operations every source
has (``current_version``, ``fetch_map``, ``fetch_base``), and capability
flags for the rest, which the export service asks instead of looking for
methods:

* ``can_mirror``: ``fetch_digests`` and ``base_reader``, a typed
  description (:mod:`.readers`) of where a base can be read range by
  range; the host then keeps lazy mirrors (``[vmar_host] base_fetch =
  lazy``);
* ``has_bootsets``: ``fetch_bootset``, the boot working set the host
  prefetches;
* ``has_layouts``: ``fetch_layout``, the block layout the host keeps the
  metadata of its bases warm by;
* ``needs_range_server``: ``range_server_command``, the nbdkit the export
  daemon runs for its base readers.

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
