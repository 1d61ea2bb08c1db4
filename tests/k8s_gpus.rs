//! Which GPUs pods hold, through the real protocols: the kubelet's pod-resources API as a gRPC
//! stand-in on a unix socket allocating a whole GPU, MIG instances (by MIG UUID) and
//! time-sliced replicas (`::n`), and the API server as an HTTPS stand-in that names the pods
//! of this node only (`NODE_NAME`'s field selector). A pod the API server does not place on
//! this node gets nothing; an answer that changes is read again when the pods change.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ceems::collect::gpu::GpuDevice;
use ceems::manager::k8s::api::KubeClient;
use ceems::manager::k8s::podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
};
use ceems::manager::k8s::{GpuLookup, K8sManager};
use ceems::manager::{ResourceManager, UnitCgroup};
use common::http::{Request, Response, TestServer};
use serde_json::json;

fn device(index: usize, minor: u32, mig: Option<(u32, &str)>) -> GpuDevice {
    GpuDevice {
        index,
        minor,
        uuid: format!("GPU-0000000{minor}-aaaa-bbbb-cccc-dddddddddddd"),
        gpu_instance_id: mig.map(|(gi, _)| gi),
        instance_uuid: mig.map(|(_, u)| u.to_owned()),
        sm_count: Some(if mig.is_some() { 42 } else { 132 }),
        fraction: if mig.is_some() { 0.5 } else { 1.0 },
        model: "NVIDIA H100 80GB HBM3".into(),
        bus_id: String::new(),
        vgpu: false,
    }
}

fn pod(name: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: "ml".into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            }],
        }],
    }
}

/// A device a pod holds: its index, GPU instance and the pod's share (rounded).
type Held = (u32, Option<u32>, String);

fn unit(uid: &str) -> UnitCgroup {
    UnitCgroup {
        uuid: uid.into(),
        cgroup_host: String::new(),
        rel: PathBuf::new(),
        dir: PathBuf::new(),
        dir_ino: None,
    }
}

#[test]
fn whole_mig_and_time_sliced_gpus_reach_the_right_pods() {
    let tmp = tempfile::tempdir().unwrap();
    let devices = vec![
        device(0, 0, None),
        device(1, 1, Some((1, "MIG-11111111-2222-3333-4444-555555555555"))),
        device(2, 1, Some((2, "MIG-66666666-7777-8888-9999-000000000000"))),
        device(3, 2, None),
    ];
    let whole = "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd";
    let sliced = "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd";
    let answer = Arc::new(Mutex::new(ListPodResourcesResponse {
        pod_resources: vec![
            pod(
                "train",
                &[whole, "MIG-11111111-2222-3333-4444-555555555555"],
            ),
            pod(
                "infer-a",
                &[
                    &format!("{sliced}::1"),
                    &format!("{sliced}::2"),
                    &format!("{sliced}::3"),
                ],
            ),
            pod(
                "infer-b",
                &[
                    &format!("{sliced}::4"),
                    "mig-66666666-7777-8888-9999-000000000000",
                ],
            ),
            // Elsewhere, as the API server says: gets nothing here.
            pod("other-node", &[whole]),
            pod("no-gpu", &[]),
        ],
    }));
    let socket = tmp.path().join("kubelet.sock");
    common::kubelet::serve(&socket, Arc::clone(&answer));
    let api = TestServer::start(
        true,
        Arc::new(|req: &Request| {
            // Only this node's pods are asked for.
            if req.target != "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-01" {
                return Response::json(
                    400,
                    json!({"kind": "Status", "code": 400, "message": req.target}),
                );
            }
            let item = |name: &str, uid: &str| json!({"metadata": {"name": name, "namespace": "ml", "uid": uid}});
            Response::json(
                200,
                json!({"kind": "PodList", "items": [
                    item("train", "uid-train"), item("infer-a", "uid-a"), item("infer-b", "uid-b"), item("no-gpu", "uid-none")
                ]}),
            )
        }),
    );
    let kubeconfig = tmp.path().join("kubeconfig.yml");
    std::fs::write(
        &kubeconfig,
        format!(
            "clusters:\n- name: k\n  cluster: {{server: '{}', certificate-authority-data: '{}'}}\ncontexts:\n- name: k\n  context: {{cluster: k, user: u}}\ncurrent-context: k\nusers:\n- name: u\n  user: {{}}\n",
            api.url(),
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &api.cert_pem)
        ),
    )
    .unwrap();
    let kube = KubeClient::from_kubeconfig(&kubeconfig, std::time::Duration::from_secs(5)).unwrap();
    let manager = K8sManager::new(tmp.path(), ceems::host::cgroup::CgroupVersion::V2, "cpu")
        .with_gpus(
            devices,
            GpuLookup {
                socket,
                kube,
                node: Some("gpu-01".into()),
            },
        );
    let units = [
        unit("uid-train"),
        unit("uid-a"),
        unit("uid-b"),
        unit("uid-none"),
    ];
    let held = |units: &[UnitCgroup]| -> Vec<(String, Vec<Held>)> {
        let mut out: Vec<_> = manager
            .gpus(units)
            .into_iter()
            .map(|u| {
                let d = u
                    .devices
                    .iter()
                    .map(|(i, d, share)| (*i, d.gpu_instance_id, format!("{share:.2}")))
                    .collect();
                (u.uuid, d)
            })
            .collect();
        out.sort();
        out
    };
    assert_eq!(
        held(&units),
        [
            ("uid-a".into(), vec![(3, None, "0.75".into())]),
            (
                "uid-b".into(),
                vec![(2, Some(2), "1.00".into()), (3, None, "0.25".into())]
            ),
            (
                "uid-train".into(),
                vec![(0, None, "1.00".into()), (1, Some(1), "1.00".into())]
            ),
        ]
    );
    // The kubelet moves a replica; the next pod set asks again.
    answer.lock().unwrap().pod_resources[1] = pod("infer-a", &[&format!("{sliced}::1")]);
    let fewer = [unit("uid-a"), unit("uid-b")];
    assert_eq!(
        held(&fewer),
        [
            ("uid-a".into(), vec![(3, None, "0.50".into())]),
            (
                "uid-b".into(),
                vec![(2, Some(2), "1.00".into()), (3, None, "0.50".into())]
            ),
        ]
    );
    assert_eq!(api.seen().len(), 2, "asked once per pod set");
}
