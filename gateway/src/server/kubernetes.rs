//! Feeds the Kubernetes controller's config fragments into the gateway: each becomes a new
//! generation through the same path as a file reload, and the controller hears whether it
//! took (it writes `Programmed` from that).

use gateway_config::KubernetesConfig;
use gateway_kubernetes::Controller;

use super::Gateway;
use crate::error::GatewayError;

/// Starts the controller; it stops when the gateway drains.
pub(super) fn spawn(gateway: Gateway, config: KubernetesConfig) -> Result<(), GatewayError> {
    let (controller, mut updates) = Controller::start(config)
        .map_err(|e| GatewayError::Internal(format!("kubernetes: {e}")))?;
    tokio::spawn(async move {
        // Owned here: dropped (its watches stopped) when this task ends.
        let _controller = controller;
        let stop = gateway.shutdown_token();
        loop {
            let update = tokio::select! {
                _ = stop.cancelled() => return,
                u = updates.recv() => match u { Some(u) => u, None => return },
            };
            let result = gateway.apply_cluster(update.fragment).await;
            let _ = update.applied.send(result.map_err(|e| e.to_string()));
        }
    });
    Ok(())
}
