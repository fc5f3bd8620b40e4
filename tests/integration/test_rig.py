"""The rig itself: a real server with a private /dev/shm, a leaked region seen through the real API."""

import os
import signal

import tritonrig


def test_private_shm_has_requested_size_and_is_not_the_hosts(triton):
    usage = triton.shm_usage()
    assert usage['total_bytes'] == 64 * 1024 * 1024
    assert os.stat(triton.shm_dir).st_dev != os.stat('/dev/shm').st_dev
    # the python backend created its own region file in the private /dev/shm only
    assert triton.backend_files()
    assert not set(triton.backend_files()) & set(os.listdir('/dev/shm'))


def test_sigkilled_client_leaks_a_registered_region(triton):
    client = triton.leak('leaked', byte_size=2 << 20)
    assert client.proc.returncode == -signal.SIGKILL
    regions = triton.system_regions()
    assert regions['leaked']['key'] == '/leaked'
    assert regions['leaked']['byte_size'] == 2 << 20
    assert 'leaked' in triton.shm_files()
    assert triton.shm_usage()['used_bytes'] >= 2 << 20


def test_two_servers_are_isolated(make_triton):
    one = make_triton(models=())
    two = make_triton(models=(), shm_size='16m')
    one.leak('only_on_one')
    assert 'only_on_one' in one.system_regions()
    assert 'only_on_one' not in two.system_regions()
    assert 'only_on_one' not in two.shm_files()
    assert two.shm_usage()['total_bytes'] == 16 * 1024 * 1024


def test_unready_server_reports_its_log(tmp_path):
    server = tritonrig.TritonServer(workdir=str(tmp_path), models=('does_not_exist',))
    try:
        server.start(timeout=30)
    except tritonrig.RigError as exc:
        assert 'does_not_exist' in str(exc) or 'exited' in str(exc)
    else:
        raise AssertionError('a server with a missing model must not come up ready')
    finally:
        server.stop()
