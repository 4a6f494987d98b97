use super::*;

const ID: &str = "5dab0ec4aebed0b17e8b783c11b859f43da98335fd4973a396ed7bbdab6659f3";
const UID: &str = "d8559883-9d60-478a-8cb5-cc238a63d908";

fn nginx() -> Identity {
    Identity {
        container_id: Some(ID.into()),
        runtime: Runtime::Containerd,
        pod_uid: Some(UID.into()),
        pod_namespace: Some("shop".into()),
        pod_name: Some("web-7d4b9c-x2x7k".into()),
        container_name: Some("nginx".into()),
        unit: None,
    }
}

fn sshd() -> Identity {
    Identity { unit: Some("sshd.service".into()), ..Default::default() }
}

fn filter(pod: Option<&str>, namespace: Option<&str>, container: Option<&str>, unit: Option<&str>) -> Filter {
    let own = |s: Option<&str>| s.map(String::from);
    Filter { pod: own(pod), namespace: own(namespace), container: own(container), unit: own(unit) }
}

#[test]
fn an_empty_filter_matches_everything() {
    assert!(nginx().matches(&Filter::default()));
    assert!(Identity::default().matches(&Filter::default()));
}

#[test]
fn pods_by_name_namespaced_name_or_uid() {
    assert!(nginx().matches(&filter(Some("web-7d4b9c-x2x7k"), None, None, None)));
    assert!(nginx().matches(&filter(Some("shop/web-7d4b9c-x2x7k"), None, None, None)));
    assert!(nginx().matches(&filter(Some(UID), None, None, None)));
    assert!(!nginx().matches(&filter(Some("default/web-7d4b9c-x2x7k"), None, None, None)));
    assert!(!nginx().matches(&filter(Some("web"), None, None, None)), "exact, not a prefix");
    assert!(!sshd().matches(&filter(Some("web-7d4b9c-x2x7k"), None, None, None)));
}

#[test]
fn every_given_field_must_match() {
    assert!(nginx().matches(&filter(None, Some("shop"), Some("nginx"), None)));
    assert!(!nginx().matches(&filter(None, Some("shop"), Some("php"), None)));
    assert!(!nginx().matches(&filter(None, Some("kube-system"), Some("nginx"), None)));
    assert!(!nginx().matches(&filter(None, None, None, Some("sshd"))));
}

#[test]
fn containers_by_name_or_id() {
    assert!(nginx().matches(&filter(None, None, Some("nginx"), None)));
    assert!(nginx().matches(&filter(None, None, Some(ID), None)));
    assert!(nginx().matches(&filter(None, None, Some(&ID[..12]), None)), "docker ps's short id");
    assert!(nginx().matches(&filter(None, None, Some(&ID[..13]), None)), "crictl ps's short id");
    assert!(!nginx().matches(&filter(None, None, Some(&ID[..6]), None)), "too short to be an id");
    assert!(!nginx().matches(&filter(None, None, Some("ngin"), None)));
}

#[test]
fn units_as_systemctl_takes_them() {
    assert!(sshd().matches(&filter(None, None, None, Some("sshd.service"))));
    assert!(sshd().matches(&filter(None, None, None, Some("sshd"))));
    let session = Identity { unit: Some("session-3.scope".into()), ..Default::default() };
    assert!(session.matches(&filter(None, None, None, Some("session-3.scope"))));
    assert!(!session.matches(&filter(None, None, None, Some("session-3"))), "a bare name means .service");
    assert!(!Identity::default().matches(&filter(None, None, None, Some("sshd"))));
}

#[test]
fn identities_round_trip_through_json_and_postcard() {
    let json = serde_json::to_string(&nginx()).unwrap();
    let back: Identity = serde_json::from_str(&json).unwrap();
    assert_eq!(back, nginx());
    let bytes = postcard::to_allocvec(&sshd()).unwrap();
    assert_eq!(postcard::from_bytes::<Identity>(&bytes).unwrap(), sshd());
}
