//! A token bucket: a burst, then a steady rate. The agent spends one on each Event it publishes
//! (one bucket the tenants share in turn, `events`) and on each status write of a PortMap (one
//! bucket per object, `status`). Pure: every call is handed `now`.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest wait a bucket asks for. Float rounding can leave it a hair short of a token
/// after exactly the wait it named; a zero wait would then be asked for again at the same
/// instant, and a caller that sleeps until then (under a paused clock, for ever) would spin.
const MIN_WAIT: Duration = Duration::from_millis(1);

/// How far short of a whole token still counts as one: the rounding of the refill arithmetic.
const ROUNDING: f64 = 1e-9;

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
        if self.tokens >= 1.0 - ROUNDING {
            self.tokens = (self.tokens - 1.0).max(0.0);
            return Ok(());
        }
        let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.per_second);
        Err(now + wait.max(MIN_WAIT))
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

/// How often [`KeyedBuckets`] forgets its full buckets.
const FORGET_EVERY: Duration = Duration::from_secs(10);

/// A bucket per key, each full when first used. A full bucket says nothing a new one would
/// not, so full ones are forgotten (those of deleted objects too), every [`FORGET_EVERY`]
/// rather than at every take: a take then costs a lookup, not a sweep of every key.
#[derive(Debug)]
pub(crate) struct KeyedBuckets<K> {
    buckets: BTreeMap<K, TokenBucket>,
    burst: f64,
    per_second: f64,
    forgotten: Option<Instant>,
}

impl<K: Ord> KeyedBuckets<K> {
    /// No buckets yet; each new one holds `burst` tokens, refilled at `per_second`.
    pub fn new(burst: f64, per_second: f64) -> Self {
        Self {
            buckets: BTreeMap::new(),
            burst,
            per_second,
            forgotten: None,
        }
    }

    /// Takes a token of `key`'s bucket, or says when one will be there.
    pub fn take(&mut self, key: K, now: Instant) -> Result<(), Instant> {
        let due = self
            .forgotten
            .is_none_or(|at| now.saturating_duration_since(at) >= FORGET_EVERY);
        if due {
            self.buckets.retain(|_, b| !b.is_full(now));
            self.forgotten = Some(now);
        }
        let (burst, per_second) = (self.burst, self.per_second);
        self.buckets
            .entry(key)
            .or_insert_with(|| TokenBucket::full(burst, per_second, now))
            .take(now)
    }

    /// Gives back a token of `key`'s bucket taken for something that did not happen.
    pub fn refund(&mut self, key: &K) {
        if let Some(b) = self.buckets.get_mut(key) {
            b.refund();
        }
    }

    /// How many buckets are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.buckets.len()
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

    #[test]
    fn a_bucket_a_hair_short_of_a_token_never_asks_to_wait_zero() {
        let t0 = Instant::now();
        // A third per second does not add up exactly in floats: the bucket is told to wait,
        // waits exactly that long, and must then either give the token or name a later time.
        let mut b = TokenBucket::full(2.0, 1.0 / 3.0, t0);
        let mut now = t0;
        let mut taken = 0;
        for _ in 0..1000 {
            match b.take(now) {
                Ok(()) => taken += 1,
                Err(then) => {
                    assert!(then > now, "asked to wait until {then:?} at {now:?}");
                    now = then;
                }
            }
        }
        assert!(
            taken >= 400,
            "every wait ends in a token: {taken} of 1000 calls"
        );
        b.tokens = 1.0 - 1e-15;
        assert_eq!(
            b.take(now),
            Ok(()),
            "a rounding short of a token is a token"
        );
        b.tokens = 0.999_999_999_999;
        b.per_second = 1e6;
        assert_eq!(b.take(now), Ok(()));
        b.tokens = 0.5;
        assert_eq!(
            b.take(now),
            Err(now + MIN_WAIT),
            "never a wait shorter than the minimum"
        );
    }

    #[test]
    fn keyed_buckets_forget_full_ones_now_and_then_not_at_every_take() {
        let t0 = Instant::now();
        let mut buckets = KeyedBuckets::new(2.0, 1.0);
        for key in 0..1000 {
            assert_eq!(buckets.take(key, t0), Ok(()));
        }
        assert_eq!(buckets.take(7, t0), Ok(()));
        assert!(buckets.take(7, t0).is_err(), "key 7 spent its burst");
        assert_eq!(buckets.len(), 1000);
        // Full again after two seconds, but not forgotten until the sweep is due.
        assert_eq!(buckets.take(1000, t0 + Duration::from_secs(3)), Ok(()));
        assert_eq!(buckets.len(), 1001);
        assert_eq!(buckets.take(1001, t0 + FORGET_EVERY), Ok(()));
        assert_eq!(buckets.len(), 1, "only the bucket just used is left");
        buckets.refund(&1001);
        buckets.refund(&5);
        assert_eq!(buckets.len(), 1, "a refund makes no bucket");
    }
}
