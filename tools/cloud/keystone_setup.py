"""Service users, the service catalogue and endpoints, in one process.

``keystone-manage bootstrap`` made the admin user, project and role and
the identity endpoints; this adds what the other services need, through
the Identity API with one keystoneauth session (one ``openstack`` CLI call
per object would cost about 2.5 s each). Everything is looked up first,
so running it again changes nothing.
"""

from keystoneauth1.identity import v3
from keystoneauth1 import session as ks_session
from keystoneclient.v3 import client as ks_client

from tools.cloud import config

# service type -> (name, description, path after the service's URL)
CATALOGUE = (
    ('image', 'glance', 'Image service', 'glance_api', ''),
    ('placement', 'placement', 'Placement API', 'placement', ''),
    ('compute', 'nova', 'Compute service', 'nova_api', '/v2.1'),
    ('network', 'neutron', 'Networking service', 'neutron', ''),
)
INTERFACES = ('public', 'internal', 'admin')
# every service user gets both: admin to see every image (vmar-agent) and
# act for Neutron/Nova callbacks, service for service tokens
# (service_token_roles_required)
SERVICE_ROLES = ('admin', 'service')


def admin_client(cloud):
    auth = v3.Password(
        auth_url=cloud.keystone_url, username='admin',
        password=cloud.password('admin'), project_name='admin',
        user_domain_id='default', project_domain_id='default')
    return ks_client.Client(session=ks_session.Session(auth=auth),
                            interface='public')


def _find(manager, **filters):
    name = filters.pop('name')
    for item in manager.list(**filters):
        if item.name == name:
            return item
    return None


def ensure(cloud):
    ks = admin_client(cloud)
    domain = ks.domains.get('default')
    project = (_find(ks.projects, name='service', domain=domain)
               or ks.projects.create('service', domain,
                                     description='OpenStack services'))
    roles = {}
    for name in SERVICE_ROLES:
        roles[name] = _find(ks.roles, name=name) or ks.roles.create(name)
    for name in config.SERVICE_USERS:
        user = _find(ks.users, name=name, domain=domain)
        if user is None:
            user = ks.users.create(name, domain=domain, project=project,
                                   password=cloud.password(name))
        else:
            ks.users.update(user, password=cloud.password(name))
        for role in roles.values():
            ks.roles.grant(role, user=user, project=project)
    region = config.REGION
    for stype, name, description, port, suffix in CATALOGUE:
        service = _find(ks.services, name=name, type=stype)
        if service is None:
            service = ks.services.create(name, stype,
                                         description=description)
        url = cloud.url(port) + suffix
        have = {e.interface: e for e in ks.endpoints.list(service=service)}
        for interface in INTERFACES:
            endpoint = have.get(interface)
            if endpoint is None:
                ks.endpoints.create(service, url, interface=interface,
                                    region=region)
            elif endpoint.url != url:
                ks.endpoints.update(endpoint, url=url)
