//! Where the agent's wall-clock time comes from: its own module because the pass loop (the
//! plan's `now`) and the status task (the writes' timestamps) both read it, and neither should
//! depend on the other for it.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

/// A source of wall-clock time.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Timestamp + Send + Sync>);

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self(Arc::new(Timestamp::now))
    }

    /// A clock reading `now`.
    pub fn from_fn(now: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    /// The time now.
    pub fn now(&self) -> Timestamp {
        (self.0)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock({})", self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_from_a_function_reads_it_each_time() {
        let at = Timestamp::from_second(1_700_000_000).expect("a time");
        let clock = Clock::from_fn(move || at);
        assert_eq!(clock.now(), at);
        assert_eq!(clock.clone().now(), at, "a clone reads the same source");
        assert_eq!(format!("{clock:?}"), format!("Clock({at})"));
    }
}
