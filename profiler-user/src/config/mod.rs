//! The daemon's settings: a TOML file (`profiler run --config FILE`), overridden by flags,
//! over built-in defaults that suit an always-on node.

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

// Each shipper's table is read and checked beside the shipper (`ship::otlp::config`,
// `ship::clickhouse::config`); the file's reader only holds them.
pub use crate::ship::{
    clickhouse::FileConfig as ClickHouseFile,
    otlp::config::{OTLP_GRPC_PATH, OTLP_HTTP_PATH, OTLP_INTERVAL, Otlp, OtlpFile, OtlpProtocol, otlp},
};

use crate::{store::retention::Retention, timespec::parse_duration_ns};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {0}: {1}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("config file {0}: {1}")]
    Parse(PathBuf, String),
    #[error("{what} '{value}' is not a size: use a number with a unit, such as 512MiB, 1GiB or 2GB")]
    Size { what: &'static str, value: String },
    #[error("{what} '{value}' is not a duration: use a number with a unit, such as 30m, 24h or 7d")]
    Duration { what: &'static str, value: String },
    #[error("{key} = {value} is out of range: use {allowed}")]
    Range { key: &'static str, value: String, allowed: &'static str },
    #[error("config file {0} is not a regular file: give the path of a TOML file")]
    NotAFile(PathBuf),
    #[error("config file {0} is larger than {MAX_CONFIG_BYTES} bytes: is it the right file?")]
    TooLarge(PathBuf),
}

/// A config file is a few lines; anything bigger is a wrong path (`--config /dev/zero` must
/// not fill memory).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Ring buffer sizes `--ring-buffer-kib` accepts: a power of two from one page to 1 GiB (the
/// kernel wants a power-of-two multiple of the page size; more than 1 GiB of locked memory for
/// samples is a typo).
pub const RING_KIB: std::ops::RangeInclusive<u32> = 4..=1 << 20;

/// The default ring: a second of samples at 1 KiB each (a record is a ~50-byte header and
/// 8 bytes a frame; 40-frame stacks are typical) for `cpus` CPUs at `hz`, between 1 and 4 MiB.
/// The reader is woken at a quarter full, so a 2-CPU node at 99 Hz needs little of even the
/// least; a ring's pages are also mapped twice into the daemon, each counting in its RSS.
pub fn default_ring_kib(cpus: u32, hz: u64) -> u32 {
    let kib = (u64::from(cpus) * hz).next_power_of_two().clamp(1024, 4096);
    kib as u32
}

/// The ring buffer's size in bytes, refusing what is not a power of two in [`RING_KIB`] rather
/// than rounding it silently.
pub fn ring_buffer_bytes(kib: u32) -> Result<u32, ConfigError> {
    if RING_KIB.contains(&kib) && kib.is_power_of_two() {
        Ok(kib * 1024)
    } else {
        Err(ConfigError::Range {
            key: "ring_buffer_kib",
            value: kib.to_string(),
            allowed: "a power of two from 4 to 1048576 (4 KiB to 1 GiB), such as 4096",
        })
    }
}

/// Kernel memory for unwind tables `--unwind-table-mib` accepts (0: frame pointers only).
pub const UNWIND_MIB: std::ops::RangeInclusive<u32> = 0..=1024;
/// The default: 80 MiB, 20 M rows of 4 bytes: the tables of 500 distinct binaries of a Debian
/// system take 35 MiB, a PyTorch + CUDA process's libraries 24 MiB (a libc is 28 k rows,
/// libtorch_cpu.so 2.6 M; see BENCHMARKS.md).
pub const UNWIND_MIB_DEFAULT: u32 = 80;

/// Words of unwind table (packed rows and page indexes, 4 bytes each) in `mib` MiB, refusing
/// what is outside [`UNWIND_MIB`].
pub fn unwind_rows(mib: u32) -> Result<u32, ConfigError> {
    if UNWIND_MIB.contains(&mib) {
        Ok(mib * (1 << 20) / size_of::<u32>() as u32)
    } else {
        Err(ConfigError::Range {
            key: "unwind_table_mib",
            value: mib.to_string(),
            allowed: "0 (frame pointers only) to 1024 MiB, such as 80",
        })
    }
}

/// Range checks for every `[detect]` threshold: NaN, negative shares and windows that would
/// keep an hour of ticks in memory are refused with the key and the allowed range.
pub fn check_thresholds(t: &crate::detect::Thresholds) -> Result<(), ConfigError> {
    fn share(key: &'static str, v: f64, zero_ok: bool) -> Result<(), ConfigError> {
        let ok = v.is_finite() && v <= 1.0 && (v > 0.0 || (zero_ok && v == 0.0));
        let allowed =
            if zero_ok { "a share from 0 to 1, such as 0.6" } else { "a share above 0 and at most 1, such as 0.5" };
        ok.then_some(()).ok_or(ConfigError::Range { key, value: v.to_string(), allowed })
    }
    fn float(key: &'static str, v: f64, max: f64, allowed: &'static str) -> Result<(), ConfigError> {
        (v.is_finite() && v > 0.0 && v <= max).then_some(()).ok_or(ConfigError::Range {
            key,
            value: v.to_string(),
            allowed,
        })
    }
    fn int(
        key: &'static str,
        v: u64,
        range: std::ops::RangeInclusive<u64>,
        allowed: &'static str,
    ) -> Result<(), ConfigError> {
        range.contains(&v).then_some(()).ok_or(ConfigError::Range { key, value: v.to_string(), allowed })
    }
    share("detect.saturated_busy", t.saturated_busy, false)?;
    int("detect.saturated_secs", t.saturated_secs.into(), 1..=600, "1 to 600 seconds")?;
    share("detect.machine_busy_max", t.machine_busy_max, true)?;
    share("detect.saturated_kernel_min", t.saturated_kernel_min, true)?;
    int("detect.saturated_critical_secs", t.saturated_critical_secs.into(), 1..=86_400, "1 to 86400 seconds")?;
    // Detector 2 keeps every busy tick of the window in memory.
    int("detect.hot_window_secs", t.hot_window_secs.into(), 1..=60, "1 to 60 seconds")?;
    share("detect.hot_share", t.hot_share, false)?;
    share("detect.watch_share", t.watch_share, false)?;
    share("detect.hot_critical_share", t.hot_critical_share, false)?;
    float("detect.netrx_p99_ms", t.netrx_p99_ms, 10_000.0, "above 0 and at most 10000 ms")?;
    int("detect.netrx_p99_min_runs", t.netrx_p99_min_runs, 1..=1_000_000, "1 to 1000000")?;
    float("detect.netrx_gap_ms", t.netrx_gap_ms, 60_000.0, "above 0 and at most 60000 ms")?;
    float("detect.netrx_critical_factor", t.netrx_critical_factor, 1000.0, "above 0 and at most 1000")?;
    int("detect.zombie_min", t.zombie_min, 1..=100_000_000, "1 to 100000000")?;
    float("detect.zombie_ratio", t.zombie_ratio, 1e6, "above 0 and at most 1000000")?;
    int("detect.zombie_critical", t.zombie_critical, 1..=100_000_000, "1 to 100000000")?;
    share("detect.throttle_share", t.throttle_share, false)?;
    // The profile of a throttled cgroup is kept for the window (and 10 s more).
    int("detect.throttle_window_secs", t.throttle_window_secs.into(), 5..=300, "5 to 300 seconds")?;
    int("detect.throttle_min_periods", t.throttle_min_periods, 1..=1_000_000, "1 to 1000000")?;
    share("detect.lock_share", t.lock_share, false)?;
    // At least two CPUs: one CPU spinning is a hot kernel function (detector 2), not contention.
    int("detect.lock_min_cpus", t.lock_min_cpus.into(), 2..=4096, "2 to 4096 CPUs")?;
    // Like detector 2, every busy tick of the window is kept in memory.
    int("detect.lock_window_secs", t.lock_window_secs.into(), 1..=60, "1 to 60 seconds")?;
    share("detect.lock_critical_share", t.lock_critical_share, false)?;
    float("detect.runq_max_ms", t.runq_max_ms, 60_000.0, "above 0 and at most 60000 ms")?;
    float("detect.runq_p99_ms", t.runq_p99_ms, 60_000.0, "above 0 and at most 60000 ms")?;
    float("detect.runq_critical_factor", t.runq_critical_factor, 1000.0, "above 0 and at most 1000")?;
    share("detect.reclaim_share", t.reclaim_share, false)?;
    share("detect.reclaim_critical_share", t.reclaim_critical_share, false)?;
    share("detect.gpu_idle_below", t.gpu_idle_below, false)?;
    int("detect.gpu_secs", t.gpu_secs.into(), 1..=600, "1 to 600 seconds")?;
    share("detect.gpu_cpu_busy", t.gpu_cpu_busy, false)?;
    // Summed over the workers: more than one second a second is a share of several.
    float("detect.gpu_blocked_share", t.gpu_blocked_share, 1024.0, "above 0 and at most 1024 seconds a second")?;
    share("detect.gpu_sync_share", t.gpu_sync_share, false)?;
    share("detect.gpu_busy_above", t.gpu_busy_above, false)?;
    share("detect.gpu_sm_active_below", t.gpu_sm_active_below, false)?;
    Ok(())
}

/// Dictionary entries a segment may hold before a new dictionary starts (memory per segment).
pub const DICT_CAP: std::ops::RangeInclusive<usize> = 1_000..=10_000_000;

/// `store.dict_cap`, range-checked.
pub fn dict_cap(v: usize) -> Result<usize, ConfigError> {
    DICT_CAP.contains(&v).then_some(v).ok_or(ConfigError::Range {
        key: "store.dict_cap",
        value: v.to_string(),
        allowed: "1000 to 10000000 entries",
    })
}

/// The `[store]` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreFile {
    pub max_size: Option<String>,
    pub max_age: Option<String>,
    /// A duration, or "off".
    pub rollup_after: Option<String>,
    pub dict_cap: Option<usize>,
}

