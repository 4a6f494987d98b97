//! Shipping the local store to fleet stores. The store stays the source of truth and the
//! buffer: a shipper follows it with a cursor of its own and never slows sampling down.

pub mod clickhouse;
