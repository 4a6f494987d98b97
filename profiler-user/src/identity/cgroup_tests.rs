use super::*;

const ID: &str = "5dab0ec4aebed0b17e8b783c11b859f43da98335fd4973a396ed7bbdab6659f3";
const NODE: &str = "90b200f66e7a7c6d3ee264d905001c37b7dd9d08e2d35aa669c2a8b092fe1a64";
const UID: &str = "d8559883-9d60-478a-8cb5-cc238a63d908";
const UID_: &str = "d8559883_9d60_478a_8cb5_cc238a63d908";
const STATIC_UID: &str = "b1e89a2fcc688644de3eb95aee8025ce";

fn container(runtime: Runtime, qos: Option<QosClass>, uid: Option<&str>) -> CgroupIdentity {
    CgroupIdentity { runtime, container_id: Some(ID.into()), pod_uid: uid.map(Into::into), qos, unit: None }
}

fn pod(runtime: Runtime, qos: QosClass) -> CgroupIdentity {
    container(runtime, Some(qos), Some(UID))
}

fn unit(name: &str) -> CgroupIdentity {
    CgroupIdentity { unit: Some(name.into()), ..Default::default() }
}

/// A cgroup v1 file with every controller at `path`, as the kubelet and docker leave it.
fn v1_file(path: &str) -> String {
    ["hugetlb", "pids", "cpu,cpuacct", "blkio", "freezer", "memory", "cpuset", "perf_event", "devices", "name=systemd"]
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{}:{c}:{path}\n", 12 - i))
        .chain(["3:rdma:/\n".to_string(), "0::/\n".to_string()])
        .collect()
}

#[test]
fn cgroupfs_driver_burstable_guaranteed_besteffort() {
    let burstable = format!("/kubepods/burstable/pod{UID}/{ID}");
    assert_eq!(parse_proc_cgroup(&v1_file(&burstable)), pod(Runtime::Unknown, QosClass::Burstable));
    let guaranteed = format!("0::/kubepods/pod{UID}/{ID}\n");
    assert_eq!(parse_proc_cgroup(&guaranteed), pod(Runtime::Unknown, QosClass::Guaranteed));
    let besteffort = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
    assert_eq!(parse_proc_cgroup(&besteffort), pod(Runtime::Unknown, QosClass::BestEffort));
}

#[test]
fn cgroupfs_driver_cri_o_keeps_its_prefix() {
    let path = format!("/kubepods/burstable/pod{UID}/crio-{ID}");
    assert_eq!(parse_path(&path), pod(Runtime::CriO, QosClass::Burstable));
}

#[test]
fn systemd_driver_each_runtime() {
    let slice = format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice");
    let containerd = format!("{slice}/cri-containerd-{ID}.scope");
    assert_eq!(parse_proc_cgroup(&v1_file(&containerd)), pod(Runtime::Containerd, QosClass::BestEffort));
    let docker = format!("0::{slice}/docker-{ID}.scope\n");
    assert_eq!(parse_proc_cgroup(&docker), pod(Runtime::Docker, QosClass::BestEffort));
    // crun (CRI-O's usual runtime) on cgroup v2 moves the processes one level down.
    let crio = format!("0::{slice}/crio-{ID}.scope/container\n");
    assert_eq!(parse_proc_cgroup(&crio), pod(Runtime::CriO, QosClass::BestEffort));
}

#[test]
fn systemd_driver_guaranteed_pod_has_no_qos_slice() {
    let path = format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
    assert_eq!(parse_path(&path), pod(Runtime::Containerd, QosClass::Guaranteed));
}

