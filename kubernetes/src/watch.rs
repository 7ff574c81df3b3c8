//! The cluster's objects kept in memory: one list-then-watch loop per kind (and per watched
//! namespace), each resuming from the last resource version it saw. A watch that ends is
//! resumed; one whose version expired (410 Gone) lists again; a failure waits with backoff.
//! Every change bumps a counter the reconciler waits on: nothing here polls.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

use crate::KubeError;
use crate::client::Client;

/// A kind the controller watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `gateway.networking.k8s.io/v1` GatewayClass (cluster-scoped).
    GatewayClass,
    /// `gateway.networking.k8s.io/v1` Gateway.
    Gateway,
    /// `gateway.networking.k8s.io/v1` HTTPRoute.
    HttpRoute,
    /// `gateway.networking.k8s.io/v1` GRPCRoute.
    GrpcRoute,
    /// `gateway.networking.k8s.io/v1alpha2` TCPRoute (experimental channel).
    TcpRoute,
    /// `gateway.networking.k8s.io/v1alpha2` UDPRoute (experimental channel).
    UdpRoute,
    /// `gateway.networking.k8s.io/v1alpha2` TLSRoute (experimental channel).
    TlsRoute,
    /// `gateway.networking.k8s.io/v1beta1` ReferenceGrant.
    ReferenceGrant,
    /// `v1` Service.
    Service,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `v1` Secret (TLS secrets only).
    Secret,
    /// `v1` Namespace (cluster-scoped), for listeners that admit routes by namespace labels.
    Namespace,
}

impl Kind {
    /// Every watched kind.
    pub const ALL: [Kind; 12] = [
        Kind::GatewayClass,
        Kind::Gateway,
        Kind::HttpRoute,
        Kind::GrpcRoute,
        Kind::TcpRoute,
        Kind::UdpRoute,
        Kind::TlsRoute,
        Kind::ReferenceGrant,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Secret,
        Kind::Namespace,
    ];

    fn api(self) -> (&'static str, &'static str) {
        match self {
            Kind::GatewayClass => ("/apis/gateway.networking.k8s.io/v1", "gatewayclasses"),
            Kind::Gateway => ("/apis/gateway.networking.k8s.io/v1", "gateways"),
            Kind::HttpRoute => ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
            Kind::GrpcRoute => ("/apis/gateway.networking.k8s.io/v1", "grpcroutes"),
            Kind::TcpRoute => ("/apis/gateway.networking.k8s.io/v1alpha2", "tcproutes"),
            Kind::UdpRoute => ("/apis/gateway.networking.k8s.io/v1alpha2", "udproutes"),
            Kind::TlsRoute => ("/apis/gateway.networking.k8s.io/v1alpha2", "tlsroutes"),
            Kind::ReferenceGrant => ("/apis/gateway.networking.k8s.io/v1beta1", "referencegrants"),
            Kind::Service => ("/api/v1", "services"),
            Kind::EndpointSlice => ("/apis/discovery.k8s.io/v1", "endpointslices"),
            Kind::Secret => ("/api/v1", "secrets"),
            Kind::Namespace => ("/api/v1", "namespaces"),
        }
    }

    /// The kind's name as the API spells it (in ReferenceGrants and `supportedKinds`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::GatewayClass => "GatewayClass",
            Kind::Gateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::TcpRoute => "TCPRoute",
            Kind::UdpRoute => "UDPRoute",
            Kind::TlsRoute => "TLSRoute",
            Kind::ReferenceGrant => "ReferenceGrant",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Secret => "Secret",
            Kind::Namespace => "Namespace",
        }
    }

    /// Whether objects of this kind live in namespaces.
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::GatewayClass | Kind::Namespace)
    }

    /// The collection's path, in `namespace` or across all.
    pub fn collection(self, namespace: Option<&str>) -> String {
        let (api, plural) = self.api();
        match namespace {
            Some(ns) if self.namespaced() => format!("{api}/namespaces/{ns}/{plural}"),
            _ => format!("{api}/{plural}"),
        }
    }

    /// One object's path.
    pub fn object(self, namespace: &str, name: &str) -> String {
        let (api, plural) = self.api();
        if self.namespaced() {
            format!("{api}/namespaces/{namespace}/{plural}/{name}")
        } else {
            format!("{api}/{plural}/{name}")
        }
    }

    fn selector(self) -> &'static str {
        // Only TLS secrets can be listener certificates; the rest are none of our business.
        match self {
            Kind::Secret => "fieldSelector=type%3Dkubernetes.io%2Ftls&",
            _ => "",
        }
    }
}

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds.
pub type Key = (String, String);

