//! Waiting on a condition with a deadline, so a test asserts on what happened, never on how
//! long it took.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Polls `check` every `poll` until it holds; panics naming `what` once `deadline` has passed.
pub async fn eventually<F, Fut>(what: &str, deadline: Duration, poll: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_checking(what, deadline, poll, check, || {}).await;
}

/// [`eventually`], running `also` before every round: a check of something that must never
/// happen meanwhile, which fails the test by panicking.
pub async fn eventually_checking<F, Fut>(
    what: &str,
    deadline: Duration,
    poll: Duration,
    mut check: F,
    also: impl Fn(),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + deadline;
    loop {
        also();
        if check().await {
            return;
        }
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for: {what}"
        );
        tokio::time::sleep(poll).await;
    }
}

/// Polls `check` every 50 ms until it returns true or `timeout` passes; says which. Blocking,
/// for code outside an async runtime (the lab's setup and teardown).
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test]
    async fn returns_once_the_check_holds_and_runs_also_every_round() {
        let rounds = Cell::new(0);
        let also = Cell::new(0);
        eventually_checking(
            "the third round",
            Duration::from_secs(10),
            Duration::from_millis(1),
            || {
                rounds.set(rounds.get() + 1);
                let done = rounds.get() == 3;
                async move { done }
            },
            || also.set(also.get() + 1),
        )
        .await;
        assert_eq!((rounds.get(), also.get()), (3, 3));
    }

    #[test]
    fn wait_until_says_whether_the_check_held_in_time() {
        let mut rounds = 0;
        assert!(wait_until(Duration::from_secs(10), || {
            rounds += 1;
            rounds == 2
        }));
        assert!(!wait_until(Duration::ZERO, || false));
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for: never")]
    async fn panics_naming_what_it_waited_for() {
        eventually(
            "never",
            Duration::ZERO,
            Duration::from_millis(1),
            || async { false },
        )
        .await;
    }
}