#[test]
fn crio_conmon_is_the_pod_but_not_the_container() {
    let path =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{ID}.scope");
    let got = parse_path(&path);
    assert_eq!(got.container_id, None);
    assert_eq!(got.runtime, Runtime::Unknown);
    assert_eq!(got.pod_uid.as_deref(), Some(UID));
    assert_eq!(got.unit, None, "a pod's process is named by its pod, not by a scope");
    // Podman's monitor, outside Kubernetes, is a unit like any other.
    let podman = parse_path(&format!("/machine.slice/libpod-conmon-{ID}.scope"));
    assert_eq!(podman.container_id, None);
    assert_eq!(podman.unit, Some(format!("libpod-conmon-{ID}.scope")));
}

#[test]
fn containerd_without_systemd_cgroup_keeps_the_slice_triple() {
    let text = format!("11:cpuset:/kubepods-burstable-pod{UID}.slice:cri-containerd:{ID}\n");
    assert_eq!(parse_proc_cgroup(&text), pod(Runtime::Containerd, QosClass::Burstable));
    let nested = format!("1:cpuset:/what/ever/kubepods-burstable-pod{UID}.slice:cri-containerd:{ID}\n");
    assert_eq!(parse_proc_cgroup(&nested), pod(Runtime::Containerd, QosClass::Burstable));
}

#[test]
fn static_pods_have_a_32_digit_uid() {
    let cgroupfs = parse_path(&format!("/kubepods/burstable/pod{STATIC_UID}/{ID}"));
    assert_eq!(cgroupfs, container(Runtime::Unknown, Some(QosClass::Burstable), Some(STATIC_UID)));
    let systemd = parse_path(&format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/cri-containerd-{ID}.scope"
    ));
    assert_eq!(systemd, container(Runtime::Containerd, Some(QosClass::Burstable), Some(STATIC_UID)));
}

#[test]
fn docker_outside_kubernetes() {
    let cgroupfs = v1_file(&format!("/docker/{ID}"));
    assert_eq!(parse_proc_cgroup(&cgroupfs), container(Runtime::Docker, None, None));
    let systemd = format!("0::/system.slice/docker-{ID}.scope\n");
    assert_eq!(parse_proc_cgroup(&systemd), container(Runtime::Docker, None, None));
}

#[test]
fn containerd_and_podman_outside_kubernetes() {
    assert_eq!(parse_path(&format!("/default/{ID}")), container(Runtime::Containerd, None, None));
    let nerdctl = parse_path(&format!("/system.slice/nerdctl-{ID}.scope"));
    assert_eq!(nerdctl, container(Runtime::Containerd, None, None));
    let podman = parse_path(&format!("/machine.slice/libpod-{ID}.scope"));
    assert_eq!(podman, container(Runtime::Podman, None, None));
    // An id under a parent that names no runtime is still a container.
    assert_eq!(parse_path(&format!("/somewhere/{ID}")), container(Runtime::Unknown, None, None));
}

#[test]
fn nested_kubernetes_reports_the_innermost_container() {
    // kind on a cgroup v1 host: the node is a docker container, the kubelet's root is /kubelet.
    let kind_v1 = parse_path(&format!("/docker/{NODE}/kubelet/kubepods/besteffort/pod{UID}/{ID}"));
    assert_eq!(kind_v1, pod(Runtime::Unknown, QosClass::BestEffort));
    // kind with the systemd driver: systemd writes the parent slices into each name.
    let kind_v2 = parse_path(&format!(
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
    ));
    assert_eq!(kind_v2, pod(Runtime::Containerd, QosClass::Burstable));
    // minikube's docker driver (OpenTelemetry testdata/cgroupv2minikube-docker).
    let minikube = format!(
        "0::/system.slice/docker-{NODE}.scope/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{ID}.scope"
    );
    assert_eq!(parse_proc_cgroup(&minikube), pod(Runtime::Docker, QosClass::Burstable));
    // A process of the pod but in no container of it (the pod cgroup itself) is not the node's.
    let pod_level = parse_path(&format!("/docker/{NODE}/kubelet/kubepods/besteffort/pod{UID}"));
    assert_eq!(
        pod_level,
        CgroupIdentity { pod_uid: Some(UID.into()), qos: Some(QosClass::BestEffort), ..Default::default() }
    );
    // The node's own daemons are the node container's, not units of this host.
    let node_daemon = parse_path(&format!("/system.slice/docker-{NODE}.scope/system.slice/containerd.service"));
    assert_eq!(node_daemon.container_id.as_deref(), Some(NODE));
    assert_eq!(node_daemon.unit, None);
}

