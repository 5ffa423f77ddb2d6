//! The load test's HTTP/1.1 client: one keep-alive connection per client thread, on hyper's
//! client half (the service's own HTTP stack) and a single-threaded tokio runtime, so each
//! thread stays a plain blocking loop.

use anyhow::{anyhow, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::time::Duration;

pub struct Client {
    runtime: tokio::runtime::Runtime,
    addr: String,
    timeout: Duration,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// What came back: the status and the whole body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Client {
    /// `addr` is `host:port`; every request gives up after `timeout`.
    pub fn new(addr: &str, timeout: Duration) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .context("cannot start the client's runtime")?;
        Ok(Client {
            runtime,
            addr: addr.to_string(),
            timeout,
            sender: None,
        })
    }

    pub fn get(&mut self, path: &str) -> Result<Answer> {
        self.send("GET", path, None, Vec::new())
    }

    pub fn post(&mut self, path: &str, content_type: &str, body: &[u8]) -> Result<Answer> {
        self.send("POST", path, Some(content_type), body.to_vec())
    }

    fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Answer> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.addr);
        if let Some(ct) = content_type {
            request = request.header(hyper::header::CONTENT_TYPE, ct);
        }
        let request = request.body(Full::new(Bytes::from(body)))?;
        let (addr, timeout) = (self.addr.clone(), self.timeout);
        let mut sender = self.sender.take();
        let answer = self.runtime.block_on(async move {
            let exchange = async {
                let ready = match sender.as_mut() {
                    Some(s) => s.ready().await.is_ok(),
                    None => false,
                };
                if !ready {
                    sender = Some(connect(&addr).await?);
                }
                let s = sender.as_mut().expect("connected above");
                let response = s.send_request(request).await?;
                let status = response.status().as_u16();
                let body = response.into_body().collect().await?.to_bytes().to_vec();
                anyhow::Ok(Answer { status, body })
            };
            let answer = tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| anyhow!("no answer within {} s", timeout.as_secs_f64()))
                .and_then(|a| a);
            (answer, sender)
        });
        let (answer, sender) = answer;
        // A connection that failed or timed out is not reused.
        self.sender = if answer.is_ok() { sender } else { None };
        answer
    }
}

async fn connect(addr: &str) -> Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}
