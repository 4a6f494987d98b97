//! The service files: the systemd unit passes `systemd-analyze verify`, the Kubernetes
//! DaemonSet passes a schema validator (kubernetes-validate, strict) and asks for exactly the
//! capabilities the daemon documents.

use std::{path::Path, process::Command};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--help").output().is_ok()
        || integration_tests::skip(&format!("{tool} is not installed (cargo xtask test installs it)"))
}

#[test]
fn systemd_unit_verifies() {
    if !have("systemd-analyze") {
        return;
    }
    let unit = std::fs::read_to_string(repo().join("deploy/systemd/profiler.service")).unwrap();
    assert!(unit.contains("Type=notify") && unit.contains("ProtectSystem=strict") && unit.contains("PrivateTmp=yes"));
    assert!(unit.contains("CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_SYSLOG"));
    assert!(unit.contains("ReadWritePaths=/var/lib/profiler") && unit.contains("Restart=on-failure"));
    // verify checks that ExecStart exists: point it at the binary under test.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("profiler.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/profiler", integration_tests::profiler_bin().to_str().unwrap()))
        .unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.lines().any(|l| l.contains("profiler.service")), "{err}");
}

#[test]
fn daemonset_validates_against_the_kubernetes_schema() {
    if !have("kubernetes-validate") {
        return;
    }
    let path = repo().join("deploy/kubernetes/daemonset.yaml");
    let out = Command::new("kubernetes-validate").arg("--strict").arg(&path).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("passed"), "{text}");
    let yaml = std::fs::read_to_string(&path).unwrap();
    for field in [
        "hostPID: true",
        "add: [\"BPF\", \"PERFMON\", \"SYS_PTRACE\", \"DAC_READ_SEARCH\", \"SYSLOG\"]",
        "hostPath:",
        "nvidia.com/gpu",
        "limits:",
        "requests:",
    ] {
        assert!(yaml.contains(field), "the DaemonSet lacks {field}");
    }
}

#[test]
fn the_daemon_tells_systemd_it_is_ready() {
    if !integration_tests::privileged("the_daemon_tells_systemd_it_is_ready") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let sock_path = tmp.path().join("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut child = Command::new(integration_tests::profiler_bin())
        .args(["run", "--listen", "off", "--data-dir"])
        .arg(tmp.path().join("data"))
        .env("NOTIFY_SOCKET", &sock_path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 64];
    let n = sock.recv(&mut buf);
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let st = child.wait().unwrap();
    let n = n.expect("READY=1 within 30 s");
    assert_eq!(&buf[..n], b"READY=1");
    let n = sock.recv(&mut buf).expect("STOPPING=1 on SIGTERM");
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert!(st.success());
}

/// `promtool` is Debian's `prometheus` package (cargo xtask test installs it).
fn promtool(args: &[&str]) -> Option<String> {
    let dir = repo().join("deploy/prometheus");
    let out = match Command::new("promtool").args(args).current_dir(&dir).output() {
        Ok(out) => out,
        Err(_) => {
            integration_tests::skip(
                "promtool is not installed (Debian package prometheus; cargo xtask test installs it)",
            );
            return None;
        }
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {}: {text}", args.join(" "));
    Some(text)
}

#[test]
fn alerting_rules_pass_promtool_and_cover_every_finding_kind() {
    let Some(text) = promtool(&["check", "rules", "profiler-rules.yml"]) else { return };
    assert!(text.contains("SUCCESS"), "{text}");
    let rules = std::fs::read_to_string(repo().join("deploy/prometheus/profiler-rules.yml")).unwrap();
    for kind in profiler::detect::Kind::ALL {
        let selector = format!("profiler_finding{{kind=\"{}\"}}", kind.name());
        assert!(rules.contains(&selector), "no alert on {selector}");
    }
    // Every metric an alert reads is one the daemon exports (a renamed metric would leave its
    // alert silent forever).
    let exported = profiler::serve::metrics::render(&Default::default());
    for metric in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("profiler_"))
    {
        let shipper = metric.starts_with("profiler_otlp_") || metric.starts_with("profiler_clickhouse_");
        assert!(shipper || exported.contains(&format!("# TYPE {metric} ")), "{metric} is not exported");
    }
}

#[test]
fn alerting_rules_fire_as_their_unit_tests_expect() {
    let Some(text) = promtool(&["test", "rules", "profiler-rules.test.yml"]) else { return };
    assert!(text.contains("SUCCESS"), "{text}");
}