#[test]
fn qos_of_an_outer_pod_does_not_leak_into_an_inner_one() {
    let path = format!("/kubepods/burstable/pod{STATIC_UID}/{NODE}/kubepods/pod{UID}/{ID}");
    assert_eq!(parse_path(&path), pod(Runtime::Unknown, QosClass::Guaranteed));
}

#[test]
fn systemd_units_outside_containers() {
    assert_eq!(parse_proc_cgroup("0::/system.slice/sshd.service\n"), unit("sshd.service"));
    assert_eq!(parse_path("/user.slice/user-0.slice/session-3.scope"), unit("session-3.scope"));
    assert_eq!(parse_path("/user.slice/user-0.slice/user@0.service/init.scope"), unit("user@0.service"));
    assert_eq!(
        parse_path("/user.slice/user-1000.slice/user@1000.service/app.slice/pipewire.service"),
        unit("pipewire.service")
    );
    assert_eq!(parse_path("/init.scope"), unit("init.scope"));
    assert_eq!(parse_path("/user.slice"), CgroupIdentity::default());
    // A mount unit named after a container's directory is not the container (cAdvisor skips
    // `.mount` names for the same reason).
    let shm = format!("/system.slice/var-lib-docker-containers-{ID}-mounts-shm.mount");
    assert_eq!(parse_path(&shm), unit(&format!("var-lib-docker-containers-{ID}-mounts-shm.mount")));
}

#[test]
fn hybrid_layout_prefers_v2_unless_it_is_root() {
    let text = "12:pids:/system.slice/cron.service\n1:name=systemd:/system.slice/cron.service\n\
                0::/system.slice/ssh.service\n";
    assert_eq!(parse_proc_cgroup(text), unit("ssh.service"));
    let root_v2 = format!("2:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n");
    assert_eq!(parse_proc_cgroup(&root_v2), container(Runtime::Docker, None, None));
}

#[test]
fn a_container_in_one_controller_beats_a_session_in_name_systemd() {
    // A process moved into a container's cpu cgroup only (this is what the real-kernel test does,
    // and what a v1 host with separate cpu and cpuacct hierarchies shows).
    let text = format!(
        "9:name=systemd:/user.slice/user-0.slice/session-3.scope\n4:memory:/process_api/19c9eaf6076fde72db70f0c8373b24a1\n\
         2:cpuacct:/\n1:cpu:/kubepods/burstable/pod{UID}/{ID}\n0::/\n"
    );
    assert_eq!(parse_proc_cgroup(&text), pod(Runtime::Unknown, QosClass::Burstable));
}

#[test]
fn nothing_known_for_root_sandboxes_and_garbage() {
    assert_eq!(parse_proc_cgroup(""), CgroupIdentity::default());
    assert_eq!(parse_proc_cgroup("0::/\n"), CgroupIdentity::default());
    assert_eq!(parse_proc_cgroup("not a cgroup line\n::\n"), CgroupIdentity::default());
    // A 32-digit id that is no pod and no container (this sandbox's memory cgroup).
    let sandbox = "9:name=systemd:/\n4:memory:/process_api/19c9eaf6076fde72db70f0c8373b24a1\n1:cpu:/\n0::/\n";
    assert_eq!(parse_proc_cgroup(sandbox), CgroupIdentity::default());
}

