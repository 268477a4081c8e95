//! Fault points: places where a test can make this process die, to check
//! what a later process makes of the state it left. A point is armed by
//! naming it in `SILO_TEST_DIE_AT`; the process then exits at once, with
//! [`DIED_AT_FAULT`], when it gets there, as a `kill -9` at that moment
//! would leave things. Unset (always, outside tests), a point costs one
//! load of a cached value.

use std::sync::OnceLock;

/// The variable that arms a fault point, by its name.
pub const DIE_AT_ENV: &str = "SILO_TEST_DIE_AT";
/// The exit code of a process that died at a fault point.
pub const DIED_AT_FAULT: i32 = 86;

/// A place a test can make the process die at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// A rewind in place: recorded as under way, its layer about to go out.
    RewindSending,
    /// A rewind in place: its layer is placed and the agent has answered,
    /// and nothing of it is recorded yet.
    RewindPlaced,
}

impl Point {
    /// The name `SILO_TEST_DIE_AT` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Point::RewindSending => "rewind-sending",
            Point::RewindPlaced => "rewind-placed",
        }
    }
}

/// Dies here if `point` is armed.
pub fn reached(point: Point) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var(DIE_AT_ENV).ok());
    if armed.as_deref() == Some(point.name()) {
        tracing::warn!(point = point.name(), "dying at an armed fault point");
        std::process::exit(DIED_AT_FAULT);
    }
}
