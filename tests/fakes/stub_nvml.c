/* A stub of NVIDIA's NVML library (libnvidia-ml.so.1) for the integration tests (tests/fakes/stub_nvml.py builds it
 * with `cc -shared -fPIC` and documents it; tests/integration/test_cuda_stub_nvml.py uses it).
 *
 * Never installed anywhere: a test puts the directory it was built in on LD_LIBRARY_PATH of the Ansible process it
 * starts, so that the modules' ctypes.CDLL("libnvidia-ml.so.1") (plugins/module_utils/nvml.py) loads it from the loader
 * path as on a host with the driver.
 *
 * It answers the calls nvml.py makes (and a few neighbours) from a text file named by NVML_STUB_CONFIG, read again on
 * every call, so that a test or the fake tritonserver can change what NVML says between two calls (a killed client's
 * charge moving to the server, an unregister giving it back). The file, one item a line, '#' comments:
 *
 *   entry_size 24|32            the nvmlProcessInfo_v3_t entry the driver writes (24: driver 580; 32: some R535)
 *   init_rc N                   what nvmlInit_v2 returns (0; 9: driver not loaded)
 *   gpu INDEX MINOR UUID MIG TOTAL_BYTES
 *                               MIG: 0 (off), 1 (on), na (nvmlDeviceGetMigMode answers NOT_SUPPORTED); MINOR na: none
 *   proc INDEX PID USED_BYTES   a compute process (a CUDA context) on GPU INDEX; USED na: NVML_VALUE_NOT_AVAILABLE
 *
 * A 32-byte entry is {uint pid; ulonglong usedGpuMemory; uint gpuInstanceId; uint computeInstanceId; ulonglong
 * usedGpuCcProtectedMemory (0)}: what a reader with a fixed 24-byte layout misreads from its second entry on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_UNKNOWN 999
#define VALUE_NOT_AVAILABLE 0xffffffffffffffffULL
#define MAX_GPUS 64
#define MAX_PROCS 1024

struct gpu {
    int present;
    int minor; /* -1: none */
    char uuid[96];
    int mig; /* 0, 1, -1: not supported */
    unsigned long long total;
};

struct proc {
    int gpu;
    unsigned int pid;
    unsigned long long used;
};

static struct gpu gpus[MAX_GPUS];
static struct proc procs[MAX_PROCS];
static int n_gpus, n_procs, entry_size = 24, init_rc;
static int initialised;

/* The configuration, read again; NVML_ERROR_UNKNOWN when it cannot be read or a line is not understood. */
static int load(void) {
    const char *path = getenv("NVML_STUB_CONFIG");
    char line[512], word[32], a[128], b[128], c[128], d[128], e[128];
    FILE *f;
    memset(gpus, 0, sizeof gpus);
    n_gpus = n_procs = 0;
    entry_size = 24;
    init_rc = 0;
    if (path == NULL || (f = fopen(path, "r")) == NULL)
        return NVML_ERROR_UNKNOWN;
    while (fgets(line, sizeof line, f) != NULL) {
        int n = sscanf(line, "%31s %127s %127s %127s %127s %127s", word, a, b, c, d, e);
        if (n <= 0 || word[0] == '#')
            continue;
        if (strcmp(word, "entry_size") == 0 && n == 2) {
            entry_size = atoi(a);
        } else if (strcmp(word, "init_rc") == 0 && n == 2) {
            init_rc = atoi(a);
        } else if (strcmp(word, "gpu") == 0 && n == 6) {
            int i = atoi(a);
            if (i < 0 || i >= MAX_GPUS)
                goto bad;
            gpus[i].present = 1;
            gpus[i].minor = strcmp(b, "na") == 0 ? -1 : atoi(b);
            if (strlen(c) >= sizeof gpus[i].uuid)
                goto bad;
            memcpy(gpus[i].uuid, c, strlen(c) + 1);
            gpus[i].mig = strcmp(d, "na") == 0 ? -1 : atoi(d);
            gpus[i].total = strtoull(e, NULL, 10);
            if (i + 1 > n_gpus)
                n_gpus = i + 1;
        } else if (strcmp(word, "proc") == 0 && n == 4 && n_procs < MAX_PROCS) {
            procs[n_procs].gpu = atoi(a);
            procs[n_procs].pid = (unsigned int)strtoul(b, NULL, 10);
            procs[n_procs].used = strcmp(c, "na") == 0 ? VALUE_NOT_AVAILABLE : strtoull(c, NULL, 10);
            n_procs++;
        } else {
            goto bad;
        }
    }
    fclose(f);
    return (entry_size == 24 || entry_size == 32) ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
bad:
    fclose(f);
    return NVML_ERROR_UNKNOWN;
}

