//! Network helpers for the NET_RX starvation scenario.
//!
//! usage:
//!   netrx-lab features IFACE GRO(0|1) TSO(0|1)   set GRO and TSO on an interface (ethtool ioctls)
//!   netrx-lab blast ADDR:PORT SECONDS            send small UDP datagrams as fast as possible
//!   netrx-lab pace ADDR:PORT SECONDS PER_SECOND  send them at a steady rate (bursts every ms)

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETHTOOL_STSO: u32 = 0x1f;

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

fn set(iface: &str, cmd: u32, value: u32) -> std::io::Result<()> {
    let mut v = EthtoolValue { cmd, data: value };
    let mut req = IfReq { name: [0; 16], data: &mut v, _pad: [0; 16] };
    req.name[..iface.len().min(15)].copy_from_slice(&iface.as_bytes()[..iface.len().min(15)]);
    // SAFETY: a plain datagram socket used only for the ioctl.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: req and v outlive the call; SIOCETHTOOL reads ifr_name and ifr_data.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL, &mut req) };
    let err = std::io::Error::last_os_error();
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    if rc < 0 { Err(err) } else { Ok(()) }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("features") if args.len() == 5 => {
            let (iface, gro, tso) = (&args[2], args[3].parse().expect("0|1"), args[4].parse().expect("0|1"));
            set(iface, ETHTOOL_SGRO, gro).unwrap_or_else(|e| panic!("GRO on {iface}: {e}"));
            set(iface, ETHTOOL_STSO, tso).unwrap_or_else(|e| panic!("TSO on {iface}: {e}"));
        }
        Some("blast") if args.len() == 4 => {
            let secs: f64 = args[3].parse().expect("seconds");
            let sock = UdpSocket::bind("0.0.0.0:0").expect("bind");
            let end = Instant::now() + Duration::from_secs_f64(secs);
            let msg = [0x42u8; 64];
            let mut n = 0u64;
            while Instant::now() < end {
                for _ in 0..256 {
                    let _ = sock.send_to(&msg, &args[2]);
                }
                n += 256;
            }
            println!("{n}");
        }
        Some("pace") if args.len() == 5 => {
            let secs: f64 = args[3].parse().expect("seconds");
            let per_ms = (args[4].parse::<u64>().expect("datagrams per second") / 1000).max(1);
            let sock = UdpSocket::bind("0.0.0.0:0").expect("bind");
            let start = Instant::now();
            let msg = [0x42u8; 64];
            let mut tick = 0u64;
            while start.elapsed().as_secs_f64() < secs {
                for _ in 0..per_ms {
                    let _ = sock.send_to(&msg, &args[2]);
                }
                tick += 1;
                // The next burst on the next millisecond: a steady load, not as fast as possible.
                if let Some(wait) = Duration::from_millis(tick).checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            println!("{}", tick * per_ms);
        }
        _ => {
            eprintln!(
                "usage: netrx-lab features IFACE GRO TSO | netrx-lab blast ADDR:PORT SECONDS | netrx-lab pace ADDR:PORT SECONDS PER_SECOND"
            );
            std::process::exit(2);
        }
    }
}
