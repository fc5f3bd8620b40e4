"""nvml.read through ctypes, against a fake libnvidia-ml that answers as the H200 of CUDA-FACTS.md did (no GPU here)."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

from ansible_collections.tritonops.shm.plugins.module_utils.host import nvml

MIB = 1 << 20
UUID = 'GPU-5b1e2c3d-0000-1111-2222-333344445555'


class FakeNvml:
    """The calls nvml.read makes, writing through the pointers ctypes passes, with the H200's answers by default."""

    def __init__(self, gpus=None, init=0, mig=(), fail=None, entry_size=24, count_bias=0):
        # [(minor, uuid, [(pid, used_bytes)])]; entry_size: the bytes of one _v3 entry the driver writes (24 with
        # driver 580, 32 with some R535 drivers); count_bias: added to the count it reports after writing
        self.gpus = gpus if gpus is not None else [(0, UUID, [(582, 582 * MIB)])]
        self.init, self.mig, self.fail = init, set(mig), dict(fail or {})
        self.entry_size, self.count_bias = entry_size, count_bias
        self.calls = []

    def _rc(self, name):
        self.calls.append(name)
        return self.fail.get(name, 0)

    def nvmlInit_v2(self):
        self.calls.append('nvmlInit_v2')
        return self.init

    def nvmlShutdown(self):
        self.calls.append('nvmlShutdown')
        return 0

    def nvmlErrorString(self, rc):
        return b'Driver Not Loaded' if rc == 9 else b'Unknown Error'

    def nvmlDeviceGetCount_v2(self, count):
        count._obj.value = len(self.gpus)
        return self._rc('nvmlDeviceGetCount_v2')

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        handle._obj.value = 1000 + index
        return self._rc('nvmlDeviceGetHandleByIndex_v2')

    def _gpu(self, handle):
        return self.gpus[handle.value - 1000]

    def nvmlDeviceGetMinorNumber(self, handle, minor):
        minor._obj.value = self._gpu(handle)[0]
        return self._rc('nvmlDeviceGetMinorNumber')

    def nvmlDeviceGetUUID(self, handle, buf, size):
        ctypes.memmove(buf, self._gpu(handle)[1].encode() + b'\0', len(self._gpu(handle)[1]) + 1)
        return self._rc('nvmlDeviceGetUUID')

    def nvmlDeviceGetMigMode(self, handle, current, pending):
        if handle.value - 1000 in self.mig:
            current._obj.value = 1
            return 0
        return 3  # NVML_ERROR_NOT_SUPPORTED: no MIG on this GPU

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, infos):
        procs = self._gpu(handle)[2]
        if infos is None or count._obj.value < len(procs):
            count._obj.value = len(procs)
            return 7 if procs else 0  # NVML_ERROR_INSUFFICIENT_SIZE, as the driver answers a count query
        for i, (pid, used) in enumerate(procs):
            used = nvml.VALUE_NOT_AVAILABLE if used is None else used
            entry = struct.pack('=IIQII', pid, 0, used, 0xFFFFFFFF, 0xFFFFFFFF).ljust(self.entry_size, b'\0')
            assert (i + 1) * self.entry_size <= ctypes.sizeof(infos), 'the caller gave no room for this entry'
            ctypes.memmove(ctypes.addressof(infos) + i * self.entry_size, entry, self.entry_size)
        count._obj.value = len(procs) + self.count_bias
        return 0


def test_the_h200_reading_one_gpu_its_minor_uuid_and_the_servers_context():
    lib = FakeNvml()
    reading = nvml.read(lambda name: lib)
    assert reading.error is None
    assert reading.gpus == (nvml.Gpu(0, 0, UUID, False, (nvml.GpuProcess(582, 582 * MIB),)),)
    assert reading.gpus[0].charged(582) == 582 * MIB and reading.gpus[0].charged(7) == 0
    assert lib.calls[0] == 'nvmlInit_v2' and lib.calls[-1] == 'nvmlShutdown'


def test_several_gpus_mig_no_context_and_an_unknown_charge():
    lib = FakeNvml(gpus=[(0, 'GPU-a', []), (1, 'GPU-b', [(699, None), (519, 1542 * MIB)])], mig={1})
    reading = nvml.read(lambda name: lib)
    assert [(g.index, g.minor, g.mig) for g in reading.gpus] == [(0, 0, False), (1, 1, True)]
    assert reading.gpus[0].processes == ()
    assert reading.gpus[1].processes == (nvml.GpuProcess(519, 1542 * MIB), nvml.GpuProcess(699, None))
    assert reading.gpus[1].charged(699) is None


