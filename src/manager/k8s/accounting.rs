//! The stats-server's side of Kubernetes: pods from the API server, listed once and then
//! followed with a watch from the list's resource version. A watch that ends (the server's
//! timeout, a dropped connection) is resumed from the last version seen; `410 Gone` (that
//! version is too old) forces a new list. Pods that end are kept a week, so that the
//! stats-server's windows see them end. Users' projects are the namespaces RoleBindings give them.

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use super::api::{KubeClient, KubeError};
use super::pod::{owner, record, Pod, PodPolicy};
use crate::host::ParseError;
use crate::manager::{unix_now, Accounting, AccountingError, Associations, UnitRecords};

/// How long ended pods are kept.
const KEEP_ENDED: i64 = 7 * 86_400;
/// What a watch asks the server to hold it open for.
pub const WATCH_SECONDS: u64 = 300;
/// How often pods are listed again where the server's list gives no resource version to
/// watch from (a proxy or stand-in that answers only lists).
pub const RELIST_WITHOUT_VERSION: Duration = Duration::from_secs(30);

/// A pod as the store holds it.
#[derive(Debug)]
struct Held {
    pod: Pod,
    /// When the watch saw it deleted.
    deleted: Option<i64>,
    /// When the store learned its latest change: a pod that ended long before a list found
    /// it ended is still reported once.
    changed: i64,
}

/// The pods the watch knows.
#[derive(Debug, Default)]
pub struct PodStore {
    pods: HashMap<String, Held>,
    /// The last resource version seen; None: list again.
    pub version: Option<String>,
    /// Lists and watches begun, for the logs and tests.
    pub lists: u64,
    pub watches: u64,
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
    /// The token of the next page; empty on the last.
    #[serde(default, rename = "continue")]
    next: String,
}

/// Pods per page of a list: a cluster of 100,000 pods is read in pages, never one answer.
pub const LIST_PAGE: usize = 500;
/// Lists begun again after a page's token expired (`410 Gone`) before one is given up.
const LIST_RESTARTS: usize = 3;

/// Every pod of the cluster, in pages of [`LIST_PAGE`] (`limit` and `continue`, all pages one
/// snapshot of the server's). A token that expired mid-list (`410 Gone`) starts the list again;
/// any other failed page fails the whole list, and nothing of it is taken.
fn list_pods(client: &KubeClient) -> Result<(Vec<Pod>, String), String> {
    let mut restarts = 0;
    'list: loop {
        let mut pods = Vec::new();
        let mut version = String::new();
        let mut token = String::new();
        loop {
            let mut path = format!("/api/v1/pods?limit={LIST_PAGE}");
            if !token.is_empty() {
                path.push_str("&continue=");
                path.extend(form_urlencoded::byte_serialize(token.as_bytes()));
            }
            let body = match client.get(&path) {
                Ok(body) => body,
                Err(KubeError::Status { code: 410, .. })
                    if !token.is_empty() && restarts < LIST_RESTARTS =>
                {
                    restarts += 1;
                    tracing::info!(pods_so_far = pods.len(), "pod list's continue token expired (410 Gone): listing again from the start");
                    continue 'list;
                }
                Err(e) => return Err(e.to_string()),
            };
            let page: PodList =
                serde_json::from_str(&body).map_err(|e| format!("pod list page: {e}"))?;
            if version.is_empty() {
                version = page.metadata.resource_version;
            }
            pods.extend(page.items);
            if page.metadata.next.is_empty() {
                return Ok((pods, version));
            }
            // A server that hands back the same token would be followed for ever.
            if page.metadata.next == token {
                return Err(format!(
                    "pod list: the continue token did not move after {} pods",
                    pods.len()
                ));
            }
            token = page.metadata.next;
        }
    }
}

#[derive(Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

impl PodStore {
    /// Takes a list: pods it lacks that the store had alive are gone (deleted while no watch
    /// ran).
    pub fn apply_list(&mut self, json: &str, now: i64) -> Result<(), String> {
        let list: PodList = serde_json::from_str(json).map_err(|e| format!("pod list: {e}"))?;
        self.apply_pods(list.items, list.metadata.resource_version, now);
        Ok(())
    }

