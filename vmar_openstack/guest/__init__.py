"""The guest component of guest-private caching, and its delivery.

Owns ``vmar-guest.c`` and ``vmar-guest.service`` (what runs inside a
guest-private server; the image library bakes them into its images) and
:mod:`.userdata`, which packs them into cloud-init user-data for images
that lack them. Uses nothing else of vmar_openstack but its exceptions.
"""
