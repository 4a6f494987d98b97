/*
 * A stand-in for NVIDIA's management library (libnvidia-ml.so.1), for tests on machines
 * without a GPU: it exports the NVML functions the profiler's daemon calls (through
 * nvml-wrapper) and answers from a text file the test writes, read again at every call, so a
 * test can change what the "GPU" says while the daemon runs. Only this library is stood in
 * for: the processes, CPUs and kernel of a test are real.
 *
 * The file is read into memory and kept while stat() says it is the same file (inode, size and
 * change time, and changed over a second ago: a change within the clock's tick would keep the
 * time): a stat a call, where NVIDIA's library makes an ioctl. Reading and scanning it at
 * every call cost more than the daemon's poller itself (`cargo xtask bench nvml`).
 *
 * Built by the tests: gcc -shared -fPIC -DSTANDIN_FILE='"PATH"' [-DHALF] -o libnvidia-ml.so.1
 * HALF leaves out about half the functions (power, temperature, memory, PCIe, ECC, row remapping,
 * clocks, clock events, per-process utilisation, CPU affinity): a driver that lacks them.
 *
 * The file, one fact a line (a missing fact: NVML_ERROR_NOT_SUPPORTED):
 *   gpus 1
 *   driver 580.159.04
 *   0 name NVIDIA H100 80GB HBM3
 *   0 uuid GPU-...
 *   0 bus 00000000:3B:00.0
 *   0 util 37            0 mem_util 12
 *   0 sm_clock 1980      0 mem_clock 2619      0 reasons 4
 *   0 power_mw 350000    0 temp 55
 *   0 mem_total 85899345920   0 mem_used 1073741824
 *   0 pcie_rx 1000       0 pcie_tx 2000       (KB/s)
 *   0 ecc_corrected 3    0 ecc_uncorrected 0
 *   0 remap 2,1,0,0      (rows remapped correctable, uncorrectable, pending, failed)
 *   0 procs 812:1073741824,901:0    (pid:bytes, comma separated)
 *   0 proc_util 812:30
 *   0 affinity 3         (a CPU mask)
 *   0 xid_events 1       (the GPU offers NVML's Xid events)
 *   0 gpm 12,30,0,5,100,200  (GPM: SM active %, SM occupancy %, tensor active %, DRAM bandwidth %,
 *                            NVLink rx and tx MiB/s over any two samples; no line: not a Hopper)
 *   xids 0:79,0:13       (Xid events, GPU:number, delivered once each in order; append to add)
 *
 * NVML's own samples (nvmlDeviceGetSamples, left out of HALF: a driver without them), GPU and
 * memory utilisation: the driver's buffer holds the last 100 samples, one every `sample_ms`, each
 * stamped with its time in µs (sample k at k * sample_ms, on the wall clock or, with
 * `sample_clock boot`, on CLOCK_BOOTTIME as some drivers stamp them); a call returns those after
 * its lastSeenTimeStamp, oldest first, as many as the caller's array holds:
 *   0 sample_ms 200      (no line: 167, the driver's 1/6 s)
 *   0 util_samples 10,90,30  (sample k reads the (k mod n)th value; no line: `util` at each)
 *   0 samples dry        (the buffer ran dry, as an idle GPU's does: NVML_ERROR_NOT_FOUND)
 *   0 samples none       (this GPU has none: NVML_ERROR_NOT_SUPPORTED)
 *   0 sample_clock boot
 *   0 samples_room 200   (arrays under 200 samples are refused: NVML_ERROR_INSUFFICIENT_SIZE, the
 *                        count set to 200, as a driver that wants room for all it may have)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <pthread.h>
#include <sys/stat.h>

#ifndef STANDIN_FILE
#error "build with -DSTANDIN_FILE='\"/path/of/the/file\"'"
#endif

#define OK 0
#define INVALID_ARGUMENT 2
#define NOT_SUPPORTED 3
#define NOT_FOUND 6
#define INSUFFICIENT_SIZE 7
#define TIMEOUT 10
#define XID_CRITICAL 0x8ULL

typedef struct device *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* The file as last read, and what stat() said of it then. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static char *cache;
static size_t cache_len;
static struct stat cache_st;
static int cache_ok;

/* Whether the file may have changed since it was cached. */
static int stale(const struct stat *now) {
    if (!cache_ok) return 1;
    if (now->st_ino != cache_st.st_ino || now->st_dev != cache_st.st_dev || now->st_size != cache_st.st_size) return 1;
    if (now->st_ctim.tv_sec != cache_st.st_ctim.tv_sec || now->st_ctim.tv_nsec != cache_st.st_ctim.tv_nsec) return 1;
    /* Changed within the last two seconds: a second write in the same tick of the file system's
       clock would leave the same time, so read it again until it has been quiet a while. */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec - now->st_ctim.tv_sec < 2;
}