/// The config file. Every key is optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub data_dir: Option<PathBuf>,
    pub frequency: Option<u64>,
    pub flush_ms: Option<u64>,
    pub ring_buffer_kib: Option<u32>,
    pub unwind_table_mib: Option<u32>,
    /// The daemon's memory budget in MiB (`--memory-mib`).
    pub memory_mib: Option<u64>,
    pub report_secs: Option<u64>,
    /// `IP:PORT` of the UI and API, or "off".
    pub listen: Option<String>,
    /// This node's name (default: the host name).
    pub node: Option<String>,
    /// The host's /var/log, where the kubelet keeps container logs.
    pub kubelet_logs: Option<PathBuf>,
    #[serde(default)]
    pub store: StoreFile,
    /// Detector thresholds (every key optional; see `detect::Thresholds`).
    #[serde(default)]
    pub detect: crate::detect::Thresholds,
    #[serde(default)]
    pub events: EventsFile,
    #[serde(default)]
    pub otlp: OtlpFile,
    /// Shipping to ClickHouse (off without a URL).
    pub clickhouse: Option<ClickHouseFile>,
    /// Read kernel counters (softnet, softirqs, interrupts, PSI, cgroups, NICs) each second
    /// and store them beside the samples [default: true].
    pub kernel_counters: Option<bool>,
    /// The flight recorder (see `flight`).
    #[serde(default)]
    pub flight: crate::flight::Settings,
    #[serde(default)]
    pub gpu: GpuFile,
    /// Off-CPU waits at least this long (ms) are recorded; 0: off (`--off-cpu-threshold-ms`).
    pub off_cpu_threshold_ms: Option<f64>,
}

