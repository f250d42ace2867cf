//! The operator's HTTP endpoints: `/healthz`, `/readyz` and `/metrics`.
//! Deliberately tiny: three GET routes need no web framework.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::health::Health;
use crate::metrics::Metrics;

/// Serves the endpoints on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Health) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = match tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let state = |result: Result<String, String>| match result {
                Ok(text) => ("200 OK", "text/plain", format!("ok: {text}")),
                Err(text) => ("503 Service Unavailable", "text/plain", text),
            };
            let (code, content_type, body) = match path {
                "/healthz" => state(health.liveness()),
                "/readyz" => state(health.readiness()),
                "/metrics" => ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.encode()),
                _ => ("404 Not Found", "text/plain", "not found".to_string()),
            };
            let response = format!(
                "HTTP/1.1 {code}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The whole answer (head and body) to `GET path` at `addr`.
    pub(crate) async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.expect("write");
        let mut out = String::new();
        stream.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn health_readiness_and_metrics_are_served() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let metrics = Arc::new(Metrics::default());
        metrics.plugin_load("postgres", "loaded");
        let health = Health::default();
        tokio::spawn(serve(listener, metrics, health.clone()));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"), "not ready before the caches are");
        health.set_leading(true);
        health.set_synced();
        let ready = get(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 200") && ready.ends_with("ok: leading"), "{ready}");
        let body = get(addr, "/metrics").await;
        assert!(body.contains(r#"plugdb_plugin_loads_total{engine="postgres",outcome="loaded"} 1"#), "{body}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
    }
}
