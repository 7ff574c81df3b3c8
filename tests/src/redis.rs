//! A real Redis server for cluster tests: Debian's `redis-server` on a free loopback port, no
//! persistence unless asked, in its own temp dir. It can be stopped and started again on the
//! same port, as an outage would, or shut down keeping its data in a dump, as an operator's
//! restart would. `None` (with the reason printed) when `redis-server` is not installed, so
//! the tests that need it skip instead of failing.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running (or stopped) `redis-server`.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server on a free loopback port; `None` when `redis-server` is missing.
    pub async fn start() -> Option<Self> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            eprintln!("skipped: redis-server is not installed (scripts/setup.sh installs it)");
            return None;
        }
        // redis-server binds it: a port the kernel never hands out on its own (`ports`).
        let port = crate::ports::reserved_port();
        let mut server = Self {
            port,
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        server.resume().await;
        Some(server)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A client for checks and setup.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis url")
    }

    /// A fresh async connection.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis")
    }

    /// Kills the server (an outage: connections are reset, the port refuses).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Shuts the server down as an operator's restart does: `SHUTDOWN SAVE` writes its data
    /// to a dump in its dir and the process exits, closing every client's connection. The next
    /// [`RedisServer::resume`] loads the dump.
    pub async fn shutdown_saving(&mut self) {
        let mut conn = self.connection().await;
        // The server closes the connection instead of answering.
        let _ = redis::cmd("SHUTDOWN")
            .arg("SAVE")
            .query_async::<()>(&mut conn)
            .await;
        if let Some(mut child) = self.child.take() {
            let status = child.wait().expect("wait for redis-server");
            assert!(
                status.success(),
                "redis-server did not shut down cleanly: {status}"
            );
        }
    }

    /// Starts the server again on the same port (empty, unless [`RedisServer::shutdown_saving`]
    /// left a dump) and waits until it answers.
    pub async fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = self.client().get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server did not answer on port {}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
