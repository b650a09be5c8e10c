//! Locking the state the agents' tasks and the checks share.

use std::sync::{Mutex, MutexGuard};

/// A lock that a panicked holder does not poison for the checks.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