/* Reads the file into `cache` when it changed; 0 when the cache holds it. Under cache_lock. */
static int load(void) {
    struct stat st;
    if (stat(STANDIN_FILE, &st) != 0) return -1;
    if (!stale(&st)) return 0;
    FILE *f = fopen(STANDIN_FILE, "r");
    if (!f) return -1;
    size_t cap = (size_t)st.st_size + 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) { fclose(f); return -1; }
    for (size_t r; (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *more = realloc(buf, 2 * cap + 1);
            if (!more) { free(buf); fclose(f); return -1; }
            buf = more;
            cap *= 2;
        }
    }
    fclose(f);
    buf[n] = 0;
    free(cache);
    cache = buf;
    cache_len = n;
    cache_st = st;
    cache_ok = 1;
    return 0;
}

/* The value of `key` (for GPU `gpu`, or global when gpu < 0) into out; 0 when found. */
static int fact(int gpu, const char *key, char *out, size_t len) {
    /* "GPU key " (or "key "), built by hand: snprintf's cost would be the stand-in's again. */
    char want[128];
    size_t w = 0, k = strlen(key);
    if (k > sizeof want - 16) return -1;
    if (gpu >= 0) {
        char digits[12];
        int n = 0;
        for (unsigned int g = (unsigned int)gpu; n == 0 || g; g /= 10) digits[n++] = (char)('0' + g % 10);
        while (n) want[w++] = digits[--n];
        want[w++] = ' ';
    }
    memcpy(want + w, key, k);
    w += k;
    want[w++] = ' ';
    int found = -1;
    pthread_mutex_lock(&cache_lock);
    if (load() == 0) {
        for (const char *line = cache; line < cache + cache_len;) {
            const char *end = memchr(line, '\n', (size_t)(cache + cache_len - line));
            if (!end) end = cache + cache_len;
            if ((size_t)(end - line) >= w && strncmp(line, want, w) == 0) {
                size_t n = (size_t)(end - line) - w;
                if (n >= len) n = len - 1;
                memcpy(out, line + w, n);
                out[n] = 0;
                found = 0;
                break;
            }
            line = end + 1;
        }
    }
    pthread_mutex_unlock(&cache_lock);
    return found;
}

static int number(int gpu, const char *key, unsigned long long *out) {
    char v[256];
    if (fact(gpu, key, v, sizeof v) != 0) return NOT_SUPPORTED;
    *out = strtoull(v, NULL, 0);
    return OK;
}

static int index_of(nvmlDevice_t d) { return (int)((uintptr_t)d - 1); }

static int text(nvmlDevice_t d, const char *key, char *out, unsigned int len) {
    char v[256];
    if (!out) return INVALID_ARGUMENT;
    if (fact(index_of(d), key, v, sizeof v) != 0) return NOT_SUPPORTED;
    if (strlen(v) + 1 > len) return INSUFFICIENT_SIZE;
    strcpy(out, v);
    return OK;
}