#[test]
fn near_misses_are_not_ids() {
    let short = &ID[1..];
    assert_eq!(parse_path(&format!("/system.slice/docker-{short}.scope")), unit(&format!("docker-{short}.scope")));
    assert_eq!(parse_path(&format!("/docker/{}", ID.to_uppercase())).container_id, None);
    assert_eq!(parse_path("/system.slice/docker-.scope").container_id, None);
    assert_eq!(parse_path(&format!("/kubepods/burstable/pod{}/{ID}", &UID[1..])).pod_uid, None);
    assert_eq!(
        parse_path(&format!("/kubepods.slice/kubepods-burstable-podNOTAUUID.slice/cri-containerd-{ID}.scope")).pod_uid,
        None
    );
    // `xpod<uid>` is not a pod: the word must stand alone or end a systemd name.
    assert_eq!(parse_path(&format!("/kubepods/xpod{UID}/{ID}")).pod_uid, None);
    // Mixed separators are no UUID the kubelet writes.
    let mixed = "d8559883-9d60_478a-8cb5-cc238a63d908";
    assert_eq!(parse_path(&format!("/kubepods/pod{mixed}/{ID}")).pod_uid, None);
}

#[test]
fn a_deleted_cgroup_still_names_its_container() {
    let text = format!("0::/kubepods/burstable/pod{UID}/{ID} (deleted)\n");
    assert_eq!(parse_proc_cgroup(&text), pod(Runtime::Unknown, QosClass::Burstable));
}

#[test]
fn runtime_names() {
    assert_eq!(serde_json::to_string(&Runtime::CriO).unwrap(), "\"cri-o\"");
    assert_eq!(serde_json::from_str::<Runtime>("\"containerd\"").unwrap(), Runtime::Containerd);
    assert_eq!(Runtime::CriO.as_str(), "cri-o");
    assert_eq!(Runtime::default().as_str(), "unknown");
}

#[test]
fn log_directory_uids() {
    assert!(is_pod_uid(UID));
    assert!(is_pod_uid(STATIC_UID));
    assert!(!is_pod_uid(UID_), "/var/log/pods writes dashes");
    assert!(!is_pod_uid("not-a-uid"));
}

#[test]
fn a_pod_named_below_a_user_manager_is_the_users_service_not_a_pod() {
    // What systemd delegates to a user: they can make any directory below it.
    let forged = "/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-burstable.slice/\
                  kubepods-burstable-pod0b3c6d1e_2f4a_4b5c_8d6e_7f8091a2b3c4.slice/\
                  cri-containerd-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.scope";
    let scope = "cri-containerd-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.scope";
    assert_eq!(parse_path(forged), unit(scope));
    assert_eq!(parse_proc_cgroup(&format!("0::{forged}\n")), unit(scope));
    assert_eq!(
        parse_path(
            "/user.slice/user-1000.slice/user@1000.service/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        ),
        unit("user@1000.service")
    );
}

#[test]
fn a_cgroup_directory_a_user_owns_is_found_and_roots_are_not() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let mine = root.path().join("kubepods/podx");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::create_dir_all(root.path().join("memory/kubepods/pody")).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Owned by whoever runs the test: root here, so nothing is "others'".
    let euid = unsafe { libc::geteuid() };
    assert_eq!(owned_by_others("0::/kubepods/podx\n", root.path()), euid != 0);
    assert!(!owned_by_others("0::/not/there\n4:memory:/kubepods/nothere\n", root.path()));
    assert!(!owned_by_others("0::/\n", root.path()));
    if euid == 0 {
        std::os::unix::fs::chown(&mine, Some(65534), Some(65534)).unwrap();
        assert!(owned_by_others("0::/kubepods/podx\n", root.path()));
        std::os::unix::fs::chown(root.path().join("memory/kubepods/pody"), Some(65534), None).unwrap();
        assert!(owned_by_others("4:memory:/kubepods/pody\n", root.path()));
        assert!(!owned_by_others("4:memory:/kubepods\n", root.path()));
    }
}
