//! User stacks for code without frame pointers: unwind tables compiled from each binary's call
//! frame information, loaded into the kernel for the sampler to walk.

pub mod table;