/// `[gpu]`: where NVIDIA's management library is and how often the GPUs are read.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFile {
    /// A file name the loader finds (`libnvidia-ml.so.1`, the default), a path
    /// (`/usr/local/nvidia/lib64/libnvidia-ml.so.1`), or `off`.
    pub nvml_library: Option<String>,
    pub poll_ms: Option<u64>,
    /// Uprobes on `libcuda.so.1` in every process mapping it (`gpu::cuda`) [default: true].
    pub cuda_probes: Option<bool>,
    /// The CUDA probes' rate guard (`gpu::cuda::guard`) [default: 1 % of each process's CPU
    /// time, about 2,300 hits a second on a core].
    pub cuda_max_calls_per_sec: Option<u32>,
}

/// `--cuda-max-calls-per-sec` / `[gpu] cuda_max_calls_per_sec`, checked.
/// `None` (unset, or 0): the default, a share of each process's CPU time
/// (`gpu::cuda::guard::budget`).
pub fn cuda_max_calls(value: Option<u32>) -> Result<Option<f64>, ConfigError> {
    let Some(v) = value.filter(|&v| v != 0).map(f64::from) else { return Ok(crate::gpu::cuda::MAX_CALLS_PER_SEC) };
    if !(10.0..=10_000_000.0).contains(&v) {
        return Err(ConfigError::Range {
            key: "gpu.cuda_max_calls_per_sec",
            value: v.to_string(),
            allowed: "10 to 10000000 calls a second, such as 10000, or 0 for 1 % of each process's CPU time",
        });
    }
    Ok(Some(v))
}

