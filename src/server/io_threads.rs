//! The threads that serve client connections: each runs a single-threaded event loop of its
//! own, and a connection handed to one stays there, so serving it needs no cross-thread wake-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::sync::mpsc;

/// A connection's work: called on its thread, inside that thread's runtime, so the socket it
/// registers belongs to that thread's event loop.
type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A fixed set of connection threads; connections are dealt out in turn.
pub(crate) struct IoThreads {
    senders: Vec<mpsc::UnboundedSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    next: AtomicUsize,
}

impl IoThreads {
    pub(crate) fn start(count: usize) -> std::io::Result<IoThreads> {
        let mut senders = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (sender, mut jobs) = mpsc::unbounded_channel::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("leafd-io-{index}"))
                .spawn(move || {
                    runtime.block_on(async {
                        while let Some(job) = jobs.recv().await {
                            tokio::spawn(job());
                        }
                    });
                    // Dropping the runtime here ends the connections still open: the listener
                    // has stopped waiting for them (its shutdown timeout passed).
                })?;
            senders.push(sender);
            threads.push(thread);
        }
        Ok(IoThreads {
            senders,
            threads,
            next: AtomicUsize::new(0),
        })
    }

    /// Runs `make()`'s future on the next thread. `make` runs there first, so it is the place
    /// to register the connection's socket with that thread's event loop.
    pub(crate) fn spawn<F, Fut>(&self, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
        let job: Job = Box::new(move || Box::pin(make()));
        // A thread only stops once `self` is dropped, so the send cannot fail while we hold it.
        let _ = self.senders[index].send(job);
    }

    /// Stops the threads, ending what still runs on them, and waits for them to exit.
    pub(crate) async fn stop(self) {
        drop(self.senders);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}