/// A copy of everything watched, as the reconciler reads it.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    objects: HashMap<Kind, BTreeMap<Key, Arc<Value>>>,
}

impl Snapshot {
    /// Every object of a kind, by key.
    pub fn all(&self, kind: Kind) -> impl Iterator<Item = (&Key, &Arc<Value>)> {
        self.objects.get(&kind).into_iter().flatten()
    }

    /// One object.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(&kind)?
            .get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Adds or replaces an object (tests build snapshots this way).
    pub fn insert(&mut self, kind: Kind, object: Value) {
        let key = key_of(kind, &object);
        self.objects
            .entry(kind)
            .or_default()
            .insert(key, Arc::new(object));
    }
}

fn key_of(kind: Kind, object: &Value) -> Key {
    let meta = &object["metadata"];
    let ns = if kind.namespaced() {
        meta["namespace"].as_str().unwrap_or_default()
    } else {
        ""
    };
    (
        ns.to_owned(),
        meta["name"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Objects at rest, as compact JSON text: a parsed `Value` costs about ten times its text,
/// and the store holds every watched object for as long as the gateway runs. The reconciler
/// parses a [`Snapshot`] per change and drops it when done.
type Objects = HashMap<Kind, BTreeMap<Key, Box<str>>>;

/// An object as kept: without what the controller never reads and the API server adds in
/// bulk (the field managers' records, `kubectl apply`'s copy of the whole object).
fn compact(mut object: Value) -> Box<str> {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    serde_json::to_string(&object)
        .unwrap_or_default()
        .into_boxed_str()
}

/// The shared store and its change counter.
pub struct Store {
    state: Mutex<Objects>,
    changed: watch::Sender<u64>,
    /// Watch loops that have not finished their first list yet.
    unsynced: Mutex<usize>,
}

impl Store {
    /// An empty store expecting `loops` watch loops to list once each.
    pub fn new(loops: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(Objects::default()),
            changed: watch::channel(0).0,
            unsynced: Mutex::new(loops),
        })
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The current state, parsed.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let objects = state
            .iter()
            .map(|(kind, map)| {
                let parsed = map
                    .iter()
                    .filter_map(|(k, text)| {
                        Some((k.clone(), Arc::new(serde_json::from_str(text).ok()?)))
                    })
                    .collect();
                (*kind, parsed)
            })
            .collect();
        Snapshot { objects }
    }

    /// Adds or replaces an object, as a watch event does (benchmarks fill stores this way).
    pub fn insert(&self, kind: Kind, object: Value) {
        self.apply(kind, "ADDED", object);
    }

    /// Whether every watch loop has listed at least once.
    pub fn synced(&self) -> bool {
        *self.unsynced.lock().unwrap_or_else(|e| e.into_inner()) == 0
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn replace(&self, kind: Kind, namespace: Option<&str>, items: Vec<Value>) {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let map = state.entry(kind).or_default();
            map.retain(|(ns, _), _| namespace.is_some_and(|n| n != ns));
            for item in items {
                map.insert(key_of(kind, &item), compact(item));
            }
        }
        self.bump();
    }

    fn apply(&self, kind: Kind, event: &str, object: Value) {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let map = state.entry(kind).or_default();
            let key = key_of(kind, &object);
            if event == "DELETED" {
                map.remove(&key);
            } else {
                map.insert(key, compact(object));
            }
        }
        self.bump();
    }

    fn listed_once(&self) {
        {
            let mut n = self.unsynced.lock().unwrap_or_else(|e| e.into_inner());
            *n = n.saturating_sub(1);
        }
        self.bump();
    }
}

