"""Sphinx configuration of vmar-openstack's documentation (tox -e docs)."""

extensions = [
    'openstackdocstheme',
    'oslo_config.sphinxext',
    'reno.sphinxext',
]

project = 'vmar-openstack'
copyright = 'the vmar-openstack authors'
master_doc = 'index'
exclude_patterns = ['_build']
pygments_style = 'native'

html_theme = 'openstackdocs'
openstackdocs_repo_name = 'vmar-openstack/vmar-openstack'
openstackdocs_use_storyboard = False
openstackdocs_auto_name = False
openstackdocs_bug_project = 'vmar-openstack'
openstackdocs_bug_tag = 'doc'
