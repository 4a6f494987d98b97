//! Network namespaces for the tests that need real NET_RX work (detect S3, irq_context).

use std::process::Command;

/// Two network namespaces joined by a veth pair, deleted on drop (the veth goes with them).
pub struct NetLab {
    pub a: String,
    pub b: String,
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Runs `ip ARGS`, which must succeed.
pub fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip");
    assert!(st.success(), "ip {}", args.join(" "));
}
