//! Starting, reloading and draining the gateway. `Gateway::start` builds the first config
//! generation and binds its listeners; `reload` builds a new generation from the config file and
//! swaps it in only if it is valid whole (listeners added, kept or removed without dropping open
//! connections); `shutdown` stops accepting, lets in-flight work finish (bounded by
//! `server.drain_timeout`) and returns.

pub mod checked;
pub mod coalesce;
pub mod conn;
pub mod fast_path;
pub mod h3;
pub mod idle;
mod kubernetes;
pub mod linger;
pub mod listeners;
pub mod policy;
pub mod sendfile;
pub mod service;
pub mod streams;
pub mod tls;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::Config;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::GatewayError;
use crate::generation::Generation;
use crate::telemetry::Telemetry;
use listeners::{ListenerContext, ListenerSet};

/// A running gateway (cheap to clone: all clones control the same gateway).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

/// The admin listener: where it was configured, where it is bound, how to stop it.
struct AdminHandle {
    configured: SocketAddr,
    local: SocketAddr,
    stop: CancellationToken,
}

struct Inner {
    cx: ListenerContext,
    listeners: Mutex<ListenerSet>,
    streams: stream_proxy::StreamServer,
    admin: Mutex<Option<AdminHandle>>,
    config_path: PathBuf,
    reload_lock: tokio::sync::Mutex<()>,
    acme: crate::certs::acme::AcmeManager,
    /// What the Kubernetes controller last asked for, merged into every load of the file.
    cluster_fragment: Mutex<Option<Arc<gateway_config::RawConfig>>>,
}

impl Gateway {
    /// Builds the first generation from `config`, binds every listener and starts serving.
    pub async fn start(config: Config) -> Result<Self, GatewayError> {
        let telemetry = Telemetry::new();
        let config = Arc::new(config);
        let generation = Generation::build(config.clone(), &telemetry)?;
        crate::memory::set_burst_size(config.server.release_memory_after_burst);
        // Refused only when an earlier gateway in this process set the same hooks.
        let _ = stream_proxy::set_connection_hooks(crate::memory::stream_hooks());
        configure_access_log(&telemetry, &config)?;
        telemetry.tracer.store(tracer_for(&telemetry, &config)?);
        telemetry
            .metrics_export
            .store(metrics_exporter_for(&telemetry, &config)?);
        // ACME certificates from storage are in the registry before the first handshake.
        let certs = crate::certs::CertRegistry::new(&telemetry.registry);
        let acme = crate::certs::acme::AcmeManager::new(certs.clone(), telemetry.registry.clone());
        let shutdown = CancellationToken::new();
        acme.apply(&config, &shutdown);
        let cx = ListenerContext {
            generation: Arc::new(ArcSwap::from_pointee(generation)),
            telemetry,
            shutdown,
            certs,
            connections: TaskTracker::new(),
            acceptors: TaskTracker::new(),
        };
        let mut set = ListenerSet::default();
        set.apply(&config, &cx)?;
        let streams =
            stream_proxy::StreamServer::start(&cx.generation.load().streams, &cx.shutdown)
                .map_err(stream_error)?;
        let gateway = Self {
            inner: Arc::new(Inner {
                cx,
                listeners: Mutex::new(set),
                streams,
                admin: Mutex::new(None),
                config_path: PathBuf::from(&config.file),
                reload_lock: tokio::sync::Mutex::new(()),
                acme,
                cluster_fragment: Mutex::new(None),
            }),
        };
        gateway.apply_admin(&config)?;
        crate::collectors::register(
            &gateway.inner.cx.telemetry,
            gateway.inner.cx.generation.clone(),
        );
        // Weak: the registry lives inside the gateway, so a strong handle would be a cycle.
        let weak = Arc::downgrade(&gateway.inner);
        gateway
            .inner
            .cx
            .telemetry
            .registry
            .add_collector(Box::new(move |out| {
                if let Some(inner) = weak.upgrade() {
                    let streams: Vec<_> = inner
                        .streams
                        .all_stats()
                        .into_iter()
                        .map(|(name, stats)| (name, stats.snapshot()))
                        .collect();
                    crate::telemetry::render_streams(&streams, out);
                }
            }));
        if config.server.watch_config && gateway.inner.config_path.is_file() {
            watch::spawn(gateway.clone());
        }
        if let Some(k) = &config.kubernetes {
            kubernetes::spawn(gateway.clone(), k.clone())?;
        }
        crate::memory::release_freed();
        Ok(gateway)
    }

