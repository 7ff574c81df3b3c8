//! The chain's contract (order of hooks, refusal closes the instances already made, reverse
//! order upstream) and the native CIDR filters.

use std::sync::Mutex;

use super::*;

type Log = Arc<Mutex<Vec<String>>>;

/// Records every hook call; closes on `close_on` if set, and upper-cases client data.
struct Recorder {
    name: &'static str,
    log: Log,
    refuse: bool,
}

impl StreamFilterFactory for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn create(&self) -> Box<dyn StreamFilter> {
        Box::new(Recorder {
            name: self.name,
            log: self.log.clone(),
            refuse: self.refuse,
        })
    }
    fn inspects_data(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl StreamFilter for Recorder {
    async fn on_connect(&mut self, _: &ConnectionInfo) -> Decision {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} connect", self.name));
        if self.refuse {
            Decision::Close
        } else {
            Decision::Continue
        }
    }
    async fn on_downstream_data(&mut self, data: &mut BytesMut, eos: bool) -> Decision {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} down {eos}", self.name));
        data.extend_from_slice(self.name.as_bytes());
        Decision::Continue
    }
    async fn on_upstream_data(&mut self, data: &mut BytesMut, _: bool) -> Decision {
        self.log.lock().unwrap().push(format!("{} up", self.name));
        data.extend_from_slice(self.name.as_bytes());
        Decision::Continue
    }
    async fn on_close(&mut self, _: &ConnectionInfo, s: &CloseSummary) {
        let why = s.error.clone().unwrap_or_default();
        self.log
            .lock()
            .unwrap()
            .push(format!("{} close {why}", self.name));
    }
}

fn info(client: &str) -> ConnectionInfo {
    let client = client.parse().unwrap();
    ConnectionInfo {
        stream: Arc::from("s"),
        protocol: StreamProtocol::Tcp,
        client,
        peer: client,
        local: "127.0.0.1:1".parse().unwrap(),
    }
}

fn chain(log: &Log, refuse_b: bool) -> FilterChain {
    let mk = |name, refuse| -> Arc<dyn StreamFilterFactory> {
        Arc::new(Recorder {
            name,
            log: log.clone(),
            refuse,
        })
    };
    FilterChain::new(vec![mk("a", false), mk("b", refuse_b), mk("c", false)])
}

#[tokio::test]
async fn hooks_run_in_order_and_upstream_in_reverse() {
    let log = Log::default();
    let c = chain(&log, false);
    assert!(c.inspects_data());
    let mut active = c.connect(&info("10.0.0.1:5")).await.unwrap();
    let mut data = BytesMut::from(&b">"[..]);
    active.downstream(&mut data, true).await.unwrap();
    assert_eq!(&data[..], b">abc");
    let mut data = BytesMut::from(&b"<"[..]);
    active.upstream(&mut data, false).await.unwrap();
    assert_eq!(&data[..], b"<cba");
    active
        .close(&info("10.0.0.1:5"), &CloseSummary::default())
        .await;
    assert_eq!(
        *log.lock().unwrap(),
        [
            "a connect",
            "b connect",
            "c connect",
            "a down true",
            "b down true",
            "c down true",
            "c up",
            "b up",
            "a up",
            "a close ",
            "b close ",
            "c close ",
        ]
    );
}

#[tokio::test]
async fn a_refusal_stops_the_chain_and_closes_what_was_made() {
    let log = Log::default();
    let refused = chain(&log, true).connect(&info("10.0.0.1:5")).await;
    assert_eq!(refused.err().as_deref(), Some("b"));
    assert_eq!(
        *log.lock().unwrap(),
        [
            "a connect",
            "b connect",
            "a close refused by filter `b`",
            "b close refused by filter `b`",
        ]
    );
}

#[tokio::test]
async fn allow_and_deny() {
    let nets: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    let allow = FilterChain::new(vec![Arc::new(CidrFilterFactory::allow(&nets))]);
    let deny = FilterChain::new(vec![Arc::new(CidrFilterFactory::deny(&nets))]);
    assert!(!allow.inspects_data());
    for (client, inside) in [
        ("10.1.2.3:1", true),
        ("[::ffff:10.1.2.3]:1", true),
        ("[::1]:1", true),
        ("192.168.0.1:1", false),
        ("[::2]:1", false),
    ] {
        assert_eq!(
            allow.connect(&info(client)).await.is_ok(),
            inside,
            "{client}"
        );
        assert_eq!(
            deny.connect(&info(client)).await.is_ok(),
            !inside,
            "{client}"
        );
    }
}
