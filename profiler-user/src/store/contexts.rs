//! The execution context of a stored stack (see `crate::context`): the marker frame at the
//! root of its kernel frames, found by walking the dictionary's nodes up.

use super::format::{Dict, MAX_STACK_FRAMES};
use crate::exec_context::Context;

impl Dict {
    /// The context of stack node `node`: walks up to the root of its kernel frames.
    pub fn context_of(&self, node: u32) -> Context {
        let mut n = node as usize;
        let mut steps = 0;
        while let Some(cur) = self.nodes.get(n).filter(|_| n != 0 && steps < MAX_STACK_FRAMES) {
            if !cur.kernel {
                // Kernel frames follow user frames (root first): a user leaf means none.
                return Context::Task;
            }
            let parent = cur.parent as usize;
            if parent == 0 || !self.nodes.get(parent).is_some_and(|p| p.kernel) {
                let name = self.strings.get(cur.frame as usize).map_or("", String::as_str);
                return Context::of_marker(name).map_or(Context::Task, Context::Softirq);
            }
            n = parent;
            steps += 1;
        }
        Context::Task
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::format::Node;

    #[test]
    fn context_of_a_stored_stack_node() {
        let strings = ["main", "[softirq:TIMER]", "run_timer_softirq", "[softirq:NET_RX]"];
        let node = |parent, frame, kernel| Node { parent, frame, kernel };
        let dict = Dict {
            strings: strings.iter().map(|s| s.to_string()).collect(),
            locations: Vec::new(),
            nodes: vec![
                node(0, 0, false),
                node(0, 0, false), // 1: main
                node(1, 1, true),  // 2: main;[softirq:TIMER]
                node(2, 2, true),  // 3: ...;run_timer_softirq
                node(0, 1, true),  // 4: [softirq:TIMER] (idle task: no user frames)
                node(4, 2, true),  // 5
                node(1, 3, false), // 6: main;[softirq:NET_RX] as a *user* frame
                node(6, 2, true),  // 7: ...;run_timer_softirq (kernel root is not a marker)
            ],
        };
        let of = |n| dict.context_of(n);
        assert_eq!(
            [of(0), of(1), of(2), of(3)],
            [Context::Task, Context::Task, Context::Softirq(1), Context::Softirq(1)]
        );
        assert_eq!(
            [of(4), of(5), of(6), of(7)],
            [Context::Softirq(1), Context::Softirq(1), Context::Task, Context::Task]
        );
        assert_eq!(of(99), Context::Task, "a dangling id is no context");
    }
}