/// The GPU poller's settings: `None` when GPU tracks are off.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub library: String,
    pub interval: Duration,
}

pub const NVML_DEFAULT: &str = "libnvidia-ml.so.1";

/// `--nvml-library`/`--gpu-poll-ms` over `[gpu]`, checked.
pub fn gpu(file: &GpuFile, library: Option<String>, poll_ms: Option<u64>) -> Result<Option<Gpu>, ConfigError> {
    let library = library.or_else(|| file.nvml_library.clone()).unwrap_or_else(|| NVML_DEFAULT.to_string());
    let poll_ms = poll_ms.or(file.poll_ms).unwrap_or(100);
    if !crate::gpu::nvml::POLL_MS.contains(&poll_ms) {
        return Err(ConfigError::Range {
            key: "gpu.poll_ms",
            value: poll_ms.to_string(),
            allowed: "10 to 10000 ms, such as 100",
        });
    }
    if library.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    if library.trim().is_empty() || library.contains('\0') {
        return Err(ConfigError::Range {
            key: "gpu.nvml_library",
            value: library,
            allowed: "a file name, a path to libnvidia-ml.so.1, or off",
        });
    }
    Ok(Some(Gpu { library, interval: Duration::from_millis(poll_ms) }))
}

/// The `[events]` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsFile {
    /// Regular expressions; kernel log lines that match one become events. Replaces the
    /// defaults when given.
    pub patterns: Option<Vec<String>>,
}

impl ConfigFile {
    /// Reads at most [`MAX_CONFIG_BYTES`] of a regular file (a FIFO or a device is refused
    /// before any read, so `/dev/zero` or a pipe nobody writes cannot fill memory or hang).
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        use std::{io::Read, os::unix::fs::OpenOptionsExt};
        let read_err = |e| ConfigError::Read(path.to_path_buf(), e);
        // O_NONBLOCK: opening a FIFO must not wait for a writer; the type check follows.
        let file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(read_err)?;
        if !file.metadata().map_err(read_err)?.is_file() {
            return Err(ConfigError::NotAFile(path.to_path_buf()));
        }
        let mut text = String::new();
        file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text).map_err(read_err)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge(path.to_path_buf()));
        }
        toml::from_str(&text).map_err(|e| ConfigError::Parse(path.to_path_buf(), e.message().to_string()))
    }
}

/// `1GiB`, `512MiB`, `2GB`, `100k`, `4096`: binary units for `Ki/Mi/Gi/Ti` and bare `K/M/G/T`,
/// decimal for `KB/MB/GB/TB`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let value: f64 = s[..split].parse().ok()?;
    let scale: f64 = match s[split..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = value * scale;
    (bytes.is_finite() && (1.0..1.8e19).contains(&bytes)).then_some(bytes as u64)
}

