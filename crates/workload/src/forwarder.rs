//! A TCP forwarder whose target can be switched: the address clients use for "the primary" of a
//! Redis or PostgreSQL pair.
//!
//! It plays the part of Sentinel, a proxy or a floating address: when the nemesis promotes the
//! replica,
//! the forwarder points at it and drops every open connection, so clients reconnect to the new
//! primary while the old one still runs with whatever it had not replicated.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running forwarder; dropping it stops accepting (open connections end at the next switch or
/// when either side closes).
#[derive(Debug)]
pub struct Forwarder {
    port: u16,
    target: Arc<watch::Sender<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Forwarder> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let (tx, _) = watch::channel(target);
        let target = Arc::new(tx);
        let task = tokio::spawn({
            let target = target.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let mut switched = target.subscribe();
                    let to = *switched.borrow_and_update();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(to).await else {
                            return;
                        };
                        let mut client = client;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = switched.changed() => {}
                        }
                    });
                }
            }
        });
        Ok(Forwarder { port, target, task })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Points new connections at `target` and closes every open one.
    pub fn switch(&self, target: SocketAddr) {
        self.target.send_replace(target);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
