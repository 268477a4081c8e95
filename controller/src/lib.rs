//! silo
