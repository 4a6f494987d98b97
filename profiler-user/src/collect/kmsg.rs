//! Follows the kernel log (/dev/kmsg) and turns lines that match configured patterns into
//! timeline events: the resets and watchdog messages an investigation starts from.

use std::{
    fs::File,
    io::Read,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
};

use serde::{Deserialize, Serialize};

/// Patterns recorded by default: ENA resets and their neighbours, and other stalls.
pub const DEFAULT_PATTERNS: &[&str] = &[
    r"ena .*[Rr]eset",
    r"TX q .* is paused for too long",
    r"NETDEV WATCHDOG",
    r"[Tt]ransmit timeout",
    r"soft lockup",
    r"rcu_.* detected stalls?",
    r"blocked for more than \d+ seconds",
    r"Out of memory: Killed process",
    // NVIDIA's driver: a GPU fault, numbered (`gpu::xid`).
    r"NVRM: Xid \(",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    /// Unix time, ns.
    pub ts_ns: u64,
    /// The pattern that matched.
    pub pattern: String,
    pub message: String,
}

/// One /dev/kmsg record: `prio,seq,usec,flags;message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    /// Microseconds since boot (CLOCK_MONOTONIC).
    pub usec: u64,
    pub message: String,
}

pub fn parse_record(raw: &str) -> Option<Record> {
    let (head, rest) = raw.split_once(';')?;
    let mut f = head.split(',');
    let _prio = f.next()?;
    let seq = f.next()?.parse().ok()?;
    let usec = f.next()?.parse().ok()?;
    // Continuation lines (" KEY=value") follow the message.
    let message = rest.lines().next().unwrap_or("").to_string();
    Some(Record { seq, usec, message })
}

pub struct Kmsg {
    file: File,
    patterns: Vec<(String, regex::Regex)>,
    buf: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    #[error("cannot open /dev/kmsg: {0}")]
    Open(#[source] std::io::Error),
    #[error("event pattern '{0}' is not a valid regular expression: {1}")]
    Pattern(String, String),
}

impl Kmsg {
    /// Opens /dev/kmsg positioned at its end: only lines logged from now on count.
    pub fn open(patterns: &[String]) -> Result<Self, KmsgError> {
        let patterns = patterns
            .iter()
            .map(|p| {
                regex::Regex::new(p).map(|r| (p.clone(), r)).map_err(|e| KmsgError::Pattern(p.clone(), e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map_err(KmsgError::Open)?;
        // SAFETY: a valid fd; SEEK_END on /dev/kmsg moves to the next new record.
        unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
        Ok(Self { file, patterns, buf: vec![0; 8192] })
    }

    pub fn validate(patterns: &[String]) -> Result<(), KmsgError> {
        for p in patterns {
            regex::Regex::new(p).map_err(|e| KmsgError::Pattern(p.clone(), e.to_string()))?;
        }
        Ok(())
    }

    /// Reads every record available now; returns those that match, as (record, pattern).
    pub fn read_matches(&mut self) -> Vec<(Record, String)> {
        let mut out = Vec::new();
        loop {
            match self.file.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&self.buf[..n]);
                    if let Some(r) = parse_record(&text)
                        && let Some((p, _)) = self.patterns.iter().find(|(_, re)| re.is_match(&r.message))
                    {
                        out.push((r, p.clone()));
                    }
                }
                // EPIPE: records were overwritten before we read them; carry on from the next.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        out
    }
}

impl AsRawFd for Kmsg {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records_and_matches_defaults() {
        let r = parse_record(
            "3,1234,5140900,-;ena 0000:00:06.0 eth0: Device reset completed successfully\n SUBSYSTEM=pci\n",
        )
        .unwrap();
        assert_eq!((r.seq, r.usec), (1234, 5140900));
        assert_eq!(r.message, "ena 0000:00:06.0 eth0: Device reset completed successfully");
        let re: Vec<regex::Regex> = DEFAULT_PATTERNS.iter().map(|p| regex::Regex::new(p).unwrap()).collect();
        assert!(re.iter().any(|p| p.is_match(&r.message)));
        for line in [
            "NETDEV WATCHDOG: eth0 (ena): transmit queue 3 timed out",
            "ena 0000:00:05.0 eth0: TX q 2 is paused for too long (threshold 5000000). Time since last napi 6532000 usec. napi scheduled: 1",
        ] {
            assert!(re.iter().any(|r| r.is_match(line)), "{line}");
        }
        assert!(!re.iter().any(|r| r.is_match("EXT4-fs (vda): mounted filesystem")));
        assert!(parse_record("garbage").is_none());
        assert!(Kmsg::validate(&["(unclosed".to_string()]).is_err());
    }
}
