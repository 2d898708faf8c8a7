/*
 * A stand-in libnvidia-ml.so.1 for tests: the real pynvml loads it through ctypes, so the
 * collector's whole path (library loading, return codes, pynvml's exception mapping and struct
 * layouts) runs without a GPU. Written for SparkOps; it declares only what it needs.
 *
 * Every call answers with the return code in an environment variable (0 when unset):
 *   STUB_INIT_RC  STUB_COUNT_RC  STUB_MEM_RC  STUB_TEMP_RC  STUB_POWER_RC  STUB_FAN_RC
 *   STUB_PCIE_RC  STUB_PROC_RC
 * Values:
 *   STUB_DEVICES      number of devices (default 1)
 *   STUB_MEM_TOTAL    memory total in bytes (default 80 GiB; 0 models a GB10 answering zeros)
 *   STUB_PROC_PID     PID of the one compute process (none when unset)
 *   STUB_PROC_MEM     its memory in bytes, or "na" for NVML's "not available"
 *   STUB_SHUTDOWN_LOG a file that nvmlShutdown appends "shutdown" to
 *
 * Build: gcc -shared -fPIC -o libnvidia-ml.so.1 nvml_stub.c
 * Codes: 3 not supported, 7 insufficient size, 9 driver not loaded, 15 GPU lost,
 * 18 library/kernel module version mismatch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *device_t;

struct memory_v1 { unsigned long long total, free, used; };
struct memory_v2 { unsigned int version; unsigned long long total, reserved, free, used; };
struct utilization { unsigned int gpu, memory; };
struct process_v3 {
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance, compute_instance;
};

static const unsigned long long GIB = 1ULL << 30;
static const unsigned long long RESERVED = 529ULL << 20;

static int rc(const char *name) {
    const char *value = getenv(name);
    return value ? atoi(value) : 0;
}

static unsigned long long number(const char *name, unsigned long long fallback) {
    const char *value = getenv(name);
    return value ? strtoull(value, NULL, 10) : fallback;
}

static int text(char *out, unsigned int size, const char *value) {
    snprintf(out, size, "%s", value);
    return 0;
}

int nvmlInitWithFlags(unsigned int flags) { (void)flags; return rc("STUB_INIT_RC"); }
int nvmlInit_v2(void) { return rc("STUB_INIT_RC"); }

int nvmlShutdown(void) {
    const char *path = getenv("STUB_SHUTDOWN_LOG");
    if (path) {
        FILE *log = fopen(path, "a");
        if (log) { fputs("shutdown\n", log); fclose(log); }
    }
    return 0;
}

const char *nvmlErrorString(int result) { (void)result; return "stub error"; }

int nvmlSystemGetDriverVersion(char *out, unsigned int size) { return text(out, size, "999.1.2"); }
int nvmlSystemGetNVMLVersion(char *out, unsigned int size) { return text(out, size, "13.999.1.2"); }
int nvmlSystemGetCudaDriverVersion(int *version) { *version = 13010; return 0; }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = (unsigned int)number("STUB_DEVICES", 1);
    return rc("STUB_COUNT_RC");
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, device_t *device) {
    *device = (device_t)(uintptr_t)(index + 1);
    return 0;
}

int nvmlDeviceGetName(device_t d, char *out, unsigned int size) {
    (void)d;
    return text(out, size, "Stub GPU");
}

int nvmlDeviceGetUUID(device_t d, char *out, unsigned int size) {
    (void)d;
    return text(out, size, "GPU-57ab0000-0000-0000-0000-000000000001");
}

int nvmlDeviceGetUtilizationRates(device_t d, struct utilization *u) {
    (void)d;
    u->gpu = 42;
    u->memory = 7;
    return 0;
}

int nvmlDeviceGetTemperature(device_t d, int sensor, unsigned int *t) {
    (void)d; (void)sensor;
    *t = 51;
    return rc("STUB_TEMP_RC");
}

int nvmlDeviceGetPowerUsage(device_t d, unsigned int *mw) { (void)d; *mw = 123456; return rc("STUB_POWER_RC"); }
int nvmlDeviceGetEnforcedPowerLimit(device_t d, unsigned int *mw) { (void)d; *mw = 700000; return 0; }
int nvmlDeviceGetClockInfo(device_t d, int type, unsigned int *mhz) { (void)d; (void)type; *mhz = 1755; return 0; }
int nvmlDeviceGetFanSpeed(device_t d, unsigned int *pct) { (void)d; *pct = 30; return rc("STUB_FAN_RC"); }
int nvmlDeviceGetCurrPcieLinkGeneration(device_t d, unsigned int *g) { (void)d; *g = 5; return rc("STUB_PCIE_RC"); }
int nvmlDeviceGetCurrPcieLinkWidth(device_t d, unsigned int *w) { (void)d; *w = 16; return rc("STUB_PCIE_RC"); }

int nvmlDeviceGetMemoryInfo(device_t d, struct memory_v1 *m) {
    unsigned long long total = number("STUB_MEM_TOTAL", 80 * GIB);
    (void)d;
    m->total = total;
    m->used = total ? RESERVED + GIB : 0;
    m->free = total ? total - m->used : 0;
    return rc("STUB_MEM_RC");
}

int nvmlDeviceGetMemoryInfo_v2(device_t d, struct memory_v2 *m) {
    unsigned long long total = number("STUB_MEM_TOTAL", 80 * GIB);
    (void)d;
    m->total = total;
    m->reserved = total ? RESERVED : 0;
    m->used = total ? GIB : 0;
    m->free = total ? total - RESERVED - GIB : 0;
    return rc("STUB_MEM_RC");
}

int nvmlDeviceGetComputeRunningProcesses_v3(device_t d, unsigned int *count, struct process_v3 *p) {
    const char *pid = getenv("STUB_PROC_PID");
    const char *used = getenv("STUB_PROC_MEM");
    (void)d;
    if (rc("STUB_PROC_RC")) return rc("STUB_PROC_RC");
    if (!pid) { *count = 0; return 0; }
    if (p == NULL || *count < 1) { *count = 1; return 7; }
    memset(p, 0, sizeof(*p));
    p->pid = (unsigned int)strtoul(pid, NULL, 10);
    p->used = (used && strcmp(used, "na") == 0) ? ~0ULL : number("STUB_PROC_MEM", GIB);
    *count = 1;
    return 0;
}

int nvmlDeviceGetGraphicsRunningProcesses_v3(device_t d, unsigned int *count, struct process_v3 *p) {
    (void)d; (void)p;
    *count = 0;
    return rc("STUB_PROC_RC");
}