    /// The bound address of a listener (useful with port 0).
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.inner
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .addr(name)
    }

    /// The bound address of an L4 stream (useful with port 0).
    pub fn stream_addr(&self, name: &str) -> Option<SocketAddr> {
        self.inner.streams.local_addr(name)
    }

    /// The counters of an L4 stream (kept across reloads while its socket is kept).
    pub fn stream_stats(&self, name: &str) -> Option<Arc<stream_proxy::StreamStats>> {
        self.inner.streams.stats(name)
    }

    /// Every L4 stream's name and counters, in config order.
    pub fn all_stream_stats(&self) -> Vec<(Arc<str>, Arc<stream_proxy::StreamStats>)> {
        self.inner.streams.all_stats()
    }

    /// The bound address of the admin API.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.inner
            .admin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|a| a.local)
    }

    /// The generation currently serving.
    pub fn generation(&self) -> Arc<Generation> {
        self.inner.cx.generation.load_full()
    }

    /// Metrics and access log.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.inner.cx.telemetry
    }

    /// Starts ACME renewals now: of the named certificate, or of all. `None` when `name` is
    /// not an ACME certificate.
    pub fn renew_certificates(&self, name: Option<&str>) -> Option<usize> {
        self.inner.acme.renew(name)
    }

    /// Live certificates: ACME certificates, OCSP staples, challenge answers.
    pub fn certificates(&self) -> &Arc<crate::certs::CertRegistry> {
        &self.inner.cx.certs
    }

    /// Whether the gateway is serving (not draining).
    pub fn is_ready(&self) -> bool {
        !self.inner.cx.shutdown.is_cancelled()
    }

    /// A token that starts the drain when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.cx.shutdown.clone()
    }

    /// The config file this gateway reloads from.
    pub fn config_path(&self) -> &std::path::Path {
        &self.inner.config_path
    }

    /// Re-reads the config file and swaps the new generation in if it is valid whole. On error
    /// the running configuration stays and the located error is returned.
    pub async fn reload(&self) -> Result<(), GatewayError> {
        let _serial = self.inner.reload_lock.lock().await;
        crate::systemd::reloading();
        let result = self.try_reload().await;
        crate::systemd::reloaded(result.is_ok());
        let t = &self.inner.cx.telemetry;
        match &result {
            Ok(()) => {
                crate::memory::release_freed();
                t.reloads_ok.inc();
                tracing::info!(config = %self.inner.config_path.display(), "configuration reloaded");
            }
            Err(e) => {
                t.reloads_failed.inc();
                tracing::error!(error = %e, "configuration reload rejected; the running configuration stays");
            }
        }
        result
    }

    async fn try_reload(&self) -> Result<(), GatewayError> {
        let path = self.inner.config_path.clone();
        let fragment = self.cluster_fragment();
        let config = tokio::task::spawn_blocking(move || {
            gateway_config::load_with(&path, fragment.as_deref())
        })
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))??;
        config.check_serves_something()?;
        self.apply_config(Arc::new(config))
    }

    fn cluster_fragment(&self) -> Option<Arc<gateway_config::RawConfig>> {
        self.inner
            .cluster_fragment
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Applies what the Kubernetes controller made, merged with the running file's text (not
    /// re-read: an edit in progress is the file watcher's business). On error the running
    /// generation and the previous fragment stay.
    pub(crate) async fn apply_cluster(
        &self,
        fragment: gateway_config::RawConfig,
    ) -> Result<(), GatewayError> {
        let _serial = self.inner.reload_lock.lock().await;
        let current = self.generation().config.clone();
        let fragment = Arc::new(fragment);
        let extra = fragment.clone();
        let config = tokio::task::spawn_blocking(move || {
            gateway_config::load_str_with(
                &current.source,
                &current.file,
                &current.base_dir,
                Some(&extra),
            )
        })
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))??;
        let result = self.apply_config(Arc::new(config));
        let t = &self.inner.cx.telemetry;
        match &result {
            Ok(()) => {
                *self
                    .inner
                    .cluster_fragment
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(fragment);
                crate::memory::release_freed();
                t.reloads_ok.inc();
                tracing::info!("configuration from kubernetes applied");
            }
            Err(e) => {
                t.reloads_failed.inc();
                tracing::error!(error = %e, "configuration from kubernetes rejected; the running configuration stays");
            }
        }
        result
    }

    /// Swaps in a validated configuration: a new generation, listeners, streams, certificates,
    /// telemetry and admin, everything built before anything is swapped. Both the file reload
    /// and the Kubernetes controller come through here.
    fn apply_config(&self, config: Arc<Config>) -> Result<(), GatewayError> {
        let cx = &self.inner.cx;
        let generation = Arc::new(Generation::build(config.clone(), &cx.telemetry)?);
        // Built before anything is swapped, so a bad endpoint rejects the whole reload.
        let tracer = tracer_for(&cx.telemetry, &config)?;
        let metrics_export = metrics_exporter_for(&cx.telemetry, &config)?;
        // New stream sockets are bound before listeners change, so either failing leaves both
        // as they were.
        let streams = self
            .inner
            .streams
            .prepare(&generation.streams)
            .map_err(stream_error)?;
        self.inner
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .apply(&config, cx)?;
        self.inner.acme.apply(&config, &cx.shutdown);
        self.inner
            .streams
            .commit(streams, config.server.drain_timeout.get());
        cx.generation.store(generation);
        crate::memory::set_burst_size(config.server.release_memory_after_burst);
        // A replaced tracer's exporter sends what it holds and stops once the requests still
        // using it end.
        cx.telemetry.tracer.store(tracer);
        // A replaced metrics exporter stops with its last reference.
        cx.telemetry.metrics_export.store(metrics_export);
        configure_access_log(&cx.telemetry, &config)?;
        self.apply_admin(&config)?;
        Ok(())
    }

    fn apply_admin(&self, config: &Config) -> Result<(), GatewayError> {
        let wanted = config.admin.as_ref().map(|a| a.addr);
        let mut slot = self.inner.admin.lock().unwrap_or_else(|e| e.into_inner());
        // Unchanged, or now naming the port it was given (configured with port 0): keep it.
        if let (Some(current), Some(w)) = (slot.as_ref(), wanted)
            && (current.configured == w || current.local == w)
        {
            return Ok(());
        }
        if slot.is_none() && wanted.is_none() {
            return Ok(());
        }
        if let Some(old) = slot.take() {
            old.stop.cancel();
        }
        if let Some(addr) = wanted {
            let listener = stream_proxy::bind_tcp(addr).map_err(|source| GatewayError::Bind {
                what: "admin".into(),
                addr,
                source,
            })?;
            let local = listener
                .local_addr()
                .map_err(|e| GatewayError::Internal(e.to_string()))?;
            let stop = self.inner.cx.shutdown.child_token();
            tokio::spawn(crate::admin::serve(
                listener,
                local,
                self.clone(),
                stop.clone(),
            ));
            let token = config.admin.as_ref().is_some_and(|a| a.token.is_some());
            if local.ip().is_loopback() || token {
                tracing::info!(addr = %local, token_required = token, "admin API listening");
            } else {
                // Allowed by `admin.allow_remote`; worth a line in every start-up log.
                tracing::warn!(addr = %local, "admin API listening beyond loopback, without a token");
            }
            *slot = Some(AdminHandle {
                configured: addr,
                local,
                stop,
            });
        }
        Ok(())
    }

    /// Stops accepting, waits for in-flight connections (up to the drain timeout), returns.
    pub async fn shutdown(self) {
        let cx = &self.inner.cx;
        let drain = self.generation().config.server.drain_timeout.get();
        cx.shutdown.cancel();
        let quic = {
            let listeners = self
                .inner
                .listeners
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            listeners.stop_all();
            listeners.quic_endpoints()
        };
        let http = async {
            cx.acceptors.close();
            cx.acceptors.wait().await;
            cx.connections.close();
            if tokio::time::timeout(drain, cx.connections.wait())
                .await
                .is_err()
            {
                tracing::warn!(
                    open = cx.connections.len(),
                    "drain timeout reached; closing the remaining connections"
                );
            }
            // Let QUIC's closing packets out before the runtime stops (bounded: a peer that
            // never answers must not hold the exit).
            let idle = futures_util::future::join_all(quic.iter().map(|e| e.wait_idle()));
            let _ = tokio::time::timeout(Duration::from_secs(1), idle).await;
        };
        tokio::join!(http, self.inner.streams.drain(drain));
        // The last requests' lines: the writer writes its queue every round, not every line.
        if let Some(log) = cx.telemetry.access_log.swap(None) {
            log.close(drain.min(TRACE_FLUSH_TIMEOUT)).await;
        }
        // Spans of the last requests: sent if the collector answers soon, else dropped.
        if let Some(tracer) = cx.telemetry.tracer.swap(None) {
            tracer.shutdown(drain.min(TRACE_FLUSH_TIMEOUT)).await;
        }
        // The final values, so the collector sees the requests served while draining.
        if let Some(exporter) = cx.telemetry.metrics_export.swap(None) {
            exporter.shutdown(drain.min(TRACE_FLUSH_TIMEOUT)).await;
        }
    }

    /// Serves until SIGINT or SIGTERM, then drains. SIGHUP reloads the config file; SIGUSR1
    /// reopens the access log (for logrotate). Tells a service manager it is ready once the
    /// signal handlers are in place.
    pub async fn run_until_signal(self) {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut hup), Ok(mut usr1)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
            signal(SignalKind::user_defined1()),
        ) else {
            tracing::error!("cannot install signal handlers; stopping on Ctrl-C only");
            crate::systemd::ready();
            let _ = tokio::signal::ctrl_c().await;
            self.shutdown().await;
            return;
        };
        // Only now: a SIGHUP sent as soon as the service manager hears of readiness must find
        // the handler installed, or its default action would end the process.
        crate::systemd::ready();
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = hup.recv() => { let _ = self.reload().await; }
                _ = usr1.recv() => {
                    if let Some(log) = self.telemetry().access_log.load_full() {
                        log.reopen();
                    }
                }
            }
        }
        tracing::info!("shutting down: draining connections");
        crate::systemd::stopping();
        self.shutdown().await;
        tracing::info!("stopped");
    }
}

