//! A stand-in of the kubelet's pod-resources API: a real gRPC server (tonic's server codec over
//! hyper's HTTP/2) on a unix socket, speaking `v1.PodResourcesLister/List` with the exporter's
//! own message types.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use ceems::manager::k8s::podresources::{ListPodResourcesRequest, ListPodResourcesResponse};

/// What `List` answers; replace it to change the node's allocations.
pub type Answer = Arc<Mutex<ListPodResourcesResponse>>;

#[derive(Clone)]
struct Lister(Answer);

impl tonic::server::NamedService for Lister {
    const NAME: &'static str = "v1.PodResourcesLister";
}

struct List(ListPodResourcesResponse);

impl tonic::server::UnaryService<ListPodResourcesRequest> for List {
    type Response = ListPodResourcesResponse;
    type Future = std::future::Ready<Result<tonic::Response<Self::Response>, tonic::Status>>;

    fn call(&mut self, _: tonic::Request<ListPodResourcesRequest>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(self.0.clone())))
    }
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Lister {
    type Response = hyper::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let answer = self.0.lock().unwrap().clone();
        Box::pin(async move {
            if req.uri().path() != ceems::manager::k8s::podresources::LIST_PATH {
                return Ok(tonic::Status::unimplemented(req.uri().path().to_owned()).into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(List(answer), req).await)
        })
    }
}

/// Serves `answer` on `socket` until the test process ends.
pub fn serve(socket: &Path, answer: Answer) {
    let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind the kubelet socket");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::UnixListener::from_std(listener).expect("tokio listener");
            // gRPC is HTTP/2: one connection per client, served until it closes.
            while let Ok((stream, _)) = listener.accept().await {
                let service = Lister(Arc::clone(&answer));
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
            }
        });
    });
}