const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// How often a kind the cluster does not serve (its CRD not installed) is asked for again.
const ABSENT_RETRY: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The server ends each watch after this; it is resumed from the same version at once.
const WATCH_SECONDS: u32 = 300;

/// Lists then watches `kind` in `namespace` (all when `None`) until the task is dropped.
pub async fn run(client: Client, kind: Kind, namespace: Option<String>, store: Arc<Store>) {
    let collection = kind.collection(namespace.as_deref());
    let mut backoff = MIN_BACKOFF;
    let mut first = true;
    let mut version: Option<String> = None;
    loop {
        let result = match &version {
            None => list(&client, kind, &collection, namespace.as_deref(), &store).await,
            Some(v) => watch(&client, kind, &collection, v, &store).await,
        };
        match result {
            Ok(next) => {
                if first && version.is_none() {
                    store.listed_once();
                    first = false;
                }
                backoff = MIN_BACKOFF;
                version = Some(next);
            }
            Err(KubeError::Gone) => {
                tracing::debug!(%collection, "watch version expired; listing again");
                version = None;
            }
            Err(KubeError::Status { status: 404, .. }) if version.is_none() => {
                // Not installed (GRPCRoute, ReferenceGrant are optional): none of them exist,
                // and the rest of the cluster must not wait for them.
                tracing::info!(%collection, "not served by this cluster; treated as empty");
                store.replace(kind, namespace.as_deref(), Vec::new());
                if first {
                    store.listed_once();
                    first = false;
                }
                tokio::time::sleep(ABSENT_RETRY).await;
            }
            Err(e) => {
                tracing::warn!(%collection, error = %e, retry_in = ?backoff, "kubernetes watch failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Lists the collection into the store; returns its resource version.
async fn list(
    client: &Client,
    kind: Kind,
    collection: &str,
    namespace: Option<&str>,
    store: &Store,
) -> Result<String, KubeError> {
    let sep = if kind.selector().is_empty() { "" } else { "?" };
    let path = format!("{collection}{sep}{}", kind.selector().trim_end_matches('&'));
    let list = client.get(&path).await?;
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let items = match list["items"].clone() {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    store.replace(kind, namespace, items);
    Ok(version)
}

/// Watches from `version` until the server ends the watch; returns the last version seen.
async fn watch(
    client: &Client,
    kind: Kind,
    collection: &str,
    version: &str,
    store: &Store,
) -> Result<String, KubeError> {
    let path = format!(
        "{collection}?{}watch=1&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&resourceVersion={version}",
        kind.selector()
    );
    let mut stream = client.watch(&path).await?;
    let mut last = version.to_owned();
    // The server ends every watch after WATCH_SECONDS; silence well past that is a connection
    // lost without a reset (network loss), which only a deadline notices.
    let limit = Duration::from_secs(u64::from(WATCH_SECONDS) + 30);
    while let Some(mut event) = tokio::time::timeout(limit, stream.next())
        .await
        .map_err(|_| KubeError::Http("watch silent past its deadline".into()))??
    {
        let kind_of_event = event["type"].as_str().unwrap_or_default().to_owned();
        let object = event["object"].take();
        match kind_of_event.as_str() {
            "ERROR" => {
                if object["code"].as_u64() == Some(410) {
                    return Err(KubeError::Gone);
                }
                return Err(KubeError::Http(format!(
                    "watch error: {}",
                    object["message"].as_str().unwrap_or_default()
                )));
            }
            t => {
                if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
                    last = v.to_owned();
                }
                if t != "BOOKMARK" {
                    store.apply(kind, t, object);
                }
            }
        }
    }
    Ok(last)
}