def test_no_library_no_driver_and_a_failing_call_are_errors_never_gpus():
    def missing(name):
        raise OSError(f'{name}: cannot open shared object file: No such file or directory')

    reading = nvml.read(missing)
    assert reading.gpus == () and 'libnvidia-ml.so.1' in reading.error and 'cannot be loaded' in reading.error
    reading = nvml.read(lambda name: FakeNvml(init=9))
    assert (
        reading.gpus == () and reading.error == 'NVML cannot be initialised: nvmlInit_v2 returned 9 (Driver Not Loaded)'
    )
    lib = FakeNvml(fail={'nvmlDeviceGetUUID': 999})
    reading = nvml.read(lambda name: lib)
    assert reading.gpus == () and 'nvmlDeviceGetUUID returned 999' in reading.error
    assert lib.calls[-1] == 'nvmlShutdown', 'NVML is shut down after a failure too'


def test_the_real_library_is_absent_on_this_machine_and_says_so():
    """Either NVML is read (a GPU machine: GPUs, each with a UUID) or the error says every place it looked."""
    reading = nvml.read()
    if reading.error is None:
        assert reading.gpus and all(g.uuid.startswith('GPU-') for g in reading.gpus), reading
    else:
        assert reading.gpus == () and 'the loader path' in reading.error and '/run/nvidia/driver' in reading.error


H200_PROCS = [(582, 582 * MIB), (699, 582 * MIB), (519, 1542 * MIB)]


def test_a_32_byte_entry_of_an_r535_driver_is_read_as_such_never_as_garbage_pids():
    """Issue 43, goal 2: some R535 drivers write a 32-byte _v3 entry; a fixed 24-byte layout read pid 0 and lost the
    real pids."""
    for size in (24, 32):
        reading = nvml.read(lambda name, size=size: FakeNvml(gpus=[(0, UUID, H200_PROCS)], entry_size=size))
        assert reading.error is None, (size, reading.error)
        assert [p.pid for p in reading.gpus[0].processes] == [519, 582, 699], size
        assert reading.gpus[0].charged(519) == 1542 * MIB


@pytest.mark.parametrize(
    'procs, expected',
    [
        ([(582, 582 * MIB), (0, MIB)], 'implausible entries'),  # pid 0
        ([(582, 582 * MIB), (0xFFFFFFFF, MIB)], 'implausible entries'),  # -1 as an unsigned pid
        ([(582, 582 * MIB), (1 << 23, MIB)], 'implausible entries'),  # above any pid_max
        ([(582, 1 << 60)], 'implausible entries'),  # a charge no GPU holds
    ],
)
def test_an_implausible_answer_is_an_error_never_a_pid(procs, expected):
    reading = nvml.read(lambda name: FakeNvml(gpus=[(0, UUID, procs)]))
    assert reading.gpus == () and expected in reading.error and 'not trusted' in reading.error, reading


def test_a_count_larger_than_the_room_given_is_an_error():
    reading = nvml.read(lambda name: FakeNvml(gpus=[(0, UUID, H200_PROCS)], count_bias=100))
    assert reading.gpus == () and 'entries in room for' in reading.error, reading


def test_the_library_is_found_where_drivers_are_installed_and_only_when_no_one_else_can_write_it(tmp_path):
    """Issue 43, goal 2: not on the loader path (the GPU Operator's /run/nvidia/driver, the toolkit's
    /usr/local/nvidia/lib64), it is found in LIBRARY_DIRS; a library others could write is never loaded as root."""
    lib, loaded = FakeNvml(), []

    def load(name):
        loaded.append(name)
        if name == nvml.LIBRARY:
            raise OSError(f'{name}: cannot open shared object file: No such file or directory')
        return lib

    drivers = tmp_path / 'run' / 'nvidia' / 'driver' / 'usr' / 'lib64'
    drivers.mkdir(parents=True)
    (drivers / nvml.LIBRARY).write_bytes(b'')
    reading = nvml.read(load, dirs=(str(tmp_path / 'missing'), str(drivers)))
    assert reading.error is None and loaded == [nvml.LIBRARY, str(drivers / nvml.LIBRARY)]
    os.chmod(drivers, 0o777)
    loaded.clear()
    reading = nvml.read(load, dirs=(str(drivers),))
    assert loaded == [nvml.LIBRARY] and reading.gpus == ()
    assert 'may be written by others (mode 777)' in reading.error and str(drivers) in reading.error
    os.chmod(drivers, 0o755)
    os.chmod(drivers / nvml.LIBRARY, 0o666)
    assert 'may be written by others (mode 666)' in nvml.read(load, dirs=(str(drivers),)).error
    os.chmod(drivers / nvml.LIBRARY, 0o644)
    os.chown(drivers / nvml.LIBRARY, 4242, 4242)
    assert 'belongs to uid 4242' in nvml.read(load, dirs=(str(drivers),)).error


def test_the_usual_driver_locations_are_searched():
    for d in ('/usr/lib/x86_64-linux-gnu', '/usr/lib64', '/usr/local/nvidia/lib64'):
        assert d in nvml.LIBRARY_DIRS
    assert '/run/nvidia/driver/usr/lib/x86_64-linux-gnu' in nvml.LIBRARY_DIRS
    assert '/host/usr/lib/x86_64-linux-gnu' in nvml.LIBRARY_DIRS
