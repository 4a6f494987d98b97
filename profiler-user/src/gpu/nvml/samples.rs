//! NVML's own utilisation samples (`nvmlDeviceGetSamples`): the driver measures GPU and memory
//! utilisation itself, every 1/6 s on most GPUs (some every 1/5 s), and keeps the last ~100
//! samples, each stamped in µs. Read once a second, they give the poller the sub-second track
//! that ten wake-ups a second gave before, for one wake-up (`cargo xtask bench nvml`): each
//! sample at its own time, every sample counted once.
//!
//! What NVML does, and what is done here about it (nvml.h; NVIDIA's bindings; tools that read
//! the samples: DCGM, nvtop, polarsignals' gpu-metrics-agent):
//! - `lastSeenTimeStamp` 0 returns the whole buffer (up to ~16 s before the daemon started):
//!   samples older than the poller's start are dropped; later calls pass the newest seen, and
//!   NVML returns only newer ones;
//! - no sample newer than that is `NVML_ERROR_NOT_FOUND`, or an empty answer: the buffer runs dry
//!   while a GPU idles. Not an error: the caller takes one `nvmlDeviceGetUtilizationRates` then;
//! - the array is filled oldest first with as many as it holds: one call with room for
//!   [`CAPACITY`], again while it comes back full (bounded by [`MAX_CALLS`]); a driver answering
//!   `NVML_ERROR_INSUFFICIENT_SIZE` instead gets the room its count asks for;
//! - the value type is NVML's to say (unsigned int for utilisation, as documented; every type of
//!   the union is read); a value outside 0-100 % is dropped (seen on drivers with stale
//!   processes);
//! - the stamp is "CPU time in µs", which drivers take from different clocks: the Unix epoch
//!   (most), or the time since boot (`CLOCK_BOOTTIME`, seen by polarsignals on a Grace machine).
//!   [`Clock::of`] tells them apart by size on a GPU's first samples; a stamp on neither is
//!   anchored once (its newest sample taken as the time of the read), so the spacing between
//!   samples stays NVML's.
//!
//! A driver or GPU without them (`NotSupported`, the symbol missing) is the caller's to handle
//! (`library::Source` falls back to polling, said once).

use nvml_wrapper::{
    Device, Nvml,
    error::{NvmlError, nvml_sym, nvml_try},
};

/// Samples asked for per call (the driver keeps about 100).
pub const CAPACITY: usize = 128;
/// Calls per GPU and kind in one read at most (a buffer refilled faster than read).
pub const MAX_CALLS: usize = 8;
/// Samples room is made for at most, for a driver that refuses a smaller array.
const MAX_ROOM: usize = 4096;
/// Stamps below this many µs are not on the Unix epoch (it is 2001-09-09): time since boot.
const EPOCH_US_FLOOR: u64 = 1_000_000_000_000_000;

/// Which buffer: `nvmlSamplingType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gpu = 1,
    Memory = 2,
}

/// The clock a GPU's stamps are on, as found on its first samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    Unix,
    /// `CLOCK_BOOTTIME`, converted with the offset measured at each read.
    Boot,
    /// Neither: unix ns = µs * 1000 + this (fixed at the first samples).
    Anchored(i128),
}

impl Clock {
    /// The clock of a GPU whose newest sample is `newest_us`, read at `unix_ns` (when the boot
    /// clock said `boot_ns`).
    pub fn of(newest_us: u64, unix_ns: u64, boot_ns: u64) -> Self {
        let ns = i128::from(newest_us) * 1000;
        // A sample is in the past, within the driver's buffer (100 samples, about 17 s): a
        // minute's slack either way for clocks read a little apart.
        let near = |now: u64| (i128::from(now) - 60_000_000_000..=i128::from(now) + 60_000_000_000).contains(&ns);
        if newest_us >= EPOCH_US_FLOOR && near(unix_ns) {
            Clock::Unix
        } else if newest_us < EPOCH_US_FLOOR && near(boot_ns) {
            Clock::Boot
        } else {
            Clock::Anchored(i128::from(unix_ns) - ns)
        }
    }

    /// A stamp in unix ns.
    pub fn unix_ns(self, us: u64, unix_ns: u64, boot_ns: u64) -> u64 {
        let ns = i128::from(us) * 1000;
        let t = match self {
            Clock::Unix => ns,
            Clock::Boot => ns + i128::from(unix_ns) - i128::from(boot_ns),
            Clock::Anchored(offset) => ns + offset,
        };
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Clock::Unix => "the Unix epoch",
            Clock::Boot => "the time since boot",
            Clock::Anchored(_) => "an unknown clock (anchored at the first read)",
        }
    }
}

