"""Behaviours that differ between Triton versions, against the real servers this machine can run.

The rig's tritonserver is 2.51 (nvidia-pytriton 0.7.0); with TRITONRIG_PYTRITON_SITE set to the
site-packages of another nvidia-pytriton (0.5.10 bundles 2.48, see tests/integration/containers/README.md)
the same tests run against that server. Answers only newer servers give (2.53+ deferred unregister, 2.58+
integer overflow, 2.60+/2.61+ reserved prefix and invalid keys, 2.68+ client shared memory off,
2.73 tritonfrontend) are covered by unit tests with their exact texts and codes, over HTTP and
gRPC (tests/unit/plugins/module_utils/test_newer_servers.py).
"""

from __future__ import annotations

import os

import tritonrig
from ansible_helpers import run_module

INFO = 'tritonops.shm.triton_shm_info'
REGION = 'tritonops.shm.triton_shm_region'
MIB = 1 << 20
DEFAULT_BACKEND = 'triton_python_backend_shm_region_*'
PREFIX = 'acme_pb_'


def version_tuple(text):
    return tuple(int(p) for p in text.split('.')[:2])


def categories(info, prefix):
    return dict((f['name'], f['category']) for f in info['files'] if f['name'].startswith(prefix))


crash = tritonrig.crash  # the server and its python stubs SIGKILLed together


def test_a_custom_python_backend_prefix_is_backend_never_orphan(tmp_path):
    """--backend-config=python,shm-region-prefix-name=...: the server killed, its backend files left behind."""
    with tritonrig.ShmNamespace('64m') as ns:
        first = tritonrig.TritonServer(
            workdir=str(tmp_path),
            namespace=ns,
            name='first',
            backend_config=('python,shm-region-prefix-name=%s' % PREFIX,),
        )
        second = None
        try:
            first.start()
            custom = [f for f in os.listdir(ns.shm_dir) if f.startswith(PREFIX)]
            assert custom, os.listdir(ns.shm_dir)
            assert not [f for f in os.listdir(ns.shm_dir) if f.startswith('triton_python_backend_shm_region_')]
            patterns = [DEFAULT_BACKEND, PREFIX + '*']
            live = run_module(INFO, dict(url=first.url, backend_patterns=patterns))
            assert set(categories(live, PREFIX).values()) == {'backend'}, categories(live, PREFIX)

            # the server and its stub die at once (a crashed container whose /dev/shm is the host's): the files stay
            crash(first)
            assert set(custom) <= set(os.listdir(ns.shm_dir))
            second = tritonrig.TritonServer(
                workdir=str(tmp_path), namespace=ns, name='second', models=(), http_port=first.http_port
            ).start()
            sweep = dict(url=second.url, orphan_patterns=['*'], min_age=0)
            default = run_module(INFO, sweep)
            # with the default rule the custom prefix is nobody's: a pattern matching everything would take it
            assert set(categories(default, PREFIX).values()) == {'orphan'}, categories(default, PREFIX)
            told = run_module(INFO, dict(sweep, backend_patterns=patterns))
            # a backend file no process holds (min_age 0, a complete scan) is a leftover: backend's, never an orphan
            assert set(categories(told, PREFIX).values()) == {'leftover'}
            assert told['summary']['leftover_files'] == len(custom)
            clean = run_module(REGION, dict(sweep, state='absent', orphan_files=True, backend_patterns=patterns))
            assert not clean.get('failed') and clean['removed_files'] == [] and clean['changed'] is False, clean
            assert set(custom) <= set(os.listdir(ns.shm_dir))
        finally:
            if second:
                second.stop()
            first.stop()


def test_unregistering_a_live_clients_region_warns_only_before_2_50(triton):
    """Triton < 2.50 could crash when a region with requests in flight was unregistered (server#3207)."""
    version = triton.version()
    client = triton.client('busy', byte_size=64 * 1024, mode='infer')
    dry = run_module(REGION, dict(url=triton.url, state='absent', name='busy'), check=True)
    warned = [w for w in dry.get('warnings', []) if '#3207' in w]
    if version_tuple(version) < (2, 50):
        assert warned and 'older than 2.50' in warned[0] and 'busy' in warned[0], dry
    else:
        assert warned == [], dry
    assert 'busy' in triton.system_regions() and client.alive
    print('FIGURE version_warning: Triton %s, warned=%s' % (version, bool(warned)))


