"""A cloud's host CA and x509 credentials, made with openssl.

The layout is QEMU's and nbdkit's (``tls-creds-x509``,
``--tls-certificates``): ``ca-cert.pem``, ``server-cert.pem`` and
``server-key.pem`` for a server, ``client-cert.pem`` and
``client-key.pem`` for a client, in one directory per credential set.
Used by the peer server's tests and bench, and by ``tools/cloud.sh up
--computes N`` for its hosts' peer servers (issue 34). Private keys are
0600 and the directories 0700: whoever runs this owns them.
"""

import os
import shutil
import subprocess


def _openssl(*args, cwd):
    # umask 077: a private key is never readable by others, not even while
    # openssl writes it
    subprocess.run(['openssl'] + list(args), cwd=cwd, check=True,
                   capture_output=True, stdin=subprocess.DEVNULL,
                   preexec_fn=lambda: os.umask(0o077))


def _private_dir(d):
    os.makedirs(d, mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)


def make_ca(d, name, days=2):
    """``ca-cert.pem`` and ``ca-key.pem`` in ``d``: a self-signed CA."""
    _private_dir(d)
    _openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days',
             str(days), '-subj', '/CN=%s' % name, '-keyout', 'ca-key.pem',
             '-out', 'ca-cert.pem', cwd=d)
    os.chmod(os.path.join(d, 'ca-key.pem'), 0o600)


def make_cert(ca, d, role, cn, san=None, days=2):
    """``<role>-cert.pem`` and ``<role>-key.pem`` in ``d``, signed by ca.

    ``role`` is ``server`` (extended key usage serverAuth) or ``client``
    (clientAuth); ``san`` a subjectAltName value (``IP:10.0.0.1``). The CA
    certificate is copied beside them.
    """
    _private_dir(d)
    csr, ext = '%s.csr' % role, os.path.join(d, '%s.ext' % role)
    _openssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=%s' % cn,
             '-keyout', '%s-key.pem' % role, '-out', csr, cwd=d)
    with open(ext, 'w') as f:
        f.write('basicConstraints=CA:FALSE\n')
        usage = 'serverAuth' if role == 'server' else 'clientAuth'
        f.write('extendedKeyUsage=%s\n' % usage)
        if san:
            f.write('subjectAltName=%s\n' % san)
    _openssl('x509', '-req', '-in', csr, '-CA',
             os.path.join(ca, 'ca-cert.pem'), '-CAkey',
             os.path.join(ca, 'ca-key.pem'), '-CAcreateserial', '-days',
             str(days), '-extfile', ext, '-out', '%s-cert.pem' % role, cwd=d)
    os.chmod(os.path.join(d, '%s-key.pem' % role), 0o600)
    for name in (csr, ext):
        os.unlink(os.path.join(d, name))
    shutil.copy(os.path.join(ca, 'ca-cert.pem'), d)