pub fn size(what: &'static str, value: &str) -> Result<u64, ConfigError> {
    parse_size(value).ok_or_else(|| ConfigError::Size { what, value: value.to_string() })
}

pub fn duration(what: &'static str, value: &str) -> Result<Duration, ConfigError> {
    parse_duration_ns(value)
        .filter(|&ns| ns > 0)
        .map(Duration::from_nanos)
        .ok_or_else(|| ConfigError::Duration { what, value: value.to_string() })
}

/// `off` (no tiering) or a duration.
pub fn rollup_after(value: &str) -> Result<Option<Duration>, ConfigError> {
    if value.eq_ignore_ascii_case("off") { Ok(None) } else { duration("rollup_after", value).map(Some) }
}

/// The settings SIGHUP reloads without a restart: detector thresholds and store bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Reloadable {
    pub thresholds: crate::detect::Thresholds,
    pub retention: Retention,
    /// `None`: no tiering.
    pub rollup_after: Option<Duration>,
}

/// Store flags given on the command line; they win over the file at every (re)load.
#[derive(Debug, Clone, Default)]
pub struct StoreFlags {
    pub max_size: Option<String>,
    pub max_age: Option<String>,
    pub rollup_after: Option<String>,
}

impl Reloadable {
    pub fn from(file: &ConfigFile, flags: &StoreFlags) -> Result<Self, ConfigError> {
        let pick = |flag: &Option<String>, file: &Option<String>, default: &str| {
            flag.clone().or_else(|| file.clone()).unwrap_or_else(|| default.to_string())
        };
        check_thresholds(&file.detect)?;
        Ok(Self {
            thresholds: file.detect.clone(),
            retention: retention(
                &pick(&flags.max_size, &file.store.max_size, "1GiB"),
                &pick(&flags.max_age, &file.store.max_age, "7d"),
            )?,
            rollup_after: rollup_after(&pick(&flags.rollup_after, &file.store.rollup_after, "24h"))?,
        })
    }
}