/// `nvmlSample_t`: a stamp and an 8-byte union, read by the type NVML gives.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawSample {
    ts_us: u64,
    value: u64,
}

/// The union's value as a number, by `nvmlValueType_t` (the union's bytes, little-endian as on
/// every machine the daemon builds for: the narrow types are the low bytes).
fn value(kind: u32, bits: u64) -> Option<f64> {
    Some(match kind {
        0 => f64::from_bits(bits),
        1 => f64::from(bits as u32),
        2 | 3 => bits as f64,
        4 => bits as i64 as f64,
        5 => f64::from(bits as u32 as i32),
        6 => f64::from(bits as u16),
        _ => return None,
    })
}

/// Per GPU and kind: the newest stamp seen (NVML's µs), and the GPU's clock once known.
#[derive(Debug, Default)]
struct Seen {
    last_us: [u64; 2],
    clock: Option<Clock>,
}

pub struct Sampler {
    gpus: Vec<Seen>,
    /// Samples before this (unix ns: the poller's start) are not the daemon's.
    since_ns: u64,
}

/// One GPU's samples from one read, (unix ns, %) oldest first: utilisation, and memory's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampled {
    pub index: u32,
    pub util: Vec<(u64, f64)>,
    pub mem: Vec<(u64, f64)>,
}

/// One read of a buffer: (unix ns, value) oldest first, and the clock found on a GPU's first
/// samples (to be said once).
pub struct Read {
    pub samples: Vec<(u64, f64)>,
    pub found_clock: Option<Clock>,
}

impl Sampler {
    pub fn new(gpus: u32, since_ns: u64) -> Self {
        Self { gpus: (0..gpus).map(|_| Seen::default()).collect(), since_ns }
    }

    /// The samples of GPU `index`'s `kind` buffer since the last read, at most `now_ns`.
    /// `NotFound` (nothing new) is an empty read; other errors are the caller's.
    pub fn read(&mut self, nvml: &Nvml, d: &Device<'_>, index: u32, kind: Kind) -> Result<Read, NvmlError> {
        let sym = nvml_sym(nvml.lib().nvmlDeviceGetSamples.as_ref())?;
        let seen = self.gpus.get_mut(index as usize).ok_or(NvmlError::InvalidArg)?;
        let slot = kind as usize - 1;
        let mut raw: Vec<(u64, f64)> = Vec::new();
        let mut buf = vec![RawSample::default(); CAPACITY];
        for _ in 0..MAX_CALLS {
            let (mut value_type, mut count) = (0u32, buf.len() as u32);
            // SAFETY: NVML's own function, with a live handle, out-parameters that outlive the
            // call and an array of `count` samples laid out as `nvmlSample_t` (a u64 stamp, an
            // 8-byte union).
            let code = unsafe {
                sym(d.handle(), kind as u32, seen.last_us[slot], &mut value_type, &mut count, buf.as_mut_ptr().cast())
            };
            match nvml_try(code) {
                Ok(()) => {}
                Err(NvmlError::NotFound) => break,
                // A driver that wants room for all it has rather than filling what fits: `count`
                // says how much (bounded), and the call is made again.
                Err(NvmlError::InsufficientSize(_)) if (count as usize) > buf.len() && buf.len() < MAX_ROOM => {
                    buf.resize((count as usize).min(MAX_ROOM), RawSample::default());
                    continue;
                }
                Err(e) => return Err(e),
            }
            let got = (count as usize).min(buf.len());
            for s in &buf[..got] {
                // Not newer than asked (a driver that repeats the last one): already counted.
                if s.ts_us <= seen.last_us[slot] {
                    continue;
                }
                if let Some(v) = value(value_type, s.value).filter(|v| (0.0..=100.0).contains(v)) {
                    raw.push((s.ts_us, v));
                }
            }
            let newest = buf[..got].iter().map(|s| s.ts_us).max().unwrap_or(0);
            seen.last_us[slot] = seen.last_us[slot].max(newest);
            if got < buf.len() {
                break;
            }
        }
        let (unix_ns, boot_ns) = (crate::timespec::now_ns(), boot_ns());
        let mut found_clock = None;
        if seen.clock.is_none()
            && let Some(newest) = raw.iter().map(|s| s.0).max()
        {
            let c = Clock::of(newest, unix_ns, boot_ns);
            seen.clock = Some(c);
            found_clock = Some(c);
        }
        let clock = seen.clock.unwrap_or(Clock::Unix);
        let mut samples: Vec<(u64, f64)> = raw
            .into_iter()
            .map(|(us, v)| (clock.unix_ns(us, unix_ns, boot_ns).min(unix_ns), v))
            .filter(|s| s.0 >= self.since_ns)
            .collect();
        samples.sort_by_key(|s| s.0);
        Ok(Read { samples, found_clock })
    }
}