def test_reserved_key_prefix_is_refused_before_the_server_is_asked(triton):
    """Triton 2.60+ refuse the python backend's prefix as a client key; 2.51 here would accept it."""
    res = run_module(
        REGION,
        dict(url=triton.url, name='sneaky', key='/triton_python_backend_shm_region_x', byte_size=MIB, create_file=True),
    )
    assert res.get('failed') and 'reserves for its python backend' in res['msg'], res
    assert 'sneaky' not in triton.system_regions()
    assert 'triton_python_backend_shm_region_x' not in triton.shm_files()


def test_every_python_based_backends_files_are_backend_under_its_name_never_orphan(tmp_path):
    """triton_<backend>_backend_shm_region_*: real files of a real python backend stub started with the vllm prefix
    (--backend-config=python,shm-region-prefix-name=triton_vllm_backend_shm_region_), left behind by a crash, and one more
    backend's file, swept with orphan_patterns ['*'] and the default backend_patterns: kept, reported under their backend."""
    vllm = 'triton_vllm_backend_shm_region_'
    with tritonrig.ShmNamespace('64m') as ns:
        first = tritonrig.TritonServer(
            workdir=str(tmp_path),
            namespace=ns,
            name='first',
            backend_config=('python,shm-region-prefix-name=%s' % vllm,),
        )
        second = None
        try:
            first.start()
            made = sorted(f for f in os.listdir(ns.shm_dir) if f.startswith(vllm))
            assert made, os.listdir(ns.shm_dir)
            live = run_module(INFO, dict(url=first.url, orphan_patterns=['*'], min_age=0))
            files = dict((f['name'], f) for f in live['files'])
            assert [(files[n]['category'], files[n]['backend']) for n in made] == [('backend', 'vllm')] * len(made), (
                files
            )

            crash(first)  # the server and its stub die together: their files stay, unheld
            assert set(made) <= set(os.listdir(ns.shm_dir))
            other = os.path.join(ns.shm_dir, 'triton_trtllm_backend_shm_region_6d59ae46-18ec-4c66-b2d4-38a207128185')
            stray = os.path.join(ns.shm_dir, 'client_left_behind')
            for path in (other, stray):
                with open(path, 'wb') as f:
                    f.write(b'\0' * MIB)
            second = tritonrig.TritonServer(
                workdir=str(tmp_path), namespace=ns, name='second', models=(), http_port=first.http_port
            ).start()
            sweep = dict(url=second.url, orphan_patterns=['*'], min_age=0)
            info = run_module(INFO, sweep)
            files = dict((f['name'], f) for f in info['files'])
            backend = made + [os.path.basename(other)]
            # held by no process (min_age 0, a complete scan): leftover, the backend's, never an orphan
            assert [files[n]['category'] for n in backend] == ['leftover'] * len(backend), files
            assert [files[n]['backend'] for n in backend] == ['vllm'] * len(made) + ['trtllm']
            assert "Triton's vllm backend shared memory" in files[made[0]]['category_reason']
            assert (
                files['client_left_behind']['category'] == 'orphan' and files['client_left_behind']['backend'] is None
            )
            assert info['summary']['leftover_files'] == len(backend)

            dry = run_module(REGION, dict(sweep, state='absent', orphan_files=True), check=True)
            assert dry['changed'] is True and [os.path.basename(p) for p in dry['removed_files']] == [
                'client_left_behind'
            ], dry
            assert set(backend) <= set(os.listdir(ns.shm_dir)) and os.path.exists(stray), 'check mode changes nothing'
            clean = run_module(REGION, dict(sweep, state='absent', orphan_files=True))
            assert not clean.get('failed') and [os.path.basename(p) for p in clean['removed_files']] == [
                'client_left_behind'
            ], clean
            assert set(backend) <= set(os.listdir(ns.shm_dir)) and not os.path.exists(stray)
            again = run_module(REGION, dict(sweep, state='absent', orphan_files=True))
            assert again['changed'] is False and again['removed_files'] == [], again

            refused = run_module(
                REGION, dict(url=second.url, name='sneaky', key='/' + vllm + 'x', byte_size=MIB, create_file=True)
            )
            assert refused.get('failed') and "here the vllm backend's" in refused['msg'], refused
            assert 'sneaky' not in second.system_regions() and vllm + 'x' not in os.listdir(ns.shm_dir)
        finally:
            if second:
                second.stop()
            first.stop()
