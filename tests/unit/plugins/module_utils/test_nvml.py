"""nvml.read through ctypes, against a fake libnvidia-ml that answers as the H200 of CUDA-FACTS.md did (no GPU here)."""

from __future__ import annotations

import ctypes

from ansible_collections.tritonops.shm.plugins.module_utils import nvml

MIB = 1 << 20
UUID = 'GPU-5b1e2c3d-0000-1111-2222-333344445555'


class FakeNvml:
    """The calls nvml.read makes, writing through the pointers ctypes passes, with the H200's answers by default."""

    def __init__(self, gpus=None, init=0, mig=(), fail=None):
        # [(minor, uuid, [(pid, used_bytes)])]
        self.gpus = gpus if gpus is not None else [(0, UUID, [(582, 582 * MIB)])]
        self.init, self.mig, self.fail = init, set(mig), dict(fail or {})
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
            infos[i].pid = pid
            infos[i].usedGpuMemory = nvml.VALUE_NOT_AVAILABLE if used is None else used
        count._obj.value = len(procs)
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
    reading = nvml.read()
    assert reading.gpus == () or reading.error is None  # on a GPU machine it reads; here it says why not
    if reading.error:
        assert 'NVML' in reading.error
