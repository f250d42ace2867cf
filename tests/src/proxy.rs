//! A TCP relay in front of the API server that a test can cut: while cut, bytes stop
//! flowing both ways on every connection, old and new (nothing is refused or closed,
//! so clients wait as they would for an unreachable server), until it is restored.

use std::net::SocketAddr;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A relay from a loopback port to `upstream`; stops relaying when dropped.
pub struct Proxy {
    /// Where clients connect.
    pub address: SocketAddr,
    open: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Relays a free loopback port to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (open, _) = watch::channel(true);
        let (upstream, gate) = (upstream.to_string(), open.subscribe());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, gate) = (upstream.clone(), gate.clone());
                tokio::spawn(async move {
                    let mut opened = gate.clone();
                    if opened.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(&upstream).await else { return };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(pump(client_read, server_write, gate.clone()), pump(server_read, client_write, gate));
                });
            }
        });
        Ok(Self { address, open, task })
    }

    /// Stops every byte from flowing until [`Proxy::restore`].
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Lets bytes flow again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding what it read while the gate is shut.
async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, mut gate: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if gate.wait_for(|open| *open).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = gate.changed() => continue,
        };
        if gate.wait_for(|open| *open).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
