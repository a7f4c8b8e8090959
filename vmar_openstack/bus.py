"""The message bus (oslo.messaging) between compute hosts and vmar-agent.

Hosts send their reports as notifications (:mod:`.export.report`) and, to
find peers, ask vmar-agent who holds a base over RPC
(:mod:`.export.discovery`, :class:`.glance_hooks.agent.HoldersEndpoint`).
Both go over the bus of the notifications: ``[oslo_messaging_notifications]
transport_url`` if set, else ``[DEFAULT] transport_url``, so a host needs
one bus setting, the one it already has for its reports. The RPC's target
is defined here, once for both ends.

oslo.messaging is imported in the functions: it brings eventlet, whose
deprecation warning every command would print otherwise.
"""

from oslo_config import cfg

#: the holders RPC: namespace and version of vmar-agent's endpoint
HOLDERS_NAMESPACE = 'vmar_holders'
HOLDERS_VERSION = '1.0'


def _unset(conf, group):
    loc = conf.get_location('transport_url', group)
    return loc is None or loc.location == cfg.Locations.opt_default


def notification_transport(conf):
    """The notification transport, or None when no bus is configured.

    oslo.messaging's defaults name a local RabbitMQ nobody configured:
    without a ``transport_url`` vmar sends nothing rather than wait on it.
    """
    import oslo_messaging
    transport = oslo_messaging.get_notification_transport(conf)
    # the call registered the options it reads
    if _unset(conf, None) and _unset(conf, 'oslo_messaging_notifications'):
        return None
    return transport


def rpc_transport(conf):
    """An RPC transport on the notifications' bus, or None (no bus)."""
    if notification_transport(conf) is None:
        return None
    import oslo_messaging
    url = conf.oslo_messaging_notifications.transport_url
    return oslo_messaging.get_rpc_transport(conf, url=url or None)


def holders_target(conf, server=None):
    import oslo_messaging
    return oslo_messaging.Target(
        topic=conf.vmar_reports.holders_topic, server=server,
        namespace=HOLDERS_NAMESPACE, version=HOLDERS_VERSION)
