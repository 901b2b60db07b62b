//! Reliable, authenticated UDP transport — **not built yet** (its own issue builds it).
//!
//! This crate is a placeholder so the workspace has its final shape; it exports nothing.
