//! The kubelet's pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`), over gRPC on
//! its unix socket: which devices each container of each pod holds. Only `List` is called; the
//! messages are the proto's, with the fields this exporter reads (prost skips the others).

use std::path::Path;
use std::time::Duration;

/// `/v1.PodResourcesLister/List`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
/// Largest answer read, as CEEMS (a node with thousands of pods).
pub const MAX_ANSWER: usize = 128 << 20;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("pod-resources socket {path}: {message}")]
    Connect { path: String, message: String },
    #[error("pod-resources List: {0}")]
    Call(String),
    #[error("pod-resources List took longer than {0:?}")]
    Timeout(Duration),
}

/// The devices one pod's containers hold, as `(resource name, device id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDevices {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<(String, String)>,
}

/// The pods of an answer that hold devices.
pub fn pod_devices(answer: &ListPodResourcesResponse) -> Vec<PodDevices> {
    answer
        .pod_resources
        .iter()
        .map(|p| PodDevices {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            devices: p
                .containers
                .iter()
                .flat_map(|c| &c.devices)
                .flat_map(|d| {
                    d.device_ids
                        .iter()
                        .map(|id| (d.resource_name.clone(), id.clone()))
                })
                .collect(),
        })
        .filter(|p| !p.devices.is_empty())
        .collect()
}

/// A device id as the GPUs are named: lower case, without a time-slicing replica suffix
/// (`GPU-<uuid>::2`).
pub fn device_key(id: &str) -> String {
    id.split("::")
        .next()
        .unwrap_or(id)
        .trim()
        .to_ascii_lowercase()
}

/// Calls `List` on the kubelet's socket. Blocks: it runs its own small runtime, on a thread of
/// its own, so that it may be called from any thread.
pub fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<ListPodResourcesResponse, PodResourcesError> {
    let socket = socket.to_owned();
    std::thread::scope(|s| {
        s.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| PodResourcesError::Call(format!("cannot start a runtime: {e}")))?;
            runtime.block_on(async {
                tokio::time::timeout(timeout, call(&socket))
                    .await
                    .map_err(|_| PodResourcesError::Timeout(timeout))?
            })
        })
        .join()
        .unwrap_or_else(|_| Err(PodResourcesError::Call("the gRPC call panicked".into())))
    })
}

async fn call(socket: &Path) -> Result<ListPodResourcesResponse, PodResourcesError> {
    let path = socket.to_owned();
    let connect_err = |message: String| PodResourcesError::Connect {
        path: socket.display().to_string(),
        message,
    };
    // The URI is required by the API and never dialled: the connector opens the socket.
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_with_connector(tower::service_fn(move |_: hyper::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| connect_err(error_chain(&e)))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_ANSWER);
    grpc.ready()
        .await
        .map_err(|e| connect_err(error_chain(&e)))?;
    let codec =
        tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
    let answer = grpc
        .unary(
            tonic::Request::new(ListPodResourcesRequest {}),
            hyper::http::uri::PathAndQuery::from_static(LIST_PATH),
            codec,
        )
        .await
        .map_err(|s| PodResourcesError::Call(format!("{}: {}", s.code(), s.message())))?;
    Ok(answer.into_inner())
}

/// An error with its causes, as tonic's transport errors say little on their own.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn devices_of_an_answer_and_their_keys() {
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train".into(),
                    namespace: "ml".into(),
                    containers: vec![ContainerResources {
                        name: "main".into(),
                        devices: vec![ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-AB::1".into(), "GPU-cd".into()],
                        }],
                    }],
                },
                PodResources {
                    name: "web".into(),
                    namespace: "default".into(),
                    containers: vec![ContainerResources::default()],
                },
            ],
        };
        // What goes over the wire comes back the same.
        let bytes = answer.encode_to_vec();
        let back = ListPodResourcesResponse::decode(bytes.as_slice()).unwrap();
        let pods = pod_devices(&back);
        assert_eq!(pods.len(), 1, "a pod without devices is left out");
        assert_eq!(pods[0].devices.len(), 2);
        assert_eq!(device_key(&pods[0].devices[0].1), "gpu-ab");
        assert_eq!(device_key("MIG-1234::7"), "mig-1234");
        assert!(ListPodResourcesResponse::decode(&b"\x0a\xff\xff"[..]).is_err());
    }

    #[test]
    fn a_missing_socket_is_an_error_that_names_it() {
        let e = list(
            Path::new("/nonexistent/kubelet.sock"),
            Duration::from_secs(2),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kubelet.sock"), "{e}");
    }
}