    /// Takes every pod of a list and the list's resource version.
    pub fn apply_pods(&mut self, items: Vec<Pod>, version: String, now: i64) {
        let listed: HashMap<String, Pod> = items
            .into_iter()
            .filter(|p| !p.metadata.uid.is_empty())
            .map(|p| (p.metadata.uid.clone(), p))
            .collect();
        for (uid, held) in self.pods.iter_mut() {
            if !listed.contains_key(uid) && held.deleted.is_none() {
                held.deleted = Some(now);
                held.changed = now;
            }
        }
        for (uid, pod) in listed {
            let same = self.pods.get(&uid).is_some_and(|h| {
                h.deleted.is_none()
                    && h.pod.metadata.resource_version == pod.metadata.resource_version
            });
            if !same {
                self.pods.insert(
                    uid,
                    Held {
                        pod,
                        deleted: None,
                        changed: now,
                    },
                );
            }
        }
        self.version = Some(version).filter(|v| !v.is_empty());
        self.lists += 1;
    }

    /// Takes one watch event line. Ok(false): the version is gone, list again.
    pub fn apply_event(&mut self, line: &str, now: i64) -> Result<bool, String> {
        let event: WatchEvent =
            serde_json::from_str(line).map_err(|e| format!("watch event: {e}"))?;
        if event.kind == "ERROR" {
            let code = event.object.get("code").and_then(|c| c.as_i64());
            return match code {
                Some(410) => Ok(false),
                _ => Err(format!("watch error: {}", event.object)),
            };
        }
        let pod: Pod =
            serde_json::from_value(event.object).map_err(|e| format!("watch event object: {e}"))?;
        if !pod.metadata.resource_version.is_empty() {
            self.version = Some(pod.metadata.resource_version.clone());
        }
        let deleted = match event.kind.as_str() {
            "ADDED" | "MODIFIED" => None,
            "DELETED" => Some(now),
            // BOOKMARK: only its version.
            _ => return Ok(true),
        };
        if !pod.metadata.uid.is_empty() {
            self.pods.insert(
                pod.metadata.uid.clone(),
                Held {
                    pod,
                    deleted,
                    changed: now,
                },
            );
        }
        Ok(true)
    }

    /// Forgets pods that ended long ago.
    pub fn prune(&mut self, policy: &PodPolicy, now: i64) {
        self.pods.retain(|_, h| {
            record(&h.pod, policy, h.deleted, now)
                .end
                .is_none_or(|end| now - end.max(h.changed) < KEEP_ENDED)
        });
    }

    /// Records of the pods alive, or that ended or changed in the last `seconds_ago` seconds.
    /// Pods that never started (pending, no start time) are left out, as CEEMS 0.14+ leaves
    /// them out: they use nothing yet, and one deleted before it starts never ran.
    pub fn records(&self, policy: &PodPolicy, seconds_ago: i64, now: i64) -> UnitRecords {
        let since = now.saturating_sub(seconds_ago);
        let records: Vec<_> = self
            .pods
            .values()
            .filter(|h| h.pod.status.phase != "Pending" || h.pod.status.start_time.is_some())
            .filter_map(|h| {
                let r = record(&h.pod, policy, h.deleted, now);
                (r.end.is_none_or(|end| end >= since) || h.changed >= since).then_some(Ok(r))
            })
            .collect();
        Box::new(records.into_iter())
    }
}

/// A name as one segment of an API path.
fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One cluster's pods, followed by a thread of its own.
pub struct K8sAccounting {
    store: Arc<Mutex<PodStore>>,
    policy: PodPolicy,
    client: Arc<KubeClient>,
    /// CEEMS's `ns_users_list_file`: namespaces' users that no RoleBinding names.
    ns_users_file: Option<std::path::PathBuf>,
}

impl K8sAccounting {
    /// Starts following the pods: `client` for lists, `watcher` (whose timeout outlasts a
    /// watch) for watches.
    pub fn start(
        client: KubeClient,
        watcher: KubeClient,
        policy: PodPolicy,
        cluster: &str,
    ) -> K8sAccounting {
        let store = Arc::new(Mutex::new(PodStore::default()));
        let client = Arc::new(client);
        let (s, c, p) = (Arc::clone(&store), Arc::clone(&client), policy.clone());
        let cluster = cluster.to_owned();
        let spawned = std::thread::Builder::new()
            .name("ceems-k8s-watch".into())
            .spawn(move || follow(&s, &c, &watcher, &p, &cluster));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the pod watch");
        }
        K8sAccounting {
            store,
            policy,
            client,
            ns_users_file: None,
        }
    }

    /// Also reads the users of each namespace from `path` (`users: {ns: [user, …]}`, as a
    /// site's admission controller or a ConfigMap writes it) at every pull.
    pub fn with_ns_users_file(mut self, path: Option<std::path::PathBuf>) -> K8sAccounting {
        self.ns_users_file = path;
        self
    }

    pub fn store(&self) -> Arc<Mutex<PodStore>> {
        Arc::clone(&self.store)
    }
}

