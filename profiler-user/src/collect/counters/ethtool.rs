//! NIC driver counters, as `ethtool -S` shows them, through the `SIOCETHTOOL` ioctl: the driver's
//! own figures, which `/sys/class/net/*/statistics` lacks (ENA's `tx_timeout`, `wd_expired`,
//! `reset_fail`, `bw_in_allowance_exceeded`, ...; virtio-net's `rx_drops`, `tx_timeouts`).
//! Only device-wide counters are kept: names without a digit (per-queue ones, `queue_3_tx_cnt`,
//! `rx_queue_0_packets`, would be hundreds of tracks on a big NIC).

use std::{collections::HashMap, os::fd::AsRawFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETH_SS_STATS: u32 = 1;
const ETH_GSTRING_LEN: usize = 32;
/// More statistics than any driver has; a bigger count is a driver bug, not read.
const MAX_STATS: usize = 10_000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// A socket for the ioctls, and per interface the names of its statistics (read once).
pub struct Ethtool {
    sock: std::os::fd::OwnedFd,
    names: HashMap<String, Vec<String>>,
}

impl Ethtool {
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: plain socket creation; the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        Ok(Self { sock: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }, names: HashMap::new() })
    }

    /// `cmd` (a buffer starting with its u32 command) through SIOCETHTOOL on `ifname`.
    fn ioctl(&self, ifname: &str, cmd: *mut libc::c_void) -> std::io::Result<()> {
        let bytes = ifname.as_bytes();
        if bytes.len() >= libc::IFNAMSIZ {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], data: cmd, _pad: [0; 16] };
        req.name[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: `req` names the interface and points at a command buffer sized for its reply.
        let r = unsafe { libc::ioctl(self.sock.as_raw_fd(), SIOCETHTOOL as _, &mut req) };
        if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
    }

    fn stat_names(&self, ifname: &str) -> std::io::Result<Vec<String>> {
        // SAFETY: all-zero is a valid DrvInfo.
        let mut info: DrvInfo = unsafe { std::mem::zeroed() };
        info.cmd = ETHTOOL_GDRVINFO;
        self.ioctl(ifname, (&raw mut info).cast())?;
        let n = info.n_stats as usize;
        if n == 0 || n > MAX_STATS {
            return Ok(Vec::new());
        }
        // ethtool_gstrings: cmd, string_set, len, then len × 32 bytes.
        let mut buf = vec![0u8; 12 + n * ETH_GSTRING_LEN];
        buf[0..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
        buf[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
        buf[8..12].copy_from_slice(&(n as u32).to_ne_bytes());
        self.ioctl(ifname, buf.as_mut_ptr().cast())?;
        let len = (u32::from_ne_bytes(buf[8..12].try_into().unwrap_or_default()) as usize).min(n);
        Ok(names_of(&buf[12..12 + len * ETH_GSTRING_LEN]))
    }

    /// The device-wide statistics of `ifname` as (name, value); empty when the driver has none.
    pub fn stats(&mut self, ifname: &str) -> Vec<(String, u64)> {
        if !self.names.contains_key(ifname) {
            let names = self.stat_names(ifname).unwrap_or_default();
            self.names.insert(ifname.to_string(), names);
        }
        let names = &self.names[ifname];
        if names.is_empty() {
            return Vec::new();
        }
        let n = names.len();
        // ethtool_stats: cmd, n_stats, then n u64 (u64-aligned: the header is 8 bytes).
        let mut buf = vec![0u64; 1 + n];
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
        head[4..].copy_from_slice(&(n as u32).to_ne_bytes());
        buf[0] = u64::from_ne_bytes(head);
        if self.ioctl(ifname, buf.as_mut_ptr().cast()).is_err() {
            // The interface went away or changed: names are read again next time.
            self.names.remove(ifname);
            return Vec::new();
        }
        let head = buf[0].to_ne_bytes();
        let got = u32::from_ne_bytes([head[4], head[5], head[6], head[7]]) as usize;
        if got != n {
            self.names.remove(ifname);
            return Vec::new();
        }
        names.iter().zip(&buf[1..]).filter(|(name, _)| device_wide(name)).map(|(name, v)| (name.clone(), *v)).collect()
    }
}

/// Stat names out of 32-byte NUL-padded slots, spaces made `_`. A name given twice (a driver
/// that repeats per-queue names) becomes empty, so it is never kept: one track, one counter.
fn names_of(slots: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = slots
        .chunks_exact(ETH_GSTRING_LEN)
        .map(|s| {
            let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).trim().replace(|c: char| c.is_whitespace() || c.is_control(), "_")
        })
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for n in &names {
        *seen.entry(n.clone()).or_default() += 1;
    }
    for n in &mut names {
        if seen[n.as_str()] > 1 {
            n.clear();
        }
    }
    names
}

/// A device-wide counter's name has no digit (`tx_timeout`, not `queue_3_tx_cnt`).
pub fn device_wide(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_which_are_kept() {
        let mut slots = vec![0u8; 5 * ETH_GSTRING_LEN];
        slots[..10].copy_from_slice(b"tx_timeout");
        slots[32..46].copy_from_slice(b"queue_0_tx_cnt");
        slots[64..72].copy_from_slice(b"rx drops");
        slots[96..101].copy_from_slice(b"bytes");
        slots[128..133].copy_from_slice(b"bytes");
        let names = names_of(&slots);
        assert_eq!(names, vec!["tx_timeout", "queue_0_tx_cnt", "rx_drops", "", ""]);
        let kept: Vec<&String> = names.iter().filter(|n| device_wide(n)).collect();
        assert_eq!(kept, vec!["tx_timeout", "rx_drops"]);
    }

    /// The real ioctl on this machine's interfaces: no error for a device without statistics
    /// (`lo`), an unknown one, or a name too long.
    #[test]
    fn the_real_ioctl_never_fails_loudly() {
        let mut e = Ethtool::new().unwrap();
        assert!(e.stats("no-such-if0").is_empty());
        assert!(e.stats("a-name-longer-than-ifnamsiz").is_empty());
        let _ = e.stats("lo");
        for dir in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
            let name = dir.file_name().to_string_lossy().into_owned();
            for (stat, _) in e.stats(&name) {
                assert!(device_wide(&stat), "{name}: {stat}");
            }
        }
    }
}