/// `CLOCK_BOOTTIME` in ns.
fn boot_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a timespec that outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The spacing of NVML's samples, ms (the median gap; `None` under three samples): what
/// `profiler status` says of a driver's sampling.
pub fn period_ms(samples: &[(u64, f64)]) -> Option<u64> {
    let mut gaps: Vec<u64> = samples.windows(2).map(|w| w[1].0.saturating_sub(w[0].0)).collect();
    if gaps.len() < 2 {
        return None;
    }
    gaps.sort_unstable();
    Some((gaps[gaps.len() / 2] + 500_000) / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_NS: u64 = 1_795_000_000_123_000_000;
    const BOOT_NS: u64 = 5_000_000_000_000; // 83 min up

    #[test]
    fn stamps_on_the_epoch_or_since_boot_land_at_their_wall_clock_time() {
        // A sample 100 ms ago on either clock.
        let unix_us = NOW_NS / 1000 - 100_000;
        let boot_us = BOOT_NS / 1000 - 100_000;
        assert_eq!(Clock::of(unix_us, NOW_NS, BOOT_NS), Clock::Unix);
        assert_eq!(Clock::of(boot_us, NOW_NS, BOOT_NS), Clock::Boot);
        assert_eq!(Clock::Unix.unix_ns(unix_us, NOW_NS, BOOT_NS), NOW_NS - 100_000_000);
        assert_eq!(Clock::Boot.unix_ns(boot_us, NOW_NS, BOOT_NS), NOW_NS - 100_000_000);
        // A buffer's oldest, 16 s back, is still on the clock.
        assert_eq!(Clock::of(unix_us - 16_000_000, NOW_NS, BOOT_NS), Clock::Unix);
    }

    #[test]
    fn a_stamp_on_neither_clock_keeps_nvmls_spacing_from_the_first_read() {
        // Some other counter: 3 s of µs since an unknown origin.
        let c = Clock::of(3_000_000, NOW_NS, BOOT_NS);
        assert!(matches!(c, Clock::Anchored(_)), "{c:?}");
        assert_eq!(c.unix_ns(3_000_000, NOW_NS, BOOT_NS), NOW_NS);
        assert_eq!(c.unix_ns(2_833_333, NOW_NS + 1, BOOT_NS), NOW_NS - 166_667_000);
        // An epoch stamp a day off is not taken at its word either.
        let day_us = 86_400_000_000;
        assert!(matches!(Clock::of(NOW_NS / 1000 - day_us, NOW_NS, BOOT_NS), Clock::Anchored(_)));
    }

    #[test]
    fn every_value_type_of_the_union_reads_as_its_number() {
        assert_eq!(value(1, 37), Some(37.0));
        // Only the low bytes are the narrow types' (the union's other bytes are left as is).
        assert_eq!(value(1, 0xdead_beef_0000_0025), Some(37.0));
        assert_eq!(value(0, 37.5f64.to_bits()), Some(37.5));
        assert_eq!(value(3, 90), Some(90.0));
        assert_eq!(value(4, (-1i64) as u64), Some(-1.0));
        assert_eq!(value(5, 0xffff_ffff), Some(-1.0));
        assert_eq!(value(6, 0x1_0063), Some(99.0));
        assert_eq!(value(7, 1), None, "a type NVML adds later is no number");
    }

    #[test]
    fn the_drivers_period_is_the_median_gap() {
        let at = |ms: &[u64]| ms.iter().map(|&m| (m * 1_000_000, 0.0)).collect::<Vec<_>>();
        assert_eq!(period_ms(&at(&[0, 167, 333, 500, 667])), Some(167));
        assert_eq!(period_ms(&at(&[0, 200, 400, 1400])), Some(200));
        assert_eq!(period_ms(&at(&[0, 200])), None);
    }
}