/* The configuration read for a call on handle (a pointer to one of gpus[]); its GPU in *g. */
static int device(void *handle, struct gpu **g) {
    int rc;
    long i;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if ((rc = load()) != NVML_SUCCESS)
        return rc;
    i = (struct gpu *)handle - gpus;
    if (handle == NULL || i < 0 || i >= n_gpus || !gpus[i].present)
        return NVML_ERROR_INVALID_ARGUMENT;
    *g = &gpus[i];
    return NVML_SUCCESS;
}

int nvmlInit_v2(void) {
    int rc = load();
    if (rc != NVML_SUCCESS)
        return rc;
    if (init_rc != NVML_SUCCESS)
        return init_rc;
    initialised++;
    return NVML_SUCCESS;
}

int nvmlInit(void) { return nvmlInit_v2(); }

int nvmlShutdown(void) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (version == NULL || length < 16)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "%s", entry_size == 32 ? "535.54.03" : "580.159.04");
    return NVML_SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    int rc;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if ((rc = load()) != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)n_gpus;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    int rc;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if ((rc = load()) != NVML_SUCCESS)
        return rc;
    if (handle == NULL || index >= (unsigned int)n_gpus || !gpus[index].present)
        return NVML_ERROR_INVALID_ARGUMENT;
    *handle = &gpus[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetIndex(void *handle, unsigned int *index) {
    struct gpu *g;
    int rc = device(handle, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    *index = (unsigned int)(g - gpus);
    return NVML_SUCCESS;
}

int nvmlDeviceGetMinorNumber(void *handle, unsigned int *minor) {
    struct gpu *g;
    int rc = device(handle, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (g->minor < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *minor = (unsigned int)g->minor;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
    struct gpu *g;
    int rc = device(handle, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (uuid == NULL || length < strlen(g->uuid) + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", g->uuid);
    return NVML_SUCCESS;
}

int nvmlDeviceGetMigMode(void *handle, unsigned int *current, unsigned int *pending) {
    struct gpu *g;
    int rc = device(handle, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (g->mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)g->mig;
    return NVML_SUCCESS;
}

struct memory { /* nvmlMemory_t */
    unsigned long long total, free, used;
};

int nvmlDeviceGetMemoryInfo(void *handle, struct memory *memory) {
    struct gpu *g;
    unsigned long long used = 0;
    int i, rc = device(handle, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    for (i = 0; i < n_procs; i++)
        if (procs[i].gpu == g - gpus && procs[i].used != VALUE_NOT_AVAILABLE)
            used += procs[i].used;
    memory->total = g->total;
    memory->used = used < g->total ? used : g->total;
    memory->free = g->total - memory->used;
    return NVML_SUCCESS;
}

/* The compute processes of GPU handle, written as entries of size bytes: INSUFFICIENT_SIZE with the count needed
 * when *count is too small (or infos NULL and some process exists), as the driver does. */
static int processes(void *handle, unsigned int *count, unsigned char *infos, int size) {
    struct gpu *g;
    unsigned int n = 0, w = 0;
    int i, rc = device(handle, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < n_procs; i++)
        n += procs[i].gpu == g - gpus;
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i = 0; i < n_procs; i++) {
        unsigned char *e = infos + (size_t)w * (size_t)size;
        unsigned int none = 0xffffffffu; /* gpuInstanceId, computeInstanceId without MIG */
        unsigned long long zero = 0;
        if (procs[i].gpu != g - gpus)
            continue;
        memset(e, 0, 8);
        memcpy(e, &procs[i].pid, 4);
        memcpy(e + 8, &procs[i].used, 8);
        if (size >= 24) {
            memcpy(e + 16, &none, 4);
            memcpy(e + 20, &none, 4);
        }
        if (size == 32)
            memcpy(e + 24, &zero, 8); /* usedGpuCcProtectedMemory */
        w++;
    }
    *count = n;
    return NVML_SUCCESS;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned int *count, void *infos) {
    return processes(handle, count, infos, entry_size);
}

int nvmlDeviceGetComputeRunningProcesses_v2(void *handle, unsigned int *count, void *infos) {
    return processes(handle, count, infos, 24);
}

int nvmlDeviceGetComputeRunningProcesses(void *handle, unsigned int *count, void *infos) {
    return processes(handle, count, infos, 16); /* nvmlProcessInfo_v1_t {pid; usedGpuMemory} */
}