impl crate::admin::Control for Gateway {
    fn generation(&self) -> Arc<Generation> {
        Gateway::generation(self)
    }

    fn telemetry(&self) -> &Telemetry {
        Gateway::telemetry(self)
    }

    fn is_ready(&self) -> bool {
        Gateway::is_ready(self)
    }

    fn reload(&self) -> impl Future<Output = Result<(), GatewayError>> + Send {
        Gateway::reload(self)
    }

    fn renew_certificates(&self, name: Option<&str>) -> Option<usize> {
        Gateway::renew_certificates(self, name)
    }
}

/// Stream start and reload errors: bind failures as such, everything else located in the file.
fn stream_error(e: stream_proxy::StreamError) -> GatewayError {
    match e {
        stream_proxy::StreamError::Bind {
            stream,
            addr,
            source,
        } => GatewayError::Bind {
            what: format!("stream `{stream}`"),
            addr,
            source,
        },
        other => GatewayError::Internal(other.to_string()),
    }
}

/// The tracer for `config` (the running one when unchanged), its error located.
fn tracer_for(
    telemetry: &Telemetry,
    config: &Config,
) -> Result<Option<Arc<crate::telemetry::Tracer>>, GatewayError> {
    crate::telemetry::trace::check(&config.telemetry).map_err(|(key, m)| config.error(key, m))?;
    telemetry
        .tracer_for(&config.telemetry)
        .map_err(|m| config.error("telemetry.traces.otlp_endpoint", m).into())
}

/// The metrics exporter for `config` (the running one when unchanged), its error located.
fn metrics_exporter_for(
    telemetry: &Telemetry,
    config: &Config,
) -> Result<Option<Arc<crate::telemetry::MetricsExporter>>, GatewayError> {
    telemetry
        .metrics_exporter_for(&config.telemetry)
        .map_err(|(key, m)| config.error(key, m).into())
}

/// Longest a shutdown waits for the last spans (and metrics) to reach the collector.
const TRACE_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

fn configure_access_log(telemetry: &Telemetry, config: &Config) -> Result<(), GatewayError> {
    let cfg = config.telemetry.access_log.as_ref();
    telemetry.configure_access_log(cfg).map_err(|e| {
        config
            .error(
                "telemetry.access_log.path",
                format!("cannot open the access log: {e}"),
            )
            .into()
    })
}

/// How often the config file is checked for changes.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);
