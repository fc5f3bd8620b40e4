"""Unit tests for module_utils/host/containers.py: a process's container or pod from its cgroup (a table of real formats)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.host import containers

CID = 'ab6a24e700069997e526947833f0caa9f645503ff2fb102c91da07f2af90b1fb'
POD = 'c5f78c7c99eb90713aa0bf5c71b521890a4570afd83c69a1a623753c7846a8af'
UID = '5c1e2d4a-9b7f-4e31-8a0c-1f2e3d4c5b6a'
UID_ = UID.replace('-', '_')


@pytest.mark.parametrize(
    'text, runtime, cid, pod_uid, qos, podman_pod',
    [
        # the host itself (cgroup v1 hybrid as on this machine, and v2)
        ('12:memory:/user.slice\n0::/user.slice/user-0.slice/session-1.scope\n', None, None, None, None, None),
        ('0::/\n', None, None, None, None, None),
        # docker: systemd and cgroupfs drivers
        (f'0::/system.slice/docker-{CID}.scope\n', 'docker', CID, None, None, None),
        (f'4:memory:/docker/{CID}\n0::/docker/{CID}\n', 'docker', CID, None, None, None),
        # podman: cgroupfs (what this machine's podman 4.3 writes, v1 lines first), systemd, in a pod
        (
            f'9:name=systemd:/libpod_parent/libpod-{CID}\n0::/libpod_parent/libpod-{CID}\n',
            'podman',
            CID,
            None,
            None,
            None,
        ),
        (
            f'9:name=systemd:/libpod_parent/{POD}/libpod-{CID}\n0::/libpod_parent/{POD}/libpod-{CID}\n',
            'podman',
            CID,
            None,
            None,
            POD,
        ),
        (f'0::/machine.slice/machine-libpod_pod_{POD}.slice/libpod-{CID}.scope\n', 'podman', CID, None, None, POD),
        (f'0::/machine.slice/libpod-{CID}.scope/container\n', 'podman', CID, None, None, None),
        # conmon is not the container
        (f'0::/machine.slice/libpod-conmon-{CID}.scope\n', None, None, None, None, None),
        # kubelet, systemd driver: containerd and cri-o, the three QoS classes
        (
            f'0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n',
            'containerd',
            CID,
            UID,
            'burstable',
            None,
        ),
        (
            f'0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope\n',
            'cri-o',
            CID,
            UID,
            'besteffort',
            None,
        ),
        (
            f'0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n',
            'containerd',
            CID,
            UID,
            'guaranteed',
            None,
        ),
        # kubelet, cgroupfs driver (v1): the bare id
        (f'11:memory:/kubepods/burstable/pod{UID}/{CID}\n', 'kubernetes', CID, UID, 'burstable', None),
        (f'11:memory:/kubepods/pod{UID}/{CID}\n', 'kubernetes', CID, UID, 'guaranteed', None),
        # read from an agent pod with its own cgroup namespace: other processes' paths are relative (/..)
        (
            f'0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n',
            'containerd',
            CID,
            UID,
            'besteffort',
            None,
        ),
        # a pod's sandbox (pause) without a container id: the pod still shows
        (
            f'0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice\n',
            None,
            None,
            UID,
            'burstable',
            None,
        ),
    ],
)
def test_parse_cgroup(text, runtime, cid, pod_uid, qos, podman_pod):
    found = containers.parse_cgroup(text)
    assert (found.runtime, found.container_id, found.pod_uid, found.qos, found.podman_pod) == (
        runtime,
        cid,
        pod_uid,
        qos,
        podman_pod,
    )
    assert found.found is (cid is not None or pod_uid is not None)


@pytest.mark.parametrize(
    'ident, label',
    [
        (containers.Identity(), 'host'),
        (containers.Identity('docker', CID), f'docker {CID[:12]}'),
        (containers.Identity('podman', CID, podman_pod=POD), f'podman pod {POD[:12]} container {CID[:12]}'),
        (containers.Identity('containerd', CID, UID, 'burstable'), f'pod {UID}'),
        (containers.Identity('containerd', CID, UID, 'burstable', pod_name='triton-0'), 'pod triton-0'),
        (
            containers.Identity('containerd', CID, UID, 'burstable', pod_name='triton-0', pod_namespace='ml'),
            'pod ml/triton-0',
        ),
    ],
)
def test_label(ident, label):
    assert ident.label == label
    assert ident.as_dict()['name'] == label
    assert None not in ident.as_dict().values()


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def test_identity_reads_the_pod_name_and_namespace_from_the_container(tmp_path):
    proc = str(tmp_path)
    _write(f'{proc}/7/cgroup', f'0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n')
    _write(f'{proc}/7/root/etc/hostname', 'triton-7d9f8-abcde\n')
    _write(f'{proc}/7/root{containers.SA_NAMESPACE}', 'inference')
    assert containers.identity(7, proc).label == 'pod inference/triton-7d9f8-abcde'
    # no service account mounted: the name alone; a host process: nothing read beyond its cgroup
    os.remove(f'{proc}/7/root{containers.SA_NAMESPACE}')
    assert containers.identity(7, proc).label == 'pod triton-7d9f8-abcde'
    _write(f'{proc}/8/cgroup', '0::/user.slice\n')
    _write(f'{proc}/8/root/etc/hostname', 'node1\n')
    assert containers.identity(8, proc) == containers.Identity()
    # gone
    assert containers.identity(9, proc) == containers.Identity()


@pytest.mark.parametrize('link', ['absolute', 'relative'])
def test_a_pods_hostname_symlinked_out_of_its_root_reads_nothing_of_the_node(tmp_path, link):
    """Issue 33: a hostile pod makes /etc/hostname a symlink to a node file; the pod's name is read inside its root."""
    proc = str(tmp_path / 'proc')
    secret = tmp_path / 'shadow'
    secret.write_text('root:$6$node-secret:19000:0:99999:7:::\n')
    _write(f'{proc}/7/cgroup', f'0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n')
    os.makedirs(f'{proc}/7/root/etc')
    target = str(secret) if link == 'absolute' else os.path.relpath(secret, f'{proc}/7/root/etc')
    os.symlink(target, f'{proc}/7/root/etc/hostname')
    assert open(f'{proc}/7/root/etc/hostname').read().startswith('root:')  # handed to the kernel whole, it leaks
    found = containers.identity(7, proc)
    assert found.pod_name is None and 'node-secret' not in repr(found)


def test_identity_of_this_process():
    assert containers.identity(os.getpid()).found is False or containers.identity(os.getpid()).container_id
