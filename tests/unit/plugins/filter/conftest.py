"""The Kubernetes versions the manifests are validated for: a test asking for ``k8s_version`` runs once per version."""

from __future__ import annotations

from kubernetes_validate import utils as kubernetes_validate_utils


def _minor(version: str) -> tuple:
    return tuple(int(n) for n in version.split('.')[:2])


# Every Kubernetes minor from 1.30 to 1.37 that the pinned kubernetes-validate bundles schemas for.
K8S_VERSIONS = sorted(
    {'.'.join(v.split('.')[:2]) for v in kubernetes_validate_utils.all_versions() if (1, 30) <= _minor(v) <= (1, 37)},
    key=_minor,
)
# a kubernetes-validate without one of them must not shrink the list silently
assert K8S_VERSIONS == [f'1.{minor}' for minor in range(30, 38)], K8S_VERSIONS


def pytest_generate_tests(metafunc):
    if 'k8s_version' in metafunc.fixturenames:
        metafunc.parametrize('k8s_version', K8S_VERSIONS)
