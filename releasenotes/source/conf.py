"""Sphinx configuration of the release notes."""

extensions = ['reno.sphinxext']
project = 'vmar-openstack Release Notes'
master_doc = 'index'