/// Lists, then watches from the list's version, for ever.
fn follow(
    store: &Mutex<PodStore>,
    client: &KubeClient,
    watcher: &KubeClient,
    policy: &PodPolicy,
    cluster: &str,
) {
    let mut backoff = Duration::from_secs(1);
    let mut said_unversioned = false;
    loop {
        let version = store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .version
            .clone();
        let began = std::time::Instant::now();
        let watching = version.is_some();
        let result = match version {
            None => list_pods(client).map(|(pods, version)| {
                let mut s = store.lock().unwrap_or_else(|p| p.into_inner());
                let listed = pods.len();
                s.apply_pods(pods, version, unix_now());
                s.prune(policy, unix_now());
                tracing::info!(cluster, pods = listed, version = ?s.version, "pods listed");
            }),
            Some(v) => watch(store, watcher, &v),
        };
        match result {
            Ok(()) => {
                backoff = Duration::from_secs(1);
                // A server that ends watches at once must not be asked in a tight loop.
                if watching && began.elapsed() < Duration::from_secs(1) {
                    std::thread::sleep(Duration::from_secs(1));
                }
                // A list without a version cannot be watched from: listed again later, not
                // at once (CEEMS's mock API server was asked 182 times in 4 s).
                let unversioned = store
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .version
                    .is_none();
                if !watching && unversioned {
                    if !said_unversioned {
                        tracing::warn!(
                            cluster,
                            every = ?RELIST_WITHOUT_VERSION,
                            "the API server's pod list has no resourceVersion, so it cannot be watched: listing pods again periodically"
                        );
                        said_unversioned = true;
                    }
                    std::thread::sleep(RELIST_WITHOUT_VERSION);
                }
            }
            Err(e) => {
                tracing::warn!(cluster, error = %e, retry_in = ?backoff, "pod list or watch failed");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// One watch from `version` until the server ends it.
fn watch(store: &Mutex<PodStore>, watcher: &KubeClient, version: &str) -> Result<(), String> {
    let path = format!(
        "/api/v1/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&resourceVersion={}",
        form_urlencoded::byte_serialize(version.as_bytes()).collect::<String>()
    );
    store.lock().unwrap_or_else(|p| p.into_inner()).watches += 1;
    let body = watcher.stream(&path).map_err(|e| e.to_string())?;
    // A line is one event.
    for line in std::io::BufReader::new(body).lines() {
        let line = line.map_err(|e| format!("watch stream: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut s = store.lock().unwrap_or_else(|p| p.into_inner());
        match s.apply_event(&line, unix_now()) {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(version, "watch version expired (410 Gone): listing again");
                s.version = None;
                return Ok(());
            }
            Err(e) => tracing::warn!(error = %e, "skipping a watch event"),
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct BindingList {
    #[serde(default)]
    items: Vec<Binding>,
}

#[derive(Deserialize)]
struct Binding {
    #[serde(default)]
    metadata: super::pod::Metadata,
    #[serde(default)]
    subjects: Vec<Subject>,
}

#[derive(Deserialize)]
struct Subject {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
}

/// CEEMS's users file: `users: {namespace: [user, …]}` as (user, namespace). A file that is
/// absent has no users; one that cannot be read or parsed is an error of this pull.
pub fn read_ns_users(path: &std::path::Path) -> Result<Vec<(String, String)>, ParseError> {
    #[derive(Deserialize)]
    struct UsersFile {
        #[serde(default)]
        users: std::collections::BTreeMap<String, Vec<String>>,
    }
    let error = |reason: String| ParseError::new(0, format!("{}: {reason}", path.display()));
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(error(format!("cannot read the namespaces' users: {e}"))),
    };
    let file: UsersFile = serde_norway::from_str(&text).map_err(|e| {
        error(format!(
            "not a users file (users: {{namespace: [user]}}): {e}"
        ))
    })?;
    Ok(file
        .users
        .into_iter()
        .flat_map(|(ns, users)| users.into_iter().map(move |u| (u, ns.clone())))
        .filter(|(u, ns)| !u.is_empty() && !ns.is_empty())
        .collect())
}

/// Adds (user, project) pairs to `a`, each once, their projects too.
fn merge_members(a: &mut Associations, pairs: Vec<(String, String)>) {
    let mut projects: std::collections::HashSet<String> = a.projects.iter().cloned().collect();
    let mut members: std::collections::HashSet<(String, String)> =
        a.members.iter().cloned().collect();
    for (user, project) in pairs {
        if projects.insert(project.clone()) {
            a.projects.push(project.clone());
        }
        if !members.contains(&(user.clone(), project.clone())) {
            members.insert((user.clone(), project.clone()));
            a.members.push((user, project));
        }
    }
}

/// Users and their namespaces from a `RoleBindingList`: subjects of kind `User`.
pub fn parse_bindings(json: &str) -> Result<Associations, String> {
    let list: BindingList =
        serde_json::from_str(json).map_err(|e| format!("role bindings: {e}"))?;
    let mut a = Associations::default();
    for b in list.items {
        let ns = b.metadata.namespace;
        if ns.is_empty() {
            continue;
        }
        if !a.projects.contains(&ns) {
            a.projects.push(ns.clone());
        }
        for s in b
            .subjects
            .into_iter()
            .filter(|s| s.kind == "User" && !s.name.is_empty())
        {
            let pair = (s.name, ns.clone());
            if !a.members.contains(&pair) {
                a.members.push(pair);
            }
        }
    }
    Ok(a)
}

impl Accounting for K8sAccounting {
    fn manager(&self) -> &'static str {
        super::MANAGER
    }

    fn units_since(&self, seconds_ago: i64) -> Result<UnitRecords, AccountingError> {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        if store.lists == 0 {
            return Err(AccountingError::Other(
                "the pods have not been listed yet".into(),
            ));
        }
        Ok(store.records(&self.policy, seconds_ago.max(0), unix_now()))
    }

    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let records: Vec<_> = store
            .records(&self.policy, i64::MAX / 4, unix_now())
            .filter(|r| r.as_ref().is_ok_and(|r| r.uuid == id))
            .collect();
        Ok(Box::new(records.into_iter()))
    }

    /// Deletes the pod, on the condition that it is still the one of this uid (a pod made
    /// again under its name is another unit).
    fn cancel(&self, unit: &crate::manager::UnitRecord) -> Result<String, AccountingError> {
        let meta = {
            let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            store.pods.get(&unit.uuid).map(|h| h.pod.metadata.clone())
        };
        let Some(meta) = meta else {
            return Err(AccountingError::Other(format!(
                "pod {} is not known to the watch",
                unit.uuid
            )));
        };
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            encode(&meta.namespace),
            encode(&meta.name)
        );
        let body = serde_json::json!({
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": unit.uuid},
        });
        self.client
            .delete(&path, &body)
            .map_err(|e| AccountingError::Other(e.to_string()))?;
        Ok(format!("pod {}/{} deleted", meta.namespace, meta.name))
    }

    /// As CEEMS: a namespace's users are those of the users file, its RoleBindings' users and
    /// whoever owns one of its pods.
    fn associations(&self) -> Option<Result<(Associations, Vec<ParseError>), AccountingError>> {
        let bindings = self
            .client
            .get("/apis/rbac.authorization.k8s.io/v1/rolebindings")
            .map_err(|e| AccountingError::Other(e.to_string()))
            .and_then(|body| parse_bindings(&body).map_err(AccountingError::Other));
        let mut associations = match bindings {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        let mut errors = Vec::new();
        let mut pairs = Vec::new();
        if let Some(path) = &self.ns_users_file {
            match read_ns_users(path) {
                Ok(found) => pairs.extend(found),
                Err(e) => errors.push(e),
            }
        }
        {
            let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            pairs.extend(store.pods.values().map(|h| owner(&h.pod, &self.policy)));
        }
        merge_members(&mut associations, pairs);
        Some(Ok((associations, errors)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, phase: &str, version: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"p-{uid}","namespace":"ml","uid":"{uid}","resourceVersion":"{version}","creationTimestamp":"2026-11-25T10:00:00Z","annotations":{{"ceems.io/created-by":"alice"}}}},"spec":{{"nodeName":"n1"}},"status":{{"phase":"{phase}","startTime":"2026-11-25T10:00:10Z"}}}}"#
        )
    }

    #[test]
    fn list_then_events_then_gone_then_list_again() {
        let mut s = PodStore::default();
        let now = crate::manager::civil::parse_rfc3339("2026-11-25T11:00:00Z").unwrap();
        let list = format!(
            r#"{{"metadata":{{"resourceVersion":"100"}},"items":[{},{}]}}"#,
            pod("a", "Running", "90"),
            pod("b", "Pending", "95")
        );
        s.apply_list(&list, now).unwrap();
        assert_eq!(s.version.as_deref(), Some("100"));
        assert!(s
            .apply_event(
                &format!(
                    r#"{{"type":"MODIFIED","object":{}}}"#,
                    pod("b", "Running", "101")
                ),
                now
            )
            .unwrap());
        assert!(s
            .apply_event(
                &format!(
                    r#"{{"type":"DELETED","object":{}}}"#,
                    pod("a", "Running", "102")
                ),
                now
            )
            .unwrap());
        assert!(s.apply_event(r#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"105"}}}"#, now).unwrap());
        assert_eq!(s.version.as_deref(), Some("105"));
        let policy = PodPolicy::default();
        let mut got: Vec<(String, String)> = s
            .records(&policy, 3600, now)
            .map(|r| r.unwrap())
            .map(|r| (r.uuid, r.state))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("a".into(), "CANCELLED".into()),
                ("b".into(), "RUNNING".into())
            ]
        );
        assert!(!s
            .apply_event(
                r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}"#,
                now
            )
            .unwrap());
        assert!(s.apply_event("{not json", now).is_err());
        // Listed again without b: it ended while nobody watched.
        let list = format!(
            r#"{{"metadata":{{"resourceVersion":"200"}},"items":[{}]}}"#,
            pod("c", "Running", "150")
        );
        s.apply_list(&list, now + 60).unwrap();
        let b = s
            .records(&policy, 3600, now + 60)
            .map(|r| r.unwrap())
            .find(|r| r.uuid == "b")
            .unwrap();
        assert_eq!((b.state.as_str(), b.end), ("CANCELLED", Some(now + 60)));
        // A week later the ended pods are forgotten.
        s.prune(&policy, now + KEEP_ENDED + 120);
        assert_eq!(s.records(&policy, i64::MAX / 4, now).count(), 1);
    }

    #[test]
    fn role_bindings_give_users_their_namespaces() {
        let doc = r#"{"items":[
          {"metadata":{"name":"edit","namespace":"ml"},"subjects":[{"kind":"User","name":"alice"},{"kind":"ServiceAccount","name":"ci"},{"kind":"Group","name":"devs"}]},
          {"metadata":{"name":"view","namespace":"web"},"subjects":[{"kind":"User","name":"alice"},{"kind":"User","name":"bob"}]}
        ]}"#;
        let a = parse_bindings(doc).unwrap();
        assert_eq!(a.projects, ["ml", "web"]);
        assert_eq!(
            a.members,
            [
                ("alice".into(), "ml".into()),
                ("alice".into(), "web".into()),
                ("bob".into(), "web".into())
            ]
        );
        assert!(parse_bindings("[").is_err());
    }

    /// CEEMS's users file adds namespaces' users; an absent file adds none, a malformed one
    /// is an error that names the file; a pair already known is not added twice.
    #[test]
    fn namespace_users_from_the_users_file_are_merged_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.yaml");
        std::fs::write(
            &path,
            "users:\n  ns1: [file1, file2]\n  ns3:\n    - file3\n",
        )
        .unwrap();
        let pairs = read_ns_users(&path).unwrap();
        assert_eq!(
            pairs,
            [
                ("file1".to_owned(), "ns1".to_owned()),
                ("file2".to_owned(), "ns1".to_owned()),
                ("file3".to_owned(), "ns3".to_owned())
            ]
        );
        assert!(read_ns_users(&dir.path().join("absent.yaml"))
            .unwrap()
            .is_empty());
        std::fs::write(&path, "users: [file1]\n").unwrap();
        let e = read_ns_users(&path).unwrap_err().to_string();
        assert!(
            e.contains("users.yaml") && e.contains("not a users file"),
            "{e}"
        );

        let mut a = Associations {
            projects: vec!["ns1".into()],
            members: vec![("rb1".into(), "ns1".into())],
            ..Default::default()
        };
        merge_members(
            &mut a,
            vec![
                ("rb1".into(), "ns1".into()),
                ("kusr2".into(), "ns2".into()),
                ("kusr2".into(), "ns2".into()),
            ],
        );
        assert_eq!(a.projects, ["ns1", "ns2"]);
        assert_eq!(
            a.members,
            [
                ("rb1".to_owned(), "ns1".to_owned()),
                ("kusr2".to_owned(), "ns2".to_owned())
            ]
        );
    }
}
