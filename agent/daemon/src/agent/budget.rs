//! A token bucket: a burst, then a steady rate. The agent spends one on each Event it publishes
//! (one bucket the tenants share in turn, `events`) and on each status write of a PortMap (one
//! bucket per object, `status`). Pure: every call is handed `now`.

use std::time::Duration;

use tokio::time::Instant;

/// `burst` tokens, refilled at `per_second`.
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    burst: f64,
    per_second: f64,
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(burst: f64, per_second: f64, now: Instant) -> Self {
        Self {
            burst,
            per_second,
            tokens: burst,
            refilled: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.refilled = now;
    }

    /// Takes a token, or says when one will be there.
    pub fn take(&mut self, now: Instant) -> Result<(), Instant> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(now + Duration::from_secs_f64((1.0 - self.tokens) / self.per_second))
    }

    /// Gives back a token taken for something that did not happen after all.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    /// Whether the bucket is full again: nothing would be lost by forgetting it.
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_the_time_of_the_next_token() {
        let t0 = Instant::now();
        let mut b = TokenBucket::full(3.0, 0.5, t0);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        assert_eq!(b.take(t0), Err(t0 + Duration::from_secs(2)));
        assert_eq!(
            b.take(t0 + Duration::from_secs(1)),
            Err(t0 + Duration::from_secs(2))
        );
        assert_eq!(b.take(t0 + Duration::from_secs(2)), Ok(()));
        assert!(!b.is_full(t0 + Duration::from_secs(3)));
        assert!(
            b.is_full(t0 + Duration::from_secs(8)),
            "refilled, never past the burst"
        );
        for _ in 0..3 {
            assert_eq!(b.take(t0 + Duration::from_secs(100)), Ok(()));
        }
        assert!(b.take(t0 + Duration::from_secs(100)).is_err());
        b.refund();
        assert_eq!(b.take(t0 + Duration::from_secs(100)), Ok(()), "refunded");
    }
}
