"""A cloud's host CA and x509 credentials, made with openssl for a run.

The layout is QEMU's and nbdkit's (``tls-creds-x509``,
``--tls-certificates``): ``ca-cert.pem``, ``server-cert.pem`` and
``server-key.pem`` for a server, ``client-cert.pem`` and
``client-key.pem`` for a client, in one directory per credential set.
Used by the peer server's tests and bench (issue 34).
"""

import os
import shutil
import subprocess


def _openssl(*args, cwd):
    subprocess.run(['openssl'] + list(args), cwd=cwd, check=True,
                   capture_output=True)


def make_ca(d, name):
    os.makedirs(d, exist_ok=True)
    _openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
             '-subj', '/CN=%s' % name, '-keyout', 'ca-key.pem', '-out',
             'ca-cert.pem', cwd=d)


def make_cert(ca, d, role, cn, san=None):
    """``<role>-cert.pem`` and ``<role>-key.pem`` in ``d``, signed by ca."""
    os.makedirs(d, exist_ok=True)
    _openssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=%s' % cn,
             '-keyout', '%s-key.pem' % role, '-out', '%s.csr' % role, cwd=d)
    ext = os.path.join(d, '%s.ext' % role)
    with open(ext, 'w') as f:
        f.write('basicConstraints=CA:FALSE\n')
        usage = 'serverAuth' if role == 'server' else 'clientAuth'
        f.write('extendedKeyUsage=%s\n' % usage)
        if san:
            f.write('subjectAltName=%s\n' % san)
    _openssl('x509', '-req', '-in', '%s.csr' % role, '-CA',
             os.path.join(ca, 'ca-cert.pem'), '-CAkey',
             os.path.join(ca, 'ca-key.pem'), '-CAcreateserial', '-days', '2',
             '-extfile', ext, '-out', '%s-cert.pem' % role, cwd=d)
    shutil.copy(os.path.join(ca, 'ca-cert.pem'), d)
