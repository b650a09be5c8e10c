//! The host's link events: one stream, opened for the underlay device the host reports and
//! opened again when that device changes or the stream ends. A link event means the kernel
//! changed behind the agent's back, so the pass it starts compares against the kernel.

use kuport_host::LinkEvent;
use tokio::sync::mpsc;

use super::LinkWatch;

/// The open link event stream, if any, and the underlay devices it was opened for.
#[derive(Default)]
pub(super) struct LinkEvents {
    rx: Option<mpsc::Receiver<LinkEvent>>,
    underlay: Option<Vec<String>>,
}

impl LinkEvents {
    /// The next link event; `None` when the stream ended. Never ready while no stream is open.
    pub(super) async fn next(&mut self) -> Option<LinkEvent> {
        match self.rx.as_mut() {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// The loop woke up on the stream with `event`: whether a link changed. A stream that ended
    /// is forgotten, to be opened again after the pass.
    pub(super) fn woke(&mut self, event: Option<LinkEvent>) -> bool {
        match event {
            Some(e) => {
                tracing::info!(
                    link = %e.name,
                    removed = e.removed,
                    "link changed on the host: running a verifying pass"
                );
                true
            }
            None => {
                self.rx = None;
                self.underlay = None;
                false
            }
        }
    }

    /// Takes the events that came while the loop debounced: whether there were any.
    pub(super) fn drain(&mut self) -> bool {
        let mut any = false;
        if let Some(rx) = self.rx.as_mut() {
            while rx.try_recv().is_ok() {
                any = true;
            }
        }
        any
    }

    /// After a pass: (re)opens the stream through `watch` once the pass knows the underlay
    /// devices, or when they changed. A stream that cannot be opened is asked for again after
    /// the next pass.
    pub(super) fn follow(&mut self, watch: Option<&mut LinkWatch>, underlay: Option<Vec<String>>) {
        let (Some(watch), Some(underlay)) = (watch, underlay) else {
            return;
        };
        if self.underlay.as_ref() == Some(&underlay) {
            return;
        }
        match watch(underlay.clone()) {
            Ok(rx) => {
                self.rx = Some(rx);
                self.underlay = Some(underlay);
            }
            Err(e) => tracing::warn!("watching link events: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use kuport_host::{HostError, HostStage};

    use super::*;

    /// A link watch recording the devices it is asked for; each open gets a new channel, whose
    /// sender is kept in `senders`.
    fn recording_watch(
        asked: Arc<Mutex<Vec<Vec<String>>>>,
        senders: Arc<Mutex<Vec<mpsc::Sender<LinkEvent>>>>,
    ) -> LinkWatch {
        Box::new(move |devices| {
            asked.lock().expect("lock").push(devices);
            let (tx, rx) = mpsc::channel(8);
            senders.lock().expect("lock").push(tx);
            Ok(rx)
        })
    }

    fn event(name: &str) -> LinkEvent {
        LinkEvent {
            name: name.to_owned(),
            removed: true,
        }
    }

    #[test]
    fn the_stream_is_opened_once_per_underlay_and_again_when_it_changes() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let senders = Arc::new(Mutex::new(Vec::new()));
        let mut watch = recording_watch(asked.clone(), senders.clone());
        let mut links = LinkEvents::default();
        links.follow(Some(&mut watch), None);
        links.follow(None, Some(vec!["wg0".to_owned()]));
        assert!(
            asked.lock().expect("lock").is_empty(),
            "nothing to open yet"
        );
        links.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        links.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        links.follow(Some(&mut watch), Some(vec!["wg1".to_owned()]));
        assert_eq!(
            *asked.lock().expect("lock"),
            [vec!["wg0".to_owned()], vec!["wg1".to_owned()]]
        );
    }

    #[test]
    fn an_ended_stream_is_forgotten_and_opened_again_for_the_same_underlay() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let senders = Arc::new(Mutex::new(Vec::new()));
        let mut watch = recording_watch(asked.clone(), senders.clone());
        let mut links = LinkEvents::default();
        links.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert!(links.woke(Some(event("kup-1"))), "a link changed");
        assert!(!links.woke(None), "the stream ended");
        links.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert_eq!(asked.lock().expect("lock").len(), 2);
    }

    #[test]
    fn events_queued_while_debouncing_count_as_a_link_change() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let senders = Arc::new(Mutex::new(Vec::new()));
        let mut watch = recording_watch(asked, senders.clone());
        let mut links = LinkEvents::default();
        assert!(!links.drain(), "no stream, no change");
        links.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert!(!links.drain());
        for name in ["kup-1", "kup-2"] {
            senders.lock().expect("lock")[0]
                .try_send(event(name))
                .expect("sent");
        }
        assert!(links.drain());
        assert!(!links.drain(), "taken");
    }

    #[test]
    fn a_stream_that_cannot_be_opened_is_asked_for_again() {
        let mut tries = 0;
        let mut watch: LinkWatch = Box::new(move |_| {
            tries += 1;
            Err(HostError::Missing {
                stage: HostStage::Links,
                what: format!("a link event stream (try {tries})"),
            })
        });
        let mut links = LinkEvents::default();
        links.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert!(links.underlay.is_none(), "not opened");
        links.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert!(links.rx.is_none());
    }
}
