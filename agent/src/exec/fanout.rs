//! Delivery of one exec's live output to the connections attached to it.
//!
//! Each connection owns one bounded queue shared by all the execs it follows.
//! An exec never waits on a connection: when a queue is full the connection
//! is dropped from that exec's subscribers and told, through its
//! [`LagSignal`], to catch up by re-attaching from the last offset it sent
//! (the ring holds what it missed). So a slow client costs memory bounded by
//! its queue and the rings, and never slows a command or other clients.

use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use silo_protocol::exec::{Channel, ExecId, ExitInfo};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc};

/// Identifies one client connection for the life of the agent.
pub type ConnId = u64;

/// What an exec tells its subscribers.
#[derive(Debug, Clone)]
pub enum Event {
    /// New output.
    Output {
        /// The exec.
        exec_id: ExecId,
        /// Offset of `data[0]`.
        seq: u64,
        /// Stdout or stderr.
        channel: Channel,
        /// The bytes.
        data: Bytes,
    },
    /// The exec ended; nothing follows for it.
    Exit {
        /// The exec.
        exec_id: ExecId,
        /// How it ended.
        exit: ExitInfo,
    },
}

/// Tells a connection which execs dropped it for being slow.
#[derive(Debug, Default)]
pub struct LagSignal {
    execs: Mutex<Vec<ExecId>>,
    notify: Notify,
}

impl LagSignal {
    fn mark(&self, exec_id: ExecId) {
        let mut execs = self.execs.lock().unwrap_or_else(PoisonError::into_inner);
        if !execs.contains(&exec_id) {
            execs.push(exec_id);
        }
        drop(execs);
        // Stores a permit when nobody is waiting, so a busy connection still sees it.
        self.notify.notify_one();
    }

    /// Execs that dropped this connection since the last call.
    pub fn take(&self) -> Vec<ExecId> {
        std::mem::take(&mut *self.execs.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Resolves when some exec has dropped this connection.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }
}

/// One connection's subscription handle, cloned into every exec it follows.
#[derive(Debug, Clone)]
pub struct Subscriber {
    /// The connection.
    pub conn: ConnId,
    /// Its event queue.
    pub tx: mpsc::Sender<Event>,
    /// Its lag notice.
    pub lag: std::sync::Arc<LagSignal>,
}

/// The subscribers of one exec.
#[derive(Debug, Default)]
pub struct Fanout {
    subs: Vec<Subscriber>,
}

impl Fanout {
    /// Adds a subscriber, replacing an earlier subscription of the same connection.
    pub fn add(&mut self, sub: Subscriber) {
        self.remove(sub.conn);
        self.subs.push(sub);
    }

    /// Removes a connection's subscription.
    pub fn remove(&mut self, conn: ConnId) {
        self.subs.retain(|s| s.conn != conn);
    }

    /// Attached connections.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Offers `event` to every subscriber without waiting; drops the ones whose
    /// queue is full (after flagging them) or closed.
    pub fn send(&mut self, exec_id: ExecId, event: &Event) {
        self.subs
            .retain(|sub| match sub.tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    sub.lag.mark(exec_id);
                    false
                }
                Err(TrySendError::Closed(_)) => false,
            });
    }

    /// Forgets everyone (the exec has ended).
    pub fn clear(&mut self) {
        self.subs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn output(seq: u64) -> Event {
        Event::Output {
            exec_id: 1,
            seq,
            channel: Channel::Stdout,
            data: Bytes::from_static(b"x"),
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_only_that_subscriber_and_flags_it() {
        let (slow_tx, _slow_rx) = mpsc::channel(1);
        let (fast_tx, mut fast_rx) = mpsc::channel(10);
        let slow_lag = Arc::new(LagSignal::default());
        let mut fanout = Fanout::default();
        fanout.add(Subscriber {
            conn: 1,
            tx: slow_tx,
            lag: slow_lag.clone(),
        });
        fanout.add(Subscriber {
            conn: 2,
            tx: fast_tx,
            lag: Arc::default(),
        });
        fanout.send(1, &output(0));
        fanout.send(1, &output(1));
        assert_eq!(fanout.len(), 1);
        slow_lag.notified().await;
        assert_eq!(slow_lag.take(), vec![1]);
        assert!(fast_rx.try_recv().is_ok() && fast_rx.try_recv().is_ok());
    }

    #[test]
    fn resubscribing_replaces_and_closed_queues_are_pruned() {
        let (tx, rx) = mpsc::channel(4);
        let mut fanout = Fanout::default();
        let sub = Subscriber {
            conn: 7,
            tx,
            lag: Arc::default(),
        };
        fanout.add(sub.clone());
        fanout.add(sub);
        assert_eq!(fanout.len(), 1);
        drop(rx);
        fanout.send(1, &output(0));
        assert_eq!(fanout.len(), 0);
    }
}
