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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    use super::IoThreads;

    #[tokio::test]
    async fn jobs_are_dealt_over_the_threads_which_end_on_stop() {
        let threads = IoThreads::start(3).unwrap();
        let names = Arc::new(Mutex::new(Vec::new()));
        let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..6 {
            let names = names.clone();
            let done = done.clone();
            threads.spawn(move || async move {
                // Inside the thread's own runtime: what a connection registers lands here.
                tokio::task::yield_now().await;
                let name = std::thread::current().name().unwrap_or("").to_string();
                names.lock().unwrap().push(name);
                let _ = done.send(());
            });
        }
        for _ in 0..6 {
            finished.recv().await.unwrap();
        }
        let names = names.lock().unwrap().clone();
        let distinct: HashSet<_> = names.iter().cloned().collect();
        let expected: HashSet<_> = (0..3).map(|i| format!("leafd-io-{i}")).collect();
        assert_eq!(distinct, expected, "six jobs over three threads: {names:?}");
        // A job that never ends is dropped with its thread's runtime at stop.
        threads.spawn(std::future::pending);
        tokio::time::timeout(std::time::Duration::from_secs(5), threads.stop())
            .await
            .expect("the threads stop");
    }
}
