"""Offline stand-in for the get-pip bootstrap that ansible-test downloads.

ansible-test bootstraps pip into the virtual environments it creates for
sanity tests by running a get-pip script it fetches from a host that is not
reachable from every network. This stand-in does the same job with the
interpreter's own ensurepip, then installs the requested packages from the
configured package index. It is copied to ~/.ansible/test/cache/ by
`.ci/setup-ansible-test`.
"""
import subprocess
import sys


def main(argv):
    subprocess.check_call([sys.executable, '-m', 'ensurepip', '--upgrade', '--default-pip'])
    args = [a for a in argv if a not in ('--no-setuptools', '--no-wheel')]
    subprocess.check_call([sys.executable, '-m', 'pip', 'install'] + args)


if __name__ == '__main__':
    main(sys.argv[1:])
