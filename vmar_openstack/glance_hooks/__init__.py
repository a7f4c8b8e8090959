"""Glance integration: the import plugin and the notification agent.

* :mod:`.plugin`: the ``vmar_mapgen`` image import plugin, which ingests an
  image during ``openstack image create --import``, before Glance stores
  it;
* :mod:`.agent`: ``vmar-agent``, which listens to Glance's notifications,
  ingests images uploaded without the plugin, follows deletions and
  changes of owner or visibility, and resyncs with Glance;
* :mod:`.publish`: how the agent publishes map versions as hidden Glance
  images (the layout is the contract's, :mod:`vmar_openstack.names`);
* :mod:`.opts`: the sample configuration of glance-api and its import
  plugins for vmar (oslo-config-generator).
"""
