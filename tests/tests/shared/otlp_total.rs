//! Shared by the test files that read what an OTLP receiver got (`#[path]`).

/// The sum of the values of `pid`'s samples in the profiles of type `sample_type` that
/// `bodies` (requests the receiver accepted) carry.
pub fn total(bodies: &[Vec<u8>], sample_type: &str, pid: i64) -> i64 {
    use profiler::export::otlp::proto::{ExportProfilesServiceRequest, Value};
    use prost::Message;
    let mut total = 0;
    for body in bodies {
        let req = ExportProfilesServiceRequest::decode(&body[..]).expect("a request our definitions read");
        let d = req.dictionary.as_ref().unwrap();
        for p in &req.resource_profiles[0].scope_profiles[0].profiles {
            let t = p.sample_type.as_ref().unwrap();
            if d.string_table[t.type_strindex as usize] != sample_type {
                continue;
            }
            for s in &p.samples {
                let of_pid = s.attribute_indices.iter().any(|&i| {
                    let a = &d.attribute_table[i as usize];
                    d.string_table[a.key_strindex as usize] == "process.pid"
                        && a.value.as_ref().and_then(|v| v.value.as_ref()) == Some(&Value::Int(pid))
                });
                if of_pid {
                    total += s.values.iter().sum::<i64>();
                }
            }
        }
    }
    total
}
