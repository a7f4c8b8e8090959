"""Glance integration: the import plugin and the notification agent.

Not implemented yet (tracked by the Glance integration issue). The package
exists so that the layout matches what OpenStack plugin users expect.
"""
