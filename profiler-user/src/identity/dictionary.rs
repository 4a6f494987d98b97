//! Small ids for identities, so a sample stores a u32 and the strings are stored once.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize, Serializer};

use super::{Identity, IdentityError};

/// Gives each distinct [`Identity`] an id: 1, 2, 3... in first-seen order; 0 is the empty
/// identity (a host process nothing is known of). Serialised as the list of identities from
/// id 1 on, so ids survive a round trip.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(try_from = "Vec<Identity>")]
pub struct Dictionary {
    /// `entries[i]` has id `i + 1`.
    entries: Vec<Identity>,
    ids: FxHashMap<Identity, u32>,
}

impl Dictionary {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `identity`, adding it if new.
    pub fn intern(&mut self, identity: Identity) -> u32 {
        if identity == Identity::default() {
            return 0;
        }
        if let Some(&id) = self.ids.get(&identity) {
            return id;
        }
        let id = u32::try_from(self.entries.len() + 1).expect("fewer than 2^32 distinct identities");
        self.entries.push(identity.clone());
        self.ids.insert(identity, id);
        id
    }

    /// The identity with `id`; `None` for 0 (nothing known) and for ids never given.
    pub fn get(&self, id: u32) -> Option<&Identity> {
        self.entries.get((id as usize).checked_sub(1)?)
    }

    /// Every (id, identity), in id order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Identity)> {
        (1..).zip(&self.entries)
    }

    /// Distinct identities, not counting id 0.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Serialize for Dictionary {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.entries.serialize(serializer)
    }
}

impl TryFrom<Vec<Identity>> for Dictionary {
    type Error = IdentityError;

    /// Refuses what `intern` could never have written: an empty entry, or one twice (a sample's
    /// id would then disagree with what `intern` gives the same identity).
    fn try_from(entries: Vec<Identity>) -> Result<Self, IdentityError> {
        let mut ids = FxHashMap::default();
        for (id, identity) in (1..).zip(&entries) {
            if *identity == Identity::default() {
                return Err(IdentityError::EmptyEntry { id });
            }
            if let Some(first) = ids.insert(identity.clone(), id) {
                return Err(IdentityError::DuplicateEntry { id, first });
            }
        }
        Ok(Dictionary { entries, ids })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::identity::Runtime;

    fn pod(name: &str) -> Identity {
        Identity {
            container_id: Some(Arc::from("5dab0ec4aebed0b17e8b783c11b859f43da98335fd4973a396ed7bbdab6659f3")),
            runtime: Runtime::Containerd,
            pod_name: Some(name.into()),
            pod_namespace: Some("shop".into()),
            ..Default::default()
        }
    }

    fn unit(name: &str) -> Identity {
        Identity { unit: Some(name.into()), ..Default::default() }
    }

    #[test]
    fn interns_in_first_seen_order_and_zero_is_nothing() {
        let mut dict = Dictionary::new();
        assert_eq!(dict.intern(Identity::default()), 0);
        assert_eq!(dict.intern(pod("web-1")), 1);
        assert_eq!(dict.intern(unit("sshd.service")), 2);
        assert_eq!(dict.intern(pod("web-1")), 1);
        assert_eq!(dict.intern(pod("web-2")), 3);
        assert_eq!(dict.len(), 3);
        assert_eq!(dict.get(0), None);
        assert_eq!(dict.get(2), Some(&unit("sshd.service")));
        assert_eq!(dict.get(4), None);
        let ids: Vec<u32> = dict.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn ids_survive_a_round_trip() {
        let mut dict = Dictionary::new();
        for identity in [pod("web-1"), unit("sshd.service"), pod("web-2")] {
            dict.intern(identity);
        }
        let bytes = postcard::to_allocvec(&dict).unwrap();
        let mut back: Dictionary = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.get(3), Some(&pod("web-2")));
        // The map came back too: interning again gives the stored ids, not new ones.
        assert_eq!(back.intern(unit("sshd.service")), 2);
        assert_eq!(back.intern(unit("cron.service")), 4);

        let json = serde_json::to_string(&dict).unwrap();
        let back: Dictionary = serde_json::from_str(&json).unwrap();
        assert_eq!(back.get(1), Some(&pod("web-1")));
        assert!(json.contains("\"runtime\":\"containerd\""), "{json}");
    }

    #[test]
    fn refuses_what_intern_never_writes() {
        let twice = serde_json::to_string(&vec![pod("a"), pod("b"), pod("a")]).unwrap();
        let err = serde_json::from_str::<Dictionary>(&twice).unwrap_err();
        assert!(err.to_string().contains("entry 3 repeats entry 1"), "{err}");
        let empty = serde_json::to_string(&vec![pod("a"), Identity::default()]).unwrap();
        let err = serde_json::from_str::<Dictionary>(&empty).unwrap_err();
        assert!(err.to_string().contains("entry 2 is empty"), "{err}");
    }
}