/* Up to max "pid:value" pairs of `key`; returns how many there are. */
static unsigned int pairs(int gpu, const char *key, unsigned int *pids, unsigned long long *values, unsigned int max) {
    char v[1024];
    if (fact(gpu, key, v, sizeof v) != 0) return 0;
    unsigned int n = 0;
    for (char *p = strtok(v, ","); p; p = strtok(NULL, ",")) {
        if (n < max) {
            pids[n] = (unsigned int)strtoul(p, NULL, 10);
            char *colon = strchr(p, ':');
            values[n] = colon ? strtoull(colon + 1, NULL, 10) : 0;
        }
        n++;
    }
    return n;
}

int nvmlInit_v2(void) { return OK; }
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return OK; }
int nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(int r) { return r == OK ? "Success" : "Not Supported (stand-in)"; }

int nvmlSystemGetDriverVersion(char *out, unsigned int len) {
    char v[128];
    if (fact(-1, "driver", v, sizeof v) != 0) return NOT_SUPPORTED;
    snprintf(out, len, "%s", v);
    return OK;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    unsigned long long n = 0;
    number(-1, "gpus", &n);
    *count = (unsigned int)n;
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *d) {
    unsigned int n = 0;
    nvmlDeviceGetCount_v2(&n);
    if (index >= n) return INVALID_ARGUMENT;
    *d = (nvmlDevice_t)(uintptr_t)(index + 1);
    return OK;
}

int nvmlDeviceGetName(nvmlDevice_t d, char *out, unsigned int len) { return text(d, "name", out, len); }
int nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned int len) { return text(d, "uuid", out, len); }

int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    char v[64];
    if (fact(index_of(d), "bus", v, sizeof v) != 0) return NOT_SUPPORTED;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%.31s", v);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%.15s", v);
    sscanf(v, "%x:%x:%x", &p->domain, &p->bus, &p->device);
    return OK;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    unsigned long long g, m = 0;
    if (number(index_of(d), "util", &g) != OK) return NOT_SUPPORTED;
    number(index_of(d), "mem_util", &m);
    u->gpu = (unsigned int)g;
    u->memory = (unsigned int)m;
    return OK;
}

int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    unsigned int pids[64];
    unsigned long long bytes[64];
    unsigned int n = pairs(index_of(d), "procs", pids, bytes, 64);
    if (n > 64) n = 64;
    if (!infos || *count < n) {
        *count = n;
        return n == 0 ? OK : INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        memset(&infos[i], 0, sizeof infos[i]);
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = bytes[i];
        infos[i].gpuInstanceId = 0xFFFFFFFF;
        infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *count = n;
    return OK;
}

#ifndef HALF
int nvmlDeviceGetCpuAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set) {
    unsigned long long mask;
    if (number(index_of(d), "affinity", &mask) != OK) return NOT_SUPPORTED;
    memset(set, 0, size * sizeof *set);
    if (size > 0) set[0] = (unsigned long)mask;
    return OK;
}

int nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    unsigned long long v;
    /* NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 */
    const char *key = type == 1 ? "sm_clock" : type == 2 ? "mem_clock" : NULL;
    if (!key || number(index_of(d), key, &v) != OK) return NOT_SUPPORTED;
    *mhz = (unsigned int)v;
    return OK;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
    return number(index_of(d), "reasons", reasons);
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    unsigned long long v;
    int r = number(index_of(d), "power_mw", &v);
    *mw = (unsigned int)v;
    return r;
}

int nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *c) {
    unsigned long long v;
    if (sensor != 0 || number(index_of(d), "temp", &v) != OK) return NOT_SUPPORTED;
    *c = (unsigned int)v;
    return OK;
}

int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    unsigned long long total, used = 0;
    if (number(index_of(d), "mem_total", &total) != OK) return NOT_SUPPORTED;
    number(index_of(d), "mem_used", &used);
    m->total = total;
    m->used = used;
    m->free = total > used ? total - used : 0;
    m->reserved = 0;
    return OK;
}

int nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs) {
    unsigned long long v;
    /* NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 */
    if (number(index_of(d), counter == 0 ? "pcie_tx" : "pcie_rx", &v) != OK) return NOT_SUPPORTED;
    *kbs = (unsigned int)v;
    return OK;
}

int nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
    (void)counter;
    return number(index_of(d), type == 0 ? "ecc_corrected" : "ecc_uncorrected", n);
}

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

int nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    *index = (unsigned int)index_of(d);
    return OK;
}

int nvmlEventSetCreate(void **set) { *set = (void *)1; return OK; }
int nvmlEventSetFree(void *set) { (void)set; return OK; }

int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    unsigned long long on = 0;
    if (number(index_of(d), "xid_events", &on) != OK || !on) return NOT_SUPPORTED;
    *types = XID_CRITICAL;
    return OK;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, void *set) {
    (void)set;
    unsigned long long on = 0;
    if (number(index_of(d), "xid_events", &on) != OK || !on || types != XID_CRITICAL) return NOT_SUPPORTED;
    return OK;
}

/* The next undelivered "xids" entry, without waiting (the daemon asks with a zero timeout). */
int nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    static unsigned int delivered = 0;
    (void)set;
    (void)timeout_ms;
    unsigned int gpus[64];
    unsigned long long codes[64];
    unsigned int n = pairs(-1, "xids", gpus, codes, 64);
    if (n > 64) n = 64;
    if (delivered >= n) return TIMEOUT;
    memset(data, 0, sizeof *data);
    data->device = (nvmlDevice_t)(uintptr_t)(gpus[delivered] + 1);
    data->eventType = XID_CRITICAL;
    data->eventData = codes[delivered];
    delivered++;
    return OK;
}

int nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                              unsigned int *failed) {
    char v[128];
    if (fact(index_of(d), "remap", v, sizeof v) != 0) return NOT_SUPPORTED;
    if (sscanf(v, "%u,%u,%u,%u", corr, unc, pending, failed) != 4) return INVALID_ARGUMENT;
    return OK;
}

int nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *s, unsigned int *count,
                                    unsigned long long last_seen) {
    (void)last_seen;
    unsigned int pids[64];
    unsigned long long util[64];
    unsigned int n = pairs(index_of(d), "proc_util", pids, util, 64);
    if (n > 64) n = 64;
    if (n == 0) return NOT_FOUND;
    if (!s || *count < n) {
        *count = n;
        return INSUFFICIENT_SIZE;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (unsigned int i = 0; i < n; i++) {
        memset(&s[i], 0, sizeof s[i]);
        s[i].pid = pids[i];
        s[i].timeStamp = (unsigned long long)ts.tv_sec * 1000000ULL + ts.tv_nsec / 1000;
        s[i].smUtil = (unsigned int)util[i];
    }
    *count = n;
    return OK;
}

/* NVML's own samples (see the top of the file). */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
} nvmlValue_t;
typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

#define SAMPLES_KEPT 100ULL

int nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long last_seen, int *val_type, unsigned int *count,
                         nvmlSample_t *samples) {
    char v[256], pattern[1024];
    unsigned long long util, ms = 167;
    int gpu = index_of(d);
    if (!count || !val_type) return INVALID_ARGUMENT;
    /* NVML_GPU_UTILIZATION_SAMPLES = 1, NVML_MEMORY_UTILIZATION_SAMPLES = 2 */
    const char *key = type == 1 ? "util" : type == 2 ? "mem_util" : NULL;
    if (!key || number(gpu, key, &util) != OK) return NOT_SUPPORTED;
    if (fact(gpu, "samples", v, sizeof v) == 0) {
        if (strcmp(v, "none") == 0) return NOT_SUPPORTED;
        if (strcmp(v, "dry") == 0) return NOT_FOUND;
    }
    number(gpu, "sample_ms", &ms);
    if (ms == 0) ms = 167;
    int have_pattern = type == 1 && fact(gpu, "util_samples", pattern, sizeof pattern) == 0;
    /* The real library answers a NULL array with its buffer's size. */
    if (!samples) {
        *count = (unsigned int)SAMPLES_KEPT;
        return OK;
    }
    unsigned long long room = 0;
    if (number(gpu, "samples_room", &room) == OK && *count < room) {
        *count = (unsigned int)room;
        return INSUFFICIENT_SIZE;
    }
    struct timespec now;
    clock_gettime(fact(gpu, "sample_clock", v, sizeof v) == 0 && strcmp(v, "boot") == 0 ? CLOCK_BOOTTIME : CLOCK_REALTIME,
                  &now);
    unsigned long long period = ms * 1000ULL;
    unsigned long long now_us = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000;
    unsigned long long newest = now_us / period, first = last_seen / period + 1;
    if (newest + 1 > SAMPLES_KEPT && first < newest + 1 - SAMPLES_KEPT) first = newest + 1 - SAMPLES_KEPT;
    if (first > newest) return NOT_FOUND;
    /* The pattern's values, parsed once a call. */
    unsigned long long values[64];
    unsigned int n = 0;
    if (have_pattern)
        for (char *p = strtok(pattern, ","); p && n < 64; p = strtok(NULL, ",")) values[n++] = strtoull(p, NULL, 10);
    unsigned int filled = 0;
    for (unsigned long long k = first; k <= newest && filled < *count; k++, filled++) {
        memset(&samples[filled], 0, sizeof samples[filled]);
        samples[filled].timeStamp = k * period;
        samples[filled].sampleValue.uiVal = (unsigned int)(n ? values[k % n] : util);
    }
    *count = filled;
    *val_type = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT, as NVIDIA documents utilisation samples */
    return OK;
}

/* GPM (Hopper and later): a sample remembers its GPU; the metrics between two samples are the
 * file's `gpm` line, whatever the time between them. */
typedef struct { int gpu; } gpm_sample;
typedef struct {
    unsigned int metricId;
    int nvmlReturn;
    double value;
    struct { char *shortName, *longName, *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    gpm_sample *sample1, *sample2;
    nvmlGpmMetric_t metrics[98];
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;

int nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    char v[256];
    if (!s) return INVALID_ARGUMENT;
    s->isSupportedDevice = fact(index_of(d), "gpm", v, sizeof v) == 0;
    return OK;
}

int nvmlGpmSampleAlloc(gpm_sample **s) {
    *s = calloc(1, sizeof **s);
    return *s ? OK : INVALID_ARGUMENT;
}

int nvmlGpmSampleFree(gpm_sample *s) {
    free(s);
    return OK;
}

int nvmlGpmSampleGet(nvmlDevice_t d, gpm_sample *s) {
    char v[256];
    if (!s) return INVALID_ARGUMENT;
    if (fact(index_of(d), "gpm", v, sizeof v) != 0) return NOT_SUPPORTED;
    s->gpu = index_of(d);
    return OK;
}

int nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    char v[256];
    double f[6];
    if (!m || !m->sample1 || !m->sample2 || m->numMetrics > 98) return INVALID_ARGUMENT;
    if (fact(m->sample2->gpu, "gpm", v, sizeof v) != 0) return NOT_SUPPORTED;
    if (sscanf(v, "%lf,%lf,%lf,%lf,%lf,%lf", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]) != 6) return INVALID_ARGUMENT;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        memset(&x->metricInfo, 0, sizeof x->metricInfo);
        x->nvmlReturn = OK;
        switch (x->metricId) {
        case 2: x->value = f[0]; break;   /* SM_UTIL */
        case 3: x->value = f[1]; break;   /* SM_OCCUPANCY */
        case 5: x->value = f[2]; break;   /* ANY_TENSOR_UTIL */
        case 10: x->value = f[3]; break;  /* DRAM_BW_UTIL */
        case 60: x->value = f[4]; break;  /* NVLINK_TOTAL_RX_PER_SEC */
        case 61: x->value = f[5]; break;  /* NVLINK_TOTAL_TX_PER_SEC */
        default: x->nvmlReturn = NOT_SUPPORTED;
        }
    }
    return OK;
}
#endif
