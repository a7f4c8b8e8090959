import setuptools

# The native block hasher is optional: without a compiler, the Python
# headers or libssl-dev, fingerprinting falls back to hashlib (slower).
BLOCKHASH = setuptools.Extension(
    'vmar_openstack.fingerprint._blockhash',
    sources=['vmar_openstack/fingerprint/_blockhash.c'],
    libraries=['crypto'],
    extra_compile_args=['-O2'],
    optional=True)

setuptools.setup(setup_requires=['pbr>=6.0.0'], pbr=True,
                 ext_modules=[BLOCKHASH])