/// Store bounds from their textual forms.
pub fn retention(max_size: &str, max_age: &str) -> Result<Retention, ConfigError> {
    Ok(Retention {
        max_bytes: size("max_size", max_size)?,
        max_age_ns: duration("max_age", max_age)?.as_nanos() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README's TOML example (issue 41, part 7: it left out the CUDA probes' keys and
    /// `gpu_sync_share`): a valid config, with every `[detect]` threshold and `[gpu]` key.
    #[test]
    fn the_readmes_example_is_a_valid_config_naming_every_threshold_and_gpu_key() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("```toml\n").expect("README has a TOML example") + "```toml\n".len();
        let text = &readme[start..start + readme[start..].find("```").unwrap()];
        let file: ConfigFile = toml::from_str(text).unwrap_or_else(|e| panic!("README's example: {e}"));
        assert_eq!(file.gpu.cuda_probes, Some(true));
        assert_eq!(file.gpu.cuda_max_calls_per_sec, Some(0));
        let value: toml::Table = toml::from_str(text).unwrap();
        let detect = value["detect"].as_table().expect("[detect]");
        let serde_json::Value::Object(defaults) = serde_json::to_value(crate::detect::Thresholds::default()).unwrap()
        else {
            panic!("thresholds serialise to an object")
        };
        let missing: Vec<&String> = defaults.keys().filter(|k| !detect.contains_key(k.as_str())).collect();
        assert!(missing.is_empty(), "README's [detect] lacks {missing:?}");
        assert_eq!(file.detect, crate::detect::Thresholds::default(), "README shows the defaults");
    }

    #[test]
    fn gpu_settings_default_to_the_standard_library_every_100_ms_and_refuse_nonsense() {
        let g = gpu(&GpuFile::default(), None, None).unwrap().unwrap();
        assert_eq!((g.library.as_str(), g.interval), (NVML_DEFAULT, Duration::from_millis(100)));
        let file = GpuFile {
            nvml_library: Some("/opt/nv/libnvidia-ml.so.1".into()),
            poll_ms: Some(500),
            ..Default::default()
        };
        let g = gpu(&file, None, None).unwrap().unwrap();
        assert_eq!((g.library.as_str(), g.interval.as_millis()), ("/opt/nv/libnvidia-ml.so.1", 500));
        assert_eq!(gpu(&file, Some("/x.so".into()), Some(50)).unwrap().unwrap().library, "/x.so");
        assert_eq!(gpu(&file, Some("off".into()), None).unwrap(), None);
        let e = gpu(&GpuFile::default(), None, Some(0)).unwrap_err().to_string();
        assert!(e.contains("gpu.poll_ms = 0 is out of range"), "{e}");
        assert!(gpu(&GpuFile::default(), Some(" ".into()), None).is_err());
    }

    #[test]
    fn the_default_ring_follows_cpus_times_hz_within_1_to_4_mib() {
        assert_eq!(default_ring_kib(2, 99), 1024);
        assert_eq!(default_ring_kib(2, 999), 2048);
        assert_eq!(default_ring_kib(96, 99), 4096);
        assert_eq!(default_ring_kib(1024, 10_000), 4096);
        for (cpus, hz) in [(1, 1), (3, 333), (64, 999)] {
            assert!(ring_buffer_bytes(default_ring_kib(cpus, hz)).is_ok());
        }
    }

    #[test]
    fn ring_sizes_are_refused_not_rounded() {
        assert_eq!(ring_buffer_bytes(4096).unwrap(), 4 << 20);
        assert_eq!(ring_buffer_bytes(4).unwrap(), 4096);
        assert_eq!(ring_buffer_bytes(1 << 20).unwrap(), 1 << 30);
        for bad in [0, 1, 2, 3, 5, 4095, 3000, 1 << 21, u32::MAX, 4_194_304] {
            let e = ring_buffer_bytes(bad).unwrap_err().to_string();
            assert!(e.contains("ring_buffer_kib") && e.contains("power of two"), "{bad}: {e}");
        }
    }

    #[test]
    fn thresholds_out_of_range_are_refused_with_their_key() {
        assert!(check_thresholds(&crate::detect::Thresholds::default()).is_ok());
        for (toml, key) in [
            ("saturated_busy = nan", "detect.saturated_busy"),
            ("saturated_busy = -1.0", "detect.saturated_busy"),
            ("saturated_busy = 0.0", "detect.saturated_busy"),
            ("saturated_busy = 1.5", "detect.saturated_busy"),
            ("machine_busy_max = inf", "detect.machine_busy_max"),
            ("hot_window_secs = 3600", "detect.hot_window_secs"),
            ("hot_window_secs = 0", "detect.hot_window_secs"),
            ("saturated_secs = 0", "detect.saturated_secs"),
            ("hot_share = -0.1", "detect.hot_share"),
            ("watch_share = nan", "detect.watch_share"),
            ("netrx_p99_ms = 0.0", "detect.netrx_p99_ms"),
            ("netrx_gap_ms = -5.0", "detect.netrx_gap_ms"),
            ("zombie_min = 0", "detect.zombie_min"),
            ("zombie_ratio = nan", "detect.zombie_ratio"),
            ("throttle_share = 1.5", "detect.throttle_share"),
            ("throttle_window_secs = 1", "detect.throttle_window_secs"),
            ("throttle_min_periods = 0", "detect.throttle_min_periods"),
            ("lock_share = 0.0", "detect.lock_share"),
            ("lock_share = 1.5", "detect.lock_share"),
            ("lock_min_cpus = 1", "detect.lock_min_cpus"),
            ("lock_window_secs = 0", "detect.lock_window_secs"),
            ("lock_window_secs = 61", "detect.lock_window_secs"),
            ("runq_max_ms = 0.0", "detect.runq_max_ms"),
            ("runq_p99_ms = inf", "detect.runq_p99_ms"),
            ("reclaim_share = 0.0", "detect.reclaim_share"),
            ("saturated_critical_secs = 0", "detect.saturated_critical_secs"),
            ("hot_critical_share = 1.5", "detect.hot_critical_share"),
            ("netrx_p99_min_runs = 0", "detect.netrx_p99_min_runs"),
            ("netrx_critical_factor = nan", "detect.netrx_critical_factor"),
            ("zombie_critical = 0", "detect.zombie_critical"),
            ("lock_critical_share = 0.0", "detect.lock_critical_share"),
            ("runq_critical_factor = -4.0", "detect.runq_critical_factor"),
            ("reclaim_critical_share = nan", "detect.reclaim_critical_share"),
        ] {
            let file: ConfigFile = toml::from_str(&format!("[detect]\n{toml}\n")).unwrap();
            let e = Reloadable::from(&file, &StoreFlags::default()).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{key} = ")) && e.contains("out of range: use"), "{toml}: {e}");
        }
        assert!(dict_cap(200_000).is_ok());
        assert!(dict_cap(0).unwrap_err().to_string().contains("store.dict_cap = 0 is out of range"));
    }

    #[test]
    fn config_files_are_small_regular_files() {
        let e = ConfigFile::load(std::path::Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("/dev/zero is not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = ConfigFile::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = ConfigFile::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "a FIFO nobody writes neither hangs nor is read: {e}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES as usize))).unwrap();
        assert!(ConfigFile::load(&big).unwrap_err().to_string().contains("is larger than"));
        let ok = dir.path().join("ok.toml");
        std::fs::write(&ok, "frequency = 49\n").unwrap();
        assert_eq!(ConfigFile::load(&ok).unwrap().frequency, Some(49));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1.5k"), Some(1536));
        for bad in ["", "GB", "1 parsec", "-1G", "0"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn flags_win_over_the_file_at_every_reload() {
        let file: ConfigFile =
            toml::from_str("[store]\nmax_size = \"64MiB\"\nmax_age = \"1d\"\n[detect]\nhot_share = 0.7\n").unwrap();
        let flags = StoreFlags { max_size: Some("1GiB".into()), ..Default::default() };
        let r = Reloadable::from(&file, &flags).unwrap();
        assert_eq!(r.retention.max_bytes, 1 << 30);
        assert_eq!(r.retention.max_age_ns, 86_400_000_000_000);
        assert_eq!(r.thresholds.hot_share, 0.7);
        assert_eq!(r.rollup_after, Some(Duration::from_secs(86_400)));
        let bad: ConfigFile = toml::from_str("[store]\nmax_age = \"forever\"\n").unwrap();
        assert!(Reloadable::from(&bad, &StoreFlags::default()).is_err());
    }

    #[test]
    fn config_file_and_errors() {
        let c: ConfigFile =
            toml::from_str("frequency = 49\n[store]\nmax_size = \"64MiB\"\nrollup_after = \"off\"\n").unwrap();
        assert_eq!(c.frequency, Some(49));
        assert_eq!(rollup_after(c.store.rollup_after.as_deref().unwrap()).unwrap(), None);
        let c: ConfigFile = toml::from_str("off_cpu_threshold_ms = 5.0\n").unwrap();
        assert_eq!(c.off_cpu_threshold_ms, Some(5.0));
        assert_eq!(ConfigFile::default().off_cpu_threshold_ms, None, "the flag's default applies");
        assert!(toml::from_str::<ConfigFile>("frequncy = 49").is_err(), "typos are refused");
        let r = retention("64MiB", "7d").unwrap();
        assert_eq!(r.max_bytes, 64 << 20);
        assert_eq!(r.max_age_ns, 7 * 86_400_000_000_000);
        assert!(retention("big", "7d").unwrap_err().to_string().contains("'big' is not a size"));
        assert!(duration("max_age", "soon").unwrap_err().to_string().contains("not a duration"));
    }
}
